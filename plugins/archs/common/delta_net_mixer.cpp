// The gated delta net mixer of the Qwen3-Next / Qwen3.5 hybrids (HF's
// Qwen3NextGatedDeltaNet in the split Qwen3.5 layout, which the converter
// writes for both): per token
//     qkv = in_proj_qkv x, z = in_proj_z x, b = in_proj_b x, a = in_proj_a x,
//     qkv = SiLU(causal depthwise conv(qkv)) over the last `kernel` inputs,
//     o = gated delta rule(q, k, v, a, b) (cmf_backend_vt.gated_delta_net),
//     y = out_proj (RMSNorm(o per value head) * norm.weight * SiLU(z)),
// the gated norm with a plain weight (x^*w) whatever arch.norm_style says.
// The state is the convolution's last kernel-1 inputs and the [dk][dv]
// matrix of every value head, two copies of each so the last position of a
// forward call can be rolled back (RecurrentState).
#include "decoder_parts.hpp"

#include <vector>

namespace cmf::archs::detail {

using cmf::sdk::Error;

namespace {

// The gated delta net geometry from the header, or from the tensors where
// the header leaves the head dims out: dv = in_proj_z rows / nv,
// dk = (in_proj_qkv rows - nv*dv) / (2 nk).
DeltaNetDims dims_of(const DecoderModel &m, const Binder &b, const std::string &p, const std::string &where) {
    const ArchConfig &c = m.cfg;
    auto need = [&](uint64_t v, const char *key) {
        if (v == 0) throw Error(CMF_ERR_PARSE, "arch." + std::string(key) + ": required for LinearAttention layers");
        if (v > UINT32_MAX) throw Error(CMF_ERR_PARSE, "arch." + std::string(key) + ": too large");
        return uint32_t(v);
    };
    DeltaNetDims d;
    d.nk = need(c.linear_num_key_heads, "linear_num_key_heads");
    d.nv = need(c.linear_num_value_heads, "linear_num_value_heads");
    d.kernel = need(c.linear_conv_kernel, "linear_conv_kernel_dim");
    if (d.nv % d.nk != 0) throw Error(CMF_ERR_PARSE, "arch.linear_num_value_heads must be a multiple of linear_num_key_heads");
    const cmf_tensor_view &z = b.view(p + "linear_attn.in_proj_z.weight"), &qkv = b.view(p + "linear_attn.in_proj_qkv.weight");
    d.dv = c.linear_value_head_dim ? need(c.linear_value_head_dim, "linear_value_head_dim")
                                   : uint32_t(z.ndim == 2 ? z.shape[0] / d.nv : 0);
    const uint64_t rest = qkv.ndim == 2 && qkv.shape[0] > uint64_t(d.nv) * d.dv ? qkv.shape[0] - uint64_t(d.nv) * d.dv : 0;
    d.dk = c.linear_key_head_dim ? need(c.linear_key_head_dim, "linear_key_head_dim") : uint32_t(rest / (2 * d.nk));
    if (d.dv == 0 || d.dk == 0)
        throw Error(CMF_ERR_BOUNDS, where + "linear_attn: cannot derive the head dims from in_proj_z / in_proj_qkv");
    return d;
}

}  // namespace

void bind_delta_net(DecoderModel &m, Binder &b, const std::string &p, const std::string &where, Layer &L) {
    const std::string fam = m.ch.family;
    const cmf_backend_vt *be = m.be;
    if (!CMF_BACKEND_HAS(be, causal_conv1d_silu) || !CMF_BACKEND_HAS(be, gated_delta_net))
        throw Error(CMF_ERR_UNSUPPORTED, fam + ": backend '" + (be->name ? be->name : "?") +
                                             "' lacks the gated delta net operations (causal_conv1d_silu, gated_delta_net)");
    const DeltaNetDims d = dims_of(m, b, p, where);
    if (m.recurrent && (d.nk != m.gdn.nk || d.nv != m.gdn.nv || d.dk != m.gdn.dk || d.dv != m.gdn.dv))
        throw Error(CMF_ERR_BOUNDS, where + "linear_attn: head dims differ from the first gated delta net layer's");
    m.gdn = d;
    m.recurrent = true;
    const uint64_t H = m.cfg.hidden_size, C = d.conv_dim(), V = d.value_dim();
    const std::string a = p + "linear_attn.";
    DeltaNetWeights &g = L.gdn;
    g.qkv = b.bind(a + "in_proj_qkv.weight", {C, H});
    g.z = b.bind(a + "in_proj_z.weight", {V, H});
    g.b = b.bind(a + "in_proj_b.weight", {d.nv, H});
    g.a = b.bind(a + "in_proj_a.weight", {d.nv, H});
    g.conv = b.bind_values(a + "conv1d.weight", C * d.kernel);
    g.a_log = b.bind(a + "A_log", {d.nv});
    g.dt_bias = b.bind(a + "dt_bias", {d.nv});
    g.norm = b.bind(a + "norm.weight", {d.dv});
    g.out = b.bind(a + "out_proj.weight", {H, V});
}

void alloc_recurrent(const DecoderModel &m, RecurrentState &r) {
    const DeltaNetDims &d = m.gdn;
    for (int i = 0; i < 2; ++i) {
        check(m.be->buffer_alloc(m.be_ctx, (d.kernel - 1) * d.conv_dim() * sizeof(float), &r.conv[i]));
        check(m.be->buffer_alloc(m.be_ctx, d.state_floats() * sizeof(float), &r.s[i]));
    }
    reset_recurrent(m, r);
}

void reset_recurrent(const DecoderModel &m, RecurrentState &r) {
    const DeltaNetDims &d = m.gdn;
    const uint64_t conv = (d.kernel - 1) * d.conv_dim(), state = d.state_floats();
    const std::vector<float> zeros(std::max(conv, state), 0.0f);
    for (int i = 0; i < 2; ++i) {
        check(m.be->buffer_write(m.be_ctx, r.conv[i], zeros.data(), conv * sizeof(float)));
        check(m.be->buffer_write(m.be_ctx, r.s[i], zeros.data(), state * sizeof(float)));
    }
    r.cur = 0;
}

void free_recurrent(const DecoderModel &m, RecurrentState &r) {
    for (int i = 0; i < 2; ++i) {
        m.be->buffer_free(m.be_ctx, r.conv[i]);
        m.be->buffer_free(m.be_ctx, r.s[i]);
        r.conv[i] = r.s[i] = nullptr;
    }
}

void delta_net_mixer(const DecoderModel &m, Scratch &sc, const Layer &L, std::span<const SeqPart> seqs, uint64_t n) {
    const cmf_backend_vt *be = m.be;
    void *bc = m.be_ctx;
    const DeltaNetDims &d = m.gdn;
    const DeltaNetWeights &g = L.gdn;
    const uint64_t V = d.value_dim(), C = d.conv_dim();
    matmuls(m, sc.xn, n, {{g.qkv.w, sc.lin_qkv}, {g.z.w, sc.lin_z}, {g.b.w, sc.lin_b}, {g.a.w, sc.lin_a}});
    for (const SeqPart &q : seqs) {
        RecurrentState &r = *q.cache->rec;
        // Both operations leave the state after all n tokens in their second
        // buffer and the one a token back in the first: [1 - cur] becomes current.
        const int cur = r.cur, next = 1 - cur;
        check(be->causal_conv1d_silu(bc, sc.lin_qkv + q.row0 * C, q.n, C, g.conv.w, d.kernel, r.conv[cur], r.conv[next],
                                     sc.lin_conv + q.row0 * C));
        check(be->gated_delta_net(bc, sc.lin_conv + q.row0 * C, q.n, d.nk, d.nv, d.dk, d.dv, sc.lin_a + q.row0 * d.nv,
                                  sc.lin_b + q.row0 * d.nv, g.a_log.w, g.dt_bias.w, r.s[cur], r.s[next],
                                  sc.lin_out + q.row0 * V));
        r.cur = next;
    }
    // Gated RMSNorm per value head: x^*w (plain weight), times SiLU(z).
    check(be->rms_norm(bc, sc.lin_out, g.norm.w, n * d.nv, d.dv, float(m.cfg.rms_norm_eps), CMF_NORM_QWEN, sc.lin_out));
    check(be->gated_act(bc, sc.lin_z, sc.lin_out, n * V, CMF_ACT_SILU, sc.lin_out));
    check(be->matmul(bc, g.out.w, sc.lin_out, n, sc.tmp));
}

}  // namespace cmf::archs::detail
