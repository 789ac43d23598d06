// Picks AVX2+FMA+F16C kernels at run time when the CPU has them, and makes
// the ISA-independent q4_pair_blocks x order and its bias terms.
#include "kernels/kernels.hpp"
#include "kernels/portable.hpp"

#include <cmf/cpu_features.hpp>

#include <cstring>

namespace cmf::codecs::kernels {

namespace {
bool has_avx2() {
#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX2)
    return cmf::cpu_has_avx2_fma_f16c();
#else
    return false;
#endif
}
}  // namespace

#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX2)
#define CMF_PICK(fn, ...) (has_avx2() ? avx2::fn(__VA_ARGS__) : portable::fn(__VA_ARGS__))
#else
#define CMF_PICK(fn, ...) portable::fn(__VA_ARGS__)
#endif

const char *active_isa() { return has_avx2() ? "avx2" : "portable"; }
float dot_f32(const float *a, const float *x, uint64_t n) { return CMF_PICK(dot_f32, a, x, n); }
float dot_f16(const uint16_t *h, const float *x, uint64_t n) { return CMF_PICK(dot_f16, h, x, n); }
float dot_bf16(const uint16_t *h, const float *x, uint64_t n) { return CMF_PICK(dot_bf16, h, x, n); }
void quantize_x(const float *x, uint64_t n, XOrder order, int8_t *q, float *d) {
    if (order != XOrder::q4_pair_blocks) return CMF_PICK(quantize_x, x, n, order, q, d);
    // q4_pairs, then per pair of blocks swap the middle two 16-byte quarters:
    // [A lo | A hi | B lo | B hi] -> [A lo | B lo | A hi | B hi] (kernels.hpp).
    CMF_PICK(quantize_x, x, n, XOrder::q4_pairs, q, d);
    for (uint64_t k = 0; k < x_blocks(n) / 2; ++k) {
        int8_t a_hi[16];
        std::memcpy(a_hi, q + 64 * k + 16, 16);
        std::memcpy(q + 64 * k + 16, q + 64 * k + 32, 16);
        std::memcpy(q + 64 * k + 32, a_hi, 16);
    }
}
void q4_pair_bias(const int8_t *q, uint64_t blocks, int16_t *bias) {
    for (uint64_t k = 0; k < blocks / 2; ++k) {
        const int8_t *lo = q + 64 * k, *hi = q + 64 * k + 32;
        for (unsigned j = 0; j < 16; ++j)
            bias[16 * k + j] = static_cast<int16_t>(8 * (lo[2 * j] + lo[2 * j + 1] + hi[2 * j] + hi[2 * j + 1]));
    }
}
float dot_i8_xq(const int8_t *w, const int8_t *xq, const float *xd, uint64_t n) {
    return CMF_PICK(dot_i8_xq, w, xq, xd, n);
}
void rows_i8_xq(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const float *xd, uint64_t n,
                uint64_t rows, float *y) {
    CMF_PICK(rows_i8_xq, w, ld, f16_scales, xq, xd, n, rows, y);
}
float dot_q4_tiled_xq(const uint8_t *t, const int8_t *xq, const int16_t *xb, const float *xd, uint64_t g) {
    return CMF_PICK(dot_q4_tiled_xq, t, xq, xb, xd, g);
}
float dot_q4_split_xq(const uint8_t *n, const uint8_t *s, const int8_t *xq, const int16_t *xb, const float *xd,
                      uint64_t g) {
    return CMF_PICK(dot_q4_split_xq, n, s, xq, xb, xd, g);
}
void rows_q4_tiled_xq(const uint8_t *t, const int8_t *xq, const int16_t *xb, const float *xd, uint64_t g, uint64_t rows,
                      float *y) {
    CMF_PICK(rows_q4_tiled_xq, t, xq, xb, xd, g, rows, y);
}
void rows_q4_split_xq(const uint8_t *n, const uint8_t *s, const int8_t *xq, const int16_t *xb, const float *xd, uint64_t g,
                      uint64_t rows, float *y) {
    CMF_PICK(rows_q4_split_xq, n, s, xq, xb, xd, g, rows, y);
}
float dot_q4_groups_xq(const uint8_t *n, const float *s, const int8_t *xq, const int16_t *xb, const float *xd,
                       uint64_t g) {
    return CMF_PICK(dot_q4_groups_xq, n, s, xq, xb, xd, g);
}
float dot_q2_groups_xq(const uint8_t *c, const float *s, const int8_t *xq, const float *xd, uint64_t g) {
    return CMF_PICK(dot_q2_groups_xq, c, s, xq, xd, g);
}
float dot_q1(const uint8_t *t, const float *x, uint64_t g) { return CMF_PICK(dot_q1, t, x, g); }
void dequant_q4_groups(const uint8_t *n, uint64_t stride, const float *s, uint64_t g, float *dst) {
    CMF_PICK(dequant_q4_groups, n, stride, s, g, dst);
}
void dequant_q2_groups(const uint8_t *c, const float *s, uint64_t g, float *dst) { CMF_PICK(dequant_q2_groups, c, s, g, dst); }
void unpack_q4_groups(const uint8_t *n, uint64_t stride, uint64_t g, int8_t *codes) {
    CMF_PICK(unpack_q4_groups, n, stride, g, codes);
}
float dot_q1t(const uint8_t *t, const float *x, uint64_t g) { return CMF_PICK(dot_q1t, t, x, g); }

}  // namespace cmf::codecs::kernels
