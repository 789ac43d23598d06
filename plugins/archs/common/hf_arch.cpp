#include "hf_arch.hpp"

#include "rope_scaling.hpp"

#include <cmf/json_read.hpp>
#include <cmf/json_writer.hpp>

#include <simdjson.h>

#include <cmath>

namespace cmf::archs {

using sdk::Error;
namespace dom = simdjson::dom;
using json::Object;

namespace {

constexpr const char *kConfig = "config.json";

[[noreturn]] void config_error(const std::string &msg) { throw Error(CMF_ERR_PARSE, std::string(kConfig) + ": " + msg); }
[[noreturn]] void unsupported(const std::string &msg) { throw Error(CMF_ERR_UNSUPPORTED, std::string(kConfig) + ": " + msg); }

uint64_t need_u64(const Object &o, const char *k) {
    auto v = o.u64(k);
    if (!v) o.missing(k);
    return *v;
}

bool contains(const std::string &s, const char *sub) { return s.find(sub) != std::string::npos; }
bool starts_with(const std::string &s, const char *p) { return s.rfind(p, 0) == 0; }

// The activation HF's ACT2FN gives for `name`, as the arch block spells it:
// "silu" or "gelu_tanh" (the tanh approximation under its HF names). Others
// are refused: the runtime computes no other activation.
std::string activation(const Object &o, const char *key, const std::string &name) {
    if (name == "silu" || name == "swish") return "silu";
    if (name == "gelu_pytorch_tanh" || name == "gelu_tanh" || name == "gelu_new") return "gelu_tanh";
    unsupported(o.key_path(key) + " \"" + name + "\": activation not supported (silu, swish, gelu_pytorch_tanh, gelu_new)");
}

// The RoPE parameters a config gives. transformers v4 spells the scaling
// `rope_scaling`; v5 spells everything `rope_parameters` (rope_theta and
// partial_rotary_factor included), per layer type for some models
// ({full_attention: {...}, sliding_attention: {...}}, Gemma 3). The scaling
// comes from `rope_scaling` when it is there and not empty (as v5's
// convert_rope_params_to_dict reads old configs), else `rope_parameters`.
struct RopeSource {
    std::optional<Object> parameters;  // rope_parameters, or its full_attention entry
    std::optional<Object> sliding;     // rope_parameters.sliding_attention
    std::optional<Object> scaling;     // where the scaling is read
    bool top_level_scaling = false;    // scaling is `rope_scaling`
};

RopeSource rope_source(const Object &tc) {
    RopeSource r;
    if (auto rp = tc.object("rope_parameters")) {
        if (rp->get("full_attention") || rp->get("sliding_attention")) {
            for (auto kv : rp->raw()) {
                const std::string key(kv.key);
                if (key != "full_attention" && key != "sliding_attention")
                    unsupported(rp->key_path(key) + ": RoPE parameters for layer type \"" + key +
                                "\", which no supported model has (full_attention, sliding_attention)");
            }
            r.parameters = rp->object("full_attention");
            r.sliding = rp->object("sliding_attention");
        } else {
            r.parameters = rp;
        }
    }
    r.scaling = r.parameters;
    if (auto rs = tc.object("rope_scaling"); rs && rs->raw().size() > 0) {
        r.scaling = rs;
        r.top_level_scaling = true;
    }
    return r;
}

}  // namespace

std::string build_arch_json(std::string_view text) {
    dom::parser parser;
    const Object top = json::parse_object(parser, text, kConfig);
    auto model_type = top.str("model_type");
    if (!model_type) config_error("no model_type");
    const std::string mt = *model_type;
    const Object tc = top.object("text_config").value_or(top);

    const bool gemma_family = contains(mt, "gemma");
    const bool qwen_family = starts_with(mt, "qwen");
    const bool hybrid = starts_with(mt, "qwen3_5") || contains(mt, "qwen3_next");
    const bool gemma_norm = (gemma_family && !contains(mt, "gemma4") && !contains(mt, "gemma3n")) || hybrid;

    const uint64_t hidden = need_u64(tc, "hidden_size");
    const uint64_t layers = need_u64(tc, "num_hidden_layers");
    const uint64_t heads = need_u64(tc, "num_attention_heads");
    const uint64_t vocab = need_u64(tc, "vocab_size");
    if (hidden == 0 || layers == 0 || heads == 0 || vocab == 0)
        config_error("hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be positive");
    // Per-layer lists are built from the count: a corrupt one must not ask
    // for terabytes. The deepest real models have a few hundred layers.
    constexpr uint64_t kMaxLayers = 65536;
    if (layers > kMaxLayers)
        config_error("num_hidden_layers " + std::to_string(layers) + " is beyond " + std::to_string(kMaxLayers));
    auto inter = tc.u64("intermediate_size");
    if (!inter) inter = tc.u64("moe_intermediate_size");
    if (!inter) config_error("missing required key " + tc.key_path("intermediate_size") + " (or moe_intermediate_size)");
    const uint64_t kv = tc.u64("num_key_value_heads").value_or(heads);
    if (kv == 0 || heads % kv != 0)
        config_error("num_key_value_heads " + std::to_string(kv) + " does not divide num_attention_heads " + std::to_string(heads));
    uint64_t head_dim;
    if (auto hd = tc.u64("head_dim")) head_dim = *hd;
    else {
        if (hidden % heads) config_error("hidden_size is not a multiple of num_attention_heads and head_dim is not given");
        head_dim = hidden / heads;
    }
    if (head_dim == 0) tc.fail("head_dim", *tc.get("head_dim"), "must be positive");
    auto max_pos = tc.u64("max_position_embeddings");
    if (!max_pos) tc.missing("max_position_embeddings");

    // layer_types: HF's names; a name no supported model has is refused (it
    // would otherwise run as full attention).
    std::vector<std::string> types;
    if (auto arr = tc.array("layer_types")) {
        for (auto e : *arr) {
            std::string_view s;
            if (e.get_string().get(s)) tc.fail("layer_types", e, "must be an array of strings");
            if (s == "linear_attention") types.push_back("LinearAttention");
            else if (s == "sliding_attention") types.push_back("SlidingAttention");
            else if (s == "full_attention") types.push_back("FullAttention");
            else unsupported(tc.key_path("layer_types") + " holds \"" + std::string(s) +
                             "\": not a layer type of a supported model (full_attention, sliding_attention, linear_attention)");
        }
        if (types.size() != layers)
            config_error(tc.key_path("layer_types") + " has " + std::to_string(types.size()) + " entries but num_hidden_layers is " + std::to_string(layers));
    } else if (hybrid) {
        // Deliberate addition to the original (which writes all FullAttention
        // here): HF derives the hybrid schedule from full_attention_interval,
        // and a GDN checkpoint described as all-attention could not run.
        const uint64_t every = tc.u64("full_attention_interval").value_or(4);
        if (every == 0) config_error("full_attention_interval must be positive");
        for (uint64_t i = 0; i < layers; ++i) types.push_back((i + 1) % every == 0 ? "FullAttention" : "LinearAttention");
    } else {
        types.assign(layers, "FullAttention");
    }
    // Qwen's sliding window: HF makes layers >= max_window_layers sliding when
    // use_sliding_window is true. Released configs leave it off; the qwen
    // forward pass has no sliding attention, so such a config is refused
    // rather than run with full attention.
    if (qwen_family && !hybrid) {
        const bool use_sw = tc.boolean("use_sliding_window").value_or(false);
        if (use_sw && tc.u64("sliding_window").value_or(0) > 0) {
            const uint64_t from = tc.u64("max_window_layers").value_or(28);
            if (from < layers)
                unsupported(tc.key_path("use_sliding_window") + " is true (layers " + std::to_string(from) + ".." +
                            std::to_string(layers - 1) + " attend a " + std::to_string(*tc.u64("sliding_window")) +
                            "-token window): sliding-window attention is not implemented for " + mt + " models");
        }
        for (const auto &t : types)
            if (t == "SlidingAttention")
                unsupported(tc.key_path("layer_types") + " has sliding_attention layers: sliding-window attention is not implemented for " + mt +
                            " models");
    }
    if (gemma_family && tc.boolean("use_bidirectional_attention").value_or(false))
        unsupported(tc.key_path("use_bidirectional_attention") + " is true (an embedding model): only causal decoders are converted");
    bool any_linear = false, any_sliding = false;
    for (const auto &t : types) {
        any_linear |= t == "LinearAttention";
        any_sliding |= t == "SlidingAttention";
    }

    const double eps = tc.finite("rms_norm_eps").value_or(tc.finite("norm_eps").value_or(1e-6));
    if (!(eps >= 0)) tc.fail("rms_norm_eps", *tc.get("rms_norm_eps"), "must be >= 0");
    const RopeSource rope_src = rope_source(tc);
    double rope_theta = 10000.0;
    if (auto v = tc.finite("rope_theta")) rope_theta = *v;
    else if (rope_src.parameters && rope_src.parameters->has("rope_theta")) rope_theta = *rope_src.parameters->finite("rope_theta");
    if (!(rope_theta > 0)) config_error("rope_theta = " + json::spelling(*tc.get("rope_theta")) + ": must be a positive number");
    float partial = hybrid ? 0.25f : 1.0f;  // HF's Qwen3NextConfig / Qwen3_5TextConfig default to 0.25
    if (auto v = tc.finite("partial_rotary_factor")) partial = static_cast<float>(*v);
    else if (rope_src.parameters && rope_src.parameters->has("partial_rotary_factor"))
        partial = static_cast<float>(*rope_src.parameters->finite("partial_rotary_factor"));
    if (!(partial > 0 && partial <= 1)) config_error("partial_rotary_factor " + std::to_string(partial) + ": must be in (0, 1]");
    // HF rotates int(head_dim * partial_rotary_factor) dims, in pairs.
    const uint64_t rot_dim = static_cast<uint64_t>(double(head_dim) * double(partial));
    if (rot_dim % 2) unsupported("head_dim * partial_rotary_factor = " + std::to_string(rot_dim) + " rotary dims, an odd number (RoPE rotates pairs)");
    rope::Scaling scaling;
    if (rope_src.scaling) {
        scaling = rope::from_hf(*rope_src.scaling, *max_pos);
        rope::check(scaling, rope_theta, static_cast<uint32_t>(rot_dim), std::string(kConfig) + ": " + rope_src.scaling->path());
    }
    std::optional<double> local_base = tc.finite("rope_local_base_freq");
    if (rope_src.sliding) {
        const rope::Scaling sl = rope::from_hf(*rope_src.sliding, *max_pos);
        if (sl.scaled())
            unsupported(rope_src.sliding->path() + "rope_type " + rope::type_name(sl.type) +
                        ": scaled RoPE on sliding layers is not implemented (they run unscaled, as Gemma 3's do)");
        if (auto t = rope_src.sliding->finite("rope_theta")) local_base = *t;
    }

    bool tie = gemma_family;
    if (auto v = top.boolean("tie_word_embeddings")) tie = *v;
    else if (auto v2 = tc.boolean("tie_word_embeddings")) tie = *v2;

    // With a top-level rope_scaling the original converter writes
    // max_position_embeddings = original_max_position_embeddings (it serves
    // the native window, unscaled); kept so its readers see what it writes.
    // The scaling itself is in rope_scaling, applied as HF applies it.
    uint64_t max_position = *max_pos;
    if (rope_src.top_level_scaling) {
        const Object &rs = *rope_src.scaling;
        std::string kind = rs.str("rope_type").value_or(rs.str("type").value_or(""));
        if ((kind == "linear" || kind == "yarn" || kind == "longrope" || kind == "dynamic" || kind == "mrope") &&
            rs.u64("original_max_position_embeddings"))
            max_position = *rs.u64("original_max_position_embeddings");
    }

    // Activation. Gemma: hidden_activation, which HF (v4) sets to the tanh
    // GELU when it is null whatever the legacy hidden_act says.
    std::string act = "silu";
    if (gemma_family) {
        if (auto a = tc.str("hidden_activation")) act = activation(tc, "hidden_activation", *a);
        else act = "gelu_tanh";
    } else if (auto a = tc.str("hidden_act")) {
        act = activation(tc, "hidden_act", *a);
    }

    json::Writer w;
    w.begin_object();
    w.key("arch_name").string(mt);
    w.key("hidden_size").u64(hidden);
    w.key("intermediate_size").u64(*inter);
    w.key("num_layers").u64(layers);
    w.key("num_attention_heads").u64(heads);
    w.key("num_kv_heads").u64(kv);
    w.key("head_dim").u64(head_dim);
    w.key("vocab_size").u64(vocab);
    w.key("layer_types").begin_array();
    for (const auto &t : types) w.string(t);
    w.end_array();
    w.key("rms_norm_eps").f64(eps);
    w.key("norm_style").string(gemma_norm ? "gemma" : "qwen");
    w.key("rope_theta").f64(rope_theta);
    w.key("tie_word_embeddings").boolean(tie);
    w.key("partial_rotary_factor").f32(partial);
    // The original writes a yarn block for rope_parameters of type yarn (and
    // nothing for other scalings); kept as it writes it, so its readers
    // find what they expect. rope_scaling below is what HF computes with.
    if (rope_src.parameters && rope_src.parameters->str("rope_type").value_or(rope_src.parameters->str("type").value_or("")) == "yarn") {
        const Object &rp = *rope_src.parameters;
        auto fct = rp.finite("factor");
        auto orig = rp.u64("original_max_position_embeddings");
        if (!fct || !orig) config_error(rp.path() + " of type yarn need factor and original_max_position_embeddings");
        const double factor = *fct;
        w.key("yarn").begin_object();
        w.key("factor").f64(factor);
        w.key("original_max_position_embeddings").u64(*orig);
        w.key("beta_fast").f64(rp.finite("beta_fast").value_or(32.0));
        w.key("beta_slow").f64(rp.finite("beta_slow").value_or(1.0));
        w.key("attention_factor").f64(rp.finite("attention_factor").value_or(0.1 * std::log(factor) + 1.0));
        if (auto m = rp.finite("mscale_all_dim")) w.key("mscale_all_dim").f64(*m);
        w.end_object();
    }
    if (scaling.scaled()) {
        w.key("rope_scaling");
        rope::write_arch(w, scaling);
    }
    if (act != "silu") w.key("hidden_act").string(act);
    if (gemma_family) w.key("embed_multiplier").f32(std::sqrt(static_cast<float>(hidden)));
    if (auto v = tc.finite("query_pre_attn_scalar")) w.key("query_pre_attn_scalar").f64(*v);
    auto pattern = tc.u64("sliding_window_pattern");
    if (!pattern && mt == "gemma2") pattern = 2;
    if (auto sw = tc.u64("sliding_window"); sw && gemma_family && (mt == "gemma2" || pattern || any_sliding))
        w.key("sliding_window").u64(*sw);
    if (pattern && gemma_family) w.key("sliding_window_pattern").u64(*pattern);
    if (local_base) w.key("rope_local_base_freq").f64(*local_base);
    if (auto v = tc.finite("final_logit_softcapping")) w.key("final_logit_softcapping").f64(*v);
    if (auto v = tc.finite("attn_logit_softcapping")) w.key("attn_logit_softcapping").f64(*v);
    uint64_t mtp = tc.u64("mtp_num_hidden_layers").value_or(0);
    if (!mtp) mtp = tc.u64("num_nextn_predict_layers").value_or(0);
    if (mtp) {
        w.key("mtp").begin_object();
        w.key("num_layers").u64(mtp);
        w.key("share_lm_head").boolean(true);
        w.key("share_embed").boolean(true);
        w.end_object();
    }
    if (uint64_t experts = tc.u64("num_experts").value_or(0)) {
        auto moe_inter = tc.u64("moe_intermediate_size");
        if (!moe_inter) config_error("num_experts is set but moe_intermediate_size is missing");
        w.key("moe").begin_object();
        w.key("num_experts").u64(experts);
        w.key("top_k").u64(tc.u64("num_experts_per_tok").value_or(2));
        w.key("moe_intermediate_size").u64(*moe_inter);
        // qwen3_5_moe always renormalises (its config has no switch).
        bool renorm = tc.boolean("norm_topk_prob").value_or(hybrid);
        if (starts_with(mt, "qwen3_5_moe")) renorm = true;
        w.key("norm_topk_prob").boolean(renorm);
        if (uint64_t s = tc.u64("shared_expert_intermediate_size").value_or(0)) w.key("shared_expert_intermediate_size").u64(s);
        w.end_object();
    }
    auto lin_k = tc.u64("linear_conv_kernel_dim"), lin_nk = tc.u64("linear_num_key_heads"), lin_nv = tc.u64("linear_num_value_heads");
    auto lin_dk = tc.u64("linear_key_head_dim"), lin_dv = tc.u64("linear_value_head_dim");
    if (any_linear) {
        if (!lin_k || !lin_nk || !lin_nv || !lin_dk || !lin_dv)
            config_error("layer_types has linear_attention layers but linear_conv_kernel_dim, linear_num_key_heads, "
                         "linear_num_value_heads, linear_key_head_dim and linear_value_head_dim are not all given");
        if (*lin_nk == 0 || *lin_nv % *lin_nk != 0)
            config_error("linear_num_value_heads must be a multiple of linear_num_key_heads");
        w.key("linear_core").begin_object();
        w.key("kind").string("gated_delta_net");
        w.key("num_heads").u64(*lin_nv);
        w.key("value_head_dim").u64(*lin_dv);
        w.end_object();
    }
    w.key("max_position_embeddings").u64(max_position);
    auto opt = [&](const char *k, const std::optional<uint64_t> &v) {
        w.key(k);
        if (v) w.u64(*v);
        else w.null();
    };
    opt("linear_conv_kernel_dim", lin_k);
    opt("linear_num_key_heads", lin_nk);
    opt("linear_num_value_heads", lin_nv);
    if (lin_dk) w.key("linear_key_head_dim").u64(*lin_dk);
    if (lin_dv) w.key("linear_value_head_dim").u64(*lin_dv);
    w.end_object();
    return w.take();
}

ArchView parse_arch(std::string_view text) {
    dom::parser parser;
    const Object a = json::parse_object(parser, text, "arch block");
    auto need = [&](const char *k) {
        auto v = a.u64(k);
        if (!v) throw Error(CMF_ERR_PARSE, std::string("arch block lacks ") + k);
        return *v;
    };
    ArchView v;
    v.arch_name = a.str("arch_name").value_or("");
    v.hidden = need("hidden_size");
    v.intermediate = need("intermediate_size");
    v.layers = need("num_layers");
    v.heads = need("num_attention_heads");
    v.kv_heads = need("num_kv_heads");
    v.head_dim = need("head_dim");
    v.vocab = need("vocab_size");
    v.tie = a.boolean("tie_word_embeddings").value_or(false);
    if (auto lt = a.get("layer_types")) {
        dom::array arr;
        if (!lt->get_array().get(arr))
            for (auto e : arr) {
                std::string_view s;
                if (!e.get_string().get(s)) v.layer_types.emplace_back(s);
            }
    }
    if (auto m = a.object("mtp")) v.mtp_layers = m->u64("num_layers").value_or(0);
    if (auto m = a.object("moe")) {
        v.num_experts = m->u64("num_experts").value_or(0);
        v.moe_intermediate = m->u64("moe_intermediate_size").value_or(0);
        v.shared_intermediate = m->u64("shared_expert_intermediate_size").value_or(0);
    }
    v.lin_conv_k = a.u64("linear_conv_kernel_dim").value_or(0);
    v.lin_nk = a.u64("linear_num_key_heads").value_or(0);
    v.lin_nv = a.u64("linear_num_value_heads").value_or(0);
    v.lin_dk = a.u64("linear_key_head_dim").value_or(0);
    v.lin_dv = a.u64("linear_value_head_dim").value_or(0);
    return v;
}

std::string plan_to_json(const std::vector<PlanEntry> &plan) {
    json::Writer w;
    w.begin_array();
    for (const auto &p : plan) {
        w.begin_object();
        w.key("name").string(p.name);
        w.key("shape").begin_array();
        for (uint64_t d : p.shape) w.u64(d);
        w.end_array();
        if (p.index) w.key("index").u64(*p.index);
        if (p.transpose) w.key("transpose").boolean(true);
        if (!p.rows.empty()) {
            w.key("rows").begin_array();
            for (auto [first, count] : p.rows) w.begin_array().u64(first).u64(count).end_array();
            w.end_array();
        }
        w.end_object();
    }
    w.end_array();
    return w.take();
}

std::string shape_str(const Shape &s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

void shape_error(const std::string &name, const Shape &got, const std::string &want) {
    throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" has shape " + shape_str(got) + " but the config implies " + want);
}

PlanEntry keep(const std::string &name, const Shape &shape) { return PlanEntry{name, shape, std::nullopt, false, {}}; }

std::string canonical_name(const ArchView &, const std::string &n) {
    auto strip = [&](const char *prefix, const char *repl) -> std::optional<std::string> {
        if (starts_with(n, prefix)) return std::string(repl) + n.substr(std::char_traits<char>::length(prefix));
        return std::nullopt;
    };
    // Vision towers and projectors of multimodal wrappers are not converted.
    for (const char *drop : {"model.visual.", "visual.", "vision_tower.", "model.vision_tower.", "multi_modal_projector.",
                             "model.multi_modal_projector.", "vision_model.", "model.vision_model."})
        if (starts_with(n, drop)) return "";
    if (n.size() >= 21 && n.compare(n.size() - 21, 21, ".rotary_emb.inv_freq") == 0) return "";  // computed, not learned
    if (contains(n, "rotary_emb.inv_freq")) return "";
    std::string x = n;
    if (auto r = strip("model.language_model.", "model.")) x = *r;
    else if (auto r2 = strip("language_model.model.", "model.")) x = *r2;
    else if (auto r3 = strip("language_model.lm_head.", "lm_head.")) x = *r3;
    // MTP spellings (Qwen3-Next / Qwen3.5) -> model.mtp.*, the original converter's names.
    if (starts_with(x, "mtp.")) {
        if (x == "mtp.fc.weight") return "model.mtp.eh_proj.weight";
        if (x == "mtp.pre_fc_norm_embedding.weight") return "model.mtp.enorm.weight";
        if (x == "mtp.pre_fc_norm_hidden.weight") return "model.mtp.hnorm.weight";
        return "model." + x;
    }
    return x;
}

namespace {

// "<prefix><digits>.<rest>" -> (number, rest). std::regex is avoided: it is
// slow, and GCC 12 warns inside it under the sanitizers (-Werror).
bool split_indexed(const std::string &s, const std::string &prefix, uint64_t &index, std::string &rest) {
    if (s.compare(0, prefix.size(), prefix) != 0) return false;
    size_t i = prefix.size(), j = i;
    while (j < s.size() && j - i < 9 && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i || j >= s.size() || s[j] != '.' || j + 1 == s.size()) return false;
    index = std::stoull(s.substr(i, j - i));
    rest = s.substr(j + 1);
    return true;
}

void want(const std::string &name, const Shape &s, const Shape &expect) {
    if (s != expect) shape_error(name, s, shape_str(expect));
}
void want_cols(const std::string &name, const Shape &s, uint64_t cols) {
    if (s.size() != 2 || s[1] != cols || s[0] == 0) shape_error(name, s, "[*, " + std::to_string(cols) + "]");
}
void want_rows(const std::string &name, const Shape &s, uint64_t rows) {
    if (s.size() != 2 || s[0] != rows || s[1] == 0) shape_error(name, s, "[" + std::to_string(rows) + ", *]");
}

// Per-layer tensors: shape checks of every role we know; unknown names pass.
std::vector<PlanEntry> plan_layer(const ArchView &a, const std::string &name, const std::string &role, uint64_t layer,
                                  bool mtp, const Shape &s) {
    const uint64_t H = a.hidden, hd = a.head_dim;
    if (!mtp && layer >= a.layers)
        throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" belongs to layer " + std::to_string(layer) + " but the config has " +
                                        std::to_string(a.layers) + " layers");
    if (mtp && layer >= std::max<uint64_t>(a.mtp_layers, 1))
        throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" belongs to MTP layer " + std::to_string(layer) + " but the config declares " +
                                        std::to_string(a.mtp_layers));
    uint64_t expert = 0;
    std::string expert_role;
    const bool is_expert = split_indexed(role, "mlp.experts.", expert, expert_role) &&
                           (expert_role == "gate_proj.weight" || expert_role == "up_proj.weight" || expert_role == "down_proj.weight");
    if (role == "input_layernorm.weight" || role == "post_attention_layernorm.weight" || role == "pre_feedforward_layernorm.weight" ||
        role == "post_feedforward_layernorm.weight")
        want(name, s, {H});
    else if (role == "self_attn.q_proj.weight") {
        want_cols(name, s, H);
        if (s[0] != a.heads * hd && s[0] != 2 * a.heads * hd)
            shape_error(name, s, "[" + std::to_string(a.heads * hd) + " (or " + std::to_string(2 * a.heads * hd) + " when gated), " + std::to_string(H) + "]");
    } else if (role == "self_attn.k_proj.weight" || role == "self_attn.v_proj.weight") want(name, s, {a.kv_heads * hd, H});
    else if (role == "self_attn.q_proj.bias") {
        if (s != Shape{a.heads * hd} && s != Shape{2 * a.heads * hd}) shape_error(name, s, "[" + std::to_string(a.heads * hd) + "]");
    } else if (role == "self_attn.k_proj.bias" || role == "self_attn.v_proj.bias") want(name, s, {a.kv_heads * hd});
    else if (role == "self_attn.o_proj.weight") want(name, s, {H, a.heads * hd});
    else if (role == "self_attn.o_proj.bias") want(name, s, {H});  // attention_bias: the runtime adds it
    else if (role == "self_attn.q_norm.weight" || role == "self_attn.k_norm.weight") want(name, s, {hd});
    else if (role == "mlp.gate_proj.weight" || role == "mlp.up_proj.weight") want_cols(name, s, H);
    else if (role == "mlp.down_proj.weight") want_rows(name, s, H);
    else if (role == "mlp.gate.weight") {
        if (!a.num_experts) throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" is an MoE router but the config declares no experts (num_experts)");
        want(name, s, {a.num_experts, H});
    } else if (is_expert) {
        const uint64_t e = expert;
        if (!a.num_experts || e >= a.num_experts)
            throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" is expert " + std::to_string(e) + " but the config declares " +
                                            std::to_string(a.num_experts) + " experts");
        if (expert_role == "down_proj.weight") want(name, s, {H, a.moe_intermediate});
        else want(name, s, {a.moe_intermediate, H});
    } else if (role == "mlp.experts.gate_up_proj" || role == "mlp.experts.gate_up_proj.weight") {
        // Fused bank [E, 2I, H] (or transposed [E, H, 2I]) -> per-expert gate/up.
        const uint64_t E = a.num_experts, I = a.moe_intermediate;
        if (!E) throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" is a fused expert bank but the config declares no experts");
        bool normal = s == Shape{E, 2 * I, H}, transposed = s == Shape{E, H, 2 * I};
        if (!normal && !transposed) shape_error(name, s, shape_str({E, 2 * I, H}) + " or " + shape_str({E, H, 2 * I}));
        std::string base = name.substr(0, name.find("mlp.experts.")) + "mlp.experts.";
        std::vector<PlanEntry> out;
        for (const char *proj : {"gate_proj", "up_proj"})
            for (uint64_t e = 0; e < E; ++e) {
                uint64_t first = std::string(proj) == "gate_proj" ? 0 : I;
                out.push_back(PlanEntry{base + std::to_string(e) + "." + proj + ".weight", {I, H}, e, !normal, {{first, I}}});
            }
        return out;
    } else if (role == "mlp.experts.down_proj" || role == "mlp.experts.down_proj.weight") {
        const uint64_t E = a.num_experts, I = a.moe_intermediate;
        if (!E) throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" is a fused expert bank but the config declares no experts");
        bool normal = s == Shape{E, H, I}, transposed = s == Shape{E, I, H};
        if (!normal && !transposed) shape_error(name, s, shape_str({E, H, I}) + " or " + shape_str({E, I, H}));
        std::string base = name.substr(0, name.find("mlp.experts.")) + "mlp.experts.";
        std::vector<PlanEntry> out;
        for (uint64_t e = 0; e < E; ++e) out.push_back(PlanEntry{base + std::to_string(e) + ".down_proj.weight", {H, I}, e, !normal, {}});
        return out;
    } else if (role == "mlp.shared_expert.gate_proj.weight" || role == "mlp.shared_expert.up_proj.weight") {
        want(name, s, {a.shared_intermediate ? a.shared_intermediate : s.empty() ? 0 : s[0], H});
    } else if (role == "mlp.shared_expert.down_proj.weight") {
        want(name, s, {H, a.shared_intermediate ? a.shared_intermediate : s.size() == 2 ? s[1] : 0});
    } else if (role == "mlp.shared_expert_gate.weight") want(name, s, {1, H});
    else if (role.rfind("linear_attn.", 0) == 0) {
        if (!a.lin_nk) throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" is a linear-attention (GDN) weight but the config declares no linear_* geometry");
        const uint64_t key_dim = a.lin_nk * a.lin_dk, value_dim = a.lin_nv * a.lin_dv, conv_dim = 2 * key_dim + value_dim;
        if (role == "linear_attn.in_proj_qkv.weight") want(name, s, {conv_dim, H});
        else if (role == "linear_attn.in_proj_z.weight") want(name, s, {value_dim, H});
        else if (role == "linear_attn.in_proj_a.weight" || role == "linear_attn.in_proj_b.weight") want(name, s, {a.lin_nv, H});
        else if (role == "linear_attn.conv1d.weight") want(name, s, {conv_dim, 1, a.lin_conv_k});
        else if (role == "linear_attn.A_log" || role == "linear_attn.dt_bias") want(name, s, {a.lin_nv});
        else if (role == "linear_attn.norm.weight") want(name, s, {a.lin_dv});
        else if (role == "linear_attn.out_proj.weight") want(name, s, {H, value_dim});
    }
    return {keep(name, s)};
}

}  // namespace

std::vector<PlanEntry> plan_tensor(const ArchView &a, const std::string &hf_name, const Shape &s) {
    const std::string name = canonical_name(a, hf_name);
    if (name.empty()) return {};
    const uint64_t H = a.hidden;
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
        if (s.size() != 2 || s[1] != H || s[0] == 0 || s[0] > a.vocab)
            shape_error(name, s, "[vocab_size " + std::to_string(a.vocab) + " (or fewer rows), hidden_size " + std::to_string(H) + "]");
        return {keep(name, s)};
    }
    if (name == "model.norm.weight" || name == "model.mtp.norm.weight" || name == "model.mtp.enorm.weight" ||
        name == "model.mtp.hnorm.weight") {
        want(name, s, {H});
        return {keep(name, s)};
    }
    if (name == "model.mtp.eh_proj.weight") {
        want(name, s, {H, 2 * H});
        return {keep(name, s)};
    }
    uint64_t layer = 0;
    std::string role;
    if (split_indexed(name, "model.layers.", layer, role)) return plan_layer(a, name, role, layer, false, s);
    if (split_indexed(name, "model.mtp.layers.", layer, role)) return plan_layer(a, name, role, layer, true, s);
    return {keep(name, s)};
}

cmf_error *import_config_hook(const cmf_host_api *host, const char *json, size_t len, const cmf_byte_sink *out,
                              std::string (*fn)(std::string_view)) {
    return sdk::call(host, [&] {
        if (!json || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "import_config: NULL argument");
        std::string arch = fn(std::string_view(json, len));
        sdk::sink_append(out, arch.data(), arch.size());
    });
}

cmf_error *import_tensor_hook(const cmf_host_api *host, const char *arch_json, size_t arch_len, const char *hf_name,
                              uint32_t ndim, const uint64_t *shape, const cmf_byte_sink *out,
                              std::vector<PlanEntry> (*fn)(const ArchView &, const std::string &, const Shape &)) {
    return sdk::call(host, [&] {
        if (!arch_json || !hf_name || !out || (ndim && !shape)) throw Error(CMF_ERR_INVALID_ARGUMENT, "import_tensor: NULL argument");
        ArchView a = parse_arch(std::string_view(arch_json, arch_len));
        std::string plan = plan_to_json(fn(a, hf_name, Shape(shape, shape + ndim)));
        sdk::sink_append(out, plan.data(), plan.size());
    });
}

}  // namespace cmf::archs
