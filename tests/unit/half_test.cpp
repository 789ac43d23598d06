// f16/bf16 conversions against the original's rules (docs/dtypes.md).
#include <doctest/doctest.h>

#include "half.hpp"

#include <cmath>
#include <limits>

using namespace cmf::codecs;

namespace {
float bits(uint32_t u) { return f32_from_bits(u); }
}  // namespace

TEST_CASE("f32 -> f16: the original's check values") {
    CHECK(f32_to_f16(1e-4f) == 0x068e);
    CHECK(f32_to_f16(0.1f) == 0x2e66);
    CHECK(f32_to_f16(-2.5f) == 0xc100);
    CHECK(f32_to_f16(65504.0f) == 0x7bff);
    CHECK(f32_to_f16(-0.0f) == 0x8000);
    CHECK(f32_to_f16(0.0f) == 0x0000);
    CHECK(f32_to_f16(1.0f) == 0x3c00);
}

TEST_CASE("f32 -> f16: normal ties round to even, carries reach the next exponent and Inf") {
    // 1 + 2^-11 is exactly halfway between 1 and 1 + 2^-10: even is 1.
    CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
    // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): up.
    CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
    // Just above a tie rounds up (sticky bit).
    CHECK(f32_to_f16(bits(0x3f801001)) == 0x3c01);
    CHECK(f32_to_f16(65519.0f) == 0x7bff);
    CHECK(f32_to_f16(65520.0f) == 0x7c00);  // carry into Inf
    CHECK(f32_to_f16(1e6f) == 0x7c00);      // overflow
    CHECK(f32_to_f16(-1e6f) == 0xfc00);
    CHECK(f32_to_f16(2047.5f) == 0x6800);   // 2047.5 -> tie between 2047 (odd) and 2048
}

TEST_CASE("f32 -> f16: subnormal results round half up, as the original does") {
    CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0001);      // IEEE would give 0x0000
    CHECK(f32_to_f16(5 * std::ldexp(1.0f, -25)) == 0x0003);  // IEEE would give 0x0002
    CHECK(f32_to_f16(3 * std::ldexp(1.0f, -25)) == 0x0002);
    CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);      // smallest subnormal
    CHECK(f32_to_f16(std::ldexp(1.0f, -14)) == 0x0400);      // smallest normal
    CHECK(f32_to_f16(std::ldexp(1.0f, -26)) == 0x0000);      // below half the smallest subnormal
    CHECK(f32_to_f16(-std::ldexp(1.0f, -25)) == 0x8001);
    CHECK(f32_to_f16(std::ldexp(1023.0f, -24)) == 0x03ff);   // largest subnormal
}

TEST_CASE("f32 -> f16: Inf and NaN") {
    CHECK(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);
    CHECK(f32_to_f16(-std::numeric_limits<float>::infinity()) == 0xfc00);
    CHECK(f32_to_f16(std::numeric_limits<float>::quiet_NaN()) == 0x7e00);
    CHECK(f32_to_f16(bits(0xffc00001)) == 0xfe00);
}

TEST_CASE("f16 -> f32 is exact widening, including subnormals and NaN payloads") {
    CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(f16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));
    CHECK(f16_to_f32(0x0400) == std::ldexp(1.0f, -14));
    CHECK(f16_to_f32(0x7bff) == 65504.0f);
    CHECK(f16_to_f32(0xc100) == -2.5f);
    CHECK(f32_bits(f16_to_f32(0x8000)) == 0x80000000u);
    CHECK(std::isinf(f16_to_f32(0x7c00)));
    CHECK(f32_bits(f16_to_f32(0x7e01)) == (0x7f800000u | (0x201u << 13)));
    // Every finite f16 survives f16 -> f32 -> f16 unchanged.
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7c00) == 0x7c00) continue;
        REQUIRE(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))) == h);
    }
}

TEST_CASE("bf16: round to nearest even on the top half, NaN stays NaN") {
    CHECK(f32_to_bf16(1.0f) == 0x3f80);
    CHECK(f32_to_bf16(-2.5f) == 0xc020);
    CHECK(f32_to_bf16(bits(0x3f808000)) == 0x3f80);  // tie, even stays
    CHECK(f32_to_bf16(bits(0x3f818000)) == 0x3f82);  // tie, odd rounds up
    CHECK(f32_to_bf16(bits(0x3f808001)) == 0x3f81);  // above tie
    CHECK(f32_to_bf16(bits(0x7f7fffff)) == 0x7f80);  // max float rounds to Inf
    CHECK(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
    CHECK(f32_to_bf16(bits(0x7f800001)) == 0x7fc0);  // signalling NaN -> quiet, top half
    CHECK(f32_to_bf16(bits(0x00000001)) == 0x0000);  // tiny subnormal rounds to 0
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    CHECK(f32_bits(bf16_to_f32(0x8001)) == 0x80010000u);
}
