// The qwen architecture plugin: qwen2 (q/k/v biases) and qwen3 (q/k-norm)
// dense decoders (ARCHS 1.4-1.9, 2.1-2.2). Computes only through the
// backend vtable it is given, so any backend can run it.
//
// Features are dispatched per layer by which tensors exist (spec 2), not by
// arch_name. The layer is described by a mixer kind and an FFN kind so the
// later additions slot in as new kinds: MoE FFN (router `mlp.gate.weight`),
// GDN mixer (layer_types LinearAttention), gated attention (q_proj with
// 2*heads*head_dim rows), and an MTP head (model.mtp.*); today those are
// refused with CMF_ERR_UNSUPPORTED naming the tensor or key.
#include "hf_import.hpp"
#include "config.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/options.hpp>
#include <cmf/plugin.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

using cmf::qwen::Config;
using cmf::qwen::LayerType;
using cmf::sdk::Error;
using cmf::sdk::HostError;

struct Plugin {
    const cmf_host_api *host;
    cmf_arch_vt vt;
};

// Throws a backend error out through sdk::call unchanged.
void check(cmf_error *e) {
    if (e != nullptr) throw HostError{e};
}

struct Weight {
    cmf_backend_weight *w = nullptr;
    uint64_t rows = 0, cols = 0;  // 1-D: rows 1, cols = length
    explicit operator bool() const { return w != nullptr; }
};

enum class MixerKind { Attention };
enum class FfnKind { Dense };

struct Layer {
    MixerKind mixer = MixerKind::Attention;
    FfnKind ffn = FfnKind::Dense;
    Weight in_norm, post_norm;
    Weight q, k, v, o;
    Weight q_bias, k_bias, v_bias;  // all or none (qwen2)
    Weight o_bias;                  // attention_bias (qwen3): o_proj's bias too
    Weight q_norm, k_norm;          // both or none (qwen3)
    Weight gate, up, down;
    uint64_t ffn_dim = 0;
};

struct Model {
    const cmf_host_api *host = nullptr;
    const cmf_backend_vt *be = nullptr;
    void *be_ctx = nullptr;
    Config cfg;
    uint32_t rot_dim = 0;
    uint64_t q_dim = 0, kv_dim = 0, max_ffn = 0;
    // The KV cache's element type (model option kv_cache): CMF_DTYPE_F32, or
    // CMF_DTYPE_F16 through the backend's kv_write / attention_kv.
    int32_t kv_dtype = CMF_DTYPE_F32;
    uint64_t kv_row_bytes() const { return kv_dim * (kv_dtype == CMF_DTYPE_F16 ? 2 : 4); }
    // The backend has matmul_multi: q/k/v and gate/up go as one call each.
    bool fused_matmuls = false;
    // RoPE scaling (cfg.rope_scaling not default): every rotation goes
    // through the backend's rope_freqs with HF's table.
    bool scaled_rope = false;
    Weight embed, final_norm, head;
    std::vector<Layer> layers;
    std::vector<cmf_backend_weight *> owned;

    ~Model() {
        for (auto *w : owned) be->weight_free(be_ctx, w);
    }
};

// Reusable device scratch, grown to the largest batch seen.
struct Scratch {
    const cmf_backend_vt *be = nullptr;
    void *be_ctx = nullptr;
    uint64_t capacity = 0;  // tokens
    float *h = nullptr, *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr, *gate = nullptr,
          *up = nullptr, *tmp = nullptr, *logits = nullptr;
    uint64_t logits_rows = 0;

    void release() {
        for (float **p : {&h, &xn, &q, &k, &v, &attn, &gate, &up, &tmp, &logits}) {
            be->buffer_free(be_ctx, *p);
            *p = nullptr;
        }
        capacity = logits_rows = 0;
    }
};

struct State {
    Model *model = nullptr;
    uint64_t n_ctx = 0;
    uint64_t n_past = 0;
    std::vector<float *> k_cache, v_cache;  // per layer: [n_ctx][kv_dim] of model->kv_dtype
    Scratch scratch;
    // The scaled RoPE table HF's rotary embedding holds, kept per state as
    // a freshly loaded HF model keeps it (dynamic NTK changes it as the
    // sequence grows); unset for unscaled RoPE.
    std::optional<cmf::archs::rope::Dynamic> rope;

    ~State() {
        scratch.release();
        for (float *p : k_cache) model->be->buffer_free(model->be_ctx, p);
        for (float *p : v_cache) model->be->buffer_free(model->be_ctx, p);
    }
};

Plugin *as_plugin(void *ctx) { return static_cast<Plugin *>(ctx); }

// ---- model creation -----------------------------------------------------------

class Binder {
public:
    Binder(const cmf_model_source *src, Model &m) : src_(src), m_(m) {
        for (uint64_t i = 0; i < src->tensor_count; ++i) {
            const char *name = nullptr;
            cmf_tensor_view v{};
            v.struct_size = sizeof v;
            check(src->tensor_at(src->user, i, &name, &v));
            if (name == nullptr) throw Error(CMF_ERR_INTERNAL, "model source returned a tensor without a name");
            index_.emplace(name, v);
        }
    }

    bool present(const std::string &name) const { return index_.count(name) != 0; }

    // Binds a tensor and checks its shape ({rows, cols} for 2-D, {len} for 1-D).
    Weight bind(const std::string &name, std::initializer_list<uint64_t> shape) {
        auto it = index_.find(name);
        if (it == index_.end()) throw Error(CMF_ERR_MISSING_TENSOR, "missing tensor " + name);
        const cmf_tensor_view &v = it->second;
        bool ok = v.ndim == shape.size();
        uint32_t d = 0;
        for (uint64_t s : shape) {
            ok = ok && (s == 0 || v.shape[d] == s);  // 0 = any
            ++d;
        }
        if (!ok) {
            std::string got;
            for (uint32_t i = 0; i < v.ndim; ++i) got += (i ? "," : "") + std::to_string(v.shape[i]);
            std::string want;
            for (uint64_t s : shape) want += (want.empty() ? "" : ",") + (s ? std::to_string(s) : std::string("*"));
            throw Error(CMF_ERR_BOUNDS, "tensor " + name + " has shape [" + got + "], expected [" + want + "]");
        }
        Weight w;
        check(m_.be->weight_bind(m_.be_ctx, &v, &w.w));
        m_.owned.push_back(w.w);
        w.rows = v.ndim == 2 ? v.shape[0] : 1;
        w.cols = v.ndim == 2 ? v.shape[1] : v.shape[0];
        return w;
    }

    Weight bind_if(const std::string &name, std::initializer_list<uint64_t> shape) {
        return present(name) ? bind(name, shape) : Weight{};
    }

private:
    const cmf_model_source *src_;
    Model &m_;
    std::unordered_map<std::string, cmf_tensor_view> index_;
};

void require_backend(const cmf_backend_vt *be) {
    if (be == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen: NULL backend");
    if (be->struct_size < offsetof(cmf_backend_vt, embed) + sizeof(void *))
        throw Error(CMF_ERR_UNSUPPORTED, std::string("qwen: backend '") + (be->name ? be->name : "?") +
                                             "' predates the transformer operations");
    const void *ops[] = {reinterpret_cast<const void *>(be->weight_bind), reinterpret_cast<const void *>(be->matmul),
                         reinterpret_cast<const void *>(be->buffer_alloc), reinterpret_cast<const void *>(be->buffer_read),
                         reinterpret_cast<const void *>(be->copy), reinterpret_cast<const void *>(be->rms_norm),
                         reinterpret_cast<const void *>(be->rope), reinterpret_cast<const void *>(be->attention),
                         reinterpret_cast<const void *>(be->gated_act), reinterpret_cast<const void *>(be->add),
                         reinterpret_cast<const void *>(be->add_bias), reinterpret_cast<const void *>(be->embed)};
    for (const void *op : ops)
        if (op == nullptr)
            throw Error(CMF_ERR_UNSUPPORTED, std::string("qwen: backend '") + (be->name ? be->name : "?") +
                                                 "' lacks an operation the qwen arch needs");
}

// Model options ("key=value,..."): kv_cache=f32|f16. Unknown keys, values
// and a backend without the f16 cache operations are errors, never ignored.
void apply_options(Model &m, const char *options) {
    for (const cmf::sdk::OptionItem &item : cmf::sdk::split_options(options)) {
        const std::string &key = item.key, &value = item.value;
        if (key != "kv_cache")
            throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen: unknown model option \"" + key + "\" (known: kv_cache=f32|f16)");
        if (value == "f32") {
            m.kv_dtype = CMF_DTYPE_F32;
        } else if (value == "f16") {
            const cmf_backend_vt *be = m.be;
            if (be->struct_size < offsetof(cmf_backend_vt, attention_kv) + sizeof(void *) || be->kv_write == nullptr ||
                be->attention_kv == nullptr)
                throw Error(CMF_ERR_UNSUPPORTED, std::string("qwen: backend '") + (be->name ? be->name : "?") +
                                                     "' has no f16 KV cache (kv_write, attention_kv)");
            m.kv_dtype = CMF_DTYPE_F16;
        } else {
            throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen: kv_cache must be f32 or f16, not \"" + value + "\"");
        }
    }
}

void build_layer(Model &m, Binder &b, uint64_t i) {
    const Config &c = m.cfg;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const uint64_t H = c.hidden_size, hd = c.head_dim;
    Layer L;
    switch (c.layer_types[i]) {
    case LayerType::FullAttention: break;
    case LayerType::LinearAttention:
        throw Error(CMF_ERR_UNSUPPORTED, "qwen: layer " + std::to_string(i) +
                                             " is LinearAttention (gated delta net): not implemented yet");
    default:
        throw Error(CMF_ERR_UNSUPPORTED, "qwen: layer " + std::to_string(i) + " has layer type " +
                                             c.layer_type_names[i] + ", which the qwen arch does not run");
    }
    L.in_norm = b.bind(p + "input_layernorm.weight", {H});
    L.post_norm = b.bind(p + "post_attention_layernorm.weight", {H});
    if (b.present(p + "self_attn.q_proj.weight")) {
        // Output-gated attention (Qwen3-Next/3.5) doubles q_proj's rows.
        // Checked before the exact-shape bind so the error says what it is.
        if (b.present(p + "linear_attn.out_proj.weight"))
            throw Error(CMF_ERR_UNSUPPORTED, "qwen: layer " + std::to_string(i) + " has GDN tensors");
    }
    L.q = b.bind(p + "self_attn.q_proj.weight", {0, H});
    if (L.q.rows == 2 * m.q_dim)
        throw Error(CMF_ERR_UNSUPPORTED, "qwen: layer " + std::to_string(i) +
                                             " has output-gated attention (q_proj rows = 2*heads*head_dim): not implemented yet");
    if (L.q.rows != m.q_dim)
        throw Error(CMF_ERR_BOUNDS, p + "self_attn.q_proj.weight has " + std::to_string(L.q.rows) +
                                        " rows, expected num_attention_heads*head_dim = " + std::to_string(m.q_dim));
    L.k = b.bind(p + "self_attn.k_proj.weight", {m.kv_dim, H});
    L.v = b.bind(p + "self_attn.v_proj.weight", {m.kv_dim, H});
    L.o = b.bind(p + "self_attn.o_proj.weight", {H, m.q_dim});
    int biases = b.present(p + "self_attn.q_proj.bias") + b.present(p + "self_attn.k_proj.bias") +
                 b.present(p + "self_attn.v_proj.bias");
    if (biases == 3) {
        L.q_bias = b.bind(p + "self_attn.q_proj.bias", {m.q_dim});
        L.k_bias = b.bind(p + "self_attn.k_proj.bias", {m.kv_dim});
        L.v_bias = b.bind(p + "self_attn.v_proj.bias", {m.kv_dim});
    } else if (biases != 0) {
        throw Error(CMF_ERR_MISSING_TENSOR, p + "self_attn: q/k/v biases must be all present or all absent");
    }
    L.o_bias = b.bind_if(p + "self_attn.o_proj.bias", {H});
    int norms = b.present(p + "self_attn.q_norm.weight") + b.present(p + "self_attn.k_norm.weight");
    if (norms == 2) {
        L.q_norm = b.bind(p + "self_attn.q_norm.weight", {hd});
        L.k_norm = b.bind(p + "self_attn.k_norm.weight", {hd});
    } else if (norms != 0) {
        throw Error(CMF_ERR_MISSING_TENSOR, p + "self_attn: q_norm and k_norm must be both present or both absent");
    }
    if (b.present(p + "mlp.gate.weight"))
        throw Error(CMF_ERR_UNSUPPORTED, "qwen: layer " + std::to_string(i) +
                                             " is a mixture-of-experts layer (mlp.gate.weight): not implemented yet");
    L.gate = b.bind(p + "mlp.gate_proj.weight", {0, H});
    L.ffn_dim = L.gate.rows;  // the true FFN width (spec 11), not the nominal intermediate_size
    L.up = b.bind(p + "mlp.up_proj.weight", {L.ffn_dim, H});
    L.down = b.bind(p + "mlp.down_proj.weight", {H, L.ffn_dim});
    m.max_ffn = std::max(m.max_ffn, L.ffn_dim);
    m.layers.push_back(L);
}

cmf_error *model_create(void *ctx, const cmf_model_source *src, const cmf_backend_vt *backend, void *backend_ctx,
                        const cmf_arch_model_params *params, cmf_arch_model **out) {
    Plugin *pl = as_plugin(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (src == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen: NULL argument");
        require_backend(backend);
        auto m = std::make_unique<Model>();
        m->host = pl->host;
        m->be = backend;
        m->be_ctx = backend_ctx;
        apply_options(*m, params != nullptr ? params->options : nullptr);
        m->fused_matmuls = backend->struct_size >= offsetof(cmf_backend_vt, matmul_multi) + sizeof(void *) &&
                           backend->matmul_multi != nullptr;
        m->cfg = cmf::qwen::parse_config(src->arch_json, src->arch_json_len);
        const Config &c = m->cfg;
        m->q_dim = c.num_attention_heads * c.head_dim;
        m->kv_dim = c.num_kv_heads * c.head_dim;
        m->rot_dim = c.rot_dim;
        m->scaled_rope = c.rope_scaling.scaled() && m->rot_dim > 0;
        if (m->scaled_rope && (backend->struct_size < offsetof(cmf_backend_vt, rope_freqs) + sizeof(void *) ||
                               backend->rope_freqs == nullptr))
            throw Error(CMF_ERR_UNSUPPORTED, std::string("qwen: arch.rope_scaling is ") + cmf::archs::rope::type_name(c.rope_scaling.type) +
                                                 " but backend '" + (backend->name ? backend->name : "?") +
                                                 "' has no rope_freqs (RoPE over a given frequency table)");
        Binder b(src, *m);
        if (b.present("model.mtp.eh_proj.weight") || b.present("model.mtp.layers.0.self_attn.q_proj.weight"))
            pl->host->log(pl->host->host_ctx, CMF_LOG_INFO, "qwen: model.mtp.* present; MTP drafting is not used yet");
        const uint64_t H = c.hidden_size;
        m->embed = b.bind("model.embed_tokens.weight", {0, H});
        for (uint64_t i = 0; i < c.num_layers; ++i) build_layer(*m, b, i);
        m->final_norm = b.bind("model.norm.weight", {H});
        if (b.present("lm_head.weight"))
            m->head = b.bind("lm_head.weight", {0, H});
        else if (c.tie_word_embeddings)
            m->head = m->embed;
        else
            throw Error(CMF_ERR_MISSING_TENSOR, "missing tensor lm_head.weight (and arch.tie_word_embeddings is false)");
        if (m->head.rows > c.vocab_size)
            throw Error(CMF_ERR_BOUNDS, "the output head has " + std::to_string(m->head.rows) +
                                            " rows, more than arch.vocab_size " + std::to_string(c.vocab_size));
        *out = reinterpret_cast<cmf_arch_model *>(m.release());
    });
}

void model_free(void *, cmf_arch_model *model) { delete reinterpret_cast<Model *>(model); }

cmf_error *model_info(void *ctx, const cmf_arch_model *model, cmf_arch_model_info *out) {
    Plugin *pl = as_plugin(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen: NULL argument");
        const Model *m = reinterpret_cast<const Model *>(model);
        cmf_arch_model_info info{};
        info.struct_size = sizeof info;
        info.vocab_size = m->cfg.vocab_size;
        info.max_context = m->cfg.max_position_embeddings;
        size_t n = std::min<size_t>(out->struct_size ? out->struct_size : sizeof info, sizeof info);
        uint32_t caller_size = out->struct_size;
        std::memcpy(out, &info, n);
        out->struct_size = caller_size ? caller_size : uint32_t(sizeof info);
    });
}

// ---- state --------------------------------------------------------------------

cmf_error *state_create(void *ctx, cmf_arch_model *model, uint64_t n_ctx, cmf_arch_state **out) {
    Plugin *pl = as_plugin(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen: NULL argument");
        Model *m = reinterpret_cast<Model *>(model);
        if (n_ctx == 0) n_ctx = m->cfg.max_position_embeddings;
        if (n_ctx == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen: n_ctx is 0 and the header gives no maximum");
        auto s = std::make_unique<State>();
        s->model = m;
        s->n_ctx = n_ctx;
        s->scratch.be = m->be;
        s->scratch.be_ctx = m->be_ctx;
        if (m->scaled_rope) s->rope.emplace(m->cfg.rope_scaling, m->cfg.rope_theta, m->rot_dim);
        // The KV cache holds K after RoPE and V, per layer, in m->kv_dtype.
        for (size_t i = 0; i < m->layers.size(); ++i) {
            float *k = nullptr, *v = nullptr;
            check(m->be->buffer_alloc(m->be_ctx, n_ctx * m->kv_row_bytes(), &k));
            s->k_cache.push_back(k);
            check(m->be->buffer_alloc(m->be_ctx, n_ctx * m->kv_row_bytes(), &v));
            s->v_cache.push_back(v);
        }
        *out = reinterpret_cast<cmf_arch_state *>(s.release());
    });
}

void state_free(void *, cmf_arch_state *state) { delete reinterpret_cast<State *>(state); }

cmf_error *state_truncate(void *ctx, cmf_arch_state *state, uint64_t n_keep) {
    Plugin *pl = as_plugin(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (state == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen: NULL state");
        State *s = reinterpret_cast<State *>(state);
        if (n_keep > s->n_past)
            throw Error(CMF_ERR_BOUNDS, "qwen: cannot keep " + std::to_string(n_keep) + " positions of " +
                                            std::to_string(s->n_past));
        // Attention reads only rows < n_past, so dropping is just the count.
        s->n_past = n_keep;
    });
}

// ---- forward ------------------------------------------------------------------

void ensure_scratch(const Model &m, Scratch &sc, uint64_t n, uint64_t logit_rows) {
    auto alloc = [&](float *&p, uint64_t floats) {
        sc.be->buffer_free(sc.be_ctx, p);
        p = nullptr;
        check(sc.be->buffer_alloc(sc.be_ctx, floats * sizeof(float), &p));
    };
    if (n > sc.capacity) {
        const uint64_t H = m.cfg.hidden_size;
        alloc(sc.h, n * H);
        alloc(sc.xn, n * H);
        alloc(sc.tmp, n * H);
        alloc(sc.q, n * m.q_dim);
        alloc(sc.attn, n * m.q_dim);
        alloc(sc.k, n * m.kv_dim);
        alloc(sc.v, n * m.kv_dim);
        alloc(sc.gate, n * m.max_ffn);
        alloc(sc.up, n * m.max_ffn);
        sc.capacity = n;
    }
    if (logit_rows > sc.logits_rows) {
        alloc(sc.logits, logit_rows * m.head.rows);
        sc.logits_rows = logit_rows;
    }
}

// y_i = x · W_i^T for weights that read the same x: one backend call when
// the backend fuses them (one parallel loop instead of one per weight).
void matmuls(const Model &m, const float *x, uint64_t n, std::initializer_list<std::pair<const cmf_backend_weight *, float *>> outs) {
    if (m.fused_matmuls && outs.size() <= 4) {
        const cmf_backend_weight *ws[4];
        float *ys[4];
        uint32_t k = 0;
        for (const auto &[w, y] : outs) ws[k] = w, ys[k++] = y;
        check(m.be->matmul_multi(m.be_ctx, ws, k, x, n, ys));
        return;
    }
    for (const auto &[w, y] : outs) check(m.be->matmul(m.be_ctx, w, x, n, y));
}

void attention_block(const Model &m, State &s, const Layer &L, size_t li, uint64_t n, uint64_t pos) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    Scratch &sc = s.scratch;
    const Config &c = m.cfg;
    const uint32_t nh = uint32_t(c.num_attention_heads), nkv = uint32_t(c.num_kv_heads), hd = uint32_t(c.head_dim);
    const int32_t style = c.gemma_norm ? CMF_NORM_GEMMA : CMF_NORM_QWEN;
    const float eps = float(c.rms_norm_eps);
    matmuls(m, sc.xn, n, {{L.q.w, sc.q}, {L.k.w, sc.k}, {L.v.w, sc.v}});
    if (L.q_bias) {
        check(be->add_bias(bc, sc.q, L.q_bias.w, n, m.q_dim));
        check(be->add_bias(bc, sc.k, L.k_bias.w, n, m.kv_dim));
        check(be->add_bias(bc, sc.v, L.v_bias.w, n, m.kv_dim));
    }
    if (L.q_norm) {
        check(be->rms_norm(bc, sc.q, L.q_norm.w, n * nh, hd, eps, style, sc.q));
        check(be->rms_norm(bc, sc.k, L.k_norm.w, n * nkv, hd, eps, style, sc.k));
    }
    if (m.rot_dim > 0) {
        for (auto [x, ld, heads] : {std::tuple{sc.q, m.q_dim, nh}, std::tuple{sc.k, m.kv_dim, nkv}}) {
            if (s.rope) {  // scaled: HF's table for this call (forward updated it)
                const cmf::archs::rope::Freqs &f = s.rope->current();
                check(be->rope_freqs(bc, x, n, ld, heads, hd, m.rot_dim, pos, f.inv_freq.data(), f.attention_factor));
            } else {
                check(be->rope(bc, x, n, ld, heads, hd, m.rot_dim, pos, float(c.rope_theta)));
            }
        }
    }
    const float scale = 1.0f / std::sqrt(float(hd));
    if (m.kv_dtype == CMF_DTYPE_F32) {  // any backend: plain copies and attention
        check(be->copy(bc, s.k_cache[li] + pos * m.kv_dim, sc.k, n * m.kv_dim));
        check(be->copy(bc, s.v_cache[li] + pos * m.kv_dim, sc.v, n * m.kv_dim));
        check(be->attention(bc, sc.q, s.k_cache[li], s.v_cache[li], sc.attn, n, pos, nh, nkv, hd, scale, 0, 0.0f));
    } else {
        check(be->kv_write(bc, s.k_cache[li], m.kv_dtype, m.kv_dim, pos, sc.k, n));
        check(be->kv_write(bc, s.v_cache[li], m.kv_dtype, m.kv_dim, pos, sc.v, n));
        check(be->attention_kv(bc, sc.q, s.k_cache[li], s.v_cache[li], m.kv_dtype, sc.attn, n, pos, nh, nkv, hd, scale,
                               0, 0.0f));
    }
    check(be->matmul(bc, L.o.w, sc.attn, n, sc.tmp));
    if (L.o_bias) check(be->add_bias(bc, sc.tmp, L.o_bias.w, n, c.hidden_size));
}

void dense_ffn(const Model &m, Scratch &sc, const Layer &L, uint64_t n) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    matmuls(m, sc.xn, n, {{L.gate.w, sc.gate}, {L.up.w, sc.up}});
    check(be->gated_act(bc, sc.gate, sc.up, n * L.ffn_dim, m.cfg.gelu_tanh ? CMF_ACT_GELU_TANH : CMF_ACT_SILU, sc.gate));
    check(be->matmul(bc, L.down.w, sc.gate, n, sc.tmp));
}

cmf_error *forward(void *ctx, cmf_arch_model *model, cmf_arch_state *state, const cmf_forward_args *args) {
    Plugin *pl = as_plugin(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || state == nullptr || args == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen forward: NULL argument");
        Model &m = *reinterpret_cast<Model *>(model);
        State &s = *reinterpret_cast<State *>(state);
        const uint64_t n = args->n_tokens, pos = args->pos;
        if (n == 0) return;
        if (args->tokens == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen forward: NULL tokens");
        if (pos != s.n_past)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen forward: pos " + std::to_string(pos) + " but the state holds " +
                                                      std::to_string(s.n_past) + " positions");
        if (pos + n > s.n_ctx)
            throw Error(CMF_ERR_BOUNDS, "qwen forward: " + std::to_string(pos + n) + " positions exceed the context of " +
                                            std::to_string(s.n_ctx));
        int32_t mode = args->logits_mode;
        if (mode != CMF_LOGITS_NONE && mode != CMF_LOGITS_LAST && mode != CMF_LOGITS_ALL)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen forward: unknown logits_mode " + std::to_string(mode));
        if (mode != CMF_LOGITS_NONE && args->logits == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "qwen forward: NULL logits");
        const uint64_t logit_rows = mode == CMF_LOGITS_ALL ? n : mode == CMF_LOGITS_LAST ? 1 : 0;
        ensure_scratch(m, s.scratch, n, logit_rows);
        Scratch &sc = s.scratch;
        const cmf_backend_vt *be = m.be;
        void *bc = m.be_ctx;
        const Config &c = m.cfg;
        const uint64_t H = c.hidden_size;
        const int32_t style = c.gemma_norm ? CMF_NORM_GEMMA : CMF_NORM_QWEN;
        const float eps = float(c.rms_norm_eps);

        // Dynamic NTK: the table this call rotates with is the one for
        // seq_len = pos + n (HF's dynamic_rope_update, once per forward).
        if (s.rope) s.rope->update(pos + n);
        check(be->embed(bc, m.embed.w, args->tokens, n, float(c.embed_multiplier), sc.h));
        for (size_t li = 0; li < m.layers.size(); ++li) {
            const Layer &L = m.layers[li];
            check(be->rms_norm(bc, sc.h, L.in_norm.w, n, H, eps, style, sc.xn));
            switch (L.mixer) {
            case MixerKind::Attention: attention_block(m, s, L, li, n, pos); break;
            }
            check(be->add(bc, sc.h, sc.tmp, n * H));
            check(be->rms_norm(bc, sc.h, L.post_norm.w, n, H, eps, style, sc.xn));
            switch (L.ffn) {
            case FfnKind::Dense: dense_ffn(m, sc, L, n); break;
            }
            check(be->add(bc, sc.h, sc.tmp, n * H));
        }
        s.n_past = pos + n;
        if (logit_rows == 0) return;
        // Only the rows whose logits are wanted go through the final norm and head.
        const float *hrows = sc.h + (n - logit_rows) * H;
        check(be->rms_norm(bc, hrows, m.final_norm.w, logit_rows, H, eps, style, sc.xn));
        check(be->matmul(bc, m.head.w, sc.xn, logit_rows, sc.logits));
        // Logits have vocab_size entries even when the head has fewer rows (extra = 0).
        const uint64_t V = c.vocab_size, R = m.head.rows;
        for (uint64_t r = 0; r < logit_rows; ++r) {
            float *dst = args->logits + r * V;
            check(be->buffer_read(bc, dst, sc.logits + r * R, R * sizeof(float)));
            std::fill(dst + R, dst + V, 0.0f);
        }
    });
}

}  // namespace

namespace {

// Converter hooks: the HF config -> arch block mapping and tensor plans
// (hf_import.cpp, shared machinery in ../common).
cmf_error *vt_import_config(void *ctx, const char *json, size_t len, const cmf_byte_sink *out) {
    return cmf::archs::import_config_hook(static_cast<Plugin *>(ctx)->host, json, len, out,
                                          cmf::archs::qwen::import_config);
}

cmf_error *vt_import_tensor(void *ctx, const char *arch_json, size_t arch_len, const char *hf_name, uint32_t ndim,
                            const uint64_t *shape, const cmf_byte_sink *out) {
    return cmf::archs::import_tensor_hook(static_cast<Plugin *>(ctx)->host, arch_json, arch_len, hf_name, ndim, shape,
                                          out, cmf::archs::qwen::import_tensor);
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "qwen arch needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto pl = std::make_unique<Plugin>();
    pl->host = host;
    cmf_arch_vt &vt = pl->vt;
    vt = cmf_arch_vt{};
    vt.struct_size = sizeof vt;
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "qwen";
    vt.version = CMF_QWEN_VERSION;
    vt.arch_names = "qwen2,qwen3";
    // Runs the dense families; converts every Qwen family (MoE and hybrid
    // files convert now and run once their forward passes land).
    vt.hf_model_types = cmf::archs::qwen::kModelTypes;
    vt.import_config = vt_import_config;
    vt.import_tensor = vt_import_tensor;
    vt.model_create = model_create;
    vt.model_free = model_free;
    vt.model_info = model_info;
    vt.state_create = state_create;
    vt.state_free = state_free;
    vt.state_truncate = state_truncate;
    vt.forward = forward;
    if (cmf_error *e = host->register_arch(reg, &pl->vt, pl.get())) return e;
    *plugin_state = pl.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) { delete static_cast<Plugin *>(plugin_state); }
