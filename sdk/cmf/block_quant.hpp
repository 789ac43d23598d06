// cmf/block_quant.hpp — the int8 quantizer of activations, one block of 32
// at a time, shared by the codecs plugin (its decode dots, *_xq) and the cpu
// backend (its int8 prefill GEMM). Header-only because plugins are separate
// shared objects and cannot link each other; one definition keeps the two
// products of "the same x, quantized" bit-identical.
//
// Per block: d = amax / 127; q = clamp(rne(x * (1/d)), -127, 127) (1/d taken
// as 0 when d is 0 or subnormal, so such a block quantizes to zeros); a block
// holding an inf or NaN gets d = NaN and q = 0, so a dot over it is NaN as an
// f32 dot would be. Each value moves by at most d/2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cmf::block_quant {

constexpr uint64_t kBlock = 32;

// x[0..n) with n <= 32 (zeros past n) -> q[0..32) in element order; returns d.
inline float quantize_block(const float *x, uint64_t n, int8_t *q) {
    float v[kBlock] = {};
    std::copy(x, x + std::min(n, kBlock), v);
    float amax = 0.0f;
    bool finite = true;
    for (float e : v) {
        const float a = std::fabs(e);
        finite &= a < std::numeric_limits<float>::infinity();  // false for inf and NaN
        amax = a > amax ? a : amax;
    }
    if (!finite) {
        std::memset(q, 0, kBlock);
        return std::numeric_limits<float>::quiet_NaN();
    }
    const float d = amax / 127.0f;
    float inv = d > 0.0f ? 1.0f / d : 0.0f;
    if (!(inv < std::numeric_limits<float>::infinity())) inv = 0.0f;  // d subnormal: the block is ~0
    for (uint64_t e = 0; e < kBlock; ++e) {
        float r = std::nearbyint(v[e] * inv);
        r = r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r);
        q[e] = static_cast<int8_t>(r);
    }
    return d;
}

#if defined(__x86_64__)
// quantize_block in registers: the 32 floats at v (all readable: the caller
// pads a short block with zeros) -> the codes as int32, 8 per register in
// element order (qi[k] holds elements 8k..8k+7); returns d. Bit-identical to
// quantize_block: the max is exact, d and 1/d are the same scalar operations,
// vroundps(nearest) is nearbyint in the default rounding mode, and min/max
// clamp as the comparisons do for finite values. An inf/NaN block gives
// d = NaN and zero codes. Callers pack the int32 lanes to the width and order
// they need.
__attribute__((target("avx2,fma,f16c"))) inline float quantize_block_avx2(const float *v, __m256i qi[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
    __m256 r[4], amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_loadu_ps(v + 8 * i);
        const __m256 a = _mm256_andnot_ps(sign, r[i]);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // !(a < inf): inf or NaN
        amax = _mm256_max_ps(amax, a);
    }
    if (_mm256_movemask_ps(bad) != 0) {
        for (int i = 0; i < 4; ++i) qi[i] = _mm256_setzero_si256();
        return std::numeric_limits<float>::quiet_NaN();
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    float inv = d > 0.0f ? 1.0f / d : 0.0f;
    if (!(inv < std::numeric_limits<float>::infinity())) inv = 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (int i = 0; i < 4; ++i) {
        const __m256 t = _mm256_round_ps(_mm256_mul_ps(r[i], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        qi[i] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(t, hi), lo));
    }
    return d;
}
#endif

}  // namespace cmf::block_quant
