// hash64 against test vectors computed with the original's algorithm (spec §8).
#include <doctest/doctest.h>

#include "common/hash64.hpp"

#include <algorithm>
#include <string>
#include <vector>

using cmf::hash64;

namespace {
uint64_t h(const std::string &s) { return hash64(s.data(), s.size()); }
}  // namespace

TEST_CASE("hash64: the original's test vectors") {
    CHECK(h("") == 0x0000000000000000ull);
    CHECK(h("CMF") == 0xb59aa39a074033ecull);
    CHECK(h("0123456789abcdef") == 0x30d401310062ea9full);
    CHECK(h("a") == 0x247f1eaecb8be39aull);
    CHECK(h(std::string(8, '\0')) == 0x46abcca593a3c687ull);
    CHECK(h("hello world") == 0x7a04b2fb6f5cae20ull);
    CHECK(h("model.embed_tokens.weight") == 0xd4b275618347dadbull);
    std::vector<unsigned char> b(256);
    for (int i = 0; i < 256; ++i) b[i] = static_cast<unsigned char>(i);
    CHECK(hash64(b.data(), 256) == 0x9955bb876c0706bfull);
    CHECK(hash64(b.data(), 9) == 0x87103ac7d2393fa8ull);
}

TEST_CASE("hash64: every length 0..200 agrees with the one-word-at-a-time definition") {
    auto fmix = [](uint64_t x) {
        x ^= x >> 33; x *= 0xFF51AFD7ED558CCDull; x ^= x >> 33; x *= 0xC4CEB9FE1A85EC53ull; x ^= x >> 33;
        return x;
    };
    std::vector<unsigned char> b(200);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(i * 37 + 11);
    for (size_t len = 0; len <= b.size(); ++len) {
        uint64_t acc = 0;
        for (size_t w = 0; w * 8 < len; ++w) {
            uint64_t word = 0;
            for (size_t k = 0; k < 8 && w * 8 + k < len; ++k) word |= uint64_t(b[w * 8 + k]) << (8 * k);
            acc ^= fmix(word) ^ (w * 0x9E3779B97F4A7C15ull);
        }
        REQUIRE(hash64(b.data(), len) == fmix(acc ^ len));
    }
}

TEST_CASE("hash64: pieces at any word offset and unaligned starts give the whole hash (vector and scalar paths)") {
    std::vector<unsigned char> b(1201);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>((i * 131) ^ (i >> 3));
    for (size_t start = 0; start < 3; ++start) {  // 1 and 2 make every load unaligned
        const unsigned char *p = b.data() + start;
        const size_t len = b.size() - start;
        const uint64_t whole = hash64(p, len);
        for (size_t cut = 0; cut <= len; cut += 8) {
            uint64_t acc = cmf::hash64_partial(p, cut, 0) ^ cmf::hash64_partial(p + cut, len - cut, cut / 8);
            REQUIRE(cmf::hash64_finish(acc, len) == whole);
        }
    }
}

TEST_CASE("hash64: Hash64Stream over pieces of any length gives the whole hash") {
    std::vector<unsigned char> b(1201);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>((i * 197) ^ (i >> 2));
    const size_t steps[] = {1, 3, 8, 5, 70, 2, 13, 64, 7};
    for (size_t first = 0; first < 9; ++first) {  // every rotation of the piece lengths
        cmf::Hash64Stream h;
        size_t at = 0;
        for (size_t k = first; at < b.size(); ++k) {
            const size_t n = std::min(steps[k % 9], b.size() - at);
            h.update(b.data() + at, n);
            at += n;
            REQUIRE(h.length() == at);
            REQUIRE(h.value() == hash64(b.data(), at));
        }
    }
    cmf::Hash64Stream empty;
    CHECK(empty.value() == hash64(b.data(), 0));
}
