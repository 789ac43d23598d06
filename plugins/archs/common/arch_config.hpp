// The header `arch` block as the decoder families (qwen, gemma) read it: the
// keys the converter writes (docs/convert.md), typed and checked. Which of
// them a family honours, and what it refuses, is the family's choice.
#pragma once

#include "rope_scaling.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cmf::archs {

enum class LayerType { FullAttention, SlidingAttention, LinearAttention, Other };

struct ArchConfig {
    std::string arch_name;
    uint64_t hidden_size = 0;
    uint64_t intermediate_size = 0;  // nominal: a layer's width is its gate_proj rows
    uint64_t num_layers = 0;
    uint64_t num_attention_heads = 0;
    uint64_t num_kv_heads = 0;
    uint64_t head_dim = 0;
    uint64_t vocab_size = 0;
    std::vector<LayerType> layer_types;
    std::vector<std::string> layer_type_names;
    double rms_norm_eps = 0;
    bool gemma_norm = false;  // norm_style "gemma": x^*(1+w)
    double rope_theta = 10000.0;
    double partial_rotary_factor = 1.0;
    uint32_t rot_dim = 0;  // int(head_dim * partial_rotary_factor), even
    bool tie_word_embeddings = false;
    uint64_t max_position_embeddings = 0;
    std::string hidden_act = "silu";  // as written: "silu", "gelu_tanh", or what the source config said
    double embed_multiplier = 1.0;
    // Gemma's keys (0 when absent).
    double query_pre_attn_scalar = 0;
    uint64_t sliding_window = 0;
    uint64_t sliding_window_pattern = 0;
    double rope_local_base_freq = 0;
    double attn_logit_softcapping = 0;
    double final_logit_softcapping = 0;
    // HF's RoPE scaling, from arch.rope_scaling (or the original converter's
    // arch.yarn); type default when neither is there. It applies to the
    // layers whose base is rope_theta (not those on rope_local_base_freq).
    rope::Scaling rope_scaling;
    bool has_moe = false;
    bool has_linear_core = false;
};

// Parses the arch object; throws cmf::sdk::Error(CMF_ERR_PARSE) naming the
// key on a missing required key or a wrong type.
ArchConfig parse_arch_config(const char *json, size_t len);

}  // namespace cmf::archs
