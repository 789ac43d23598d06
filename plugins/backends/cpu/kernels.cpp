#include "kernels.hpp"

#include "../../codecs/half.hpp"

#include <cstring>
#include <initializer_list>

#if defined(CMF_NATIVE_KERNELS) && defined(__x86_64__)
#include <immintrin.h>
#define CMF_X86 1
#endif

namespace cmf::cpu {

namespace {

using codecs::bf16_to_f32;
using codecs::f16_to_f32;

// ---- portable ---------------------------------------------------------------

// Eight independent accumulators keep the FP adder pipeline full without
// -ffast-math (which we do not use: results must not depend on flags).
float dot_portable(const float *a, const float *b, uint64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

void axpy_portable(float a, const float *x, float *y, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void matmul_portable(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) {
    for (uint64_t r = r0; r < r1; ++r)
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = dot_portable(w + r * cols, x + b * ldx, cols);
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

void gemm_panel_portable(const float *panel, uint64_t n_rows, uint64_t cols, const float *x, uint64_t ldx,
                         uint64_t n_batch, float *y, uint64_t ldy) {
    for (uint64_t b = 0; b < n_batch; ++b)
        for (uint64_t r = 0; r < n_rows; ++r) y[b * ldy + r] = dot_portable(panel + r * cols, x + b * ldx, cols);
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

AVX2 float dot_avx2(const float *a, const float *b, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float r = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; ++i) r += a[i] * b[i];
    return r;
}

AVX2 void axpy_avx2(float a, const float *x, float *y, uint64_t n) {
    __m256 va = _mm256_set1_ps(a);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
}

void matmul_avx2(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                 uint64_t r1, float *y, uint64_t ldy) {
    for (uint64_t r = r0; r < r1; ++r)
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = dot_avx2(w + r * cols, x + b * ldx, cols);
}

// 8 weights as f32: F16C for f16, a 16-bit shift for bf16.
AVX2 inline __m256 load8_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}
AVX2 inline __m256 load8_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
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

// Four rows against one activation vector per pass: x is loaded once per 4
// rows, and 8 accumulators hide FMA latency. Decode is bandwidth-bound, so
// the point is to keep the weight stream going.
template <bool Bf16>
AVX2 void matmul_h16_avx2(const uint16_t *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch,
                          uint64_t r0, uint64_t r1, float *y, uint64_t ldy) {
    uint64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        const uint16_t *w0 = w + r * cols, *w1 = w0 + cols, *w2 = w1 + cols, *w3 = w2 + cols;
        for (uint64_t b = 0; b < n_batch; ++b) {
            const float *xb = x + b * ldx;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
                   a3 = _mm256_setzero_ps(), c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(),
                   c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
            uint64_t i = 0;
            for (; i + 16 <= cols; i += 16) {
                __m256 xv = _mm256_loadu_ps(xb + i), xu = _mm256_loadu_ps(xb + i + 8);
                a0 = _mm256_fmadd_ps(load8<Bf16>(w0 + i), xv, a0);
                a1 = _mm256_fmadd_ps(load8<Bf16>(w1 + i), xv, a1);
                a2 = _mm256_fmadd_ps(load8<Bf16>(w2 + i), xv, a2);
                a3 = _mm256_fmadd_ps(load8<Bf16>(w3 + i), xv, a3);
                c0 = _mm256_fmadd_ps(load8<Bf16>(w0 + i + 8), xu, c0);
                c1 = _mm256_fmadd_ps(load8<Bf16>(w1 + i + 8), xu, c1);
                c2 = _mm256_fmadd_ps(load8<Bf16>(w2 + i + 8), xu, c2);
                c3 = _mm256_fmadd_ps(load8<Bf16>(w3 + i + 8), xu, c3);
            }
            for (; i + 8 <= cols; i += 8) {
                __m256 xv = _mm256_loadu_ps(xb + i);
                a0 = _mm256_fmadd_ps(load8<Bf16>(w0 + i), xv, a0);
                a1 = _mm256_fmadd_ps(load8<Bf16>(w1 + i), xv, a1);
                a2 = _mm256_fmadd_ps(load8<Bf16>(w2 + i), xv, a2);
                a3 = _mm256_fmadd_ps(load8<Bf16>(w3 + i), xv, a3);
            }
            float s0 = hsum(_mm256_add_ps(a0, c0)), s1 = hsum(_mm256_add_ps(a1, c1)),
                  s2 = hsum(_mm256_add_ps(a2, c2)), s3 = hsum(_mm256_add_ps(a3, c3));
            for (; i < cols; ++i) {
                s0 += h16_scalar<Bf16>(w0[i]) * xb[i];
                s1 += h16_scalar<Bf16>(w1[i]) * xb[i];
                s2 += h16_scalar<Bf16>(w2[i]) * xb[i];
                s3 += h16_scalar<Bf16>(w3[i]) * xb[i];
            }
            float *yb = y + b * ldy + r;
            yb[0] = s0;
            yb[1] = s1;
            yb[2] = s2;
            yb[3] = s3;
        }
    }
    for (; r < r1; ++r) {
        const uint16_t *wr = w + r * cols;
        for (uint64_t b = 0; b < n_batch; ++b) {
            const float *xb = x + b * ldx;
            __m256 a = _mm256_setzero_ps();
            uint64_t i = 0;
            for (; i + 8 <= cols; i += 8) a = _mm256_fmadd_ps(load8<Bf16>(wr + i), _mm256_loadu_ps(xb + i), a);
            float s = hsum(a);
            for (; i < cols; ++i) s += h16_scalar<Bf16>(wr[i]) * xb[i];
            y[b * ldy + r] = s;
        }
    }
}

AVX2 void convert_f16_avx2(const uint16_t *src, uint64_t n, float *dst) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_f16(src + i));
    for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
AVX2 void convert_bf16_avx2(const uint16_t *src, uint64_t n, float *dst) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_bf16(src + i));
    for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// 4 weight rows x 3 tokens: 12 accumulators + 3 activation registers + 1
// weight register = all 16 ymm. 7 loads feed 12 FMAs, so the loop is
// FMA-bound with the panel in L2 and the 3 activation rows in L1.
AVX2 void block_4x3(const float *w, uint64_t cols, const float *x, uint64_t ldx, float *y, uint64_t ldy) {
    const float *w0 = w, *w1 = w + cols, *w2 = w1 + cols, *w3 = w2 + cols;
    const float *x0 = x, *x1 = x + ldx, *x2 = x1 + ldx;
    __m256 a00 = _mm256_setzero_ps(), a01 = _mm256_setzero_ps(), a02 = _mm256_setzero_ps();
    __m256 a10 = _mm256_setzero_ps(), a11 = _mm256_setzero_ps(), a12 = _mm256_setzero_ps();
    __m256 a20 = _mm256_setzero_ps(), a21 = _mm256_setzero_ps(), a22 = _mm256_setzero_ps();
    __m256 a30 = _mm256_setzero_ps(), a31 = _mm256_setzero_ps(), a32 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i), v2 = _mm256_loadu_ps(x2 + i);
        __m256 wv = _mm256_loadu_ps(w0 + i);
        a00 = _mm256_fmadd_ps(wv, v0, a00);
        a01 = _mm256_fmadd_ps(wv, v1, a01);
        a02 = _mm256_fmadd_ps(wv, v2, a02);
        wv = _mm256_loadu_ps(w1 + i);
        a10 = _mm256_fmadd_ps(wv, v0, a10);
        a11 = _mm256_fmadd_ps(wv, v1, a11);
        a12 = _mm256_fmadd_ps(wv, v2, a12);
        wv = _mm256_loadu_ps(w2 + i);
        a20 = _mm256_fmadd_ps(wv, v0, a20);
        a21 = _mm256_fmadd_ps(wv, v1, a21);
        a22 = _mm256_fmadd_ps(wv, v2, a22);
        wv = _mm256_loadu_ps(w3 + i);
        a30 = _mm256_fmadd_ps(wv, v0, a30);
        a31 = _mm256_fmadd_ps(wv, v1, a31);
        a32 = _mm256_fmadd_ps(wv, v2, a32);
    }
    float s[4][3] = {{hsum(a00), hsum(a01), hsum(a02)},
                     {hsum(a10), hsum(a11), hsum(a12)},
                     {hsum(a20), hsum(a21), hsum(a22)},
                     {hsum(a30), hsum(a31), hsum(a32)}};
    const float *wr[4] = {w0, w1, w2, w3};
    const float *xr[3] = {x0, x1, x2};
    for (; i < cols; ++i)
        for (int r = 0; r < 4; ++r)
            for (int b = 0; b < 3; ++b) s[r][b] += wr[r][i] * xr[b][i];
    for (int b = 0; b < 3; ++b)
        for (int r = 0; r < 4; ++r) y[b * ldy + r] = s[r][b];
}

// Tokens outer (3 at a time, their rows stay in L1), panel rows inner.
void gemm_panel_avx2(const float *panel, uint64_t n_rows, uint64_t cols, const float *x, uint64_t ldx,
                     uint64_t n_batch, float *y, uint64_t ldy) {
    uint64_t b = 0;
    for (; b + 3 <= n_batch; b += 3) {
        uint64_t r = 0;
        for (; r + 4 <= n_rows; r += 4) block_4x3(panel + r * cols, cols, x + b * ldx, ldx, y + b * ldy + r, ldy);
        for (; r < n_rows; ++r)
            for (uint64_t k = b; k < b + 3; ++k) y[k * ldy + r] = dot_avx2(panel + r * cols, x + k * ldx, cols);
    }
    for (; b < n_batch; ++b)
        for (uint64_t r = 0; r < n_rows; ++r) y[b * ldy + r] = dot_avx2(panel + r * cols, x + b * ldx, cols);
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
#endif

const Kernels kPortable{"portable",
                        matmul_portable,
                        matmul_h16_generic<convert_f16_portable, dot_portable>,
                        matmul_h16_generic<convert_bf16_portable, dot_portable>,
                        convert_f16_portable,
                        convert_bf16_portable,
                        gemm_panel_portable,
                        dot_portable,
                        axpy_portable};
#ifdef CMF_X86
const Kernels kAvx2{"avx2",          matmul_avx2,       matmul_h16_avx2<false>, matmul_h16_avx2<true>,
                    convert_f16_avx2, convert_bf16_avx2, gemm_panel_avx2,        dot_avx2,
                    axpy_avx2};
// AVX-512 machines get the 512-bit f32 dot; the 16-bit and GEMM kernels are
// the AVX2 ones (AVX-512 CPUs run them; no AVX-512 machine to tune on here).
const Kernels kAvx512{"avx512",         matmul_avx512,     matmul_h16_avx2<false>, matmul_h16_avx2<true>,
                      convert_f16_avx2, convert_bf16_avx2, gemm_panel_avx2,        dot_avx512,
                      axpy_avx2};
#endif

}  // namespace

const Kernels *kernels_for(const char *isa) {
    if (std::strcmp(isa, "portable") == 0) return &kPortable;
#ifdef CMF_X86
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (std::strcmp(isa, "avx2") == 0 && avx2) return &kAvx2;
    if (std::strcmp(isa, "avx512") == 0 && avx2 && __builtin_cpu_supports("avx512f")) return &kAvx512;
#endif
    return nullptr;
}

const Kernels &kernels() {
    static const Kernels *best = [] {
        for (const char *isa : {"avx512", "avx2"})
            if (const Kernels *k = kernels_for(isa)) return k;
        return &kPortable;
    }();
    return *best;
}

}  // namespace cmf::cpu
