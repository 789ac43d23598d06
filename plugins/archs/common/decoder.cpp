#include "decoder.hpp"

#include <cmf/options.hpp>
#include <cmf/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>

namespace cmf::archs {

namespace {

using cmf::sdk::Error;

void require_backend(const cmf_backend_vt *be, const char *fam) {
    if (be == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(fam) + ": NULL backend");
    if (be->struct_size < offsetof(cmf_backend_vt, embed) + sizeof(void *))
        throw Error(CMF_ERR_UNSUPPORTED, std::string(fam) + ": backend '" + (be->name ? be->name : "?") +
                                             "' predates the transformer operations");
    const void *ops[] = {reinterpret_cast<const void *>(be->weight_bind), reinterpret_cast<const void *>(be->matmul),
                         reinterpret_cast<const void *>(be->buffer_alloc), reinterpret_cast<const void *>(be->buffer_read),
                         reinterpret_cast<const void *>(be->copy), reinterpret_cast<const void *>(be->rms_norm),
                         reinterpret_cast<const void *>(be->rope), reinterpret_cast<const void *>(be->attention),
                         reinterpret_cast<const void *>(be->gated_act), reinterpret_cast<const void *>(be->add),
                         reinterpret_cast<const void *>(be->add_bias), reinterpret_cast<const void *>(be->embed)};
    for (const void *op : ops)
        if (op == nullptr)
            throw Error(CMF_ERR_UNSUPPORTED, std::string(fam) + ": backend '" + (be->name ? be->name : "?") +
                                                 "' lacks an operation the " + fam + " arch needs");
}

bool has_kv_ops(const cmf_backend_vt *be) {
    return backend_has(be, offsetof(cmf_backend_vt, kv_write), be->kv_write) &&
           backend_has(be, offsetof(cmf_backend_vt, attention_kv), be->attention_kv);
}

bool has_ring_attention(const cmf_backend_vt *be) {
    return backend_has(be, offsetof(cmf_backend_vt, kv_write), be->kv_write) &&
           backend_has(be, offsetof(cmf_backend_vt, attention_ring), be->attention_ring);
}

// Model options ("key=value,..."): kv_cache=f32|f16, the KV cache's dtype.
// Unknown keys, values and a backend without the f16 cache operations are
// errors, never ignored.
int32_t kv_dtype_option(const cmf_backend_vt *be, const std::string &fam, const char *options) {
    int32_t dtype = CMF_DTYPE_F32;
    for (const cmf::sdk::OptionItem &item : cmf::sdk::split_options(options)) {
        const std::string &key = item.key, &value = item.value;
        if (key != "kv_cache")
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": unknown model option \"" + key + "\" (known: kv_cache=f32|f16)");
        if (value == "f32") {
            dtype = CMF_DTYPE_F32;
        } else if (value == "f16") {
            if (!has_kv_ops(be))
                throw Error(CMF_ERR_UNSUPPORTED, fam + ": backend '" + (be->name ? be->name : "?") +
                                                     "' has no f16 KV cache (kv_write, attention_kv)");
            dtype = CMF_DTYPE_F16;
        } else {
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": kv_cache must be f32 or f16, not \"" + value + "\"");
        }
    }
    return dtype;
}

void build_layer(DecoderModel &m, Binder &b, const DecoderNames &names, uint64_t i) {
    const ArchConfig &c = m.cfg;
    const std::string fam = m.ch.family;
    const std::string p = names.body + "layers." + std::to_string(i) + ".";
    const std::string where = b.prefix() + p;
    const uint64_t H = c.hidden_size, hd = c.head_dim;
    Layer L;
    L.choice = m.ch.layers[i];
    switch (c.layer_types[i]) {
    case LayerType::FullAttention:
    case LayerType::SlidingAttention: break;
    case LayerType::LinearAttention:
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) +
                                             " is LinearAttention (gated delta net): not implemented yet");
    default:
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) + " has layer type " +
                                             c.layer_type_names[i] + ", which the " + fam + " arch does not run");
    }
    L.in_norm = b.bind(p + "input_layernorm.weight", {H});
    // Sandwich norms (gemma2/3): post_attention_layernorm is applied to the
    // attention's output, pre_feedforward_layernorm before the FFN.
    const bool sandwich = b.present(p + "pre_feedforward_layernorm.weight");
    if (sandwich) {
        L.post_attn_norm = b.bind(p + "post_attention_layernorm.weight", {H});
        L.pre_ffn_norm = b.bind(p + "pre_feedforward_layernorm.weight", {H});
        if (!b.present(p + "post_feedforward_layernorm.weight"))
            throw Error(CMF_ERR_MISSING_TENSOR, where + "pre_feedforward_layernorm.weight is present but "
                                                        "post_feedforward_layernorm.weight is not (sandwich norms come in pairs)");
        L.post_ffn_norm = b.bind(p + "post_feedforward_layernorm.weight", {H});
    } else {
        L.pre_ffn_norm = b.bind(p + "post_attention_layernorm.weight", {H});
        if (b.present(p + "post_feedforward_layernorm.weight"))
            throw Error(CMF_ERR_MISSING_TENSOR, where + "post_feedforward_layernorm.weight is present but "
                                                        "pre_feedforward_layernorm.weight is not (sandwich norms come in pairs)");
    }
    if (b.present(p + "linear_attn.out_proj.weight"))
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) + " has GDN tensors");
    L.q = b.bind(p + "self_attn.q_proj.weight", {0, H});
    if (L.q.rows == 2 * m.q_dim)
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) +
                                             " has output-gated attention (q_proj rows = 2*heads*head_dim): not implemented yet");
    if (L.q.rows != m.q_dim)
        throw Error(CMF_ERR_BOUNDS, where + "self_attn.q_proj.weight has " + std::to_string(L.q.rows) +
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
        throw Error(CMF_ERR_MISSING_TENSOR, where + "self_attn: q/k/v biases must be all present or all absent");
    }
    if (b.present(p + "self_attn.o_proj.bias")) L.o_bias = b.bind(p + "self_attn.o_proj.bias", {H});
    int norms = b.present(p + "self_attn.q_norm.weight") + b.present(p + "self_attn.k_norm.weight");
    if (norms == 2) {
        L.q_norm = b.bind(p + "self_attn.q_norm.weight", {hd});
        L.k_norm = b.bind(p + "self_attn.k_norm.weight", {hd});
    } else if (norms != 0) {
        throw Error(CMF_ERR_MISSING_TENSOR, where + "self_attn: q_norm and k_norm must be both present or both absent");
    }
    if (b.present(p + "mlp.gate.weight"))
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) +
                                             " is a mixture-of-experts layer (mlp.gate.weight): not implemented yet");
    L.gate = b.bind(p + "mlp.gate_proj.weight", {0, H});
    L.ffn_dim = L.gate.rows;  // the true FFN width (spec 11), not the nominal intermediate_size
    L.up = b.bind(p + "mlp.up_proj.weight", {L.ffn_dim, H});
    L.down = b.bind(p + "mlp.down_proj.weight", {H, L.ffn_dim});
    m.max_ffn = std::max(m.max_ffn, L.ffn_dim);
    m.layers.push_back(L);
}

}  // namespace

DecoderModel::~DecoderModel() {
    for (auto *w : owned) be->weight_free(be_ctx, w);
}

void Scratch::release() {
    for (float **p : {&h, &xn, &q, &k, &v, &attn, &gate, &up, &tmp, &logits}) {
        be->buffer_free(be_ctx, *p);
        *p = nullptr;
    }
    capacity = logits_rows = 0;
}

DecoderState::~DecoderState() {
    scratch.release();
    for (float *p : k_cache) model->be->buffer_free(model->be_ctx, p);
    for (float *p : v_cache) model->be->buffer_free(model->be_ctx, p);
}

std::unique_ptr<DecoderModel> create_decoder(const cmf_host_api *host, const cmf_model_source *src,
                                             const cmf_backend_vt *be, void *be_ctx, const char *options,
                                             const ArchConfig &cfg, DecoderChoices choices, const DecoderNames &names) {
    const std::string fam = choices.family;
    if (src == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL model source");
    require_backend(be, choices.family);
    if (choices.layers.size() != cfg.num_layers)
        throw Error(CMF_ERR_INTERNAL, fam + ": layer choices for " + std::to_string(choices.layers.size()) + " of " +
                                          std::to_string(cfg.num_layers) + " layers");
    auto m = std::make_unique<DecoderModel>();
    m->host = host;
    m->be = be;
    m->be_ctx = be_ctx;
    m->cfg = cfg;
    m->ch = std::move(choices);
    m->kv_dtype = kv_dtype_option(be, fam, options);
    m->fused_matmuls = backend_has(be, offsetof(cmf_backend_vt, matmul_multi), be->matmul_multi);
    const ArchConfig &c = m->cfg;
    m->q_dim = c.num_attention_heads * c.head_dim;
    m->kv_dim = c.num_kv_heads * c.head_dim;
    m->rot_dim = c.rot_dim;
    m->scaled_rope = c.rope_scaling.scaled() && m->rot_dim > 0;
    if (m->scaled_rope && !backend_has(be, offsetof(cmf_backend_vt, rope_freqs), be->rope_freqs))
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": arch.rope_scaling is " + rope::type_name(c.rope_scaling.type) +
                                             " but backend '" + (be->name ? be->name : "?") +
                                             "' has no rope_freqs (RoPE over a given frequency table)");
    Binder b(src, be, be_ctx, "", m->owned);
    const std::string &body = names.body;
    if (b.present(body + "mtp.eh_proj.weight") || b.present(body + "mtp.layers.0.self_attn.q_proj.weight"))
        host->log(host->host_ctx, CMF_LOG_INFO, (fam + ": " + body + "mtp.* present; MTP drafting is not used yet").c_str());
    const uint64_t H = c.hidden_size;
    m->embed = b.bind(body + "embed_tokens.weight", {0, H});
    for (uint64_t i = 0; i < c.num_layers; ++i) build_layer(*m, b, names, i);
    m->final_norm = b.bind(body + "norm.weight", {H});
    if (names.head.empty()) return m;  // an encoder: hidden states only
    if (b.present(names.head))
        m->head = b.bind(names.head, {0, H});
    else if (c.tie_word_embeddings)
        m->head = m->embed;
    else
        throw Error(CMF_ERR_MISSING_TENSOR, "missing tensor " + names.head + " (and arch.tie_word_embeddings is false)");
    if (m->head.rows > c.vocab_size)
        throw Error(CMF_ERR_BOUNDS, "the output head has " + std::to_string(m->head.rows) +
                                        " rows, more than arch.vocab_size " + std::to_string(c.vocab_size));
    return m;
}

std::unique_ptr<DecoderState> create_decoder_state(DecoderModel &m, uint64_t n_ctx) {
    const std::string fam = m.ch.family;
    if (n_ctx == 0) n_ctx = m.cfg.max_position_embeddings;
    if (n_ctx == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": n_ctx is 0 and the header gives no maximum");
    auto s = std::make_unique<DecoderState>();
    s->model = &m;
    s->n_ctx = n_ctx;
    s->scratch.be = m.be;
    s->scratch.be_ctx = m.be_ctx;
    if (m.scaled_rope) s->rope.emplace(m.cfg.rope_scaling, m.cfg.rope_theta, m.rot_dim);
    // The KV cache holds K after RoPE and V, per layer, in m.kv_dtype. A
    // sliding layer's is a ring of window + chunk - 1 rows when that is
    // shorter than the context and the backend has attention_ring: a call
    // of at most `chunk` tokens then finds every key its queries see.
    const bool rings = has_ring_attention(m.be);
    s->chunk = m.ring_chunk();
    for (size_t i = 0; i < m.layers.size(); ++i) {
        const uint64_t window = m.layers[i].choice.window;
        const bool ring = rings && window > 0 && window + s->chunk - 1 < n_ctx;
        const uint64_t rows = ring ? window + s->chunk - 1 : n_ctx;
        float *k = nullptr, *v = nullptr;
        check(m.be->buffer_alloc(m.be_ctx, rows * m.kv_row_bytes(), &k));
        s->k_cache.push_back(k);
        check(m.be->buffer_alloc(m.be_ctx, rows * m.kv_row_bytes(), &v));
        s->v_cache.push_back(v);
        s->cache_rows.push_back(rows);
        s->ring.push_back(ring);
    }
    return s;
}

void truncate_decoder_state(DecoderState &s, uint64_t n_keep) {
    const std::string fam = s.model->ch.family;
    if (n_keep > s.n_past)
        throw Error(CMF_ERR_BOUNDS, fam + ": cannot keep " + std::to_string(n_keep) + " positions of " +
                                        std::to_string(s.n_past));
    // Attention reads only positions < n_past, so dropping is just the count,
    // as long as every ring still holds the window before n_keep: the
    // position p of row p % rows is overwritten once p + rows < n_past.
    for (size_t i = 0; i < s.ring.size() && n_keep > 0; ++i) {
        if (!s.ring[i]) continue;
        const uint64_t window = s.model->layers[i].choice.window;
        const uint64_t first = n_keep > window ? n_keep - window : 0;  // the oldest position the next query needs
        if (first + s.cache_rows[i] < s.n_past)
            throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(i) + "'s sliding-window cache keeps " +
                                                 std::to_string(s.cache_rows[i]) + " positions and no longer holds " +
                                                 "the window before position " + std::to_string(n_keep) +
                                                 " (rolled back from " + std::to_string(s.n_past) + ")");
    }
    s.n_past = n_keep;
}

namespace {

void ensure_scratch(const DecoderModel &m, Scratch &sc, uint64_t n, uint64_t logit_rows) {
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
void matmuls(const DecoderModel &m, const float *x, uint64_t n,
             std::initializer_list<std::pair<const cmf_backend_weight *, float *>> outs) {
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

// One sequence's rows in a pass: a single forward is a pass of one, a
// forward_batch of several laid end to end in the activations.
struct SeqRows {
    DecoderState *s = nullptr;
    const int32_t *tokens = nullptr;
    uint64_t n = 0;           // tokens
    uint64_t pos = 0;         // position of tokens[0] (= s->n_past)
    uint64_t row0 = 0;        // first row in the pass's activations
    uint64_t logit_rows = 0;  // 0, 1 (the last token) or n
    float *logits = nullptr;  // host, logit_rows * vocab_size floats
};

// sc.tmp = attention(sc.xn) for layer li over every sequence's rows: the
// projections, biases and q/k-norm run once over all rows; RoPE, the cache
// write and attention per sequence, at its positions and on its own cache.
void attention_block(const DecoderModel &m, Scratch &sc, const Layer &L, size_t li, std::span<const SeqRows> seqs,
                     uint64_t n) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    const ArchConfig &c = m.cfg;
    const uint32_t nh = uint32_t(c.num_attention_heads), nkv = uint32_t(c.num_kv_heads), hd = uint32_t(c.head_dim);
    const int32_t style = m.ch.norm_style;
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
    const float scale = m.ch.attn_scale, softcap = m.ch.attn_softcap;
    const uint32_t window = L.choice.window;
    for (const SeqRows &r : seqs) {
        DecoderState &s = *r.s;
        float *q = sc.q + r.row0 * m.q_dim, *k = sc.k + r.row0 * m.kv_dim, *v = sc.v + r.row0 * m.kv_dim;
        float *attn = sc.attn + r.row0 * m.q_dim;
        if (m.rot_dim > 0) {
            for (auto [x, ld, heads] : {std::tuple{q, m.q_dim, nh}, std::tuple{k, m.kv_dim, nkv}}) {
                if (s.rope && L.choice.scaled_rope) {  // HF's table for this call (the forward updated it)
                    const rope::Freqs &f = s.rope->current();
                    check(be->rope_freqs(bc, x, r.n, ld, heads, hd, m.rot_dim, r.pos, f.inv_freq.data(),
                                         f.attention_factor));
                } else {
                    check(be->rope(bc, x, r.n, ld, heads, hd, m.rot_dim, r.pos, L.choice.rope_theta));
                }
            }
        }
        if (s.ring[li]) {  // rows pos % R.., split where the ring wraps
            const uint64_t R = s.cache_rows[li], r0 = r.pos % R, n1 = std::min(r.n, R - r0);
            for (auto [cache, src] : {std::pair{s.k_cache[li], k}, std::pair{s.v_cache[li], v}}) {
                check(be->kv_write(bc, cache, m.kv_dtype, m.kv_dim, r0, src, n1));
                if (n1 < r.n) check(be->kv_write(bc, cache, m.kv_dtype, m.kv_dim, 0, src + n1 * m.kv_dim, r.n - n1));
            }
            check(be->attention_ring(bc, q, s.k_cache[li], s.v_cache[li], m.kv_dtype, R, attn, r.n, r.pos, nh, nkv, hd,
                                     scale, window, softcap));
        } else if (m.kv_dtype == CMF_DTYPE_F32) {  // any backend: plain copies and attention
            check(be->copy(bc, s.k_cache[li] + r.pos * m.kv_dim, k, r.n * m.kv_dim));
            check(be->copy(bc, s.v_cache[li] + r.pos * m.kv_dim, v, r.n * m.kv_dim));
            check(be->attention(bc, q, s.k_cache[li], s.v_cache[li], attn, r.n, r.pos, nh, nkv, hd, scale, window,
                                softcap));
        } else {
            check(be->kv_write(bc, s.k_cache[li], m.kv_dtype, m.kv_dim, r.pos, k, r.n));
            check(be->kv_write(bc, s.v_cache[li], m.kv_dtype, m.kv_dim, r.pos, v, r.n));
            check(be->attention_kv(bc, q, s.k_cache[li], s.v_cache[li], m.kv_dtype, attn, r.n, r.pos, nh, nkv, hd,
                                   scale, window, softcap));
        }
    }
    check(be->matmul(bc, L.o.w, sc.attn, n, sc.tmp));
    if (L.o_bias) check(be->add_bias(bc, sc.tmp, L.o_bias.w, n, c.hidden_size));
}

// sc.tmp = ffn(sc.xn).
void dense_ffn(const DecoderModel &m, Scratch &sc, const Layer &L, uint64_t n) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    matmuls(m, sc.xn, n, {{L.gate.w, sc.gate}, {L.up.w, sc.up}});
    check(be->gated_act(bc, sc.gate, sc.up, n * L.ffn_dim, m.ch.act, sc.gate));
    check(be->matmul(bc, L.down.w, sc.gate, n, sc.tmp));
}

void check_step(const DecoderModel &m, const DecoderState &s, const DecoderStep &a) {
    const std::string fam = std::string(m.ch.family) + " forward";
    if (a.n_tokens != 0 && a.tokens == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL tokens");
    if (a.pos != s.n_past)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": pos " + std::to_string(a.pos) + " but the state holds " +
                                                  std::to_string(s.n_past) + " positions");
    if (a.pos + a.n_tokens > s.n_ctx)
        throw Error(CMF_ERR_BOUNDS, fam + ": " + std::to_string(a.pos + a.n_tokens) +
                                        " positions exceed the context of " + std::to_string(s.n_ctx));
    const int32_t mode = a.logits_mode;
    if (mode != CMF_LOGITS_NONE && mode != CMF_LOGITS_LAST && mode != CMF_LOGITS_ALL)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": unknown logits_mode " + std::to_string(mode));
    if (mode != CMF_LOGITS_NONE && a.logits == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL logits");
    if (a.n_layers > m.layers.size())
        throw Error(CMF_ERR_BOUNDS, fam + ": " + std::to_string(a.n_layers) + " layers asked of " +
                                        std::to_string(m.layers.size()));
    if (mode != CMF_LOGITS_NONE && !m.head)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": the model has no output head (an encoder gives hidden states only)");
    if (a.n_layers != 0 && a.n_layers < m.layers.size() && mode != CMF_LOGITS_NONE)
        throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": logits need every layer (n_layers < num_layers gives hidden states only)");
}

// The tokens of every sequence through the layers, head and soft-cap, in
// the scratch `sc`; `n` rows in all.
void forward_rows(DecoderModel &m, Scratch &sc, std::span<const SeqRows> seqs, uint64_t n, uint64_t n_layers,
                  float *hidden) {
    uint64_t logit_total = 0;
    for (const SeqRows &r : seqs) logit_total += r.logit_rows;
    ensure_scratch(m, sc, n, logit_total);
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    const ArchConfig &c = m.cfg;
    const uint64_t H = c.hidden_size;
    const int32_t style = m.ch.norm_style;
    const float eps = float(c.rms_norm_eps);

    if (seqs.size() == 1) {
        check(be->embed(bc, m.embed.w, seqs[0].tokens, n, m.ch.embed_scale, sc.h));
    } else {
        std::vector<int32_t> tokens;
        tokens.reserve(n);
        for (const SeqRows &r : seqs) tokens.insert(tokens.end(), r.tokens, r.tokens + r.n);
        check(be->embed(bc, m.embed.w, tokens.data(), n, m.ch.embed_scale, sc.h));
    }
    for (size_t li = 0; li < n_layers; ++li) {
        const Layer &L = m.layers[li];
        check(be->rms_norm(bc, sc.h, L.in_norm.w, n, H, eps, style, sc.xn));
        switch (L.mixer) {
        case MixerKind::Attention: attention_block(m, sc, L, li, seqs, n); break;
        }
        if (L.post_attn_norm) check(be->rms_norm(bc, sc.tmp, L.post_attn_norm.w, n, H, eps, style, sc.tmp));
        check(be->add(bc, sc.h, sc.tmp, n * H));
        check(be->rms_norm(bc, sc.h, L.pre_ffn_norm.w, n, H, eps, style, sc.xn));
        switch (L.ffn) {
        case FfnKind::Dense: dense_ffn(m, sc, L, n); break;
        }
        if (L.post_ffn_norm) check(be->rms_norm(bc, sc.tmp, L.post_ffn_norm.w, n, H, eps, style, sc.tmp));
        check(be->add(bc, sc.h, sc.tmp, n * H));
    }
    // Layers past n_layers are not run: their caches do not hold these positions.
    for (const SeqRows &r : seqs) r.s->n_past = r.pos + r.n;
    if (hidden != nullptr) check(be->buffer_read(bc, hidden, sc.h, n * H * sizeof(float)));
    if (logit_total == 0) return;
    // Only the rows whose logits are wanted go through the final norm and
    // the head: each sequence's last logit_rows rows, gathered in sc.xn,
    // then one head matmul for all of them.
    uint64_t out = 0;
    for (const SeqRows &r : seqs) {
        if (r.logit_rows == 0) continue;
        const float *hrows = sc.h + (r.row0 + r.n - r.logit_rows) * H;
        check(be->rms_norm(bc, hrows, m.final_norm.w, r.logit_rows, H, eps, style, sc.xn + out * H));
        out += r.logit_rows;
    }
    check(be->matmul(bc, m.head.w, sc.xn, logit_total, sc.logits));
    // Logits have vocab_size entries even when the head has fewer rows (extra = 0).
    const uint64_t V = c.vocab_size, R = m.head.rows;
    const float cap = m.ch.final_softcap;
    out = 0;
    for (const SeqRows &s : seqs) {
        for (uint64_t r = 0; r < s.logit_rows; ++r, ++out) {
            float *dst = s.logits + r * V;
            check(be->buffer_read(bc, dst, sc.logits + out * R, R * sizeof(float)));
            if (cap > 0)  // as HF: divide, tanh, multiply, in f32
                for (uint64_t j = 0; j < R; ++j) dst[j] = std::tanh(dst[j] / cap) * cap;
            std::fill(dst + R, dst + V, 0.0f);
        }
    }
}

uint64_t logit_rows_of(int32_t mode, uint64_t n) {
    return mode == CMF_LOGITS_ALL ? n : mode == CMF_LOGITS_LAST ? 1 : 0;
}

}  // namespace

void decoder_forward(DecoderModel &m, DecoderState &s, const DecoderStep &a) {
    check_step(m, s, a);
    const uint64_t n = a.n_tokens;
    if (n == 0) return;
    const uint64_t n_layers = a.n_layers == 0 ? m.layers.size() : a.n_layers;
    const int32_t mode = a.logits_mode;
    // Dynamic NTK: HF's dynamic_rope_update runs once per forward call (not
    // per chunk below), for seq_len = the call's last position + 1.
    if (s.rope) s.rope->update(a.pos + n);
    // Rings hold the keys of at most s.chunk new tokens: longer calls run in chunks.
    const uint64_t chunk = std::find(s.ring.begin(), s.ring.end(), true) != s.ring.end() ? s.chunk : n;
    const uint64_t H = m.cfg.hidden_size, V = m.cfg.vocab_size;
    for (uint64_t c0 = 0; c0 < n; c0 += chunk) {
        const uint64_t cn = std::min(chunk, n - c0);
        const bool last = c0 + cn == n;
        SeqRows r;
        r.s = &s;
        r.tokens = a.tokens + c0;
        r.n = cn;
        r.pos = a.pos + c0;
        r.logit_rows = mode == CMF_LOGITS_ALL ? cn : (mode == CMF_LOGITS_LAST && last) ? 1 : 0;
        r.logits = mode == CMF_LOGITS_ALL ? a.logits + c0 * V : a.logits;
        forward_rows(m, s.scratch, std::span<const SeqRows>(&r, 1), cn, n_layers,
                     a.hidden != nullptr ? a.hidden + c0 * H : nullptr);
    }
}

void decoder_forward_batch(DecoderModel &m, std::span<DecoderState *const> states, std::span<const DecoderStep> steps) {
    const std::string fam = std::string(m.ch.family) + " forward_batch";
    if (states.size() != steps.size())
        throw Error(CMF_ERR_INTERNAL, fam + ": " + std::to_string(states.size()) + " states for " +
                                          std::to_string(steps.size()) + " steps");
    // Every layer kind must have its per-sequence step in forward_rows; a
    // new kind is refused here (also by a call of no sequences, the probe
    // hosts make) until it has one.
    for (size_t li = 0; li < m.layers.size(); ++li) {
        const Layer &L = m.layers[li];
        if (L.mixer != MixerKind::Attention || L.ffn != FfnKind::Dense)
            throw Error(CMF_ERR_UNSUPPORTED, fam + ": layer " + std::to_string(li) + " is of a kind not batched yet");
    }
    std::vector<SeqRows> seqs;
    seqs.reserve(states.size());
    uint64_t n = 0;
    for (size_t i = 0; i < states.size(); ++i) {
        DecoderState *s = states[i];
        const DecoderStep &a = steps[i];
        if (s == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL state " + std::to_string(i));
        if (s->model != &m) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": state " + std::to_string(i) + " belongs to another model");
        for (size_t j = 0; j < i; ++j)
            if (states[j] == s)
                throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": states " + std::to_string(j) + " and " + std::to_string(i) +
                                                          " are the same state");
        if (a.n_layers != 0 || a.hidden != nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": hidden states and partial layer stacks are for single forwards");
        check_step(m, *s, a);
        // A sliding layer's ring holds the keys of at most s->chunk new
        // tokens; a single forward splits longer calls, a batched pass does not.
        if (a.n_tokens > s->chunk && std::find(s->ring.begin(), s->ring.end(), true) != s->ring.end())
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": sequence " + std::to_string(i) + " has " +
                                                      std::to_string(a.n_tokens) + " tokens; with sliding-window rings a "
                                                      "batched pass takes at most " + std::to_string(s->chunk) + " per sequence");
        if (a.n_tokens == 0) continue;
        if (s->rope) s->rope->update(a.pos + a.n_tokens);  // once per call, as a single forward does
        SeqRows r;
        r.s = s;
        r.tokens = a.tokens;
        r.n = a.n_tokens;
        r.pos = a.pos;
        r.row0 = n;
        r.logit_rows = logit_rows_of(a.logits_mode, a.n_tokens);
        r.logits = a.logits;
        seqs.push_back(r);
        n += a.n_tokens;
    }
    if (seqs.empty()) return;
    forward_rows(m, states[0]->scratch, seqs, n, m.layers.size(), nullptr);
}

// ---- the cmf_arch_vt run members ----------------------------------------------

namespace {

ArchPlugin *plugin_of(void *ctx) { return static_cast<ArchPlugin *>(ctx); }

cmf_error *vt_model_create(void *ctx, const cmf_model_source *src, const cmf_backend_vt *backend, void *backend_ctx,
                           const cmf_arch_model_params *params, cmf_arch_model **out) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (src == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL argument");
        require_backend(backend, pl->family);
        // Options are checked before the arch block and any tensor.
        kv_dtype_option(backend, pl->family, params != nullptr ? params->options : nullptr);
        ArchConfig cfg = parse_arch_config(src->arch_json, src->arch_json_len);
        DecoderChoices ch = pl->choose(cfg);
        auto m = create_decoder(pl->host, src, backend, backend_ctx, params != nullptr ? params->options : nullptr, cfg,
                                std::move(ch));
        *out = reinterpret_cast<cmf_arch_model *>(m.release());
    });
}

void vt_model_free(void *, cmf_arch_model *model) { delete reinterpret_cast<DecoderModel *>(model); }

cmf_error *vt_model_info(void *ctx, const cmf_arch_model *model, cmf_arch_model_info *out) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL argument");
        const DecoderModel *m = reinterpret_cast<const DecoderModel *>(model);
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

cmf_error *vt_state_create(void *ctx, cmf_arch_model *model, uint64_t n_ctx, cmf_arch_state **out) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL argument");
        auto s = create_decoder_state(*reinterpret_cast<DecoderModel *>(model), n_ctx);
        *out = reinterpret_cast<cmf_arch_state *>(s.release());
    });
}

void vt_state_free(void *, cmf_arch_state *state) { delete reinterpret_cast<DecoderState *>(state); }

cmf_error *vt_state_truncate(void *ctx, cmf_arch_state *state, uint64_t n_keep) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (state == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + ": NULL state");
        truncate_decoder_state(*reinterpret_cast<DecoderState *>(state), n_keep);
    });
}

cmf_error *vt_forward(void *ctx, cmf_arch_model *model, cmf_arch_state *state, const cmf_forward_args *args) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        if (model == nullptr || state == nullptr || args == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(pl->family) + " forward: NULL argument");
        DecoderStep step;
        step.tokens = args->tokens;
        step.n_tokens = args->n_tokens;
        step.pos = args->pos;
        step.logits_mode = args->logits_mode;
        step.logits = args->logits;
        decoder_forward(*reinterpret_cast<DecoderModel *>(model), *reinterpret_cast<DecoderState *>(state), step);
    });
}

cmf_error *vt_forward_batch(void *ctx, cmf_arch_model *model, uint32_t n_seqs, cmf_arch_state *const *states,
                            const cmf_forward_args *const *args) {
    ArchPlugin *pl = plugin_of(ctx);
    return cmf::sdk::call(pl->host, [&] {
        const std::string fam = std::string(pl->family) + " forward_batch";
        if (model == nullptr || (n_seqs != 0 && (states == nullptr || args == nullptr)))
            throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL argument");
        std::vector<DecoderState *> ss(n_seqs);
        std::vector<DecoderStep> steps(n_seqs);
        for (uint32_t i = 0; i < n_seqs; ++i) {
            const cmf_forward_args *a = args[i];
            if (a == nullptr || states[i] == nullptr)
                throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": NULL state or args for sequence " + std::to_string(i));
            if (a->struct_size < offsetof(cmf_forward_args, logits) + sizeof(float *))
                throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": args " + std::to_string(i) + " has struct_size " +
                                                          std::to_string(a->struct_size));
            ss[i] = reinterpret_cast<DecoderState *>(states[i]);
            steps[i].tokens = a->tokens;
            steps[i].n_tokens = a->n_tokens;
            steps[i].pos = a->pos;
            steps[i].logits_mode = a->logits_mode;
            steps[i].logits = a->logits;
        }
        decoder_forward_batch(*reinterpret_cast<DecoderModel *>(model), ss, steps);
    });
}

}  // namespace

void set_decoder_run_members(cmf_arch_vt &vt) {
    vt.model_create = vt_model_create;
    vt.model_free = vt_model_free;
    vt.model_info = vt_model_info;
    vt.state_create = vt_state_create;
    vt.state_free = vt_state_free;
    vt.state_truncate = vt_state_truncate;
    vt.forward = vt_forward;
    vt.forward_batch = vt_forward_batch;
}

}  // namespace cmf::archs
