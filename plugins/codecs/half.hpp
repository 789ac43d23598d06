// f16 and bf16 conversions exactly as the original implementation does them
// (docs/dtypes.md). Note the f32 -> f16 encoder is not IEEE: normal results round
// half-to-even, but subnormal results round half-up (2^-25 -> 0x0001), and
// overflow goes straight to Inf. Files in the wild were written this way.
#pragma once

#include <cstdint>
#include <cstring>

namespace cmf::codecs {

inline uint32_t f32_bits(float f) noexcept {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float f32_from_bits(uint32_t u) noexcept {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t f32_to_f16(float f) noexcept {
    uint32_t x = f32_bits(f);
    uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    uint32_t exp32 = (x >> 23) & 0xFFu;
    uint32_t mant = x & 0x7FFFFFu;
    if (exp32 == 0xFF) return mant ? static_cast<uint16_t>(sign | 0x7E00u) : static_cast<uint16_t>(sign | 0x7C00u);
    int32_t e = static_cast<int32_t>(exp32) - 112;
    if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
    if (e >= 1) {
        uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
        bool round = (mant >> 12) & 1u;
        bool sticky = (mant & 0xFFFu) != 0;
        if (round && (sticky || (h & 1u))) ++h;  // may carry into the exponent / Inf
        return static_cast<uint16_t>(sign | h);
    }
    if (e >= -10) {
        uint32_t m = mant | 0x800000u;
        uint32_t s = static_cast<uint32_t>(14 - e);
        uint32_t h = (m >> s) + ((m >> (s - 1)) & 1u);  // round half up
        return static_cast<uint16_t>(sign | h);
    }
    return sign;
}

inline float f16_to_f32(uint16_t h) noexcept {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t out;
    if (exp == 0) {
        if (mant == 0) {
            out = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            out = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3FFu) << 13);
        }
    } else if (exp == 0x1F) {
        out = sign | 0x7F800000u | (mant << 13);
    } else {
        out = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    return f32_from_bits(out);
}

// bf16: round-to-nearest-even on the top half; NaN keeps its top half with
// the quiet bit set, as the writer of the original's test fixtures does.
inline uint16_t f32_to_bf16(float f) noexcept {
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}

inline float bf16_to_f32(uint16_t b) noexcept { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

}  // namespace cmf::codecs
