#include "arch_config.hpp"

#include <cmf/plugin.hpp>

#include <simdjson.h>

namespace cmf::archs {

namespace {

using cmf::sdk::Error;
using simdjson::dom::element;

[[noreturn]] void bad(const std::string &key, const std::string &what) {
    throw Error(CMF_ERR_PARSE, "arch." + key + ": " + what);
}

bool has(element obj, const char *key) {
    element e;
    return obj[key].get(e) == simdjson::SUCCESS && !e.is_null();
}

uint64_t get_uint(element obj, const char *key) {
    element e;
    if (obj[key].get(e) != simdjson::SUCCESS || e.is_null()) bad(key, "required key is missing");
    uint64_t v;
    if (e.get_uint64().get(v) != simdjson::SUCCESS) bad(key, "must be a non-negative integer");
    return v;
}

double get_number(element obj, const char *key, double fallback, bool required = false) {
    element e;
    if (obj[key].get(e) != simdjson::SUCCESS || e.is_null()) {
        if (required) bad(key, "required key is missing");
        return fallback;
    }
    double v;
    if (e.get_double().get(v) == simdjson::SUCCESS) return v;
    int64_t i;
    if (e.get_int64().get(i) == simdjson::SUCCESS) return double(i);
    uint64_t u;
    if (e.get_uint64().get(u) == simdjson::SUCCESS) return double(u);
    bad(key, "must be a number");
}

std::string get_string(element obj, const char *key, const char *fallback, bool required = false) {
    element e;
    if (obj[key].get(e) != simdjson::SUCCESS || e.is_null()) {
        if (required) bad(key, "required key is missing");
        return fallback;
    }
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS) bad(key, "must be a string");
    return std::string(s);
}

bool get_bool(element obj, const char *key, bool fallback) {
    element e;
    if (obj[key].get(e) != simdjson::SUCCESS || e.is_null()) return fallback;
    bool b;
    if (e.get_bool().get(b) != simdjson::SUCCESS) bad(key, "must be true or false");
    return b;
}

}  // namespace

ArchConfig parse_arch_config(const char *json, size_t len) {
    if (json == nullptr || len == 0) throw Error(CMF_ERR_PARSE, "arch: the header has no arch object");
    simdjson::dom::parser parser;
    element root;
    if (auto err = parser.parse(simdjson::padded_string(json, len)).get(root))
        throw Error(CMF_ERR_PARSE, std::string("arch: invalid JSON: ") + simdjson::error_message(err));
    if (!root.is_object()) throw Error(CMF_ERR_PARSE, "arch: must be a JSON object");
    ArchConfig c;
    c.arch_name = get_string(root, "arch_name", "", true);
    c.hidden_size = get_uint(root, "hidden_size");
    c.intermediate_size = get_uint(root, "intermediate_size");
    c.num_layers = get_uint(root, "num_layers");
    c.num_attention_heads = get_uint(root, "num_attention_heads");
    c.num_kv_heads = get_uint(root, "num_kv_heads");
    c.head_dim = get_uint(root, "head_dim");
    c.vocab_size = get_uint(root, "vocab_size");
    c.max_position_embeddings = get_uint(root, "max_position_embeddings");
    c.rms_norm_eps = get_number(root, "rms_norm_eps", 0, true);
    std::string style = get_string(root, "norm_style", "qwen");
    if (style != "qwen" && style != "gemma") bad("norm_style", "must be \"qwen\" or \"gemma\", got \"" + style + "\"");
    c.gemma_norm = style == "gemma";
    c.rope_theta = get_number(root, "rope_theta", 10000.0);
    c.partial_rotary_factor = get_number(root, "partial_rotary_factor", 1.0);
    c.tie_word_embeddings = get_bool(root, "tie_word_embeddings", false);
    // Which activations a family runs is its choice (Gemma runs the tanh GELU
    // whatever a Gemma 1 config's "gelu" says).
    c.hidden_act = get_string(root, "hidden_act", "silu");
    c.embed_multiplier = get_number(root, "embed_multiplier", 1.0);
    c.query_pre_attn_scalar = get_number(root, "query_pre_attn_scalar", 0);
    c.sliding_window = has(root, "sliding_window") ? get_uint(root, "sliding_window") : 0;
    c.sliding_window_pattern = has(root, "sliding_window_pattern") ? get_uint(root, "sliding_window_pattern") : 0;
    c.rope_local_base_freq = get_number(root, "rope_local_base_freq", 0);
    c.attn_logit_softcapping = get_number(root, "attn_logit_softcapping", 0);
    c.final_logit_softcapping = get_number(root, "final_logit_softcapping", 0);
    c.has_yarn = has(root, "yarn");
    c.has_moe = has(root, "moe");
    c.has_linear_core = has(root, "linear_core");

    simdjson::dom::array types;
    element lt;
    if (root["layer_types"].get(lt) != simdjson::SUCCESS || lt.is_null()) bad("layer_types", "required key is missing");
    if (lt.get_array().get(types) != simdjson::SUCCESS) bad("layer_types", "must be an array of strings");
    for (element t : types) {
        std::string_view s;
        if (t.get_string().get(s) != simdjson::SUCCESS) bad("layer_types", "must be an array of strings");
        c.layer_type_names.emplace_back(s);
        c.layer_types.push_back(s == "FullAttention"      ? LayerType::FullAttention
                                : s == "SlidingAttention" ? LayerType::SlidingAttention
                                : s == "LinearAttention"  ? LayerType::LinearAttention
                                                          : LayerType::Other);
    }

    if (c.hidden_size == 0 || c.num_layers == 0 || c.num_attention_heads == 0 || c.num_kv_heads == 0 ||
        c.head_dim == 0 || c.vocab_size == 0)
        throw Error(CMF_ERR_PARSE, "arch: hidden_size, num_layers, heads, head_dim and vocab_size must be > 0");
    if (c.num_attention_heads % c.num_kv_heads != 0)
        bad("num_kv_heads", "num_attention_heads must be a multiple of num_kv_heads");
    if (c.layer_types.size() != c.num_layers)
        bad("layer_types", "has " + std::to_string(c.layer_types.size()) + " entries for " +
                               std::to_string(c.num_layers) + " layers");
    if (!(c.rms_norm_eps >= 0)) bad("rms_norm_eps", "must be >= 0");
    if (!(c.rope_theta > 0)) bad("rope_theta", "must be > 0");
    for (auto [key, v] : {std::pair{"query_pre_attn_scalar", c.query_pre_attn_scalar},
                          std::pair{"rope_local_base_freq", c.rope_local_base_freq},
                          std::pair{"attn_logit_softcapping", c.attn_logit_softcapping},
                          std::pair{"final_logit_softcapping", c.final_logit_softcapping}})
        if (has(root, key) && !(v > 0)) bad(key, "must be > 0");
    if (has(root, "sliding_window") && c.sliding_window == 0) bad("sliding_window", "must be > 0");
    if (has(root, "sliding_window_pattern") && c.sliding_window_pattern == 0) bad("sliding_window_pattern", "must be > 0");
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) bad("partial_rotary_factor", "must be in (0, 1]");
    return c;
}

}  // namespace cmf::archs
