#include "kernels.hpp"

#include "../../codecs/half.hpp"

#include <cmf/cpu_features.hpp>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <initializer_list>
#include <vector>

#if defined(CMF_NATIVE_KERNELS) && defined(__x86_64__)
#include <immintrin.h>
#define CMF_X86 1
#endif

namespace cmf::cpu {

namespace {

using codecs::bf16_to_f32;
using codecs::f16_to_f32;

// ---- portable ---------------------------------------------------------------

// A dot/axpy operand element as f32: f32 as is, f16 bits (an f16 KV cache) widened.
inline float wide1(float v) { return v; }
inline float wide1(uint16_t h) { return f16_to_f32(h); }

// q8 KV cache blocks (QuantQ8Fn / DequantQ8Fn): a block's f16 scale.
inline float q8_scale(const uint8_t *blk) { return f16_to_f32(static_cast<uint16_t>(blk[0] | blk[1] << 8)); }
void quant_q8_32(const float *src, uint64_t n_blocks, uint8_t *dst) {
    for (uint64_t b = 0; b < n_blocks; ++b, src += 32, dst += 34) {
        float amax = 0.0f;
        bool finite = true;
        for (int i = 0; i < 32; ++i) {
            finite = finite && std::isfinite(src[i]);
            amax = std::max(amax, std::fabs(src[i]));
        }
        const float d = finite ? amax / 127.0f : NAN;
        const uint16_t h = codecs::f32_to_f16(d);
        dst[0] = static_cast<uint8_t>(h & 0xFF);
        dst[1] = static_cast<uint8_t>(h >> 8);
        if (!finite || d == 0.0f) {  // the codes of a NaN-scaled or all-zero block are 0
            std::memset(dst + 2, 0, 32);
            continue;
        }
        const float id = 1.0f / d;
        for (int i = 0; i < 32; ++i)
            dst[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::round(src[i] * id), -127.0f, 127.0f)));
    }
}
void dequant_q8_32_portable(const uint8_t *src, uint64_t n_blocks, float *dst) {
    for (uint64_t b = 0; b < n_blocks; ++b, src += 34, dst += 32) {
        const float d = q8_scale(src);
        for (int i = 0; i < 32; ++i) dst[i] = d * static_cast<float>(static_cast<int8_t>(src[2 + i]));
    }
}

void heads_dot_q8_portable(const float *q, const uint8_t *rows, uint64_t ld_bytes, uint64_t n_keys, uint32_t n_heads,
                           uint32_t group, uint32_t hd, float *out, uint64_t ldo) {
    const uint32_t nb = hd / 32;
    for (uint64_t j = 0; j < n_keys; ++j)
        for (uint32_t h = 0; h < n_heads; ++h) {
            const uint8_t *kb = rows + j * ld_bytes + uint64_t(h / group) * nb * 34;
            const float *qh = q + uint64_t(h) * hd;
            float s = 0.0f;
            for (uint32_t b = 0; b < nb; ++b, kb += 34) {
                float t = 0.0f;
                for (int i = 0; i < 32; ++i) t += qh[32 * b + i] * static_cast<float>(static_cast<int8_t>(kb[2 + i]));
                s += q8_scale(kb) * t;
            }
            out[h * ldo + j] = s;
        }
}
void heads_axpy_q8_portable(const float *a, uint64_t lda, const uint8_t *rows, uint64_t ld_bytes, uint64_t n_keys,
                            uint32_t n_heads, uint32_t group, uint32_t hd, float *o) {
    const uint32_t nb = hd / 32;
    for (uint64_t j = 0; j < n_keys; ++j)
        for (uint32_t h = 0; h < n_heads; ++h) {
            const uint8_t *vb = rows + j * ld_bytes + uint64_t(h / group) * nb * 34;
            float *oh = o + uint64_t(h) * hd;
            for (uint32_t b = 0; b < nb; ++b, vb += 34) {
                const float s = a[h * lda + j] * q8_scale(vb);
                for (int i = 0; i < 32; ++i) oh[32 * b + i] += s * static_cast<float>(static_cast<int8_t>(vb[2 + i]));
            }
        }
}

// Eight independent accumulators keep the FP adder pipeline full without
// -ffast-math (which we do not use: results must not depend on flags).
template <class T>
float dot_wide_portable(const float *a, const T *b, uint64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * wide1(b[i + k]);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += a[i] * wide1(b[i]);
    return s;
}
template <class T>
void axpy_wide_portable(float a, const T *x, float *y, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) y[i] += a * wide1(x[i]);
}
float dot_portable(const float *a, const float *b, uint64_t n) { return dot_wide_portable(a, b, n); }
void axpy_portable(float a, const float *x, float *y, uint64_t n) { axpy_wide_portable(a, x, y, n); }
float dot_f16_portable(const float *a, const uint16_t *h, uint64_t n) { return dot_wide_portable(a, h, n); }
void axpy_f16_portable(float a, const uint16_t *h, float *y, uint64_t n) { axpy_wide_portable(a, h, y, n); }
// Per head, the same sums as dot/axpy above (so portable results did not change).
template <class T>
void heads_dot_portable(const float *q, const T *rows, uint64_t ldrow, uint64_t n_keys, uint32_t n_heads,
                        uint32_t group, uint32_t hd, float *out, uint64_t ldo) {
    for (uint64_t j = 0; j < n_keys; ++j)
        for (uint32_t h = 0; h < n_heads; ++h)
            out[h * ldo + j] = dot_wide_portable(q + uint64_t(h) * hd, rows + j * ldrow + uint64_t(h / group) * hd, hd);
}
template <class T>
void heads_axpy_portable(const float *a, uint64_t lda, const T *rows, uint64_t ldrow, uint64_t n_keys, uint32_t n_heads,
                         uint32_t group, uint32_t hd, float *o) {
    for (uint32_t h = 0; h < n_heads; ++h)
        for (uint64_t j = 0; j < n_keys; ++j)
            axpy_wide_portable(a[h * lda + j], rows + j * ldrow + uint64_t(h / group) * hd, o + uint64_t(h) * hd, hd);
}

float exp_sum_portable(float *x, uint64_t n, float sub) {
    float sum = 0.0f;
    for (uint64_t i = 0; i < n; ++i) sum += (x[i] = x[i] == -INFINITY ? 0.0f : std::exp(x[i] - sub));
    return sum;
}

float scale_max_portable(float *x, uint64_t n, float scale) {
    float m = -INFINITY;
    for (uint64_t i = 0; i < n; ++i) m = std::max(m, x[i] *= scale);
    return m;
}

void silu_mul_portable(const float *g, const float *u, uint64_t n, float *out) {
    for (uint64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void silu_portable(const float *x, uint64_t n, float *out) {
    for (uint64_t i = 0; i < n; ++i) out[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void sigmoid_mul_portable(const float *g, const float *u, uint64_t n, float *out) {
    for (uint64_t i = 0; i < n; ++i) out[i] = u[i] / (1.0f + std::exp(-g[i]));
}

void matmul_portable(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) {
    for (uint64_t r = r0; r < r1; ++r)
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = dot_portable(w + r * cols, x + b * ldx, cols);
}

// IEEE binary16 from binary32, round to nearest even everywhere, as F16C's
// vcvtps2ph does (so both ISAs store the same cache bits). codecs'
// f32_to_f16 is not this: it rounds subnormal halves up, as the original
// implementation's scale encoder does (docs/dtypes.md), which a KV cache need not copy.
uint16_t f32_to_f16_rne(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t exp32 = (x >> 23) & 0xFFu, mant = x & 0x7FFFFFu;
    if (exp32 == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u | (mant >> 13) : 0u));
    const int32_t e = static_cast<int32_t>(exp32) - 112;  // the f16 exponent field
    uint32_t m, shift;
    if (e >= 1) {
        if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
        m = (static_cast<uint32_t>(e) << 23) | mant;  // exponent and mantissa, rounded as one: a carry bumps the exponent
        shift = 13;
    } else {
        if (e < -10) return sign;  // below half the smallest subnormal (its exact half rounds to even: 0)
        m = mant | 0x800000u;
        shift = static_cast<uint32_t>(14 - e);
    }
    uint32_t h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
}

void narrow_f16_portable(const float *src, uint64_t n, uint16_t *dst) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = f32_to_f16_rne(src[i]);
}

void convert_f16_portable(const uint16_t *src, uint64_t n, float *dst) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
void convert_bf16_portable(const uint16_t *src, uint64_t n, float *dst) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// Portable 16-bit rows: widen one row at a time into a stack buffer.
template <ConvertH16Fn Convert, DotFn Dot>
void matmul_h16_generic(const uint16_t *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                        uint64_t r1, float *y, uint64_t ldy) {
    constexpr uint64_t kChunk = 1024;
    float buf[kChunk];
    for (uint64_t r = r0; r < r1; ++r) {
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = 0.0f;
        for (uint64_t c0 = 0; c0 < cols; c0 += kChunk) {
            uint64_t n = cols - c0 < kChunk ? cols - c0 : kChunk;
            Convert(w + r * cols + c0, n, buf);
            for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] += Dot(buf, x + b * ldx + c0, n);
        }
    }
}

void pack_w_portable(const float *w, uint64_t ldw, uint64_t n_rows, uint64_t cols, float *wp) {
    for (uint64_t p = 0; p * kGemmRows < n_rows; ++p)
        for (uint64_t k = 0; k < cols; ++k)
            for (uint64_t i = 0; i < kGemmRows; ++i) {
                const uint64_t r = p * kGemmRows + i;
                wp[(p * cols + k) * kGemmRows + i] = r < n_rows ? w[r * ldw + k] : 0.0f;
            }
}

void pack_x_portable(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t b0, uint64_t b1,
                     float *xp) {
    for (uint64_t b = b0; b < b1; ++b)
        for (uint64_t k = 0; k < cols; ++k)
            for (uint64_t t = 0; t < kGemmTokens; ++t) {
                const uint64_t tok = b * kGemmTokens + t;
                xp[(b * cols + k) * kGemmTokens + t] = tok < n_batch ? x[tok * ldx + k] : 0.0f;
            }
}

// The reference for the packed layouts: one plain dot product per output.
void gemm_packed_portable(const float *wp, uint64_t n_rows, uint64_t cols, const float *xp, uint64_t n_batch,
                          float *y, uint64_t ldy) {
    for (uint64_t b = 0; b < n_batch; ++b)
        for (uint64_t r = 0; r < n_rows; ++r) {
            const float *wr = wp + (r / kGemmRows) * cols * kGemmRows + r % kGemmRows;
            const float *xb = xp + (b / kGemmTokens) * cols * kGemmTokens + b % kGemmTokens;
            float s = 0.0f;
            for (uint64_t k = 0; k < cols; ++k) s += wr[k * kGemmRows] * xb[k * kGemmTokens];
            y[b * ldy + r] = s;
        }
}

// gemm_panel from the three parts, packing into thread-local buffers.
template <PackWFn PackW, PackXFn PackX, GemmPackedFn Gemm>
void gemm_panel_generic(const float *panel, uint64_t n_rows, uint64_t cols, const float *x, uint64_t ldx,
                        uint64_t n_batch, float *y, uint64_t ldy) {
    thread_local std::vector<float> wp, xp;
    wp.resize(packed_w_floats(n_rows, cols));
    xp.resize(packed_x_floats(n_batch, cols));
    PackW(panel, cols, n_rows, cols, wp.data());
    PackX(x, ldx, n_batch, cols, 0, gemm_x_blocks(n_batch), xp.data());
    Gemm(wp.data(), n_rows, cols, xp.data(), n_batch, y, ldy);
}

#ifdef CMF_X86
// ---- AVX2 + FMA (+ F16C for f16) --------------------------------------------
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 inline float hsum(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

// 8 weights as f32: F16C for f16, a 16-bit shift for bf16.
AVX2 inline __m256 load8_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
AVX2 inline __m256 load8_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

// Eight elements of a dot/axpy operand widened to f32: f32 as is, f16 bits
// (an f16 KV cache) with F16C; one at a time for the tails.
AVX2 inline __m256 load8_wide(const float *p) { return _mm256_loadu_ps(p); }
AVX2 inline __m256 load8_wide(const uint16_t *p) { return load8_f16(p); }

// dot(a, b) with four accumulators; b f32 or f16 bits.
template <class T>
AVX2 float dot_wide_avx2(const float *a, const T *b, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8_wide(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8_wide(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), load8_wide(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), load8_wide(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8_wide(b + i), s0);
    float r = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; ++i) r += a[i] * wide1(b[i]);
    return r;
}
// y += a * x; x f32 or f16 bits.
template <class T>
AVX2 void axpy_wide_avx2(float a, const T *x, float *y, uint64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8_wide(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * wide1(x[i]);
}
// Blocks of NK <= 4 keys against two query heads (eight FMA chains in
// flight, one per (head, key)): each 8 columns of a key's KV-head slice are
// widened once and meet both heads' q (the heads of a GQA group share it;
// Shared says whether heads h and h+1 do), and the 4 keys' sums of a head
// leave through one horizontal-add tree into out[h*ldo + j..j+4]. Against
// one call per key (four heads per step, each head widening its own copy of
// the slice, a tree per 4 heads and a scalar transpose of the scores in the
// caller): decode attention at depth 512 on the 0.6B q4 file, 2 threads,
// 8 alternating rounds, mean 235 -> 209 us per layer (docs/performance.md,
// 2026-12-01 08:25).
// Accumulator (head, key) depends only on that pair, and lane i of the tree
// holds key i's sum whatever the other keys hold: missing keys of a short
// block are zeros and a key's score is the same in any block.
template <class T, int NK, bool Pair, bool Shared>
AVX2 __attribute__((always_inline)) inline void heads_dot_block(const float *q0, const float *q1, const T *k0,
                                                                const T *k1, uint64_t ldrow, uint32_t hd, float *o0,
                                                                float *o1) {
    __m256 acc[2][4];
    for (int p = 0; p < 2; ++p)
        for (int k = 0; k < 4; ++k) acc[p][k] = _mm256_setzero_ps();
    for (uint32_t d = 0; d < hd; d += 8) {
        const __m256 qa = _mm256_loadu_ps(q0 + d);
        const __m256 qb = Pair ? _mm256_loadu_ps(q1 + d) : qa;
#pragma GCC unroll 4
        for (int k = 0; k < NK; ++k) {
            const __m256 ka = load8_wide(k0 + k * ldrow + d);
            acc[0][k] = _mm256_fmadd_ps(qa, ka, acc[0][k]);
            if constexpr (Pair) acc[1][k] = _mm256_fmadd_ps(qb, Shared ? ka : load8_wide(k1 + k * ldrow + d), acc[1][k]);
        }
    }
    for (int p = 0; p < (Pair ? 2 : 1); ++p) {
        // lane i of the 128-bit result is key i's sum.
        const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(acc[p][0], acc[p][1]), _mm256_hadd_ps(acc[p][2], acc[p][3]));
        const __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        float *o = p ? o1 : o0;
        if constexpr (NK == 4) {
            _mm_storeu_ps(o, s);
        } else {
            alignas(16) float tmp[4];
            _mm_store_ps(tmp, s);
            for (int k = 0; k < NK; ++k) o[k] = tmp[k];
        }
    }
}
// The rows a dot block prefetches (heads_dot_*): its share of the lines of
// 4 rows' spans, so a 4-key step spreads its prefetches over its head
// blocks. All of them at the step's start (128 lines in the 0.6B shape)
// ran out of line fill buffers: perf put 41 % of the dot's time on the
// prefetch loop, and spread, the K pass at depth 2048 (28 caches) went
// from 299-310 to 238-279 us per layer (3 rounds).
// Block b takes `per` lines of each row, and one more while b < extra (set
// once per call, so a block pays no division).
struct DotPrefetch {
    const char *rows = nullptr;  // 4 rows ahead, nullptr: none
    uint64_t ldrow_bytes = 0, per = 0, extra = 0;
    DotPrefetch() = default;
    DotPrefetch(uint64_t ldrow_bytes_, uint64_t span_lines, uint32_t blocks)
        : ldrow_bytes(ldrow_bytes_), per(span_lines / blocks), extra(span_lines % blocks) {}
    inline void block(uint32_t b) const {
        if (rows == nullptr) return;
        const uint64_t l0 = b * per + std::min<uint64_t>(b, extra), l1 = l0 + per + (b < extra ? 1 : 0);
        for (int k = 0; k < 4; ++k)
            for (uint64_t l = l0; l < l1; ++l) _mm_prefetch(rows + k * ldrow_bytes + 64 * l, _MM_HINT_T0);
    }
};
// Heads h, h+1 take KV heads h / group, (h+1) / group: counted along the
// heads (head h = kv * group + i), not divided per block. The blocks and
// their head loops are always_inline: GCC had kept each block out of line,
// a call with two integer divisions and the accumulators through the stack
// per 4 keys and head pair. Inlined, decode attention at depth 2048 (28 f16
// caches, bench_qwen --attention) went from 625-660 to 571-585 us per
// layer (3 alternating rounds), before the prefetch was spread.
struct HeadWalk {
    uint32_t group, kv = 0, i = 0;
    uint32_t next() {  // this head's KV head, then step to the next head
        const uint32_t k = kv;
        if (++i == group) i = 0, ++kv;
        return k;
    }
};
template <class T, int NK>
AVX2 __attribute__((always_inline)) inline void heads_dot_keys(const float *q, const T *rows, uint64_t ldrow,
                                                               uint32_t n_heads, uint32_t group, uint32_t hd,
                                                               float *out, uint64_t ldo,
                                                               const DotPrefetch &pf = {}) {
    HeadWalk w{group};
    uint32_t h = 0;
    for (; h + 2 <= n_heads; h += 2) {
        pf.block(h / 2);
        const uint32_t g0 = w.next(), g1 = w.next();
        const float *q0 = q + uint64_t(h) * hd;
        const T *k0 = rows + uint64_t(g0) * hd, *k1 = rows + uint64_t(g1) * hd;
        float *o0 = out + uint64_t(h) * ldo;
        if (g0 == g1)
            heads_dot_block<T, NK, true, true>(q0, q0 + hd, k0, k1, ldrow, hd, o0, o0 + ldo);
        else
            heads_dot_block<T, NK, true, false>(q0, q0 + hd, k0, k1, ldrow, hd, o0, o0 + ldo);
    }
    if (h < n_heads) {
        pf.block(h / 2);
        heads_dot_block<T, NK, false, false>(q + uint64_t(h) * hd, nullptr, rows + uint64_t(w.next()) * hd, nullptr,
                                             ldrow, hd, out + uint64_t(h) * ldo, nullptr);
    }
}
// Both attention kernels read their run of cache rows (one KV head's slice
// of each, 2 KiB apart in the 0.6B shape) in an order the hardware
// prefetcher does not follow, so the rows this many keys ahead are
// prefetched in software. At depth 512 (as above, after the dot change):
// 209 -> 190 us per layer with 8 keys for both kernels; 16 keys: within the
// noise of 8 (175 / 167 us, 6 rounds). The per-key loop of the old dot saw
// no gain from 2-8 keys ahead: its time was in the widening and the trees.
constexpr uint64_t kDotKeysAhead = 8;
constexpr uint64_t kAxpyKeysAhead = 8;
// Into L1, a line per 64 bytes of [p, p + bytes).
inline void prefetch_span(const void *p, uint64_t bytes) {
    for (uint64_t off = 0; off < bytes; off += 64) _mm_prefetch(static_cast<const char *>(p) + off, _MM_HINT_T0);
}
template <class T>
AVX2 void heads_dot_avx2(const float *q, const T *rows, uint64_t ldrow, uint64_t n_keys, uint32_t n_heads,
                         uint32_t group, uint32_t hd, float *out, uint64_t ldo) {
    if (hd % 8 != 0) {
        for (uint64_t j = 0; j < n_keys; ++j)
            for (uint32_t h = 0; h < n_heads; ++h)
                out[h * ldo + j] = dot_wide_avx2(q + uint64_t(h) * hd, rows + j * ldrow + uint64_t(h / group) * hd, hd);
        return;
    }
    uint64_t j = 0;
    const uint64_t span = uint64_t((n_heads + group - 1) / group) * hd * sizeof(T);
    DotPrefetch pf(ldrow * sizeof(T), (span + 63) / 64, (n_heads + 1) / 2);
    for (; j + 4 <= n_keys; j += 4) {
        pf.rows = j + kDotKeysAhead + 4 <= n_keys ? reinterpret_cast<const char *>(rows + (j + kDotKeysAhead) * ldrow)
                                                  : nullptr;
        heads_dot_keys<T, 4>(q, rows + j * ldrow, ldrow, n_heads, group, hd, out + j, ldo, pf);
    }
    switch (n_keys - j) {
    case 3: heads_dot_keys<T, 3>(q, rows + j * ldrow, ldrow, n_heads, group, hd, out + j, ldo); break;
    case 2: heads_dot_keys<T, 2>(q, rows + j * ldrow, ldrow, n_heads, group, hd, out + j, ldo); break;
    case 1: heads_dot_keys<T, 1>(q, rows + j * ldrow, ldrow, n_heads, group, hd, out + j, ldo); break;
    default: break;
    }
}
template <class T>
AVX2 void heads_axpy_avx2(const float *a, uint64_t lda, const T *rows, uint64_t ldrow, uint64_t n_keys, uint32_t n_heads,
                          uint32_t group, uint32_t hd, float *o) {
    for (uint32_t h = 0; h < n_heads; ++h) {
        const float *ah = a + h * lda;
        const T *rh = rows + uint64_t(h / group) * hd;
        float *oh = o + uint64_t(h) * hd;
        uint32_t d = 0;
        // 64 columns of this head's output in 8 registers over the whole run.
        for (; d + 64 <= hd; d += 64) {
            __m256 acc[8];
            for (int i = 0; i < 8; ++i) acc[i] = _mm256_loadu_ps(oh + d + 8 * i);
            for (uint64_t j = 0; j < n_keys; ++j) {
                const __m256 va = _mm256_set1_ps(ah[j]);
                const T *r = rh + j * ldrow + d;
                // this block's 64 columns of that row (2 lines f16, 4 f32)
                if (j + kAxpyKeysAhead < n_keys) prefetch_span(r + kAxpyKeysAhead * ldrow, 64 * sizeof(T));
#pragma GCC unroll 8
                for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(va, load8_wide(r + 8 * i), acc[i]);
            }
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(oh + d + 8 * i, acc[i]);
        }
        if (d < hd)  // the rest of the columns as per-key axpys (the same operations per element)
            for (uint64_t j = 0; j < n_keys; ++j) axpy_wide_avx2(ah[j], rh + j * ldrow + d, oh + d, hd - d);
    }
}
AVX2 float dot_avx2(const float *a, const float *b, uint64_t n) { return dot_wide_avx2(a, b, n); }
AVX2 void axpy_avx2(float a, const float *x, float *y, uint64_t n) { axpy_wide_avx2(a, x, y, n); }
AVX2 float dot_f16_avx2(const float *a, const uint16_t *h, uint64_t n) { return dot_wide_avx2(a, h, n); }
AVX2 void axpy_f16_avx2(float a, const uint16_t *h, float *y, uint64_t n) { axpy_wide_avx2(a, h, y, n); }

// exp(x) for 8 lanes: Cephes' expf. x = n ln2 + r with |r| <= ln2/2 (ln2
// split in two for precision), exp(r) by a degree-7 polynomial, 2^n into the
// exponent bits. Inputs below -87.34 (results below the smallest normal
// float, and -inf) give 0; inputs are clamped above at 88.38 (2^127).
AVX2 inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365447505531f), hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// Eight lanes of running maxima: a single running max is a chain of
// dependent scalar maxss (with the scaling, ~9 % of decode attention at
// depth 2048 in perf before this). bench_qwen --attention, 3 alternating
// rounds: depth 2048 467-495 -> 419-454 us per layer, depth 256 34-41 -> 30-38.
AVX2 float scale_max_avx2(float *x, uint64_t n, float scale) {
    const __m256 s = _mm256_set1_ps(scale);
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
        _mm256_storeu_ps(x + i, v);
        m8 = _mm256_max_ps(m8, v);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m8);
    float m = -INFINITY;
    for (float l : lanes) m = std::max(m, l);
    for (; i < n; ++i) m = std::max(m, x[i] *= scale);
    return m;
}
AVX2 float exp_sum_avx2(float *x, uint64_t n, float sub) {
    const __m256 vs = _mm256_set1_ps(sub);
    __m256 acc = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum(acc);
    if (i < n) {  // the tail through the same polynomial, for one rounding behaviour per row
        alignas(32) float t[8];
        for (uint64_t j = 0; j < 8; ++j) t[j] = i + j < n ? x[i + j] - sub : -INFINITY;
        _mm256_store_ps(t, exp8(_mm256_load_ps(t)));
        for (uint64_t j = 0; i + j < n; ++j) sum += (x[i + j] = t[j]);
    }
    return sum;
}

AVX2 void silu_mul_avx2(const float *g, const float *u, uint64_t n, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

AVX2 void silu_avx2(const float *x, uint64_t n, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        const __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), xv)));
        _mm256_storeu_ps(out + i, _mm256_div_ps(xv, den));
    }
    for (; i < n; ++i) out[i] = x[i] / (1.0f + std::exp(-x[i]));
}

AVX2 void sigmoid_mul_avx2(const float *g, const float *u, uint64_t n, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g + i))));
        _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_loadu_ps(u + i), den));
    }
    for (; i < n; ++i) out[i] = u[i] / (1.0f + std::exp(-g[i]));
}

void matmul_avx2(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                 uint64_t r1, float *y, uint64_t ldy) {
    for (uint64_t r = r0; r < r1; ++r)
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = dot_avx2(w + r * cols, x + b * ldx, cols);
}

template <bool Bf16>
AVX2 inline __m256 load8(const uint16_t *p) {
    if constexpr (Bf16)
        return load8_bf16(p);
    else
        return load8_f16(p);
}

template <bool Bf16>
inline float h16_scalar(uint16_t h) {
    return Bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// One row at a time, read front to back as a single stream, with four
// accumulators to hide FMA latency; the other batch rows re-read it from L1.
// Decode is bandwidth-bound, so the point is to keep the weight stream going.
// The hardware prefetcher alone leaves bandwidth unused (and stops at 4 KiB
// page boundaries), so the stream is also prefetched kPrefetchAhead bytes
// ahead, a distance chosen per CPU (cmf/cpu_features.hpp). Measured on the
// 0.6B f16 file's bytes (2 threads, /tmp matvec harness, 2026-11-30, EPYC
// Zen 3): four interleaved row streams (the previous form, 8 KiB ahead)
// 14.8-16.9 GB/s; one stream 16.8-18.9 without prefetch, 20.3-23.4 with
// 1 KiB ahead (512 B and 2 KiB: lower). On the Intel VM (2026-12-01), the
// same harness: 1 KiB 18.0-18.7 GB/s, 4 KiB 22.1-23.3.
const long kPrefetchAhead = cmf::prefetch_ahead_bytes(cmf::PrefetchStream::light);
template <bool Bf16>
AVX2 void matmul_h16_avx2(const uint16_t *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch,
                          uint64_t r0, uint64_t r1, float *y, uint64_t ldy) {
    for (uint64_t r = r0; r < r1; ++r) {
        const uint16_t *wr = w + r * cols;
        for (uint64_t b = 0; b < n_batch; ++b) {
            const float *xb = x + b * ldx;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
                   a3 = _mm256_setzero_ps();
            uint64_t i = 0;
            for (; i + 32 <= cols; i += 32) {
                if (b == 0) _mm_prefetch(reinterpret_cast<const char *>(wr + i) + kPrefetchAhead, _MM_HINT_T0);
                a0 = _mm256_fmadd_ps(load8<Bf16>(wr + i), _mm256_loadu_ps(xb + i), a0);
                a1 = _mm256_fmadd_ps(load8<Bf16>(wr + i + 8), _mm256_loadu_ps(xb + i + 8), a1);
                a2 = _mm256_fmadd_ps(load8<Bf16>(wr + i + 16), _mm256_loadu_ps(xb + i + 16), a2);
                a3 = _mm256_fmadd_ps(load8<Bf16>(wr + i + 24), _mm256_loadu_ps(xb + i + 24), a3);
            }
            for (; i + 8 <= cols; i += 8) a0 = _mm256_fmadd_ps(load8<Bf16>(wr + i), _mm256_loadu_ps(xb + i), a0);
            float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            for (; i < cols; ++i) s += h16_scalar<Bf16>(wr[i]) * xb[i];
            y[b * ldy + r] = s;
        }
    }
}

AVX2 void narrow_f16_avx2(const float *src, uint64_t n, uint16_t *dst) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; ++i) dst[i] = f32_to_f16_rne(src[i]);
}

AVX2 void convert_f16_avx2(const uint16_t *src, uint64_t n, float *dst) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_f16(src + i));
    for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
AVX2 void dequant_q8_32_avx2(const uint8_t *src, uint64_t n_blocks, float *dst) {
    for (uint64_t b = 0; b < n_blocks; ++b, src += 34, dst += 32) {
        const __m256 d = _mm256_set1_ps(q8_scale(src));
        for (int j = 0; j < 4; ++j) {
            const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(src + 2 + 8 * j));
            _mm256_storeu_ps(dst + 8 * j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
        }
    }
}
// The q8 attention kernels read a row's heads once, in key order; rows this
// many keys ahead are prefetched (as kDotKeysAhead for the f16/f32 ones).
constexpr uint64_t kQ8KeysAhead = 8;
// A q8 block's 32 codes as four vectors of 8 floats.
AVX2 inline void q8_codes(const uint8_t *blk, __m256 c[4]) {
    for (int i = 0; i < 4; ++i)
        c[i] = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(blk + 2 + 8 * i))));
}
AVX2 void heads_dot_q8_avx2(const float *q, const uint8_t *rows, uint64_t ld_bytes, uint64_t n_keys, uint32_t n_heads,
                            uint32_t group, uint32_t hd, float *out, uint64_t ldo) {
    const uint32_t nb = hd / 32;
    const uint64_t span = uint64_t((n_heads + group - 1) / group) * nb * 34;
    for (uint64_t j = 0; j < n_keys; ++j) {
        const uint8_t *row = rows + j * ld_bytes;
        if (j + kQ8KeysAhead < n_keys) prefetch_span(row + kQ8KeysAhead * ld_bytes, span);
        for (uint32_t h0 = 0; h0 < n_heads; h0 += group) {
            const uint8_t *kb0 = row + uint64_t(h0 / group) * nb * 34;
            const uint32_t h1 = std::min(n_heads, h0 + group);
            // the group's heads four at a time: each block widened once per four heads
            for (uint32_t hc = h0; hc < h1; hc += 4) {
                const uint32_t nh = std::min(4u, h1 - hc);
                __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
                const uint8_t *kb = kb0;
                for (uint32_t b = 0; b < nb; ++b, kb += 34) {
                    __m256 c[4];
                    q8_codes(kb, c);
                    const __m256 d = _mm256_set1_ps(q8_scale(kb));
                    for (uint32_t i = 0; i < nh; ++i) {
                        const float *qb = q + uint64_t(hc + i) * hd + 32 * b;
                        __m256 t = _mm256_mul_ps(_mm256_loadu_ps(qb), c[0]);
                        t = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 8), c[1], t);
                        t = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 16), c[2], t);
                        t = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 24), c[3], t);
                        acc[i] = _mm256_fmadd_ps(d, t, acc[i]);
                    }
                }
                for (uint32_t i = 0; i < nh; ++i) out[(hc + i) * ldo + j] = hsum(acc[i]);
            }
        }
    }
}
AVX2 void heads_axpy_q8_avx2(const float *a, uint64_t lda, const uint8_t *rows, uint64_t ld_bytes, uint64_t n_keys,
                             uint32_t n_heads, uint32_t group, uint32_t hd, float *o) {
    const uint32_t nb = hd / 32;
    const uint64_t span = uint64_t((n_heads + group - 1) / group) * nb * 34;
    // Keys in order, each row read once: per block the codes are widened once
    // for the whole group, whose outputs (n_heads * hd floats) stay in L1.
    for (uint64_t j = 0; j < n_keys; ++j) {
        const uint8_t *row = rows + j * ld_bytes;
        if (j + kQ8KeysAhead < n_keys) prefetch_span(row + kQ8KeysAhead * ld_bytes, span);
        for (uint32_t h0 = 0; h0 < n_heads; h0 += group) {
            const uint32_t h1 = std::min(n_heads, h0 + group);
            const uint8_t *vb = row + uint64_t(h0 / group) * nb * 34;
            for (uint32_t b = 0; b < nb; ++b, vb += 34) {
                __m256 c[4];
                q8_codes(vb, c);
                const float d = q8_scale(vb);
                for (uint32_t h = h0; h < h1; ++h) {
                    const __m256 s = _mm256_set1_ps(a[h * lda + j] * d);
                    float *ob = o + uint64_t(h) * hd + 32 * b;
                    for (int i = 0; i < 4; ++i)
                        _mm256_storeu_ps(ob + 8 * i, _mm256_fmadd_ps(s, c[i], _mm256_loadu_ps(ob + 8 * i)));
                }
            }
        }
    }
}
AVX2 void convert_bf16_avx2(const uint16_t *src, uint64_t n, float *dst) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_bf16(src + i));
    for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// Prefill GEMM, outer-product form (the BLIS/GotoBLAS shape), on the packed
// layouts of kernels.hpp. Each micro-kernel step k multiplies 16 weights of
// one k (2 vectors, contiguous in the packed panel) by one activation of each
// of 6 tokens (broadcasts, contiguous in the packed block): 12 FMAs on 12
// accumulators per 8 loads, FMA-bound. The earlier dot-product form (4 rows x 3
// tokens) read 224 B per 12 FMAs and reached ~55 % of the FMA peak.
static_assert(kGemmRows == 16 && kGemmTokens == 6, "the AVX2 micro-kernel is 16 rows x 6 tokens");

// 8x8 transpose in registers: r[i] holds row i on entry, column i on exit.
AVX2 inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// One weight panel: pk[k*16 + i] = rows[i*ld + k] for i < n_rows, 0 for
// n_rows <= i < 16. 8x8 blocks through registers (a scalar strided copy
// cost ~20 % of the GEMM itself at 512 tokens).
AVX2 void pack_panel(const float *rows, uint64_t ld, uint64_t n_rows, uint64_t cols, float *pk) {
    uint64_t k = 0;
    for (; k + 8 <= cols; k += 8)
        for (uint64_t half = 0; half < 2; ++half) {
            __m256 r[8];
            for (uint64_t i = 0; i < 8; ++i) {
                const uint64_t row = half * 8 + i;
                r[i] = row < n_rows ? _mm256_loadu_ps(rows + row * ld + k) : _mm256_setzero_ps();
            }
            transpose8(r);
            for (uint64_t j = 0; j < 8; ++j) _mm256_storeu_ps(pk + (k + j) * kGemmRows + half * 8, r[j]);
        }
    for (; k < cols; ++k) {
        float *dst = pk + k * kGemmRows;
        uint64_t i = 0;
        for (; i < n_rows; ++i) dst[i] = rows[i * ld + k];
        for (; i < kGemmRows; ++i) dst[i] = 0.0f;
    }
}

AVX2 void pack_w_avx2(const float *w, uint64_t ldw, uint64_t n_rows, uint64_t cols, float *wp) {
    for (uint64_t r0 = 0; r0 < n_rows; r0 += kGemmRows)
        pack_panel(w + r0 * ldw, ldw, std::min(kGemmRows, n_rows - r0), cols, wp + r0 * cols);
}

// Token blocks: the same 8x8 transpose over 6 token rows and 2 zero rows;
// each k stores exactly its 6 floats (128 + 64 bits), never into the next
// k's or the next block's place: blocks are packed by different threads.
AVX2 void pack_x_avx2(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t b0, uint64_t b1,
                      float *xp) {
    for (uint64_t b = b0; b < b1; ++b) {
        const uint64_t t0 = b * kGemmTokens, nt = std::min(kGemmTokens, n_batch - t0);
        const float *xb = x + t0 * ldx;
        float *dst = xp + b * cols * kGemmTokens;
        uint64_t k = 0;
        for (; k + 8 <= cols; k += 8) {
            __m256 r[8];
            for (uint64_t i = 0; i < 8; ++i) r[i] = i < nt ? _mm256_loadu_ps(xb + i * ldx + k) : _mm256_setzero_ps();
            transpose8(r);
            for (uint64_t j = 0; j < 8; ++j) {
                float *d = dst + (k + j) * kGemmTokens;
                _mm_storeu_ps(d, _mm256_castps256_ps128(r[j]));
                _mm_storel_pi(reinterpret_cast<__m64 *>(d + 4), _mm256_extractf128_ps(r[j], 1));
            }
        }
        for (; k < cols; ++k)
            for (uint64_t t = 0; t < kGemmTokens; ++t) dst[k * kGemmTokens + t] = t < nt ? xb[t * ldx + k] : 0.0f;
    }
}

// out[t*16 + i] = sum_k wp[k*16 + i] * xb[k*6 + t]: one panel (16 rows) by
// one token block (6 tokens), all of k; y[t*ldy + i] for i < nr, t < nt.
AVX2 void micro_16x6(const float *wp, const float *xb, uint64_t cols, float *y, uint64_t ldy, uint64_t nr,
                     uint64_t nt) {
    // Fully unrolled (GCC keeps the loops otherwise, and with them the
    // accumulators in memory): 12 accumulators stay in ymm registers.
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int t = 0; t < 6; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (uint64_t k = 0; k < cols; ++k) {
        const __m256 w0 = _mm256_loadu_ps(wp + k * 16), w1 = _mm256_loadu_ps(wp + k * 16 + 8);
#pragma GCC unroll 6
        for (int t = 0; t < 6; ++t) {
            const __m256 xv = _mm256_broadcast_ss(xb + k * 6 + t);
            acc[t][0] = _mm256_fmadd_ps(w0, xv, acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, xv, acc[t][1]);
        }
    }
    if (nr == 16 && nt == 6) {
#pragma GCC unroll 6
        for (int t = 0; t < 6; ++t) {
            _mm256_storeu_ps(y + t * ldy, acc[t][0]);
            _mm256_storeu_ps(y + t * ldy + 8, acc[t][1]);
        }
        return;
    }
    alignas(32) float out[6][16];
#pragma GCC unroll 6
    for (int t = 0; t < 6; ++t) {
        _mm256_store_ps(out[t], acc[t][0]);
        _mm256_store_ps(out[t] + 8, acc[t][1]);
    }
    for (uint64_t t = 0; t < nt; ++t) std::memcpy(y + t * ldy, out[t], nr * sizeof(float));
}

// Loop order: each panel (16 x cols floats: 64 KiB at cols = 1024, packed
// just before by the caller, so L2-resident) meets every token block in turn;
// the token blocks stream from the shared packed activations, one
// sequential 24-byte-per-k stream. Measured alternatives (single thread,
// 1024x3072 and 3072x1024, 512 tokens, same session): blocking k by 256
// (the panel's slice in L1, the activations' k-slice in L2) was ~5 %
// slower; the kernel runs at 75-90 % of the FMA peak either way.
AVX2 void gemm_packed_avx2(const float *wp, uint64_t n_rows, uint64_t cols, const float *xp, uint64_t n_batch,
                           float *y, uint64_t ldy) {
    const uint64_t blocks = gemm_x_blocks(n_batch);
    for (uint64_t r0 = 0; r0 < n_rows; r0 += kGemmRows) {
        const uint64_t nr = std::min(kGemmRows, n_rows - r0);
        const float *wpanel = wp + r0 * cols;
        for (uint64_t b = 0; b < blocks; ++b) {
            const uint64_t t0 = b * kGemmTokens;
            micro_16x6(wpanel, xp + b * cols * kGemmTokens, cols, y + t0 * ldy + r0, ldy, nr,
                       std::min(kGemmTokens, n_batch - t0));
        }
    }
}

#undef AVX2

__attribute__((target("avx512f"))) float dot_avx512(const float *a, const float *b, uint64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    uint64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    // Horizontal sum by hand: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized.
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    float r = 0.0f;
    for (float l : lanes) r += l;
    return r;
}

void matmul_avx512(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                   uint64_t r1, float *y, uint64_t ldy) {
    for (uint64_t r = r0; r < r1; ++r)
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = dot_avx512(w + r * cols, x + b * ldx, cols);
}

// The prefill GEMM's micro-kernel on zmm: a packed panel's 16 rows of one k
// are exactly one zmm, so two adjacent panels (32 rows) x 6 tokens take 2
// loads and 6 broadcasts per 12 FMAs of 16 lanes, twice the AVX2 kernel's
// work per instruction. Each output is the same k-ordered chain of FMAs as
// in micro_16x6, so the results are the same bits. (Written out again rather
// than shared through a template: one template would carry one target
// attribute, and an AVX-512 one on the AVX2 path would break AVX2-only CPUs.)
#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
AVX512 void micro_32x6(const float *wp0, const float *wp1, const float *xb, uint64_t cols, float *y, uint64_t ldy,
                       uint64_t nr, uint64_t nt) {
    __m512 acc[6][2];
#pragma GCC unroll 6
    for (int t = 0; t < 6; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (uint64_t k = 0; k < cols; ++k) {
        const __m512 w0 = _mm512_loadu_ps(wp0 + k * 16), w1 = _mm512_loadu_ps(wp1 + k * 16);
#pragma GCC unroll 6
        for (int t = 0; t < 6; ++t) {
            const __m512 xv = _mm512_set1_ps(xb[k * 6 + t]);
            acc[t][0] = _mm512_fmadd_ps(w0, xv, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, xv, acc[t][1]);
        }
    }
    if (nr == 32 && nt == 6) {
#pragma GCC unroll 6
        for (int t = 0; t < 6; ++t) {
            _mm512_storeu_ps(y + t * ldy, acc[t][0]);
            _mm512_storeu_ps(y + t * ldy + 16, acc[t][1]);
        }
        return;
    }
    alignas(64) float out[6][32];
#pragma GCC unroll 6
    for (int t = 0; t < 6; ++t) {
        _mm512_store_ps(out[t], acc[t][0]);
        _mm512_store_ps(out[t] + 16, acc[t][1]);
    }
    for (uint64_t t = 0; t < nt; ++t) std::memcpy(y + t * ldy, out[t], nr * sizeof(float));
}

// gemm_packed_avx2's loop order, two panels at a time; a last lone panel
// takes the AVX2 micro-kernel.
AVX512 void gemm_packed_avx512(const float *wp, uint64_t n_rows, uint64_t cols, const float *xp, uint64_t n_batch,
                               float *y, uint64_t ldy) {
    const uint64_t blocks = gemm_x_blocks(n_batch);
    for (uint64_t r0 = 0; r0 < n_rows; r0 += 2 * kGemmRows) {
        const uint64_t nr = std::min(2 * kGemmRows, n_rows - r0);
        const float *wpanel = wp + r0 * cols;
        for (uint64_t b = 0; b < blocks; ++b) {
            const uint64_t t0 = b * kGemmTokens, nt = std::min(kGemmTokens, n_batch - t0);
            if (nr > kGemmRows)
                micro_32x6(wpanel, wpanel + kGemmRows * cols, xp + b * cols * kGemmTokens, cols, y + t0 * ldy + r0, ldy,
                           nr, nt);
            else
                micro_16x6(wpanel, xp + b * cols * kGemmTokens, cols, y + t0 * ldy + r0, ldy, nr, nt);
        }
    }
}
// exp8's Cephes polynomial on 16 lanes: the same operations per element,
// so the same bits as exp8 (written out again, as micro_32x6 is: a shared
// template would carry one target attribute). (maskz forms with every lane set: GCC 12's
// plain max, min, roundscale, cvtps and slli start from an undefined
// register and trip -Wmaybe-uninitialized.)
AVX512 inline __m512 exp16(__m512 x) {
    constexpr __mmask16 all = 0xFFFF;
    const __m512 lo = _mm512_set1_ps(-87.3365447505531f), hi = _mm512_set1_ps(88.3762626647949f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_maskz_min_ps(all, _mm512_maskz_max_ps(all, x, lo), hi);
    const __m512 n = _mm512_maskz_roundscale_ps(all, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_maskz_slli_epi32(
        all, _mm512_add_epi32(_mm512_maskz_cvtps_epi32(all, n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(static_cast<__mmask16>(~under), p, _mm512_castsi512_ps(e));
}
inline __mmask16 tail_mask16(uint64_t left) { return static_cast<__mmask16>((1u << left) - 1u); }
// Two sums in flight (one exp16 chain per 16 elements is short; the adds
// were the loop's critical path at 8 lanes). Prefill attention spent 11 %
// of its time in exp_sum_avx2 at depth 4096.
AVX512 float exp_sum_avx512(float *x, uint64_t n, float sub) {
    const __m512 vs = _mm512_set1_ps(sub);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vs));
        const __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vs));
        _mm512_storeu_ps(x + i, e0);
        _mm512_storeu_ps(x + i + 16, e1);
        acc0 = _mm512_add_ps(acc0, e0);
        acc1 = _mm512_add_ps(acc1, e1);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask16(n - i);
        const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vs)));
        _mm512_mask_storeu_ps(x + i, m, e);
        acc0 = _mm512_add_ps(acc0, e);
    }
    alignas(64) float lanes[16];  // (by hand: see dot_avx512)
    _mm512_store_ps(lanes, _mm512_add_ps(acc0, acc1));
    float sum = 0.0f;
    for (float l : lanes) sum += l;
    return sum;
}
AVX512 float scale_max_avx512(float *x, uint64_t n, float scale) {
    const __m512 s = _mm512_set1_ps(scale);
    __m512 m16 = _mm512_set1_ps(-INFINITY);
    for (uint64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask16(n - i);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
        _mm512_mask_storeu_ps(x + i, m, v);
        m16 = _mm512_mask_max_ps(m16, m, m16, v);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, m16);
    float mx = -INFINITY;
    for (float l : lanes) mx = std::max(mx, l);
    return mx;
}

// Decode attention on zmm (an f16 or f32 KV cache): the AVX2 kernels'
// loops with 16 columns per instruction, so a key's slice of 128 head dims
// is 8 widenings and 8 FMAs per head instead of 16 and 16. Each (head, key)
// sum and each output element is still its own chain in key order, so a run
// gives the bits of one-key calls (tested), like the AVX2 kernels; the two
// sets differ from each other in the summation order of a dot. The block and
// key loops repeat the AVX2 ones on purpose, as micro_32x6 does: a shared
// template carries one target attribute, and the blocks must inline into
// their loops (an out-of-line call per 4 keys and head pair).
template <class T>
AVX512 inline __m512 load16_wide(const T *p) {
    if constexpr (std::is_same_v<T, float>)
        return _mm512_loadu_ps(p);
    else
        // (maskz: the plain form starts from an undefined register, see sums4.)
        return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}
// Lane i of the result is acc[i]'s sum (i < 4).
AVX512 inline __m128 sums4(const __m512 acc[4]) {
    __m256 h[4];
    for (int k = 0; k < 4; ++k) {
        // (maskz: GCC 12's plain extract and cast start from an undefined
        // register and trip -Wuninitialized.)
        const __m512d a = _mm512_castps_pd(acc[k]);
        h[k] = _mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, a, 0)),
                             _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, a, 1)));
    }
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}
// o[k] = the sum of acc[k] for k < NK.
template <int NK>
AVX512 __attribute__((always_inline)) inline void store_sums4(const __m512 acc[4], float *o) {
    const __m128 s = sums4(acc);
    if constexpr (NK == 4) {
        _mm_storeu_ps(o, s);
    } else {
        alignas(16) float tmp[4];
        _mm_store_ps(tmp, s);
        for (int k = 0; k < NK; ++k) o[k] = tmp[k];
    }
}
// heads_dot_block on zmm (see there): NK <= 4 keys against a pair of heads.
template <class T, int NK, bool Pair, bool Shared>
AVX512 __attribute__((always_inline)) inline void heads_dot_block16(const float *q0, const float *q1, const T *k0,
                                                                    const T *k1, uint64_t ldrow, uint32_t hd,
                                                                    float *o0, float *o1) {
    __m512 acc[2][4];
    for (int p = 0; p < 2; ++p)
        for (int k = 0; k < 4; ++k) acc[p][k] = _mm512_setzero_ps();
    for (uint32_t d = 0; d < hd; d += 16) {
        const __m512 qa = _mm512_loadu_ps(q0 + d);
        const __m512 qb = Pair ? _mm512_loadu_ps(q1 + d) : qa;
#pragma GCC unroll 4
        for (int k = 0; k < NK; ++k) {
            const __m512 ka = load16_wide(k0 + k * ldrow + d);
            acc[0][k] = _mm512_fmadd_ps(qa, ka, acc[0][k]);
            if constexpr (Pair) acc[1][k] = _mm512_fmadd_ps(qb, Shared ? ka : load16_wide(k1 + k * ldrow + d), acc[1][k]);
        }
    }
    store_sums4<NK>(acc[0], o0);
    if constexpr (Pair) store_sums4<NK>(acc[1], o1);
}
template <class T, int NK>
AVX512 __attribute__((always_inline)) inline void heads_dot_keys16(const float *q, const T *rows, uint64_t ldrow,
                                                                   uint32_t n_heads, uint32_t group, uint32_t hd,
                                                                   float *out, uint64_t ldo,
                                                                   const DotPrefetch &pf = {}) {
    HeadWalk w{group};
    uint32_t h = 0;
    for (; h + 2 <= n_heads; h += 2) {
        pf.block(h / 2);
        const uint32_t g0 = w.next(), g1 = w.next();
        const float *q0 = q + uint64_t(h) * hd;
        const T *k0 = rows + uint64_t(g0) * hd, *k1 = rows + uint64_t(g1) * hd;
        float *o0 = out + uint64_t(h) * ldo;
        if (g0 == g1)
            heads_dot_block16<T, NK, true, true>(q0, q0 + hd, k0, k1, ldrow, hd, o0, o0 + ldo);
        else
            heads_dot_block16<T, NK, true, false>(q0, q0 + hd, k0, k1, ldrow, hd, o0, o0 + ldo);
    }
    if (h < n_heads) {
        pf.block(h / 2);
        heads_dot_block16<T, NK, false, false>(q + uint64_t(h) * hd, nullptr, rows + uint64_t(w.next()) * hd, nullptr,
                                               ldrow, hd, out + uint64_t(h) * ldo, nullptr);
    }
}
template <class T>
AVX512 void heads_dot_avx512(const float *q, const T *rows, uint64_t ldrow, uint64_t n_keys, uint32_t n_heads,
                             uint32_t group, uint32_t hd, float *out, uint64_t ldo) {
    if (hd % 16 != 0) return heads_dot_avx2(q, rows, ldrow, n_keys, n_heads, group, hd, out, ldo);
    uint64_t j = 0;
    const uint64_t span = uint64_t((n_heads + group - 1) / group) * hd * sizeof(T);
    DotPrefetch pf(ldrow * sizeof(T), (span + 63) / 64, (n_heads + 1) / 2);
    for (; j + 4 <= n_keys; j += 4) {
        pf.rows = j + kDotKeysAhead + 4 <= n_keys ? reinterpret_cast<const char *>(rows + (j + kDotKeysAhead) * ldrow)
                                                  : nullptr;
        heads_dot_keys16<T, 4>(q, rows + j * ldrow, ldrow, n_heads, group, hd, out + j, ldo, pf);
    }
    switch (n_keys - j) {
    case 3: heads_dot_keys16<T, 3>(q, rows + j * ldrow, ldrow, n_heads, group, hd, out + j, ldo); break;
    case 2: heads_dot_keys16<T, 2>(q, rows + j * ldrow, ldrow, n_heads, group, hd, out + j, ldo); break;
    case 1: heads_dot_keys16<T, 1>(q, rows + j * ldrow, ldrow, n_heads, group, hd, out + j, ldo); break;
    default: break;
    }
}
// heads_axpy_avx2 with 128 columns of a head's output in 8 zmm registers
// over the run (the whole head at the 0.6B shape's head_dim). Two heads of
// one GQA group run together (16 accumulators): each V row is loaded and
// widened once for both, where a head at a time widened it once per head
// (the widening was half the kernel's vector work). Each head's sums are
// the same operations in the same order either way.
template <class T, bool Pair>
AVX512 inline void heads_axpy_block16(const float *a0, const float *a1, const T *rh, uint64_t ldrow,
                                      uint64_t n_keys, float *o0, float *o1) {
    __m512 acc0[8], acc1[8];
    for (int i = 0; i < 8; ++i) {
        acc0[i] = _mm512_loadu_ps(o0 + 16 * i);
        acc1[i] = Pair ? _mm512_loadu_ps(o1 + 16 * i) : acc0[i];
    }
    for (uint64_t j = 0; j < n_keys; ++j) {
        const __m512 va = _mm512_set1_ps(a0[j]);
        const __m512 vb = Pair ? _mm512_set1_ps(a1[j]) : va;
        const T *r = rh + j * ldrow;
        if (j + kAxpyKeysAhead < n_keys) prefetch_span(r + kAxpyKeysAhead * ldrow, 128 * sizeof(T));
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
            const __m512 v = load16_wide(r + 16 * i);
            acc0[i] = _mm512_fmadd_ps(va, v, acc0[i]);
            if constexpr (Pair) acc1[i] = _mm512_fmadd_ps(vb, v, acc1[i]);
        }
    }
    for (int i = 0; i < 8; ++i) {
        _mm512_storeu_ps(o0 + 16 * i, acc0[i]);
        if constexpr (Pair) _mm512_storeu_ps(o1 + 16 * i, acc1[i]);
    }
}
template <class T>
AVX512 void heads_axpy_avx512(const float *a, uint64_t lda, const T *rows, uint64_t ldrow, uint64_t n_keys,
                              uint32_t n_heads, uint32_t group, uint32_t hd, float *o) {
    if (hd % 128 != 0) return heads_axpy_avx2(a, lda, rows, ldrow, n_keys, n_heads, group, hd, o);
    for (uint32_t h = 0; h < n_heads;) {
        const bool pair = h + 1 < n_heads && (h + 1) / group == h / group;
        const T *rh = rows + uint64_t(h / group) * hd;
        float *o0 = o + uint64_t(h) * hd;
        for (uint32_t d = 0; d < hd; d += 128) {
            if (pair)
                heads_axpy_block16<T, true>(a + h * lda, a + (h + 1) * lda, rh + d, ldrow, n_keys, o0 + d, o0 + hd + d);
            else
                heads_axpy_block16<T, false>(a + h * lda, nullptr, rh + d, ldrow, n_keys, o0 + d, nullptr);
        }
        h += pair ? 2 : 1;
    }
}
// Decode attention over a q8 cache (CMF_KV_DTYPE_Q8_32, heads of whole
// blocks) on zmm: a block's 32 codes as two vectors of 16 floats (two
// sign extensions and two converts, where the AVX2 kernels take four of
// each), its f16 scale by a broadcast and one convert, and the loops of the
// f16 kernels above: four keys against a pair of heads (a block widened once
// for both heads of a GQA pair), the (head, key) sums reduced four at a time
// (sums4) instead of one tree per key and head, V's outputs held in
// registers over the run. The AVX2 kernels read a q8 cache at 10.5 GB/s on
// two cores of the Intel Xeon VM at depth 4096, under half of what its f16
// cache streams at: their widening and the per-key trees were the work.
// The dot keeps the contract's form, d * (q . c) per block; the axpy adds
// (a * d) * c per key in key order, the AVX2 kernel's operations. The key
// and head loops repeat the f16 kernels' on purpose, for the reason given
// there (one target attribute per template, the blocks inlined into their
// loops): here a head is a run of 34-byte blocks, not of elements.
// (maskz forms: the plain ones start from an undefined register, see sums4.)
AVX512 inline void q8_codes16(const uint8_t *blk, __m512 &lo, __m512 &hi) {
    constexpr __mmask16 all = 0xFFFF;
    lo = _mm512_maskz_cvtepi32_ps(
        all, _mm512_maskz_cvtepi8_epi32(all, _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2))));
    hi = _mm512_maskz_cvtepi32_ps(
        all, _mm512_maskz_cvtepi8_epi32(all, _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 18))));
}
AVX512 inline __m512 q8_scale16(const uint8_t *blk) {
    uint16_t h;
    std::memcpy(&h, blk, 2);
    return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_set1_epi16(static_cast<short>(h)));
}
// NK <= 4 keys against a pair of heads (k0, k1: the heads' first blocks in
// key 0's row); nb blocks a head.
template <int NK, bool Pair, bool Shared>
AVX512 __attribute__((always_inline)) inline void heads_dot_q8_block16(const float *q0, const float *q1,
                                                                       const uint8_t *k0, const uint8_t *k1,
                                                                       uint64_t ld_bytes, uint32_t nb, float *o0,
                                                                       float *o1) {
    __m512 acc[2][4];
    for (int p = 0; p < 2; ++p)
        for (int k = 0; k < 4; ++k) acc[p][k] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; ++b) {
        const __m512 qa0 = _mm512_loadu_ps(q0 + 32 * b), qa1 = _mm512_loadu_ps(q0 + 32 * b + 16);
        const __m512 qb0 = Pair ? _mm512_loadu_ps(q1 + 32 * b) : qa0, qb1 = Pair ? _mm512_loadu_ps(q1 + 32 * b + 16) : qa1;
#pragma GCC unroll 4
        for (int k = 0; k < NK; ++k) {
            const uint8_t *ka = k0 + k * ld_bytes + 34 * b;
            __m512 c0, c1;
            q8_codes16(ka, c0, c1);
            const __m512 da = q8_scale16(ka);
            acc[0][k] = _mm512_fmadd_ps(da, _mm512_fmadd_ps(qa1, c1, _mm512_mul_ps(qa0, c0)), acc[0][k]);
            if constexpr (Pair) {
                if constexpr (Shared) {
                    acc[1][k] = _mm512_fmadd_ps(da, _mm512_fmadd_ps(qb1, c1, _mm512_mul_ps(qb0, c0)), acc[1][k]);
                } else {
                    const uint8_t *kb = k1 + k * ld_bytes + 34 * b;
                    __m512 e0, e1;
                    q8_codes16(kb, e0, e1);
                    acc[1][k] = _mm512_fmadd_ps(q8_scale16(kb), _mm512_fmadd_ps(qb1, e1, _mm512_mul_ps(qb0, e0)),
                                                acc[1][k]);
                }
            }
        }
    }
    store_sums4<NK>(acc[0], o0);
    if constexpr (Pair) store_sums4<NK>(acc[1], o1);
}
template <int NK>
AVX512 __attribute__((always_inline)) inline void heads_dot_q8_keys16(const float *q, const uint8_t *rows,
                                                                      uint64_t ld_bytes, uint32_t n_heads,
                                                                      uint32_t group, uint32_t hd, float *out,
                                                                      uint64_t ldo, const DotPrefetch &pf = {}) {
    const uint32_t nb = hd / 32;
    HeadWalk w{group};
    uint32_t h = 0;
    for (; h + 2 <= n_heads; h += 2) {
        pf.block(h / 2);
        const uint32_t g0 = w.next(), g1 = w.next();
        const float *q0 = q + uint64_t(h) * hd;
        const uint8_t *k0 = rows + uint64_t(g0) * nb * 34, *k1 = rows + uint64_t(g1) * nb * 34;
        float *o0 = out + uint64_t(h) * ldo;
        if (g0 == g1)
            heads_dot_q8_block16<NK, true, true>(q0, q0 + hd, k0, k1, ld_bytes, nb, o0, o0 + ldo);
        else
            heads_dot_q8_block16<NK, true, false>(q0, q0 + hd, k0, k1, ld_bytes, nb, o0, o0 + ldo);
    }
    if (h < n_heads) {
        pf.block(h / 2);
        heads_dot_q8_block16<NK, false, false>(q + uint64_t(h) * hd, nullptr, rows + uint64_t(w.next()) * nb * 34,
                                               nullptr, ld_bytes, nb, out + uint64_t(h) * ldo, nullptr);
    }
}
AVX512 void heads_dot_q8_avx512(const float *q, const uint8_t *rows, uint64_t ld_bytes, uint64_t n_keys,
                                uint32_t n_heads, uint32_t group, uint32_t hd, float *out, uint64_t ldo) {
    const uint64_t span = uint64_t((n_heads + group - 1) / group) * (hd / 32) * 34;
    DotPrefetch pf(ld_bytes, (span + 63) / 64, (n_heads + 1) / 2);
    uint64_t j = 0;
    for (; j + 4 <= n_keys; j += 4) {
        pf.rows = j + kQ8KeysAhead + 4 <= n_keys ? reinterpret_cast<const char *>(rows + (j + kQ8KeysAhead) * ld_bytes)
                                                 : nullptr;
        heads_dot_q8_keys16<4>(q, rows + j * ld_bytes, ld_bytes, n_heads, group, hd, out + j, ldo, pf);
    }
    switch (n_keys - j) {
    case 3: heads_dot_q8_keys16<3>(q, rows + j * ld_bytes, ld_bytes, n_heads, group, hd, out + j, ldo); break;
    case 2: heads_dot_q8_keys16<2>(q, rows + j * ld_bytes, ld_bytes, n_heads, group, hd, out + j, ldo); break;
    case 1: heads_dot_q8_keys16<1>(q, rows + j * ld_bytes, ld_bytes, n_heads, group, hd, out + j, ldo); break;
    default: break;
    }
}
// 128 columns (four blocks) of a head's output in 8 zmm registers over the
// run; a pair of heads sharing a KV head widens each block once for both.
template <bool Pair>
AVX512 inline void heads_axpy_q8_block16(const float *a0, const float *a1, const uint8_t *rh, uint64_t ld_bytes,
                                         uint64_t n_keys, float *o0, float *o1) {
    __m512 acc0[8], acc1[8];
    for (int i = 0; i < 8; ++i) {
        acc0[i] = _mm512_loadu_ps(o0 + 16 * i);
        acc1[i] = Pair ? _mm512_loadu_ps(o1 + 16 * i) : acc0[i];
    }
    for (uint64_t j = 0; j < n_keys; ++j) {
        const uint8_t *r = rh + j * ld_bytes;
        if (j + kQ8KeysAhead < n_keys) prefetch_span(r + kQ8KeysAhead * ld_bytes, 4 * 34);
        // a * d as vectors: the same f32 products as the scalar ones, without
        // a scalar convert, two multiplies and two broadcasts per block
        const __m512 va = _mm512_set1_ps(a0[j]), vb = Pair ? _mm512_set1_ps(a1[j]) : va;
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b) {
            const __m512 d = q8_scale16(r + 34 * b);
            __m512 c0, c1;
            q8_codes16(r + 34 * b, c0, c1);
            const __m512 sa = _mm512_mul_ps(va, d);
            acc0[2 * b] = _mm512_fmadd_ps(sa, c0, acc0[2 * b]);
            acc0[2 * b + 1] = _mm512_fmadd_ps(sa, c1, acc0[2 * b + 1]);
            if constexpr (Pair) {
                const __m512 sb = _mm512_mul_ps(vb, d);
                acc1[2 * b] = _mm512_fmadd_ps(sb, c0, acc1[2 * b]);
                acc1[2 * b + 1] = _mm512_fmadd_ps(sb, c1, acc1[2 * b + 1]);
            }
        }
    }
    for (int i = 0; i < 8; ++i) {
        _mm512_storeu_ps(o0 + 16 * i, acc0[i]);
        if constexpr (Pair) _mm512_storeu_ps(o1 + 16 * i, acc1[i]);
    }
}
AVX512 void heads_axpy_q8_avx512(const float *a, uint64_t lda, const uint8_t *rows, uint64_t ld_bytes, uint64_t n_keys,
                                 uint32_t n_heads, uint32_t group, uint32_t hd, float *o) {
    if (hd % 128 != 0) return heads_axpy_q8_avx2(a, lda, rows, ld_bytes, n_keys, n_heads, group, hd, o);
    const uint32_t nb = hd / 32;
    for (uint32_t h = 0; h < n_heads;) {
        const bool pair = h + 1 < n_heads && (h + 1) / group == h / group;
        const uint8_t *rh = rows + uint64_t(h / group) * nb * 34;
        float *o0 = o + uint64_t(h) * hd;
        for (uint32_t d = 0; d < hd; d += 128) {
            if (pair)
                heads_axpy_q8_block16<true>(a + h * lda, a + (h + 1) * lda, rh + d / 32 * 34, ld_bytes, n_keys, o0 + d,
                                            o0 + hd + d);
            else
                heads_axpy_q8_block16<false>(a + h * lda, nullptr, rh + d / 32 * 34, ld_bytes, n_keys, o0 + d, nullptr);
        }
        h += pair ? 2 : 1;
    }
}
#undef AVX512
#endif

const Kernels kPortable{"portable",
                        matmul_portable,
                        matmul_h16_generic<convert_f16_portable, dot_portable>,
                        matmul_h16_generic<convert_bf16_portable, dot_portable>,
                        convert_f16_portable,
                        convert_bf16_portable,
                        gemm_panel_generic<pack_w_portable, pack_x_portable, gemm_packed_portable>,
                        pack_w_portable,
                        pack_x_portable,
                        gemm_packed_portable,
                        dot_portable,
                        axpy_portable,
                        exp_sum_portable,
                        scale_max_portable,
                        silu_mul_portable,
                        dot_f16_portable,
                        axpy_f16_portable,
                        narrow_f16_portable,
                        heads_dot_portable<float>,
                        heads_dot_portable<uint16_t>,
                        heads_axpy_portable<float>,
                        heads_axpy_portable<uint16_t>,
                        quant_q8_32,
                        dequant_q8_32_portable,
                        heads_dot_q8_portable,
                        heads_axpy_q8_portable,
                        silu_portable,
                        sigmoid_mul_portable};
#ifdef CMF_X86
constexpr GemmPanelFn gemm_panel_avx2 = gemm_panel_generic<pack_w_avx2, pack_x_avx2, gemm_packed_avx2>;
const Kernels kAvx2{"avx2",           matmul_avx2,      matmul_h16_avx2<false>, matmul_h16_avx2<true>,
                    convert_f16_avx2, convert_bf16_avx2, gemm_panel_avx2,       pack_w_avx2,
                    pack_x_avx2,      gemm_packed_avx2,  dot_avx2,              axpy_avx2,
                    exp_sum_avx2,     scale_max_avx2,    silu_mul_avx2,         dot_f16_avx2,
                    axpy_f16_avx2,    narrow_f16_avx2,   heads_dot_avx2<float>, heads_dot_avx2<uint16_t>,
                    heads_axpy_avx2<float>, heads_axpy_avx2<uint16_t>, quant_q8_32, dequant_q8_32_avx2, heads_dot_q8_avx2, heads_axpy_q8_avx2,
                    silu_avx2,        sigmoid_mul_avx2};
// AVX-512 machines get the 512-bit f32 dot, GEMM micro-kernel, softmax
// pieces and decode attention; the 16-bit matmul kernels are the AVX2 ones (memory-bound: the
// width does not matter).
constexpr GemmPanelFn gemm_panel_avx512 = gemm_panel_generic<pack_w_avx2, pack_x_avx2, gemm_packed_avx512>;
const Kernels kAvx512{"avx512",         matmul_avx512,     matmul_h16_avx2<false>, matmul_h16_avx2<true>,
                      convert_f16_avx2, convert_bf16_avx2, gemm_panel_avx512,      pack_w_avx2,
                      pack_x_avx2,      gemm_packed_avx512, dot_avx512,            axpy_avx2,
                      exp_sum_avx512,   scale_max_avx512,  silu_mul_avx2,          dot_f16_avx2,
                      axpy_f16_avx2,    narrow_f16_avx2,   heads_dot_avx512<float>, heads_dot_avx512<uint16_t>,
                      heads_axpy_avx512<float>, heads_axpy_avx512<uint16_t>, quant_q8_32, dequant_q8_32_avx2, heads_dot_q8_avx512, heads_axpy_q8_avx512,
                      silu_avx2,        sigmoid_mul_avx2};
#endif

}  // namespace

const Kernels *kernels_for(const char *isa) {
    if (std::strcmp(isa, "portable") == 0) return &kPortable;
#ifdef CMF_X86
    const bool avx2 = cpu_has_avx2_fma_f16c();
    if (std::strcmp(isa, "avx2") == 0 && avx2) return &kAvx2;
    if (std::strcmp(isa, "avx512") == 0 && avx2 && __builtin_cpu_supports("avx512f")) return &kAvx512;
#endif
    return nullptr;
}

bool isa_allowed(const char *isa) {
    static const int cap = isa_cap_from_env("CMF_CPU_ISA");  // 0: portable only, 1: up to AVX2, 2+: AVX-512
    if (std::strcmp(isa, "portable") == 0) return true;
    if (std::strncmp(isa, "avx512", 6) == 0) return cap >= 2;
    return cap >= 1;
}

const Kernels &kernels() {
    static const Kernels *best = [] {
        for (const char *isa : {"avx512", "avx2"})
            if (const Kernels *k = isa_allowed(isa) ? kernels_for(isa) : nullptr) return k;
        return &kPortable;
    }();
    return *best;
}

}  // namespace cmf::cpu
