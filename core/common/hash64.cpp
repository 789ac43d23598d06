#include "hash64.hpp"

#include <cstring>

namespace cmf {

namespace {
inline uint64_t fmix(uint64_t x) noexcept {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}
}  // namespace

uint64_t hash64(const void *data, size_t len) noexcept {
    return hash64_finish(hash64_partial(data, len, 0), len);
}

uint64_t hash64_finish(uint64_t acc, uint64_t total_len) noexcept { return fmix(acc ^ total_len); }

uint64_t hash64_partial(const void *data, size_t len, uint64_t first_word) noexcept {
    // Words are independent (XOR of per-word mixes), so four lanes run in
    // parallel and the result does not depend on the order of combination.
    const unsigned char *p = static_cast<const unsigned char *>(data);
    const uint64_t salt = 0x9E3779B97F4A7C15ull;
    size_t words = len / 8;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = 0;
    for (; i + 4 <= words; i += 4) {
        uint64_t w[4];
        std::memcpy(w, p + i * 8, 32);
        uint64_t k = first_word + i;
        a0 ^= fmix(w[0]) ^ (k * salt);
        a1 ^= fmix(w[1]) ^ ((k + 1) * salt);
        a2 ^= fmix(w[2]) ^ ((k + 2) * salt);
        a3 ^= fmix(w[3]) ^ ((k + 3) * salt);
    }
    uint64_t acc = a0 ^ a1 ^ a2 ^ a3;
    for (; i < words; ++i) {
        uint64_t w;
        std::memcpy(&w, p + i * 8, 8);
        acc ^= fmix(w) ^ ((first_word + i) * salt);
    }
    if (size_t rem = len % 8) {
        uint64_t w = 0;
        std::memcpy(&w, p + words * 8, rem);  // little-endian host, zero padded
        acc ^= fmix(w) ^ ((first_word + words) * salt);
    }
    return acc;
}

}  // namespace cmf
