#include "kernels.hpp"

#include <cstring>
#include <initializer_list>

#if defined(CMF_NATIVE_KERNELS) && defined(__x86_64__)
#include <immintrin.h>
#define CMF_X86 1
#endif

namespace cmf::cpu {

namespace {

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

void matmul_portable(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) {
    for (uint64_t r = r0; r < r1; ++r)
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = dot_portable(w + r * cols, x + b * ldx, cols);
}

#ifdef CMF_X86
__attribute__((target("avx2,fma"))) float dot_avx2(const float *a, const float *b, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float r = _mm_cvtss_f32(h);
    for (; i < n; ++i) r += a[i] * b[i];
    return r;
}

void matmul_avx2(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                 uint64_t r1, float *y, uint64_t ldy) {
    for (uint64_t r = r0; r < r1; ++r)
        for (uint64_t b = 0; b < n_batch; ++b) y[b * ldy + r] = dot_avx2(w + r * cols, x + b * ldx, cols);
}

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

const Kernels kPortable{"portable", matmul_portable};
#ifdef CMF_X86
const Kernels kAvx2{"avx2", matmul_avx2};
const Kernels kAvx512{"avx512", matmul_avx512};
#endif

}  // namespace

const Kernels *kernels_for(const char *isa) {
    if (std::strcmp(isa, "portable") == 0) return &kPortable;
#ifdef CMF_X86
    __builtin_cpu_init();
    if (std::strcmp(isa, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &kAvx2;
    if (std::strcmp(isa, "avx512") == 0 && __builtin_cpu_supports("avx512f")) return &kAvx512;
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
