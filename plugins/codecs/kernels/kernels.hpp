// Dot-product kernels behind Dtype::matmul_rows. Each entry point picks the
// AVX2+FMA+F16C implementation when the CPU has those features (checked once)
// and the portable one otherwise. All are reentrant and allocation-free.
// They accumulate in f32 (activations are never quantized), so results match
// the reference decode followed by an f32 dot product up to summation order.
#pragma once

#include <cstdint>

namespace cmf::codecs::kernels {

float dot_f32(const float *a, const float *x, uint64_t n);
float dot_f16(const uint16_t *h, const float *x, uint64_t n);
float dot_bf16(const uint16_t *h, const float *x, uint64_t n);
float dot_i8_f32(const int8_t *q, const float *x, uint64_t n);  // unscaled sum q[i]*x[i]
// q4: 16 B of nibbles (even element low) per group, value (q-8)*scale.
float dot_q4_tiled(const uint8_t *tiles, const float *x, uint64_t groups);                  // [f16 s][16 B]
float dot_q4_split(const uint8_t *nibbles, const uint8_t *f16_scales, const float *x, uint64_t groups);
float dot_q4_groups(const uint8_t *nibbles, const float *scales, const float *x, uint64_t groups);
// q2tp: 8 B per group, weight 4k+j in bits [2j, 2j+2) of byte k, value (c-1.5)*scale.
float dot_q2_groups(const uint8_t *chunks, const float *scales, const float *x, uint64_t groups);
float dot_q1(const uint8_t *tiles, const float *x, uint64_t groups);   // [f16 s][4 B bits]
float dot_q1t(const uint8_t *tiles, const float *x, uint64_t groups);  // [f16 s][7 B base-3]

// Which implementation the dispatcher chose ("avx2" or "portable").
const char *active_isa();

}  // namespace cmf::codecs::kernels
