// The gated delta rule of the Qwen3-Next / Qwen3.5 linear-attention layers
// (cmf_backend_vt.gated_delta_net), per value head, in two forms:
//  - recurrent: one rank-1 update of the head's [dk][dv] state per token
//    (decode, and short inputs);
//  - chunked: the WY form over chunks of tokens (prefill), which composes a
//    chunk's rank-1 updates into small matrix products; algebraically the
//    same as the recurrence, equal to it up to rounding (tested).
// Both read the inputs `prepare` writes: the L2-normalised query (scaled by
// 1/sqrt(dk)) and key heads, beta and the log-decay of every token.
#pragma once

#include <cstdint>

namespace cmf::cpu::gdn {

struct Dims {
    uint32_t nk = 0, nv = 0, dk = 0, dv = 0;
    // Floats per token of the qkv input: nk query heads, nk key heads, nv value heads.
    uint64_t qkv_len() const { return 2 * uint64_t(nk) * dk + uint64_t(nv) * dv; }
    uint32_t rep() const { return nv / nk; }  // value heads per key head
};

// For tokens [t0, t1): q[t][g] = q_g / sqrt(|q_g|^2 + 1e-6) / sqrt(dk) and
// k[t][g] likewise without the scale (q, k: [n][nk][dk]); beta[t][h] =
// sigmoid(b[t][h]), g[t][h] = -exp(a_log[h]) * softplus(a[t][h] +
// dt_bias[h]) (beta, g: [n][nv]), softplus as PyTorch's (x for x > 20).
void prepare(const Dims &d, const float *qkv, uint64_t t0, uint64_t t1, const float *a, const float *b,
             const float *a_log, const float *dt_bias, float *q, float *k, float *beta, float *g);

// Inputs of one value head h: the prepared arrays above and the raw qkv
// rows (its value head); out rows `ldo` floats apart, at h * dv.
struct Head {
    const float *q, *k, *qkv, *beta, *g;
    float *out;
    uint64_t ldo;
};

// Token t of head h: S_dst = decay * S_src + k (beta (v - decay * S_src^T k))^T,
// out_t = S_dst^T q. S_dst may equal S_src.
void step(const Dims &d, uint32_t h, const Head &in, uint64_t t, const float *S_src, float *S_dst);

// Tokens [0, n) of head h one by one, S ([dk][dv]) advanced in place.
void recurrent(const Dims &d, uint32_t h, const Head &in, uint64_t n, float *S);

// Tokens [0, n) of head h in chunks of `chunk` tokens (WY form), S advanced
// in place. The same values as recurrent up to rounding.
void chunked(const Dims &d, uint32_t h, const Head &in, uint64_t n, float *S, uint64_t chunk = 64);

// The causal depthwise convolution in front of the rule (before its SiLU),
// for channels [c0, c1) (at most 256) of tokens [0, n): out[t][c] = sum over
// j < K of w[c*K + j] * u[t + j][c], the input stream u being the `hist` =
// K - 1 state rows, then x's rows (C floats each), terms added in j order.
void conv1d_block(const float *state, const float *x, uint64_t C, const float *w, uint64_t K, uint64_t c0, uint64_t c1,
                  uint64_t n, float *out);

}  // namespace cmf::cpu::gdn
