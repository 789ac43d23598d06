#include "arch_config.hpp"

#include <cmf/json_read.hpp>
#include <cmf/plugin.hpp>

#include <cmath>

namespace cmf::archs {

namespace {

using cmf::sdk::Error;

[[noreturn]] void bad(const std::string &key, const std::string &what) {
    throw Error(CMF_ERR_PARSE, "arch." + key + ": " + what);
}

}  // namespace

ArchConfig parse_arch_config(const char *json, size_t len) {
    if (json == nullptr || len == 0) throw Error(CMF_ERR_PARSE, "arch: the header has no arch object");
    simdjson::dom::parser parser;
    const json::Object a = json::parse_object(parser, std::string_view(json, len), "arch");
    auto need_u64 = [&](const char *k) {
        auto v = a.u64(k);
        if (!v) bad(k, "required key is missing");
        return *v;
    };
    ArchConfig c;
    c.arch_name = a.str("arch_name").value_or("");
    if (c.arch_name.empty()) bad("arch_name", "required key is missing");
    c.hidden_size = need_u64("hidden_size");
    c.intermediate_size = need_u64("intermediate_size");
    c.num_layers = need_u64("num_layers");
    c.num_attention_heads = need_u64("num_attention_heads");
    c.num_kv_heads = need_u64("num_kv_heads");
    c.head_dim = need_u64("head_dim");
    c.vocab_size = need_u64("vocab_size");
    c.max_position_embeddings = need_u64("max_position_embeddings");
    auto eps = a.finite("rms_norm_eps");
    if (!eps) bad("rms_norm_eps", "required key is missing");
    c.rms_norm_eps = *eps;
    std::string style = a.str("norm_style").value_or("qwen");
    if (style != "qwen" && style != "gemma") bad("norm_style", "must be \"qwen\" or \"gemma\", got \"" + style + "\"");
    c.gemma_norm = style == "gemma";
    c.rope_theta = a.finite("rope_theta").value_or(10000.0);
    c.partial_rotary_factor = a.finite("partial_rotary_factor").value_or(1.0);
    c.tie_word_embeddings = a.boolean("tie_word_embeddings").value_or(false);
    // Which activations a family runs is its choice (Gemma runs the tanh GELU
    // whatever a Gemma 1 config's "gelu" says).
    c.hidden_act = a.str("hidden_act").value_or("silu");
    c.embed_multiplier = a.finite("embed_multiplier").value_or(1.0);
    c.query_pre_attn_scalar = a.finite("query_pre_attn_scalar").value_or(0);
    c.sliding_window = a.u64("sliding_window").value_or(0);
    c.sliding_window_pattern = a.u64("sliding_window_pattern").value_or(0);
    c.rope_local_base_freq = a.finite("rope_local_base_freq").value_or(0);
    c.attn_logit_softcapping = a.finite("attn_logit_softcapping").value_or(0);
    c.final_logit_softcapping = a.finite("final_logit_softcapping").value_or(0);
    c.has_moe = a.has("moe");
    c.has_linear_core = a.has("linear_core");
    // RoPE scaling: our record (rope_scaling), else the original converter's yarn block.
    if (auto rs = a.object("rope_scaling")) c.rope_scaling = rope::from_arch(*rs);
    else if (auto y = a.object("yarn")) c.rope_scaling = rope::from_original_yarn(*y, c.max_position_embeddings);

    auto types = a.array("layer_types");
    if (!types) bad("layer_types", "required key is missing");
    for (simdjson::dom::element t : *types) {
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
        if (a.has(key) && !(v > 0)) bad(key, "must be > 0");
    if (a.has("sliding_window") && c.sliding_window == 0) bad("sliding_window", "must be > 0");
    if (a.has("sliding_window_pattern") && c.sliding_window_pattern == 0) bad("sliding_window_pattern", "must be > 0");
    if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) bad("partial_rotary_factor", "must be in (0, 1]");
    // HF rotates int(head_dim * partial_rotary_factor) dims in pairs.
    c.rot_dim = static_cast<uint32_t>(std::floor(double(c.head_dim) * c.partial_rotary_factor));
    if (c.rot_dim % 2 != 0)
        bad("partial_rotary_factor", "head_dim * partial_rotary_factor = " + std::to_string(c.rot_dim) +
                                         " rotary dims, an odd number (RoPE rotates pairs)");
    rope::check(c.rope_scaling, c.rope_theta, c.rot_dim, "arch.rope_scaling");
    return c;
}

}  // namespace cmf::archs
