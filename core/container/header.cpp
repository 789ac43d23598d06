#include "container/header.hpp"

#include "common/error.hpp"
#include "common/json.hpp"

#include <simdjson.h>

namespace cmf::container {

namespace {

using simdjson::dom::element;
using simdjson::dom::object;

[[noreturn]] void fail(const std::string &msg) { throw Error(CMF_ERR_PARSE, "header JSON: " + msg); }

element required(const object &o, const char *key, const std::string &where) {
    element e;
    if (o[key].get(e) != simdjson::SUCCESS) fail("missing required key '" + where + key + "'");
    return e;
}
uint64_t as_uint(const element &e, const std::string &what) {
    auto v = json::u64_of(e);
    if (!v) fail("'" + what + "' = " + json::spelling(e) + ": must be a non-negative integer that fits 64 bits");
    return *v;
}
double as_number(const element &e, const std::string &what) {
    auto v = json::number_of(e);
    if (!v) fail("'" + what + "' = " + json::spelling(e) + ": must be a number");
    return *v;
}
std::string as_string(const element &e, const std::string &what) {
    std::string_view v;
    if (e.get(v) != simdjson::SUCCESS) fail("'" + what + "' must be a string");
    return std::string(v);
}
// An optional key: absent and null both read as "not there".
bool optional_key(const object &o, const char *key, element &out) {
    if (o[key].get(out) != simdjson::SUCCESS) return false;
    return !out.is_null();
}

ArchInfo parse_arch(const object &a) {
    ArchInfo r;
    r.arch_name = as_string(required(a, "arch_name", "arch."), "arch.arch_name");
    struct { const char *key; uint64_t *dst; } ints[] = {
        {"hidden_size", &r.hidden_size}, {"intermediate_size", &r.intermediate_size},
        {"num_layers", &r.num_layers}, {"num_attention_heads", &r.num_attention_heads},
        {"num_kv_heads", &r.num_kv_heads}, {"head_dim", &r.head_dim}, {"vocab_size", &r.vocab_size},
        {"max_position_embeddings", &r.max_position_embeddings}};
    for (auto &f : ints) *f.dst = as_uint(required(a, f.key, "arch."), std::string("arch.") + f.key);
    simdjson::dom::array types;
    if (required(a, "layer_types", "arch.").get(types) != simdjson::SUCCESS) fail("'arch.layer_types' must be an array");
    for (element t : types) {
        std::string s = as_string(t, "arch.layer_types[]");
        if (s != "FullAttention" && s != "SlidingAttention" && s != "LinearAttention" && s != "ShortConv" && s != "Kda")
            fail("unknown layer type '" + s + "' in arch.layer_types");
        r.layer_types.push_back(std::move(s));
    }
    r.rms_norm_eps = as_number(required(a, "rms_norm_eps", "arch."), "arch.rms_norm_eps");
    element e;
    if (optional_key(a, "norm_style", e)) {
        r.norm_style = as_string(e, "arch.norm_style");
        if (r.norm_style != "qwen" && r.norm_style != "gemma") fail("unknown arch.norm_style '" + r.norm_style + "'");
    }
    if (optional_key(a, "rope_theta", e)) r.rope_theta = as_number(e, "arch.rope_theta");
    if (optional_key(a, "tie_word_embeddings", e) && e.get(r.tie_word_embeddings) != simdjson::SUCCESS)
        fail("'arch.tie_word_embeddings' must be a boolean");
    if (optional_key(a, "num_loops", e)) r.num_loops = as_uint(e, "arch.num_loops");
    if (optional_key(a, "moe", e)) {
        object m;
        if (e.get(m) != simdjson::SUCCESS) fail("'arch.moe' must be an object");
        r.has_moe = true;
        r.moe_num_experts = as_uint(required(m, "num_experts", "arch.moe."), "arch.moe.num_experts");
        as_uint(required(m, "top_k", "arch.moe."), "arch.moe.top_k");
        as_uint(required(m, "moe_intermediate_size", "arch.moe."), "arch.moe.moe_intermediate_size");
    }
    return r;
}

}  // namespace

Header parse_header(const uint8_t *data, uint64_t len) {
    if (!simdjson::validate_utf8(reinterpret_cast<const char *>(data), size_t(len))) fail("not valid UTF-8");
    simdjson::dom::parser parser;
    element root = parse_json(parser, std::string_view(reinterpret_cast<const char *>(data), size_t(len)), "header JSON");
    object top;
    if (root.get(top) != simdjson::SUCCESS) fail("the header must be a JSON object");

    Header h;
    element e;
    if (optional_key(top, "format", e)) h.format = as_string(e, "format");
    as_number(required(top, "version", ""), "version");
    object arch;
    if (required(top, "arch", "").get(arch) != simdjson::SUCCESS) fail("'arch' must be an object");
    h.arch = parse_arch(arch);
    h.arch_json = simdjson::minify(arch);
    h.quant_type = as_string(required(top, "quant_type", ""), "quant_type");
    static const char *quant_types[] = {"Q8_ROW", "Q4_BLOCK", "Q8_2F", "VBIT", "BF16", "F16", "F32"};
    bool known = false;
    for (const char *q : quant_types) known = known || h.quant_type == q;
    if (!known) fail("unknown quant_type '" + h.quant_type + "'");

    if (optional_key(top, "provenance", e)) h.provenance_json = simdjson::minify(e);
    if (optional_key(top, "tokenizer_config", e)) {
        object tc;
        if (e.get(tc) != simdjson::SUCCESS) fail("'tokenizer_config' must be an object or null");
        h.tokenizer_config_json = simdjson::minify(tc);
        element t;
        if (optional_key(tc, "chat_template", t)) h.chat_template = as_string(t, "tokenizer_config.chat_template");
        if (optional_key(tc, "eos_token_ids", t)) {
            simdjson::dom::array ids;
            if (t.get(ids) != simdjson::SUCCESS) fail("'tokenizer_config.eos_token_ids' must be an array");
            for (element id : ids) as_uint(id, "tokenizer_config.eos_token_ids[]");
        }
        for (const char *k : {"bos_token_id", "pad_token_id"})
            if (optional_key(tc, k, t)) as_uint(t, std::string("tokenizer_config.") + k);
    }
    if (optional_key(top, "section_hashes", e)) {
        object sh;
        if (e.get(sh) != simdjson::SUCCESS) fail("'section_hashes' must be an object");
        for (const char *k : {"masks", "vocab", "index"}) {
            element v;
            if (optional_key(sh, k, v)) h.section_hashes[k] = as_string(v, std::string("section_hashes.") + k);
        }
    }
    if (optional_key(top, "skills", e)) {
        simdjson::dom::array skills;
        if (e.get(skills) != simdjson::SUCCESS) fail("'skills' must be an array");
        for (element s : skills) {
            object rec;
            if (s.get(rec) != simdjson::SUCCESS) fail("each skills[] record must be an object");
            as_string(required(rec, "id", "skills[]."), "skills[].id");
            element sel;
            if (optional_key(rec, "selection", sel)) {
                object so;
                if (sel.get(so) != simdjson::SUCCESS) fail("'skills[].selection' must be an object");
                as_uint(required(so, "rank", "skills[].selection."), "skills[].selection.rank");
            }
            element b;
            if (optional_key(rec, "base_dir_hash", b)) {
                as_string(b, "skills[].base_dir_hash");
                h.skill_file = true;
            }
            ++h.skill_count;
        }
        h.skills_json = simdjson::minify(skills);
    }
    if (optional_key(top, "shard", e)) {
        object sh;
        if (e.get(sh) != simdjson::SUCCESS) fail("'shard' must be an object");
        ShardBlock b;
        b.no = as_uint(required(sh, "no", "shard."), "shard.no");
        b.count = as_uint(required(sh, "count", "shard."), "shard.count");
        h.shard = b;
    }
    return h;
}

}  // namespace cmf::container
