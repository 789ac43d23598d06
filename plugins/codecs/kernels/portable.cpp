#include "kernels/portable.hpp"

#include "half.hpp"

#include <cstring>

namespace cmf::codecs::kernels::portable {

namespace {
float f16_at(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
}
float q4_group(const uint8_t *nib, const float *x) {
    float acc = 0.0f;
    for (int k = 0; k < 16; ++k) {
        acc += static_cast<float>((nib[k] & 15) - 8) * x[2 * k];
        acc += static_cast<float>((nib[k] >> 4) - 8) * x[2 * k + 1];
    }
    return acc;
}
}  // namespace

float dot_f32(const float *a, const float *x, uint64_t n) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; ++i) acc += a[i] * x[i];
    return acc;
}
float dot_f16(const uint16_t *h, const float *x, uint64_t n) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; ++i) acc += f16_to_f32(h[i]) * x[i];
    return acc;
}
float dot_bf16(const uint16_t *h, const float *x, uint64_t n) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; ++i) acc += bf16_to_f32(h[i]) * x[i];
    return acc;
}
float dot_i8_f32(const int8_t *q, const float *x, uint64_t n) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; ++i) acc += static_cast<float>(q[i]) * x[i];
    return acc;
}
float dot_q4_tiled(const uint8_t *tiles, const float *x, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) acc += f16_at(tiles + 18 * g) * q4_group(tiles + 18 * g + 2, x + 32 * g);
    return acc;
}
float dot_q4_split(const uint8_t *nibbles, const uint8_t *f16_scales, const float *x, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) acc += f16_at(f16_scales + 2 * g) * q4_group(nibbles + 16 * g, x + 32 * g);
    return acc;
}
float dot_q4_groups(const uint8_t *nibbles, const float *scales, const float *x, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) acc += scales[g] * q4_group(nibbles + 16 * g, x + 32 * g);
    return acc;
}
float dot_q2_groups(const uint8_t *chunks, const float *scales, const float *x, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) {
        float a = 0.0f;
        const uint8_t *c = chunks + 8 * g;
        for (int i = 0; i < 32; ++i) a += (static_cast<float>((c[i / 4] >> (2 * (i % 4))) & 3) - 1.5f) * x[32 * g + i];
        acc += scales[g] * a;
    }
    return acc;
}
float dot_q1(const uint8_t *tiles, const float *x, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 6 * g;
        float a = 0.0f;
        for (int i = 0; i < 32; ++i) a += ((t[2 + i / 8] >> (i % 8)) & 1) ? x[32 * g + i] : -x[32 * g + i];
        acc += f16_at(t) * a;
    }
    return acc;
}
float dot_q1t(const uint8_t *tiles, const float *x, uint64_t groups) {
    static constexpr unsigned kPow3[5] = {1, 3, 9, 27, 81};
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 9 * g;
        float a = 0.0f;
        for (unsigned i = 0; i < 32; ++i) {
            unsigned d = t[2 + i / 5] / kPow3[i % 5] % 3;
            if (d == 1) a += x[32 * g + i];
            else if (d == 2) a -= x[32 * g + i];
        }
        acc += f16_at(t) * a;
    }
    return acc;
}

}  // namespace cmf::codecs::kernels::portable
