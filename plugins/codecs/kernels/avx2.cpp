// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c; only called
// after dispatch.cpp has checked the CPU. Accumulation order differs from the
// portable kernels (8 lanes, fused multiply-adds), so results agree with the
// reference decode to f32 rounding, not bit-for-bit.
#include "kernels/portable.hpp"

#include <immintrin.h>

#include <cstring>

namespace cmf::codecs::kernels::avx2 {

namespace {

float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
float f16_scalar(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
// 32 signed int8 codes times 32 activations, as an 8-lane partial sum.
__m256 dot32_i8(__m128i lo16, __m128i hi16, const float *x) {
    __m256 acc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo16)), _mm256_loadu_ps(x));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo16, 8))), _mm256_loadu_ps(x + 8), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi16)), _mm256_loadu_ps(x + 16), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi16, 8))), _mm256_loadu_ps(x + 24), acc);
    return acc;
}
// One q4 group (16 nibble bytes, even element in the low nibble), unscaled.
__m256 q4_group(const uint8_t *nib, const float *x) {
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(nib));
    __m128i mask = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(b, mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    __m128i eight = _mm_set1_epi8(8);
    __m128i e0 = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);  // elements 0..15
    __m128i e1 = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight);  // elements 16..31
    return dot32_i8(e0, e1, x);
}

}  // namespace

float dot_f32(const float *a, const float *x, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), s1);
    }
    float acc = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) acc += a[i] * x[i];
    return acc;
}

float dot_f16(const uint16_t *h, const float *x, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i + 8)));
        s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), s1);
    }
    float acc = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) acc += _cvtsh_ss(h[i]) * x[i];
    return acc;
}

float dot_bf16(const uint16_t *h, const float *x, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i))), 16);
        s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(w), _mm256_loadu_ps(x + i), s0);
    }
    float acc = hsum(s0);
    for (; i < n; ++i) {
        uint32_t u = static_cast<uint32_t>(h[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        acc += f * x[i];
    }
    return acc;
}

float dot_i8_f32(const int8_t *q, const float *x, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q + i));
        __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q + i + 16));
        s0 = _mm256_add_ps(s0, dot32_i8(lo, hi, x + i));
    }
    for (; i + 8 <= n; i += 8) {
        __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(q + i));
        s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_loadu_ps(x + i), s0);
    }
    float acc = hsum(s0);
    for (; i < n; ++i) acc += static_cast<float>(q[i]) * x[i];
    return acc;
}

float dot_q4_tiled(const uint8_t *tiles, const float *x, uint64_t groups) {
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t g = 0; g < groups; ++g)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(tiles + 18 * g)), q4_group(tiles + 18 * g + 2, x + 32 * g), acc);
    return hsum(acc);
}

float dot_q4_split(const uint8_t *nibbles, const uint8_t *f16_scales, const float *x, uint64_t groups) {
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t g = 0; g < groups; ++g)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(f16_scales + 2 * g)), q4_group(nibbles + 16 * g, x + 32 * g), acc);
    return hsum(acc);
}

float dot_q4_groups(const uint8_t *nibbles, const float *scales, const float *x, uint64_t groups) {
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t g = 0; g < groups; ++g)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(scales[g]), q4_group(nibbles + 16 * g, x + 32 * g), acc);
    return hsum(acc);
}

float dot_q2_groups(const uint8_t *chunks, const float *scales, const float *x, uint64_t groups) {
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i three = _mm256_set1_epi32(3);
    const __m256 half3 = _mm256_set1_ps(1.5f);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *c = chunks + 8 * g;
        __m256 ga = _mm256_setzero_ps();
        for (int part = 0; part < 4; ++part) {  // 8 elements = 2 bytes = 16 bits
            uint16_t v;
            std::memcpy(&v, c + 2 * part, 2);
            __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(v), shifts), three);
            __m256 w = _mm256_sub_ps(_mm256_cvtepi32_ps(codes), half3);
            ga = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + 32 * g + 8 * part), ga);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(scales[g]), ga, acc);
    }
    return hsum(acc);
}

float dot_q1(const uint8_t *tiles, const float *x, uint64_t groups) {
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 6 * g;
        __m256 ga = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(t[2 + k]), bits), bits);
            __m256 xv = _mm256_loadu_ps(x + 32 * g + 8 * k);
            // +x where the bit is set, -x elsewhere: flip the sign bit of the clear lanes.
            __m256 flip = _mm256_andnot_ps(_mm256_castsi256_ps(set), _mm256_set1_ps(-0.0f));
            ga = _mm256_add_ps(ga, _mm256_xor_ps(xv, flip));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(t)), ga, acc);
    }
    return hsum(acc);
}

namespace {
// Byte value -> its 5 base-3 digits as weights (0, +1, -1) in lanes 0..4 of
// an 8-float row (lanes 5..7 zero). Bytes > 242 never occur in valid payloads
// (the decoder rejects them) and map to 0 here. 8 KiB: stays in L1.
struct TritTable {
    alignas(32) float v[256][8];
    TritTable() {
        for (int b = 0; b < 256; ++b) {
            int x = b;
            for (int k = 0; k < 8; ++k, x /= 3)
                v[b][k] = (b > 242 || k >= 5) ? 0.0f : (x % 3 == 2 ? -1.0f : static_cast<float>(x % 3));
        }
    }
};
const TritTable kTrits;
}  // namespace

float dot_q1t(const uint8_t *tiles, const float *x, uint64_t groups) {
    // Masked loads read exactly the 5 (last byte: 2) activations a byte covers,
    // so nothing past the group (or the end of x) is touched.
    const __m256i five = _mm256_setr_epi32(-1, -1, -1, -1, -1, 0, 0, 0);
    const __m256i two = _mm256_setr_epi32(-1, -1, 0, 0, 0, 0, 0, 0);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 9 * g;
        const float *xg = x + 32 * g;
        __m256 ga = _mm256_setzero_ps();
        for (int j = 0; j < 6; ++j)
            ga = _mm256_fmadd_ps(_mm256_load_ps(kTrits.v[t[2 + j]]), _mm256_maskload_ps(xg + 5 * j, five), ga);
        ga = _mm256_fmadd_ps(_mm256_load_ps(kTrits.v[t[8]]), _mm256_maskload_ps(xg + 30, two), ga);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(t)), ga, acc);
    }
    return hsum(acc);
}

}  // namespace cmf::codecs::kernels::avx2
