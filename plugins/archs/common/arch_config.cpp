#include "arch_config.hpp"
#include "json_fields.hpp"

#include <cmf/plugin.hpp>

#include <simdjson.h>

namespace cmf::archs {

using cmf::sdk::Error;
using simdjson::dom::element;

ArchConfig parse_arch_config(const char *json, size_t len) {
    if (json == nullptr || len == 0) throw Error(CMF_ERR_PARSE, "arch: the header has no arch object");
    simdjson::dom::parser parser;
    element root;
    if (auto err = parser.parse(simdjson::padded_string(json, len)).get(root))
        throw Error(CMF_ERR_PARSE, std::string("arch: invalid JSON: ") + simdjson::error_message(err));
    if (!root.is_object()) throw Error(CMF_ERR_PARSE, "arch: must be a JSON object");
    const JsonFields f(root, "arch.");
    ArchConfig c;
    c.arch_name = f.string("arch_name", "", true);
    c.hidden_size = f.uint("hidden_size");
    c.intermediate_size = f.uint("intermediate_size");
    c.num_layers = f.uint("num_layers");
    c.num_attention_heads = f.uint("num_attention_heads");
    c.num_kv_heads = f.uint("num_kv_heads");
    c.head_dim = f.uint("head_dim");
    c.vocab_size = f.uint("vocab_size");
    c.max_position_embeddings = f.uint("max_position_embeddings");
    c.rms_norm_eps = f.number("rms_norm_eps", 0, true);
    std::string style = f.string("norm_style", "qwen");
    if (style != "qwen" && style != "gemma") f.bad("norm_style", "must be \"qwen\" or \"gemma\", got \"" + style + "\"");
    c.gemma_norm = style == "gemma";
    c.rope_theta = f.number("rope_theta", 10000.0);
    c.partial_rotary_factor = f.number("partial_rotary_factor", 1.0);
    c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
    // Which activations a family runs is its choice (Gemma runs the tanh GELU
    // whatever a Gemma 1 config's "gelu" says).
    c.hidden_act = f.string("hidden_act", "silu");
    c.embed_multiplier = f.number("embed_multiplier", 1.0);
    c.query_pre_attn_scalar = f.number("query_pre_attn_scalar", 0);
    c.sliding_window = f.has("sliding_window") ? f.uint("sliding_window") : 0;
    c.sliding_window_pattern = f.has("sliding_window_pattern") ? f.uint("sliding_window_pattern") : 0;
    c.rope_local_base_freq = f.number("rope_local_base_freq", 0);
    c.attn_logit_softcapping = f.number("attn_logit_softcapping", 0);
    c.final_logit_softcapping = f.number("final_logit_softcapping", 0);
    c.has_yarn = f.has("yarn");
    c.has_moe = f.has("moe");
    c.has_linear_core = f.has("linear_core");

    for (const std::string &t : f.strings("layer_types")) {
        c.layer_type_names.push_back(t);
        c.layer_types.push_back(t == "FullAttention"      ? LayerType::FullAttention
                                : t == "SlidingAttention" ? LayerType::SlidingAttention
                                : t == "LinearAttention"  ? LayerType::LinearAttention
                                                          : LayerType::Other);
    }

    if (c.hidden_size == 0 || c.num_layers == 0 || c.num_attention_heads == 0 || c.num_kv_heads == 0 ||
        c.head_dim == 0 || c.vocab_size == 0)
        throw Error(CMF_ERR_PARSE, "arch: hidden_size, num_layers, heads, head_dim and vocab_size must be > 0");
    if (c.num_attention_heads % c.num_kv_heads != 0)
        f.bad("num_kv_heads", "num_attention_heads must be a multiple of num_kv_heads");
    if (c.layer_types.size() != c.num_layers)
        f.bad("layer_types", "has " + std::to_string(c.layer_types.size()) + " entries for " +
                               std::to_string(c.num_layers) + " layers");
    if (!(c.rms_norm_eps >= 0)) f.bad("rms_norm_eps", "must be >= 0");
    if (!(c.rope_theta > 0)) f.bad("rope_theta", "must be > 0");
    for (auto [key, v] : {std::pair{"query_pre_attn_scalar", c.query_pre_attn_scalar},
                          std::pair{"rope_local_base_freq", c.rope_local_base_freq},
                          std::pair{"attn_logit_softcapping", c.attn_logit_softcapping},
                          std::pair{"final_logit_softcapping", c.final_logit_softcapping}})
        if (f.has(key) && !(v > 0)) f.bad(key, "must be > 0");
    if (f.has("sliding_window") && c.sliding_window == 0) f.bad("sliding_window", "must be > 0");
    if (f.has("sliding_window_pattern") && c.sliding_window_pattern == 0) f.bad("sliding_window_pattern", "must be > 0");
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) f.bad("partial_rotary_factor", "must be in (0, 1]");
    return c;
}

}  // namespace cmf::archs
