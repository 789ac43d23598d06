// Portable kernel implementations (also the reference the AVX2 ones are tested against).
#pragma once

#include <cstdint>

namespace cmf::codecs::kernels::portable {

float dot_f32(const float *a, const float *x, uint64_t n);
float dot_f16(const uint16_t *h, const float *x, uint64_t n);
float dot_bf16(const uint16_t *h, const float *x, uint64_t n);
float dot_i8_f32(const int8_t *q, const float *x, uint64_t n);
float dot_q4_tiled(const uint8_t *tiles, const float *x, uint64_t groups);
float dot_q4_split(const uint8_t *nibbles, const uint8_t *f16_scales, const float *x, uint64_t groups);
float dot_q4_groups(const uint8_t *nibbles, const float *scales, const float *x, uint64_t groups);
float dot_q2_groups(const uint8_t *chunks, const float *scales, const float *x, uint64_t groups);
float dot_q1(const uint8_t *tiles, const float *x, uint64_t groups);
float dot_q1t(const uint8_t *tiles, const float *x, uint64_t groups);

}  // namespace cmf::codecs::kernels::portable

namespace cmf::codecs::kernels::avx2 {

float dot_f32(const float *a, const float *x, uint64_t n);
float dot_f16(const uint16_t *h, const float *x, uint64_t n);
float dot_bf16(const uint16_t *h, const float *x, uint64_t n);
float dot_i8_f32(const int8_t *q, const float *x, uint64_t n);
float dot_q4_tiled(const uint8_t *tiles, const float *x, uint64_t groups);
float dot_q4_split(const uint8_t *nibbles, const uint8_t *f16_scales, const float *x, uint64_t groups);
float dot_q4_groups(const uint8_t *nibbles, const float *scales, const float *x, uint64_t groups);
float dot_q2_groups(const uint8_t *chunks, const float *scales, const float *x, uint64_t groups);
float dot_q1(const uint8_t *tiles, const float *x, uint64_t groups);
float dot_q1t(const uint8_t *tiles, const float *x, uint64_t groups);

}  // namespace cmf::codecs::kernels::avx2
