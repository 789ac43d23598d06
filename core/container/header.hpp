// The JSON header of a CMF v2 file (spec §2), parsed with
// simdjson into the typed fields libcmf needs. Unknown keys are ignored;
// a required key that is missing or mistyped, or an unknown enum spelling,
// is a Parse error (the original deserializes into typed structs).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cmf::container {

struct ArchInfo {
    std::string arch_name;
    uint64_t hidden_size = 0, intermediate_size = 0, num_layers = 0, num_attention_heads = 0,
             num_kv_heads = 0, head_dim = 0, vocab_size = 0, max_position_embeddings = 0;
    std::vector<std::string> layer_types;
    double rms_norm_eps = 0;
    std::string norm_style = "qwen";
    double rope_theta = 10000.0;
    bool tie_word_embeddings = false;
    uint64_t num_loops = 1;
    bool has_moe = false;
    uint64_t moe_num_experts = 0;
};

struct ShardBlock {
    uint64_t no = 0, count = 0;
};

struct Header {
    std::string format = "cmf";
    ArchInfo arch;
    std::string quant_type;
    // Minified JSON of the optional blocks, empty when absent or null.
    std::string arch_json, provenance_json, tokenizer_config_json, skills_json;
    std::string chat_template;      // tokenizer_config.chat_template, "" if absent
    size_t skill_count = 0;
    bool skill_file = false;        // some skills[] record has base_dir_hash
    std::optional<ShardBlock> shard;
    // section_hashes: key -> the string as written (parsed at verify time).
    std::map<std::string, std::string> section_hashes;
};

// Throws cmf::Error(CMF_ERR_PARSE, ...) naming the offending key.
Header parse_header(const uint8_t *data, uint64_t len);

}  // namespace cmf::container
