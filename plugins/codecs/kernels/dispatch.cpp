// Picks AVX2+FMA+F16C kernels at run time when the CPU has them.
#include "kernels/kernels.hpp"
#include "kernels/portable.hpp"

#include <cmf/cpu_features.hpp>

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
    CMF_PICK(quantize_x, x, n, order, q, d);
}
float dot_i8_xq(const int8_t *w, const int8_t *xq, const float *xd, uint64_t n) {
    return CMF_PICK(dot_i8_xq, w, xq, xd, n);
}
float dot_q4_tiled_xq(const uint8_t *t, const int8_t *xq, const float *xd, uint64_t g) {
    return CMF_PICK(dot_q4_tiled_xq, t, xq, xd, g);
}
float dot_q4_split_xq(const uint8_t *n, const uint8_t *s, const int8_t *xq, const float *xd, uint64_t g) {
    return CMF_PICK(dot_q4_split_xq, n, s, xq, xd, g);
}
float dot_q4_groups_xq(const uint8_t *n, const float *s, const int8_t *xq, const float *xd, uint64_t g) {
    return CMF_PICK(dot_q4_groups_xq, n, s, xq, xd, g);
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
