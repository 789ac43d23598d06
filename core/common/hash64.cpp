#include "hash64.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
namespace {
#define CMF_AVX2 __attribute__((target("avx2")))

// Low 64 bits of a*b per lane. AVX2 has no 64-bit multiply (vpmullq is
// AVX-512DQ), so it is built from 32-bit pieces: lo*lo (full 64-bit
// product) + ((lo*hi + hi*lo) << 32).
CMF_AVX2 inline __m256i mul64(__m256i a, __m256i b) {
    __m256i cross = _mm256_mullo_epi32(a, _mm256_shuffle_epi32(b, 0xB1));  // a.lo*b.hi, a.hi*b.lo
    __m256i sum = _mm256_slli_epi64(_mm256_add_epi32(cross, _mm256_srli_epi64(cross, 32)), 32);
    return _mm256_add_epi64(_mm256_mul_epu32(a, b), sum);
}

CMF_AVX2 inline __m256i fmix4(__m256i x, __m256i c1, __m256i c2) {
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 33));
    x = mul64(x, c1);
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 33));
    x = mul64(x, c2);
    return _mm256_xor_si256(x, _mm256_srli_epi64(x, 33));
}

// Eight words per step in two independent lanes of four; the word-index
// salt advances by addition (k*salt + 8*salt) instead of a multiply.
// Measured on the 2-core EPYC: 13.6 GB/s per core from L2 vs 5.3 GB/s for
// the scalar loop (verify is then bound by memory, not by the hash).
CMF_AVX2 uint64_t partial_avx2(const unsigned char *p, size_t words, uint64_t first_word, size_t *done) {
    const uint64_t salt = 0x9E3779B97F4A7C15ull;
    const __m256i c1 = _mm256_set1_epi64x(int64_t(0xFF51AFD7ED558CCDull));
    const __m256i c2 = _mm256_set1_epi64x(int64_t(0xC4CEB9FE1A85EC53ull));
    const uint64_t k = first_word;
    __m256i s0 = _mm256_set_epi64x(int64_t((k + 3) * salt), int64_t((k + 2) * salt), int64_t((k + 1) * salt),
                                   int64_t(k * salt));
    __m256i s1 = _mm256_add_epi64(s0, _mm256_set1_epi64x(int64_t(4 * salt)));
    const __m256i step = _mm256_set1_epi64x(int64_t(8 * salt));
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= words; i += 8) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i * 8));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i * 8 + 32));
        a0 = _mm256_xor_si256(a0, _mm256_xor_si256(fmix4(w0, c1, c2), s0));
        a1 = _mm256_xor_si256(a1, _mm256_xor_si256(fmix4(w1, c1, c2), s1));
        s0 = _mm256_add_epi64(s0, step);
        s1 = _mm256_add_epi64(s1, step);
    }
    uint64_t lanes[4];
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(lanes), _mm256_xor_si256(a0, a1));
    *done = i;
    return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}

bool have_avx2() noexcept {
    static const bool yes = __builtin_cpu_supports("avx2");
    return yes;
}
}  // namespace
#endif

uint64_t hash64_partial(const void *data, size_t len, uint64_t first_word) noexcept {
    // Words are independent (XOR of per-word mixes), so four lanes run in
    // parallel and the result does not depend on the order of combination.
    const unsigned char *p = static_cast<const unsigned char *>(data);
    const uint64_t salt = 0x9E3779B97F4A7C15ull;
    size_t words = len / 8;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = 0;
#if defined(__x86_64__)
    if (words >= 8 && have_avx2()) a0 = partial_avx2(p, words, first_word, &i);
#endif
    for (; i + 4 <= words; i += 4) {
        uint64_t w[4];
        std::memcpy(w, p + i * 8, 32);
        const uint64_t k = first_word + i;
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

void Hash64Stream::update(const void *data, size_t len) noexcept {
    const unsigned char *p = static_cast<const unsigned char *>(data);
    if (carry_len_ > 0) {
        const size_t take = std::min(len, 8 - carry_len_);
        std::memcpy(carry_ + carry_len_, p, take);
        carry_len_ += take;
        total_ += take;
        p += take;
        len -= take;
        if (carry_len_ < 8) return;
        acc_ ^= hash64_partial(carry_, 8, total_ / 8 - 1);
        carry_len_ = 0;
    }
    const size_t whole = len / 8 * 8;
    if (whole > 0) acc_ ^= hash64_partial(p, whole, total_ / 8);
    total_ += whole;
    carry_len_ = len - whole;
    std::memcpy(carry_, p + whole, carry_len_);
    total_ += carry_len_;
}

uint64_t Hash64Stream::value() const noexcept {
    uint64_t acc = acc_;
    if (carry_len_ > 0) acc ^= hash64_partial(carry_, carry_len_, total_ / 8);
    return hash64_finish(acc, total_);
}

}  // namespace cmf
