// Portable kernel implementations (also the reference the SIMD ones are tested against).
// The per-ISA quantize_x take XOrder natural, q4_pairs and q2_quads only;
// kernels::quantize_x (dispatch.cpp) derives q4_pair_blocks from q4_pairs.
#pragma once

#include "kernels/kernels.hpp"

#include <cstdint>

#define CMF_CODECS_KERNEL_DECLS                                                                                       \
    float dot_f32(const float *a, const float *x, uint64_t n);                                                        \
    float dot_f16(const uint16_t *h, const float *x, uint64_t n);                                                     \
    float dot_bf16(const uint16_t *h, const float *x, uint64_t n);                                                    \
    void quantize_x(const float *x, uint64_t n, XOrder order, int8_t *q, float *d);                                   \
    void q4_pair_offset(const int8_t *q, uint64_t blocks, int32_t *offset);                                           \
    void i8_offset(const int8_t *q, uint64_t blocks, int32_t *offset);                                                \
    float dot_i8_xq(const int8_t *w, const int8_t *xq, const float *xd, uint64_t n);                                  \
    void rows_i8_xq(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff, \
                    const float *xd, uint64_t n, uint64_t rows, float *y);                                           \
    void rows_i8_xq_batch(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq,              \
                          const int32_t *xboff, const float *xd, uint64_t n, uint64_t rows, uint64_t k, float *y,    \
                          uint64_t ldy);                                                                             \
    float dot_vbit_xq(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, const int8_t *xq,               \
                      const int32_t *xoff, const float *xd, uint64_t groups);                                         \
    void rows_vbit_xq(const uint8_t *const *codes, const uint8_t *widths, const uint8_t *f16_scales,              \
                      const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows,         \
                      const VbitRowsX &vx, float *y);                                                                 \
    void unpack_vbit_groups(const uint8_t *codes, unsigned b, uint64_t groups, int8_t *out);                       \
    void rows_q1_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,  \
                    uint64_t rows, float *y);                                                                         \
    void unpack_q1_groups(const uint8_t *tiles, uint64_t groups, int8_t *codes, float *scales);                    \
    void q1_passes_x(const int8_t *xq, uint64_t groups, uint8_t *xt);                                              \
    void rows_q1_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,  \
                           float *y);                                                                                 \
    void rows_q1t_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows, \
                            float *y);                                                                                \
    void unpack_q1_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales);                          \
    void unpack_q1t_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales);                         \
    void rows_q1t_xq(const uint8_t *tiles, const int8_t *xq, const float *xd, uint64_t groups, uint64_t rows,         \
                     float *y);                                                                                       \
    void unpack_q1t_groups(const uint8_t *tiles, uint64_t groups, int8_t *codes, float *scales);                   \
    bool q1s_ascending(const uint8_t *entries, uint64_t count);                                                      \
    void q1s_slice_sums(const uint8_t *steps, uint64_t n_steps, uint64_t cols, const float *xf, float *sums);     \
    void q1s_overlay_xq(const uint8_t *tiles, const uint8_t *entries, uint64_t count, uint64_t phase,             \
                        uint64_t begin, uint64_t cols, uint64_t rows, const int8_t *xq, const float *xd, float *y);  \
    float dot_q4_tiled_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd,              \
                          uint64_t groups);                                                                           \
    float dot_q4_split_xq(const uint8_t *nibbles, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xoff,  \
                          const float *xd, uint64_t groups);                                                          \
    void rows_q4_tiled_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd,            \
                          uint64_t groups, uint64_t rows, float *y);                                                  \
    void rows_q4_split_xq(const uint8_t *nibbles, uint64_t nib_ld, const uint8_t *f16_scales, uint64_t scale_ld,   \
                          const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows,     \
                          float *y);                                                                                  \
    void q4_pair_x_table(const int8_t *xq, const int32_t *xoff, uint64_t groups, int8_t *xt);                       \
    float dot_q4_groups_xq(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int32_t *xoff,       \
                           const float *xd, uint64_t groups);                                                         \
    void rows_q4_groups_xq(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int32_t *xoff,       \
                           const float *xd, uint64_t groups, uint64_t rows, float *y);                                \
    void ladder_scales(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes,                \
                       uint64_t code_stride, uint64_t groups, unsigned rows, float *out);                             \
    void ladder_scales_powers(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes,         \
                              uint64_t code_stride, uint64_t groups, unsigned rows, float *out);                      \
    void rows_q4tp_xq(const uint8_t *nibbles, const float *first, const float *ratio, const uint8_t *codes,         \
                      uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups, \
                      uint64_t rows, float *scratch, float *y);                                                       \
    float dot_q2_groups_xq(const uint8_t *chunks, const float *scales, const int8_t *xq, const int32_t *xoff,        \
                           const float *xd, uint64_t groups);                                                         \
    void rows_q2_groups_xq(const uint8_t *chunks, const float *scales, const int8_t *xq, const int32_t *xoff,       \
                           const float *xd, uint64_t groups, uint64_t rows, float *y);                                \
    void rows_q2tp_xq(const uint8_t *chunks, const float *first, const float *ratio, const uint8_t *codes,          \
                      uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups, \
                      uint64_t rows, float *scratch, float *y);                                                       \
    void dequant_q4_groups(const uint8_t *nibbles, uint64_t stride, const float *scales, uint64_t groups, float *dst); \
    void dequant_q2_groups(const uint8_t *chunks, const float *scales, uint64_t groups, float *dst);                  \
    void dequant_vbit_groups(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, uint64_t groups,            \
                             float *dst);                                                                             \
    void unpack_q4_groups(const uint8_t *nibbles, uint64_t stride, uint64_t groups, int8_t *codes);

namespace cmf::codecs::kernels::portable {
CMF_CODECS_KERNEL_DECLS
}  // namespace cmf::codecs::kernels::portable

namespace cmf::codecs::kernels::avx2 {
CMF_CODECS_KERNEL_DECLS
}  // namespace cmf::codecs::kernels::avx2

// avx2.cpp compiled a second time for CPUs with AVX-512 VNNI (+VL, BW): the
// q4 pair dots take vpdpbusd (meson.build, CMF_CODECS_VNNI).
namespace cmf::codecs::kernels::avx512vnni {
CMF_CODECS_KERNEL_DECLS
}  // namespace cmf::codecs::kernels::avx512vnni

#undef CMF_CODECS_KERNEL_DECLS

#include <vector>

// Every kernel above, by name, for X-macro tables.
#define CMF_CODECS_KERNEL_NAMES(X)                                                                                    \
    X(dot_f32) X(dot_f16) X(dot_bf16) X(quantize_x) X(q4_pair_offset) X(i8_offset)                \
    X(dot_i8_xq) X(rows_i8_xq) X(rows_i8_xq_batch) X(dot_vbit_xq) X(rows_vbit_xq) X(unpack_vbit_groups) X(rows_q1_xq) X(unpack_q1_groups) X(q1_passes_x) X(rows_q1_passes_xq) X(rows_q1t_passes_xq) X(unpack_q1_passes) X(unpack_q1t_passes) X(rows_q1t_xq) X(unpack_q1t_groups) X(q1s_ascending) X(q1s_overlay_xq) X(q1s_slice_sums)                                            \
    X(dot_q4_tiled_xq) X(dot_q4_split_xq) X(rows_q4_tiled_xq) X(rows_q4_split_xq) X(q4_pair_x_table) X(dot_q4_groups_xq)                \
    X(rows_q4_groups_xq) X(ladder_scales) X(ladder_scales_powers) X(rows_q4tp_xq) X(dot_q2_groups_xq) X(rows_q2_groups_xq) X(rows_q2tp_xq) X(dequant_q4_groups) X(dequant_q2_groups) X(dequant_vbit_groups)    \
    X(unpack_q4_groups)

namespace cmf::codecs::kernels {
// One ISA's kernels as function pointers, so tests can hold every SIMD build
// against the portable one on a CPU that runs more than one of them.
struct SimdKernels {
    const char *isa;
#define CMF_CODECS_KERNEL_MEMBER(name) decltype(&portable::name) name;
    CMF_CODECS_KERNEL_NAMES(CMF_CODECS_KERNEL_MEMBER)
#undef CMF_CODECS_KERNEL_MEMBER
};
// The SIMD builds this binary has and this CPU can run (fastest first; empty
// on a CPU without AVX2).
std::vector<SimdKernels> simd_kernels();

// rows_i8_xq_batch as one ISA's rows_i8_xq per token over 16-row tiles
// (each tile's codes stay in L1 while every token passes over them). The
// row kernel is a template argument and the template has internal linkage,
// so each ISA's file has its own copy and no weak symbol
// (tests/codecs/no_shared_inline_copies.sh).
namespace {
template <decltype(&portable::rows_i8_xq) Rows>
void i8_tiles_per_token(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                        const float *xd, uint64_t n, uint64_t rows, uint64_t k, float *y, uint64_t ldy) {
    const uint64_t nb = x_blocks(n);
    for (uint64_t t0 = 0; t0 < rows; t0 += 16) {
        const uint64_t t1 = rows - t0 < 16 ? rows : t0 + 16;
        for (uint64_t t = 0; t < k; ++t)
            Rows(w + t0 * ld, ld, f16_scales + 2 * t0, xq + t * 32 * nb, xboff + t * nb, xd + t * nb, n, t1 - t0,
                 y + t * ldy + t0);
    }
}
}  // namespace
}  // namespace cmf::codecs::kernels
