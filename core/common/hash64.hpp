// hash64: the 64-bit hash CMF v2 puts on every tensor, the header and the
// directory (spec §8). Not a cryptographic hash.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cmf {

uint64_t hash64(const void *data, size_t len) noexcept;

// hash64 in pieces (words are mixed independently and XOR-combined, so a
// long payload can be hashed by several threads): hash64_partial over bytes
// that start at word index `first_word` (piece lengths other than the last
// must be multiples of 8), XOR the partials, then hash64_finish with the
// total length. hash64(p, n) == hash64_finish(hash64_partial(p, n, 0), n).
uint64_t hash64_partial(const void *data, size_t len, uint64_t first_word) noexcept;
uint64_t hash64_finish(uint64_t acc, uint64_t total_len) noexcept;

// hash64 of bytes that arrive in pieces of any length (a payload streamed
// into a file): whole words are hashed as they come, a partial word waits
// for the next piece. value() == hash64 of everything fed so far.
class Hash64Stream {
public:
    void update(const void *data, size_t len) noexcept;
    uint64_t value() const noexcept;
    uint64_t length() const noexcept { return total_; }

private:
    uint64_t acc_ = 0, total_ = 0;
    unsigned char carry_[8] = {};
    size_t carry_len_ = 0;
};

}  // namespace cmf
