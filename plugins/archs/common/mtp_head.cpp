// The multi-token-prediction (MTP) head of Qwen3-Next / Qwen3.5 checkpoints
// (model.mtp.*; vLLM's qwen3_next_mtp.py semantics, HF ignores these
// tensors): the draft for the token after next. Its entry p combines the
// trunk's final normed hidden state at position p with the embedding of the
// token at p + 1:
//     x = eh_proj [enorm(embed(t_{p+1})) | hnorm(h_p)]     (embedding first)
//     x = decoder layer (model.mtp.layers.0, its own KV cache, RoPE at p)
//     draft logits = head(norm(x))                          (the trunk's head)
// The trunk's forward keeps h_p and t_p of every position; decoder_draft
// runs the entries the head has not seen yet in one batch, the last one
// with the token the caller chose for n_past.
#include "decoder_parts.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cmf::archs::detail {

using cmf::sdk::Error;

void bind_mtp(DecoderModel &m, Binder &b, const std::string &body) {
    const std::string fam = m.ch.family;
    const uint64_t H = m.cfg.hidden_size;
    if (!CMF_BACKEND_HAS(m.be, copy_rows))
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": backend '" + (m.be->name ? m.be->name : "?") +
                                             "' lacks copy_rows, which the MTP head needs (model option mtp=off runs without it)");
    auto h = std::make_unique<MtpHead>();
    h->enorm = b.bind(body + "mtp.enorm.weight", {H});
    h->hnorm = b.bind(body + "mtp.hnorm.weight", {H});
    h->eh_proj = b.bind(body + "mtp.eh_proj.weight", {H, 2 * H});
    h->norm = b.bind(body + "mtp.norm.weight", {H});
    h->layer.choice = {0, float(m.cfg.rope_theta)};
    m.mtp = std::move(h);  // before the layer: scratch sizes look at it
    build_layer_at(m, b, body + "mtp.layers.0.", SIZE_MAX, m.mtp->layer);
}

void alloc_mtp_state(DecoderModel &m, DecoderState &s) {
    check(m.be->buffer_alloc(m.be_ctx, s.n_ctx * m.kv_row_bytes(m.mtp->layer), &s.mtp_k));
    check(m.be->buffer_alloc(m.be_ctx, s.n_ctx * m.kv_row_bytes(m.mtp->layer), &s.mtp_v));
    check(m.be->buffer_alloc(m.be_ctx, s.n_ctx * m.cfg.hidden_size * sizeof(float), &s.mtp_hidden));
    s.tokens.reserve(s.n_ctx);
}

}  // namespace cmf::archs::detail

namespace cmf::archs {

using cmf::sdk::Error;

void decoder_draft(DecoderModel &m, DecoderState &s, int32_t next_token, float *logits) {
    using namespace detail;
    const std::string fam = std::string(m.ch.family) + " draft";
    if (!m.mtp) throw Error(CMF_ERR_UNSUPPORTED, fam + ": the model has no draft head (or model option mtp=off)");
    if (s.n_past == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, fam + ": the state holds no position to draft from");
    if (next_token < 0 || uint64_t(next_token) >= m.embed.rows)
        throw Error(CMF_ERR_BOUNDS, fam + ": token " + std::to_string(next_token) + " outside the vocabulary");
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    const MtpHead &mh = *m.mtp;
    const uint64_t H = m.cfg.hidden_size, P = s.n_past;
    const int32_t style = m.ch.norm_style;
    const float eps = float(m.cfg.rms_norm_eps);
    // Entries [mtp_len, P): entry p reads h_p and the token at p + 1 (the
    // caller's next_token for the last); in chunks, so a long prompt's
    // catch-up keeps the scratch of a prefill chunk.
    constexpr uint64_t kChunk = 512;
    std::vector<int32_t> toks;
    s.mtp_len = std::min(s.mtp_len, P - 1);  // entry P - 1 reads next_token: always redone
    while (s.mtp_len < P) {
        const uint64_t p0 = s.mtp_len, n = std::min(kChunk, P - p0);
        const bool last = p0 + n == P;
        toks.resize(n);
        for (uint64_t i = 0; i < n; ++i) toks[i] = p0 + i + 1 < P ? s.tokens[p0 + i + 1] : next_token;
        ensure_scratch(m, s.scratch, n, last ? 1 : 0);
        Scratch &sc = s.scratch;
        check(be->embed(bc, m.embed.w, toks.data(), n, m.ch.embed_scale, sc.h));
        check(be->rms_norm(bc, sc.h, mh.enorm.w, n, H, eps, style, sc.tmp));
        check(be->copy_rows(bc, sc.xn, 2 * H, sc.tmp, H, n, H));
        check(be->rms_norm(bc, s.mtp_hidden + p0 * H, mh.hnorm.w, n, H, eps, style, sc.tmp));
        check(be->copy_rows(bc, sc.xn + H, 2 * H, sc.tmp, H, n, H));
        check(be->matmul(bc, mh.eh_proj.w, sc.xn, n, sc.h));
        run_layer(m, s, mh.layer, {s.mtp_k, s.mtp_v, nullptr, SIZE_MAX}, n, p0);
        s.mtp_len = p0 + n;
        if (!last) continue;
        check(be->rms_norm(bc, sc.h + (n - 1) * H, mh.norm.w, 1, H, eps, style, sc.xn));
        check(be->matmul(bc, m.head.w, sc.xn, 1, sc.logits));
        const uint64_t V = m.cfg.vocab_size, R = m.head.rows;
        check(be->buffer_read(bc, logits, sc.logits, R * sizeof(float)));
        if (const float cap = m.ch.final_softcap; cap > 0)
            for (uint64_t j = 0; j < R; ++j) logits[j] = std::tanh(logits[j] / cap) * cap;
        std::fill(logits + R, logits + V, 0.0f);
    }
}

}  // namespace cmf::archs
