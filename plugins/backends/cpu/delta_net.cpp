#include "delta_net.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cmf::cpu::gdn {

// The loops below are element-wise over a head's contiguous dims, which the
// compiler vectorizes; each heavy function is also built for AVX2 and
// AVX-512 and picked at load by the CPU (GCC's target_clones). Where the
// target has FMA, GCC fuses a multiply into its add (C++'s default
// -ffp-contract=fast), so those builds round differently from the baseline
// one: equal up to rounding, as between the chunked and recurrent forms
// (tests/unit/cpu_backend_moe_gdn_test.cpp).
#define CMF_GDN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace {

// PyTorch's softplus (beta 1, threshold 20), in f32.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x / sqrt(|x|^2 + 1e-6) * scale, as HF's l2norm (eps inside the root).
void l2_normalise(const float *x, uint32_t n, float scale, float *y) {
    double ss = 0;
    for (uint32_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
    const float inv = float(1.0 / std::sqrt(ss + 1e-6));
    for (uint32_t i = 0; i < n; ++i) y[i] = (x[i] * inv) * scale;
}

// y[j] += a * x[j] for j < n: the form every product below takes, so the
// compiler vectorizes over the contiguous index and keeps each sum's order.
inline void axpy(float a, const float *x, float *y, uint64_t n) {
    for (uint64_t j = 0; j < n; ++j) y[j] += a * x[j];
}

// y[j] += a[j] * x[j] for j < n.
inline void axpy_mul(const float *a, const float *x, float *y, uint64_t n) {
    for (uint64_t j = 0; j < n; ++j) y[j] += a[j] * x[j];
}

// Rows r < R of Y (ldy apart, n columns) += sum over i < K of c(r, i) * row i
// of X (ldx apart), each element's terms added in i order: what R rows of
// K axpy calls do, with a block of 32 columns of the R rows held in
// registers across the K terms, so each X row is read once per R rows
// instead of once per row (the chunked form's products are all this shape).
template <int R, class Coef>
inline void rows_update(float *Y, uint64_t ldy, const float *X, uint64_t ldx, uint64_t K, uint64_t n, Coef c) {
    constexpr uint64_t W = 32;
    uint64_t j0 = 0;
    for (; j0 + W <= n; j0 += W) {
        float acc[R][W];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r)
            for (uint64_t j = 0; j < W; ++j) acc[r][j] = Y[r * ldy + j0 + j];
        for (uint64_t i = 0; i < K; ++i) {
            const float *x = X + i * ldx + j0;
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                const float a = c(r, i);
                for (uint64_t j = 0; j < W; ++j) acc[r][j] += a * x[j];
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r)
            for (uint64_t j = 0; j < W; ++j) Y[r * ldy + j0 + j] = acc[r][j];
    }
    if (j0 < n)
        for (int r = 0; r < R; ++r)
            for (uint64_t i = 0; i < K; ++i) axpy(c(r, i), X + i * ldx + j0, Y + r * ldy + j0, n - j0);
}
// rows_update over `rows` rows, four at a time: c(r, i) for row r of all.
template <class Coef>
inline void rows_update_all(float *Y, uint64_t ldy, uint64_t rows, const float *X, uint64_t ldx, uint64_t K, uint64_t n,
                            Coef c) {
    uint64_t r0 = 0;
    for (; r0 + 4 <= rows; r0 += 4)
        rows_update<4>(Y + r0 * ldy, ldy, X, ldx, K, n, [&](int r, uint64_t i) { return c(r0 + r, i); });
    for (; r0 < rows; ++r0)
        rows_update<1>(Y + r0 * ldy, ldy, X, ldx, K, n, [&](int, uint64_t i) { return c(r0, i); });
}

}  // namespace

void prepare(const Dims &d, const float *qkv, uint64_t t0, uint64_t t1, const float *a, const float *b,
             const float *a_log, const float *dt_bias, float *q, float *k, float *beta, float *g) {
    const uint64_t ld = d.qkv_len(), kd = uint64_t(d.nk) * d.dk;
    const float scale = 1.0f / std::sqrt(float(d.dk));
    for (uint64_t t = t0; t < t1; ++t) {
        const float *row = qkv + t * ld;
        for (uint32_t h = 0; h < d.nk; ++h) {
            l2_normalise(row + uint64_t(h) * d.dk, d.dk, scale, q + t * kd + uint64_t(h) * d.dk);
            l2_normalise(row + kd + uint64_t(h) * d.dk, d.dk, 1.0f, k + t * kd + uint64_t(h) * d.dk);
        }
        for (uint32_t h = 0; h < d.nv; ++h) {
            const uint64_t i = t * d.nv + h;
            beta[i] = 1.0f / (1.0f + std::exp(-b[i]));
            g[i] = -std::exp(a_log[h]) * softplus(a[i] + dt_bias[h]);
        }
    }
}

CMF_GDN_CLONES void step(const Dims &d, uint32_t h, const Head &in, uint64_t t, const float *S_src, float *S_dst) {
    const uint32_t dk = d.dk, dv = d.dv, kh = h / d.rep();
    const uint64_t kd = uint64_t(d.nk) * dk;
    const float *q = in.q + t * kd + uint64_t(kh) * dk, *k = in.k + t * kd + uint64_t(kh) * dk;
    const float *v = in.qkv + t * d.qkv_len() + 2 * kd + uint64_t(h) * dv;
    const float decay = std::exp(in.g[t * d.nv + h]), bt = in.beta[t * d.nv + h];
    thread_local std::vector<float> r, delta;
    r.assign(dv, 0.0f);
    delta.resize(dv);
    // r = (decay S)^T k, row by row of S
    for (uint32_t i = 0; i < dk; ++i) {
        const float *s = S_src + uint64_t(i) * dv;
        const float ki = k[i];
        for (uint32_t j = 0; j < dv; ++j) r[j] += (decay * s[j]) * ki;
    }
    for (uint32_t j = 0; j < dv; ++j) delta[j] = bt * (v[j] - r[j]);
    // S' = decay S + k delta^T, out = S'^T q, in one pass (same element
    // order whether S_dst is S_src or not).
    float *o = in.out + t * in.ldo + uint64_t(h) * dv;
    std::fill(o, o + dv, 0.0f);
    for (uint32_t i = 0; i < dk; ++i) {
        const float *s = S_src + uint64_t(i) * dv;
        float *sd = S_dst + uint64_t(i) * dv;
        const float ki = k[i], qi = q[i];
        for (uint32_t j = 0; j < dv; ++j) {
            const float x = decay * s[j] + ki * delta[j];
            sd[j] = x;
            o[j] += x * qi;
        }
    }
}

void recurrent(const Dims &d, uint32_t h, const Head &in, uint64_t n, float *S) {
    for (uint64_t t = 0; t < n; ++t) step(d, h, in, t, S, S);
}

// Per chunk of L tokens, with G the cumulative log-decay inside the chunk,
// D[i][j] = exp(G_i - G_j) (j <= i) and S the state entering it (as HF's
// torch_chunk_gated_delta_rule, modeling_qwen3_next.py):
//   A = strictly lower part of -(diag(beta) K K^T) * D,  T = (I - A)^-1
//   U = T diag(beta) V,  W = T diag(beta e^G) K,  Vn = U - W S
//   O = diag(e^G) Q S + ((Q K^T) * D, j <= i) Vn
//   S = e^(G_last) S + (diag(e^(G_last - G)) K)^T Vn
CMF_GDN_CLONES void chunked(const Dims &d, uint32_t h, const Head &in, uint64_t n, float *S, uint64_t chunk) {
    const uint64_t dk = d.dk, dv = d.dv, kd = uint64_t(d.nk) * dk, ld = d.qkv_len();
    const uint32_t kh = h / d.rep();
    thread_local std::vector<float> G, K, Q, KT, A, T, U, W, Vn, QK, tmp;
    for (uint64_t c0 = 0; c0 < n; c0 += chunk) {
        const uint64_t L = std::min(chunk, n - c0);
        G.resize(L);
        K.resize(L * dk), Q.resize(L * dk), KT.resize(dk * L);
        A.assign(L * L, 0.0f), T.assign(L * L, 0.0f), QK.assign(L * L, 0.0f);
        U.assign(L * dv, 0.0f), W.assign(L * dk, 0.0f), Vn.resize(L * dv), tmp.resize(L);
        float cum = 0.0f;
        for (uint64_t i = 0; i < L; ++i) {
            const uint64_t t = c0 + i;
            cum += in.g[t * d.nv + h];
            G[i] = cum;
            const float *kr = in.k + t * kd + uint64_t(kh) * dk, *qr = in.q + t * kd + uint64_t(kh) * dk;
            std::copy(kr, kr + dk, K.begin() + i * dk);
            std::copy(qr, qr + dk, Q.begin() + i * dk);
            for (uint64_t c = 0; c < dk; ++c) KT[c * L + i] = kr[c];
        }
        auto beta = [&](uint64_t i) { return in.beta[(c0 + i) * d.nv + h]; };
        auto value = [&](uint64_t i) { return in.qkv + (c0 + i) * ld + 2 * kd + uint64_t(h) * dv; };
        // A[i][:] = K_i K^T (all j; the strict lower part is kept), QK likewise.
        rows_update_all(A.data(), L, L, KT.data(), L, dk, L, [&](uint64_t i, uint64_t c) { return K[i * dk + c]; });
        rows_update_all(QK.data(), L, L, KT.data(), L, dk, L, [&](uint64_t i, uint64_t c) { return Q[i * dk + c]; });
        for (uint64_t i = 0; i < L; ++i) {
            float *ar = A.data() + i * L, *qr = QK.data() + i * L;
            for (uint64_t j = 0; j < L; ++j) {
                ar[j] = j < i ? -(beta(i) * ar[j]) * std::exp(G[i] - G[j]) : 0.0f;
                qr[j] = j <= i ? qr[j] * std::exp(G[i] - G[j]) : 0.0f;
            }
        }
        // T = (I - A)^-1 by forward substitution: row i (j < i) is
        // A[i][j] + sum over m of A[i][m] T[m][j], T[m][j] = 0 for j >= m.
        for (uint64_t i = 0; i < L; ++i) {
            float *tr = T.data() + i * L;
            const float *ar = A.data() + i * L;
            std::copy(ar, ar + i, tr);
            for (uint64_t m = 0; m < i; ++m) axpy(ar[m], T.data() + m * L, tr, m);
            tr[i] = 1.0f;
        }
        // U = T diag(beta) V, W = T diag(beta e^G) K (T unit lower triangular).
        for (uint64_t t = 0; t < L; ++t) {
            float *ur = U.data() + t * dv, *wr = W.data() + t * dk;
            for (uint64_t m = 0; m <= t; ++m) {
                const float tm = T[t * L + m];
                axpy(tm * beta(m), value(m), ur, dv);
                axpy(tm * (beta(m) * std::exp(G[m])), K.data() + m * dk, wr, dk);
            }
        }
        // Vn = U - W S; O = e^G Q S + QK Vn.
        std::copy(U.begin(), U.begin() + L * dv, Vn.begin());
        rows_update_all(Vn.data(), dv, L, S, dv, dk, dv, [&](uint64_t t, uint64_t i) { return -W[t * dk + i]; });
        float *out = in.out + c0 * in.ldo + uint64_t(h) * dv;
        for (uint64_t t = 0; t < L; ++t) std::fill(out + t * in.ldo, out + t * in.ldo + dv, 0.0f), tmp[t] = std::exp(G[t]);
        rows_update_all(out, in.ldo, L, S, dv, dk, dv, [&](uint64_t t, uint64_t i) { return tmp[t] * Q[t * dk + i]; });
        for (uint64_t t = 0; t < L; ++t)
            for (uint64_t j = 0; j <= t; ++j) axpy(QK[t * L + j], Vn.data() + j * dv, out + t * in.ldo, dv);
        // S = e^(G_last) S + (diag(e^(G_last - G)) K)^T Vn.
        const float glast = G[L - 1], elast = std::exp(glast);
        for (uint64_t t = 0; t < L; ++t) tmp[t] = std::exp(glast - G[t]);
        for (uint64_t j = 0; j < dk * dv; ++j) S[j] *= elast;
        rows_update_all(S, dv, dk, Vn.data(), dv, L, dv, [&](uint64_t i, uint64_t t) { return K[t * dk + i] * tmp[t]; });
    }
}

CMF_GDN_CLONES void conv1d_block(const float *state, const float *x, uint64_t C, const float *w, uint64_t K, uint64_t c0,
                                 uint64_t c1, uint64_t n, float *out) {
    // The block's taps turned tap-major, so the channel loop reads them
    // contiguously (w is channel-major, K apart) and vectorizes.
    const uint64_t nc = c1 - c0, hist = K - 1;
    thread_local std::vector<float> taps;
    taps.resize(K * nc);
    for (uint64_t c = 0; c < nc; ++c)
        for (uint64_t j = 0; j < K; ++j) taps[j * nc + c] = w[(c0 + c) * K + j];
    for (uint64_t t = 0; t < n; ++t) {
        float *o = out + t * C + c0;
        for (uint64_t c = 0; c < nc; ++c) o[c] = 0.0f;
        for (uint64_t j = 0; j < K; ++j) {
            const float *u = (t + j < hist ? state + (t + j) * C : x + (t + j - hist) * C) + c0;
            axpy_mul(taps.data() + j * nc, u, o, nc);
        }
    }
}

}  // namespace cmf::cpu::gdn
