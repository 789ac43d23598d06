// The q1s overlay loop, shared by the portable and the SIMD kernel files,
// each with its own f16 conversion (F16C's vcvtph2ps where the file is
// built for it, the portable bit-field decode otherwise). In an anonymous
// namespace so each file keeps its own copy and no weak symbol
// (tests/codecs/no_shared_inline_copies.sh).
#pragma once

#include <cstdint>
#include <cstring>

namespace cmf::codecs::kernels {
namespace {

// y[r] += the corrections of the overlay entries [0, count) (6 B each: u32
// element index, strictly ascending, all in [begin, begin + rows * cols);
// f16 value) of a q1 base (tiles over the whole tensor), row r holding the
// elements [begin + r*cols, begin + (r+1)*cols): (value - base value) *
// d[c/32] * q[c] at the entry's column c, x being natural-order int8 blocks.
// An entry below the current row (a list out of order) or past the range
// is skipped: nothing outside x, y[0, rows) and the tiles is read or written.
// A row's corrections are summed in a register and added once: added to y
// one by one, consecutive entries of a row waited on each other through
// memory, and the row is followed as the indices ascend instead of divided
// out (a 64-bit division per entry cost about as much as the base dots).
template <float (*F16)(const uint8_t *)>
inline void q1s_overlay_rows(const uint8_t *tiles, const uint8_t *entries, uint64_t count, uint64_t begin,
                             uint64_t cols, uint64_t rows, const int8_t *xq, const float *xd, float *y) {
    uint64_t row = 0, row_begin = begin;
    const uint64_t end = begin + rows * cols;
    float acc = 0.0f;
    for (uint64_t e = 0; e < count; ++e) {
        const uint8_t *p = entries + 6 * e;
        uint32_t idx;
        std::memcpy(&idx, p, 4);
        if (idx < row_begin || idx >= end) continue;
        if (idx >= row_begin + cols) {
            y[row] += acc;
            acc = 0.0f;
            do ++row, row_begin += cols;
            while (idx >= row_begin + cols);
        }
        const uint8_t *tile = tiles + 6 * (idx / 32);
        uint32_t bits;
        std::memcpy(&bits, tile + 2, 4);
        const float s = F16(tile), base = ((bits >> (idx % 32)) & 1u) ? s : -s;
        const uint64_t c = idx - row_begin;
        acc += (F16(p + 4) - base) * (xd[c / 32] * static_cast<float>(xq[c]));
    }
    if (count != 0 && rows != 0) y[row] += acc;
}

// Whether entries [from, count) ascend strictly, entry from-1 included
// when from > 0 (the scalar loop; the AVX-512 build does 16 at a time).
inline bool q1s_ascending_from(const uint8_t *entries, uint64_t from, uint64_t count) {
    uint32_t prev = 0;
    if (from > 0) std::memcpy(&prev, entries + 6 * (from - 1), 4);
    for (uint64_t e = from; e < count; ++e) {
        uint32_t idx;
        std::memcpy(&idx, entries + 6 * e, 4);
        if (e > 0 && idx <= prev) return false;
        prev = idx;
    }
    return true;
}

}  // namespace
}  // namespace cmf::codecs::kernels
