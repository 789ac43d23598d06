// Byte-level constants and helpers of the CMF v2 container (spec §1, §3,
// §4): envelope layout, little-endian access, checked arithmetic.
#pragma once

#include "common/error.hpp"

#include <cmf/cmf_types.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace cmf::container {

inline constexpr uint8_t kMagic[4] = {'C', 'M', 'F', 0x01};
inline constexpr uint32_t kVersion = 2;
inline constexpr uint64_t kEnvelopeSize = 128;
inline constexpr uint64_t kDirRecordSize = 56;
inline constexpr uint64_t kDataAlign = 4096;        // data_off alignment
inline constexpr uint64_t kTensorAlign = 64;        // every payload
inline constexpr uint64_t kPageTensorAlign = 4096;  // W1: payloads >= kLargeTensor
inline constexpr uint64_t kLargeTensor = 16384;
inline constexpr int32_t kMaxDtypeId = 16;           // ids above: UnknownDtype at open

inline uint16_t rd16(const uint8_t *p) noexcept { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t rd32(const uint8_t *p) noexcept { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint64_t rd64(const uint8_t *p) noexcept { uint64_t v; std::memcpy(&v, p, 8); return v; }
inline void wr16(uint8_t *p, uint16_t v) noexcept { std::memcpy(p, &v, 2); }
inline void wr32(uint8_t *p, uint32_t v) noexcept { std::memcpy(p, &v, 4); }
inline void wr64(uint8_t *p, uint64_t v) noexcept { std::memcpy(p, &v, 8); }
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "CMF is little-endian; this build assumes a LE host");

// Overflow-checked arithmetic: false on overflow.
inline bool add_ok(uint64_t a, uint64_t b, uint64_t &out) noexcept { return !__builtin_add_overflow(a, b, &out); }
inline bool mul_ok(uint64_t a, uint64_t b, uint64_t &out) noexcept { return !__builtin_mul_overflow(a, b, &out); }
inline uint64_t align_up(uint64_t x, uint64_t a) noexcept { return (x + a - 1) / a * a; }

// The six sections addressed by the envelope, in the order open() checks them.
enum Section : int { kHeader = 0, kDir, kData, kMasks, kVocab, kIndex, kSectionCount };
inline const char *section_name(int s) noexcept {
    static const char *names[] = {"header", "directory", "data", "masks", "vocab", "index"};
    return names[s];
}

struct Envelope {
    uint32_t version = kVersion;
    uint32_t flags = 0;
    uint32_t required_features = 0;
    uint64_t off[kSectionCount] = {};
    uint64_t len[kSectionCount] = {};
    uint64_t header_hash = 0;  // 0x70
    uint64_t dir_hash = 0;     // 0x78

    void encode(uint8_t out[kEnvelopeSize]) const noexcept {
        std::memset(out, 0, kEnvelopeSize);
        std::memcpy(out, kMagic, 4);
        wr32(out + 4, version);
        wr32(out + 8, flags);
        wr32(out + 12, required_features);
        for (int s = 0; s < kSectionCount; ++s) {
            wr64(out + 16 + 16 * s, off[s]);
            wr64(out + 24 + 16 * s, len[s]);
        }
        wr64(out + 0x70, header_hash);
        wr64(out + 0x78, dir_hash);
    }
    // Decodes the fields only (magic/version checks are the reader's).
    static Envelope decode(const uint8_t *p) noexcept {
        Envelope e;
        e.version = rd32(p + 4);
        e.flags = rd32(p + 8);
        e.required_features = rd32(p + 12);
        for (int s = 0; s < kSectionCount; ++s) {
            e.off[s] = rd64(p + 16 + 16 * s);
            e.len[s] = rd64(p + 24 + 16 * s);
        }
        e.header_hash = rd64(p + 0x70);
        e.dir_hash = rd64(p + 0x78);
        return e;
    }
};

// "%016x" of a hash, as section_hashes and base_dir_hash spell it.
inline std::string hex16(uint64_t v) {
    static const char d[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = d[v & 15];
    return s;
}

}  // namespace cmf::container
