// q1 (12), q1s (13), q1t (14): binary and ternary codes per 32-group with an
// f16 scale (spec §3.2; docs/dtypes.md). q1s appends an exact outlier list, q1t a
// per-row outlier overlay. Groups are taken over the flattened tensor, as the
// original's decoder does; its encoders need 2-D with cols % 32 == 0.
#include "dtypes/all.hpp"
#include "dtypes/common.hpp"
#include "kernels/kernels.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

namespace cmf::codecs {

namespace {

// ---- q1 base tiles [f16 s][4 B bits, LSB-first] ----------------------------------
float q1_value(const uint8_t *tiles, uint64_t i) {
    const uint8_t *tile = tiles + 6 * (i / 32);
    unsigned k = static_cast<unsigned>(i % 32);
    float s = load_f16(tile);
    return ((tile[2 + k / 8] >> (k % 8)) & 1u) ? s : -s;
}

// Encodes q1 tiles for a 2-D matrix. `outlier` (optional) marks elements that
// neither enter the scale nor the carry; `diffuse` turns on the q1p carry.
void encode_q1_tiles(const float *src, Matrix m, bool diffuse, const std::vector<bool> *outlier, uint8_t *tiles) {
    uint64_t gpr = m.cols / 32;
    for (uint64_t r = 0; r < m.rows; ++r) {
        float carry = 0.0f;
        for (uint64_t g = 0; g < gpr; ++g) {
            uint64_t base = r * m.cols + 32 * g;
            const float *w = src + base;
            float sum = 0.0f;
            uint32_t count = 0;
            for (int i = 0; i < 32; ++i)
                if (!outlier || !(*outlier)[base + i]) sum += std::fabs(w[i]), ++count;
            float mean = outlier ? (count ? sum / static_cast<float>(count) : 0.0f) : sum / 32.0f;
            float s = f16_scale(mean);
            uint8_t *tile = tiles + 6 * (r * gpr + g);
            store_u16(tile, f32_to_f16(s));
            uint32_t bits = 0;
            for (int i = 0; i < 32; ++i) {
                bool bit;
                if ((outlier && (*outlier)[base + i]) || !diffuse) {
                    bit = w[i] >= 0.0f;
                } else {
                    float v = w[i] + carry;
                    bit = v >= 0.0f;
                    carry = v - (bit ? s : -s);
                }
                bits |= static_cast<uint32_t>(bit) << i;
            }
            store_u32(tile + 2, bits);
        }
    }
}

// The q1 values of elements [begin, end) into dst (q1's decode, q1s's base):
// whole groups through the SIMD unpack (codes +-1 and the group's scale; a
// code picks the scale or its negation, as q1_value does, NaN's sign
// included), the ends of a range that cuts groups one by one. q1s's prefill
// dequantizes its panels for the f32 GEMM: one element at a time (tile,
// scale and bit found per element), that was 56 % of a pp256 run.
void q1_values(const uint8_t *tiles, uint64_t begin, uint64_t end, float *dst) {
    uint64_t i = begin;
    for (; i < end && i % 32 != 0; ++i) *dst++ = q1_value(tiles, i);
    constexpr uint64_t kChunk = 64;  // groups unpacked at a time, on the stack
    int8_t codes[32 * kChunk];
    float scales[kChunk];
    for (uint64_t groups = (end - i) / 32; groups > 0;) {
        const uint64_t n = std::min(groups, kChunk);
        kernels::unpack_q1_groups(tiles + 6 * (i / 32), n, codes, scales);
        for (uint64_t g = 0; g < n; ++g)
            for (uint64_t k = 0; k < 32; ++k) dst[32 * g + k] = codes[32 * g + k] > 0 ? scales[g] : -scales[g];
        dst += 32 * n, i += 32 * n, groups -= n;
    }
    for (; i < end; ++i) *dst++ = q1_value(tiles, i);
}

// The q1 rows [r0, r1) of a matrix of gpr groups a row against x quantized
// to int8 blocks in natural order (kernels::rows_q1_xq): q1 and q1s's base.
void q1_base_rows(const uint8_t *tiles, uint64_t gpr, const QuantizedX &xq, uint64_t n_batch, uint64_t r0, uint64_t r1,
                  float *y, uint64_t ldy) {
    for_row_tiles(r0, r1, n_batch, [&](uint64_t t0, uint64_t t1, uint64_t b) {
        kernels::rows_q1_xq(tiles + 6 * t0 * gpr, xq.q(b), xq.offset(b), xq.d(b), gpr, t1 - t0, y + b * ldy + t0);
    }, 6 * gpr);
}

// A step of 16 groups' bits as q1_passes' 64 lane bytes (kernels.hpp,
// rows_q1_passes_xq: bit t of byte 4j+i is bit 4t+i of group j), eight
// lanes a word: word b holds groups 2b and 2b+1, whose nibbles t spread one
// a byte give an 8x8 bit matrix (byte t, bit k: element 4t+k%4 of group
// 2b+k/4) that one transpose turns into lanes 8b..8b+7 (word operations,
// not a bit at a time: the copies are made as a model loads).
uint64_t transpose_bits_8x8(uint64_t x) {  // bit 8r+c -> bit 8c+r
    uint64_t t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAull;
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCull;
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ull;
    return x ^ t ^ (t << 28);
}
// 32 bits -> their 8 nibbles, one in the low half of each byte.
uint64_t spread_nibbles(uint32_t v) {
    uint64_t y = v;
    y = (y | (y << 16)) & 0x0000FFFF0000FFFFull;
    y = (y | (y << 8)) & 0x00FF00FF00FF00FFull;
    return (y | (y << 4)) & 0x0F0F0F0F0F0F0F0Full;
}
void pass_lanes_from_bits(const uint32_t bits[16], uint64_t lanes[8]) {
    for (unsigned b = 0; b < 8; ++b)
        lanes[b] = transpose_bits_8x8(spread_nibbles(bits[2 * b]) | spread_nibbles(bits[2 * b + 1]) << 4);
}
// Each byte's low nibble to its even bits (bit k -> bit 2k), eight bytes a word.
uint64_t spread_to_even_bits(uint64_t x) {
    x &= 0x0F0F0F0F0F0F0F0Full;
    x = (x | (x << 2)) & 0x3333333333333333ull;
    return (x | (x << 1)) & 0x5555555555555555ull;
}
// Whether q1's and q1t's decode copies are made for t: a matrix whose rows
// are whole steps of 16 groups, where the copies' AVX-512 kernel runs.
bool pass_steps_pay(const cmf_tensor_view &t) {
    return t.ndim == 2 && t.shape[1] != 0 && t.shape[1] % 512 == 0 && kernels::q1_passes_kernel();
}
// A step of 16 q1 tiles (96 bytes) as q1_passes' step: the 64 lane bytes,
// then the 16 f16 scales.
void q1_step_to_passes(const uint8_t *tiles, uint8_t *step) {
    uint32_t bits[16];
    uint64_t lanes[8];
    for (unsigned j = 0; j < 16; ++j) {
        bits[j] = load_u32(tiles + 6 * j + 2);
        std::memcpy(step + 64 + 2 * j, tiles + 6 * j, 2);
    }
    pass_lanes_from_bits(bits, lanes);
    std::memcpy(step, lanes, 64);
}
class Q1 final : public Dtype {
public:
    int32_t id() const override { return CMF_DTYPE_Q1; }
    const char *name() const override { return "q1"; }
    uint64_t expected_size(Shape shape) const override { return checked_mad(groups_of(elements(shape)), 6, 0, name()); }
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        validate(t);  // never read past nbytes, even if the caller skipped validation
        const uint64_t len = sdk::row_len_of(t);
        q1_values(bytes_of(t), r0 * len, r1 * len, dst);
    }
    bool can_quantize() const override { return true; }
    // Option error_diffusion=1 is the converter's `--quant q1p`.
    void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                  std::vector<uint8_t> &out) const override {
        Options opt(params, name(), {"error_diffusion"});
        Matrix m = require_2d_groups(shape, name());
        size_t base = out.size();
        out.resize(base + expected_size(shape));
        encode_q1_tiles(src, m, opt.get_bool("error_diffusion", false), nullptr, out.data() + base);
    }
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        validate(w);
        uint64_t cols = sdk::row_len_of(w);
        if (cols % 32 != 0) return matmul_by_decode(*this, w, x, ldx, n_batch, r0, r1, y, ldy);
        const QuantizedX &xq = quantized_x(x, ldx, n_batch, cols, kernels::XOrder::natural);
        q1_base_rows(bytes_of(w), cols / 32, xq, n_batch, r0, r1, y, ldy);
    }
    // int8 view: codes +-1 and the group's scale (whole groups per row).
    bool has_int8_rows() const override { return true; }
    bool int8_view(const cmf_tensor_view &t) const override { return rows_of_int8_blocks(t); }
    void int8_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) const override {
        validate(t);
        const uint64_t gpr = t.shape[1] / 32;
        kernels::unpack_q1_groups(bytes_of(t) + 6 * r0 * gpr, (r1 - r0) * gpr, codes, scales);
    }
    // q1_passes, where its AVX-512 kernel runs and every row is whole steps
    // of 16 groups; the copy is as large as the payload, step for step.
    int32_t decode_layout(const cmf_tensor_view &t, uint64_t *bytes) const override {
        *bytes = 0;
        if (!pass_steps_pay(t)) return -1;
        *bytes = t.nbytes;
        return CMF_DTYPE_MEM_Q1_PASSES;
    }
    void decode_copy(const cmf_tensor_view &t, uint8_t *dst) const override {
        uint64_t n = 0;
        if (decode_layout(t, &n) < 0) Dtype::decode_copy(t, dst);
        validate(t);
        const uint8_t *p = bytes_of(t);
        for (uint64_t k = 0; k < t.nbytes / 96; ++k) q1_step_to_passes(p + 96 * k, dst + 96 * k);
    }
};

// ---- q1_passes and q1t_passes (memory-only: q1's and q1t's decode copies) ----------
// x's passes for the q1_passes and q1t_passes kernels (kernels::q1_passes_x,
// each activation row's after the other), made once per x (xq.serial) for
// every row range of its matmul on this thread, in a room only this reads.
const uint8_t *q1_passes_of_x(const QuantizedX &xq, uint64_t n_batch, uint64_t gpr) {
    const uint64_t per_x = kernels::kQ1PassesXStepBytes * (gpr / 16);
    thread_local uint64_t made_from = 0;
    uint8_t *xt = static_cast<uint8_t *>(kernels::thread_room(kernels::RoomSlot::q1_passes_x, n_batch * per_x));
    if (made_from != xq.serial) {
        for (uint64_t b = 0; b < n_batch; ++b) kernels::q1_passes_x(xq.q(b), gpr, xt + b * per_x);
        made_from = xq.serial;
    }
    return xt;
}

// q1_passes (Ternary false) and q1t_passes: q1's payload, and q1t's base
// without an overlay, of a matrix with whole steps of 16 groups a row, each
// step's bits as the lane bytes of the AVX-512 kernel's passes (ABI:
// CMF_DTYPE_MEM_Q1_PASSES, CMF_DTYPE_MEM_Q1T_PASSES; kernels.hpp,
// rows_q1_passes_xq and rows_q1t_passes_xq), memory-only: q1's and q1t's
// decode copies. They decode and give their int8 views with the values q1
// and q1t give on the same weights, and multiply with the same integer sum
// per group (q1_passes adds the groups up as q1's BITALG kernel does, so
// the same bits there); no encoder, no column selection.
template <bool Ternary>
class Q1PassesOf final : public Dtype {
    static constexpr uint64_t kStepBytes = Ternary ? 160 : 96;  // 16 groups

public:
    int32_t id() const override { return Ternary ? CMF_DTYPE_MEM_Q1T_PASSES : CMF_DTYPE_MEM_Q1_PASSES; }
    const char *name() const override { return Ternary ? "q1t_passes" : "q1_passes"; }
    uint64_t expected_size(Shape shape) const override {
        if (shape.size() != 2 || shape[1] % 512 != 0)
            fail(CMF_ERR_INVALID_ARGUMENT, std::string(name()) + ": 2-D with a multiple of 512 columns only");
        return checked_mad(groups_of(elements(shape)), kStepBytes / 16, 0, name());
    }
    // Rows [r0, r1) as int8 codes (+-1; q1t: -1, 0, +1) and group scales.
    static void unpack(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) {
        const uint64_t spr = t.shape[1] / 512;
        (Ternary ? kernels::unpack_q1t_passes : kernels::unpack_q1_passes)(bytes_of(t) + kStepBytes * spr * r0,
                                                                           (r1 - r0) * spr, codes, scales);
    }
    // A code picks 0, the scale or its negation, as q1's and q1t's decoders
    // do (not code * scale: -1 * NaN keeps the NaN's sign, 0 * -s is -0).
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        validate(t);
        const uint64_t cols = t.shape[1];
        std::vector<int8_t> codes(cols);
        std::vector<float> scales(cols / 32);
        // A group's scale and its negation held for its 32 codes: picked per
        // element from scales[c / 32], the loop did not vectorize and took a
        // third of a q1s prefill through its copy.
        for (uint64_t r = r0; r < r1; ++r) {
            unpack(t, r, r + 1, codes.data(), scales.data());
            for (uint64_t g = 0; g < cols / 32; ++g, dst += 32) {
                const int8_t *code = codes.data() + 32 * g;
                const float s = scales[g], ns = -s;
                // (q1t_passes: a code of 2, from a 3 no copy holds, as 2s,
                // as the kernel multiplies it)
                for (unsigned k = 0; k < 32; ++k)
                    dst[k] = Ternary ? (code[k] == 0 ? 0.0f : code[k] == 1 ? s : code[k] < 0 ? ns : s + s)
                                     : code[k] > 0 ? s : ns;
            }
        }
    }
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        validate(w);
        if (r0 >= r1) return;
        const uint64_t gpr = w.shape[1] / 32;
        const QuantizedX &xq = quantized_x(x, ldx, n_batch, w.shape[1], kernels::XOrder::natural);
        const uint8_t *xt = q1_passes_of_x(xq, n_batch, gpr);
        for_row_tiles(r0, r1, n_batch, [&](uint64_t t0, uint64_t t1, uint64_t b) {
            (Ternary ? kernels::rows_q1t_passes_xq : kernels::rows_q1_passes_xq)(
                bytes_of(w) + kStepBytes * (gpr / 16) * t0, xt + b * kernels::kQ1PassesXStepBytes * (gpr / 16), xq.d(b),
                gpr, t1 - t0, y + b * ldy + t0);
        }, kStepBytes * (gpr / 16));
    }
    bool has_int8_rows() const override { return true; }
    bool int8_view(const cmf_tensor_view &t) const override { return rows_of_int8_blocks(t); }
    void int8_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) const override {
        validate(t);
        unpack(t, r0, r1, codes, scales);
    }
};

// ---- q1s -----------------------------------------------------------------------
struct Q1sView {
    uint64_t n, count;
    const uint8_t *tiles, *entries;
};

Q1sView q1s_view(const cmf_tensor_view &t) {
    Q1sView v;
    v.n = elements(shape_of(t));
    uint64_t base = checked_mad(groups_of(v.n), 6, 0, "q1s");
    if (t.nbytes < base + 4)
        fail(CMF_ERR_BOUNDS, "q1s payload is " + std::to_string(t.nbytes) + " bytes, its base and count need " +
                                 std::to_string(base + 4));
    v.tiles = bytes_of(t);
    v.count = load_u32(v.tiles + base);
    v.entries = v.tiles + base + 4;
    if (t.nbytes != base + 4 + 6 * v.count)
        fail(CMF_ERR_BOUNDS, "q1s payload is " + std::to_string(t.nbytes) + " bytes, " + std::to_string(v.count) +
                                 " outliers need " + std::to_string(base + 4 + 6 * v.count));
    return v;
}

// q1s_passes (CMF_DTYPE_MEM_Q1S_PASSES, q1s's decode copy; docs/dtypes.md):
// the base as q1_passes, then u32 first_step[slices + 1], then u8
// lane_row[16 * slices], then from the next multiple of 64 bytes the
// slices' steps of 96 bytes (16 u16 columns, 16 f32 corrections: value -
// base value). Slice i belongs to the window of rows 64*(i/4) .. +63; its
// lane l holds the outliers of row 64*(i/4) + lane_row[16i + l] (0xFF:
// none), in ascending column order, a column >= cols an empty slot
// (0xFFFF). The correction is the f32 difference q1s's kernel makes per
// entry; base value + correction gives back the value's bits, or no copy
// is made (an outlier so far below its group's scale that the correction
// rounds): the value then decodes from it (a slot of value and base value,
// as many bytes, took two f16 conversions and a subtraction per step more).
// Within a window the rows go to the slices fullest first, so a slice's
// rows have about as many outliers each: at the encoder's 1 % on 1024
// columns, 84 % of the slots hold an outlier where 16 rows in their own
// order filled 63 % (a simulation of Poisson row counts; the 0.6B file's
// copy, 48 MiB of slots for 40 of list, about 83 %).
constexpr uint64_t kQ1sPassesMaxCols = 0xFFFF;  // u16 columns, 0xFFFF free to mean "empty"
constexpr uint64_t kQ1sStepBytes = 96;
constexpr uint8_t kQ1sNoRow = 0xFF;
struct Q1sPassesLayout {
    uint64_t rows, cols, base_bytes, slices, table_at, lanes_at, steps_at;
    Q1sPassesLayout(uint64_t rows_, uint64_t cols_)
        : rows(rows_),
          cols(cols_),
          base_bytes(checked_mad(groups_of(checked_mad(rows, cols, 0, "q1s_passes")), 6, 0, "q1s_passes")),
          slices((rows + 15) / 16),
          table_at(base_bytes),
          lanes_at(checked_mad(slices + 1, 4, base_bytes, "q1s_passes")),
          steps_at((checked_mad(slices, 16, lanes_at, "q1s_passes") + 63) & ~uint64_t(63)) {}
};
// The q1 base value at element idx: its group's scale, negated where its bit is 0.
float base_value(const uint8_t *tiles, uint64_t idx) {
    const uint8_t *tile = tiles + 6 * (idx / 32);
    const float s = load_f16(tile);
    return (load_u32(tile + 2) >> (idx % 32)) & 1u ? s : -s;
}
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
// Where each row of a q1s matrix whose outlier indices strictly ascend
// goes in its copy: each window's rows by descending outlier count (ties
// by row), 16 to a slice, a slice as many steps as its first row has
// outliers.
struct Q1sOverlayPlan {
    std::vector<uint32_t> first_step;  // slices + 1
    std::vector<uint8_t> lane_row;     // 16 * slices
    std::vector<uint32_t> slot_of_row; // 16 * slice + lane
};
Q1sOverlayPlan q1s_overlay_plan(const uint8_t *entries, uint64_t count, const Q1sPassesLayout &l) {
    std::vector<uint32_t> per_row(l.rows, 0);
    for (uint64_t e = 0; e < count; ++e) ++per_row[load_u32(entries + 6 * e) / l.cols];
    Q1sOverlayPlan p{std::vector<uint32_t>(l.slices + 1, 0), std::vector<uint8_t>(16 * l.slices, kQ1sNoRow),
                     std::vector<uint32_t>(l.rows, 0)};
    for (uint64_t w0 = 0; w0 < l.rows; w0 += 64) {
        const unsigned n = static_cast<unsigned>(std::min<uint64_t>(64, l.rows - w0));
        unsigned order[64];
        std::iota(order, order + n, 0u);
        std::stable_sort(order, order + n, [&](unsigned a, unsigned b) { return per_row[w0 + a] > per_row[w0 + b]; });
        for (unsigned q = 0; q < n; ++q) {
            const uint64_t slot = 16 * (w0 / 16) + q;
            p.lane_row[slot] = static_cast<uint8_t>(order[q]);
            p.slot_of_row[w0 + order[q]] = static_cast<uint32_t>(slot);
            if (q % 16 == 0) p.first_step[slot / 16 + 1] = per_row[w0 + order[q]];
        }
    }
    for (uint64_t i = 0; i < l.slices; ++i) p.first_step[i + 1] += p.first_step[i];
    return p;
}

class Q1s final : public Dtype {
public:
    int32_t id() const override { return CMF_DTYPE_Q1S; }
    const char *name() const override { return "q1s"; }
    uint32_t flags() const override { return CMF_CODEC_VARIABLE_SIZE; }
    uint64_t expected_size(Shape shape) const override {
        elements(shape);
        return CMF_SIZE_VARIABLE;
    }
    void validate(const cmf_tensor_view &t) const override { validate_facts(t); }
    // An index >= n is an error; a list out of order is not (a repeated
    // index: its last value wins), but only a strictly ascending list gets
    // kQ1sAscending, on which the kernels find a row range's entries by
    // binary search.
    uint32_t validate_facts(const cmf_tensor_view &t) const override {
        Q1sView v = q1s_view(t);
        bool up = true;
        uint32_t prev = 0;
        for (uint64_t e = 0; e < v.count; ++e) {
            uint32_t idx = load_u32(v.entries + 6 * e);
            if (idx >= v.n)
                fail(CMF_ERR_PARSE, "q1s outlier " + std::to_string(e) + " has index " + std::to_string(idx) +
                                        " >= element count " + std::to_string(v.n));
            if (e > 0 && idx <= prev) up = false;
            prev = idx;
        }
        return up ? kQ1sAscending : 0;
    }
    // No validate() per call: the host validates every tensor once at load
    // (an index >= n is an error there), and here an entry is only written
    // when its index falls in the rows asked for. With the list known to
    // ascend, only the range's entries are read (one embedding row a token
    // otherwise read the whole list: 0.78 ms, 5 % of a 0.6B token).
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        Q1sView v = q1s_view(t);
        uint64_t len = sdk::row_len_of(t);
        uint64_t begin = r0 * len, end = r1 * len;
        q1_values(v.tiles, begin, end, dst);
        uint64_t lo = 0, hi = v.count;
        if (t.facts & kQ1sAscending) lo = first_at(v, begin), hi = first_at(v, end);
        for (uint64_t e = lo; e < hi; ++e) {
            uint32_t idx = load_u32(v.entries + 6 * e);
            if (idx >= begin && idx < end) dst[idx - begin] = load_f16(v.entries + 6 * e + 4);
        }
    }
    // The q1 base through rows_q1_xq, then each outlier of the rows as a
    // correction (value - base value) * x (q1s_overlay_xq), both against x
    // quantized to int8 blocks. A list whose indices do not
    // strictly ascend (the original writes them ascending; a repeated index
    // means its last value wins) takes the decode-then-dot path, which
    // applies the entries in their order. Whether they ascend the view's
    // facts say when the host validated the tensor at load (kQ1sAscending);
    // otherwise it takes a read of the whole list, done once per thread and
    // matmul (the caller's x_id names one matmul, split into many row
    // ranges): 36 MB a token per thread on the 0.6B shape. Then each range
    // finds its entries by binary search. Scanned per range, the list cost
    // about twice the base dots of the 0.6B shape (docs/performance.md).
    // Without this kernel a matmul dequantized 16-row tiles, each scanning
    // the whole overlay twice.
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        Q1sView v = q1s_view(w);
        const uint64_t cols = sdk::row_len_of(w);
        if (cols % 32 != 0 || !((w.facts & kQ1sAscending) || ascending(v)))
            return matmul_by_decode(*this, w, x, ldx, n_batch, r0, r1, y, ldy);
        const QuantizedX &xq = quantized_x(x, ldx, n_batch, cols, kernels::XOrder::natural);
        // In pieces of at most kTableTileBytes of base tiles, each piece's
        // base and then its overlay: the overlay gathers each entry's tile,
        // which the base has just brought into L2 (a decode chunk of the
        // 0.6B output layer is 1.8 MB of tiles, whose overlay read them from
        // memory a second time). A piece's entries [lo, hi), found by binary
        // search (the list ascends), are prefetched before its base runs and
        // arrive while it computes (read when the overlay came to them, they
        // were its longest waits). The overlay runs against the same
        // quantized x as the base: a row is its decoded values against it.
        const uint64_t gpr = cols / 32, piece = std::max<uint64_t>(4, kTableTileBytes / (6 * gpr));
        for (uint64_t p0 = r0; p0 < r1; p0 += piece) {
            const uint64_t p1 = std::min(r1, p0 + piece);
            const uint64_t lo = first_at(v, p0 * cols), hi = first_at(v, p1 * cols);
            for (uint64_t at = 6 * lo / 64 * 64; at < 6 * hi; at += 64) __builtin_prefetch(v.entries + at);
            q1_base_rows(v.tiles, gpr, xq, n_batch, p0, p1, y, ldy);
            for (uint64_t b = 0; b < n_batch; ++b)
                kernels::q1s_overlay_xq(v.tiles, v.entries + 6 * lo, hi - lo, lo % 16, p0 * cols, cols, p1 - p0,
                                        xq.q(b), xq.d(b), y + b * ldy + p0);
        }
    }

    // q1s_passes, where q1_passes is made for the base (the AVX-512
    // kernel runs and rows are whole steps of 16 groups), for a list that
    // strictly ascends within the tensor (the original writes it so): the
    // base as q1_passes, the outliers one row a lane (docs/dtypes.md).
    int32_t decode_layout(const cmf_tensor_view &t, uint64_t *bytes) const override {
        *bytes = 0;
        const std::optional<Q1sOverlayPlan> p = passes_plan(t);
        if (!p) return -1;
        *bytes = checked_mad(p->first_step.back(), kQ1sStepBytes, Q1sPassesLayout(t.shape[0], t.shape[1]).steps_at,
                             "q1s_passes");
        return CMF_DTYPE_MEM_Q1S_PASSES;
    }
    void decode_copy(const cmf_tensor_view &t, uint8_t *dst) const override {
        const std::optional<Q1sOverlayPlan> plan = passes_plan(t);
        if (!plan) Dtype::decode_copy(t, dst);
        const Q1sOverlayPlan &p = *plan;
        const Q1sView v = q1s_view(t);
        const Q1sPassesLayout l(t.shape[0], t.shape[1]);
        for (uint64_t k = 0; k < l.base_bytes / 96; ++k) q1_step_to_passes(v.tiles + 96 * k, dst + 96 * k);
        std::memset(dst + l.table_at, 0, l.steps_at - l.table_at);
        std::memcpy(dst + l.table_at, p.first_step.data(), 4 * p.first_step.size());
        std::memcpy(dst + l.lanes_at, p.lane_row.data(), p.lane_row.size());
        uint8_t *steps = dst + l.steps_at;
        for (uint64_t k = 0; k < p.first_step.back(); ++k) {
            for (unsigned j = 0; j < 16; ++j) store_u16(steps + kQ1sStepBytes * k + 2 * j, 0xFFFF);
            std::memset(steps + kQ1sStepBytes * k + 32, 0, 64);  // corrections of +0
        }
        uint64_t row = 0, row_end = l.cols;
        uint32_t in_row = 0;
        for (uint64_t e = 0; e < v.count; ++e) {
            const uint8_t *entry = v.entries + 6 * e;
            const uint32_t idx = load_u32(entry);
            if (idx >= row_end) row = idx / l.cols, row_end = (row + 1) * l.cols, in_row = 0;
            const uint32_t slot = p.slot_of_row[row];
            uint8_t *st = steps + kQ1sStepBytes * (p.first_step[slot / 16] + in_row++);
            store_u16(st + 2 * (slot % 16), static_cast<uint16_t>(idx - row * l.cols));
            const float d = load_f16(entry + 4) - base_value(v.tiles, idx);  // as q1s's kernels make it
            std::memcpy(st + 32 + 4 * (slot % 16), &d, 4);
        }
    }

private:
    // cmf_tensor_view.facts bit: the outlier indices strictly ascend.
    static constexpr uint32_t kQ1sAscending = 1;
    // Where each row goes in t's q1s_passes copy, if one is made for t:
    // decode_layout's answer and decode_copy's plan, found once per call.
    std::optional<Q1sOverlayPlan> passes_plan(const cmf_tensor_view &t) const {
        if (!pass_steps_pay(t) || t.shape[1] > kQ1sPassesMaxCols) return std::nullopt;
        const Q1sView v = q1s_view(t);
        if (!((t.facts & kQ1sAscending) || kernels::q1s_ascending(v.entries, v.count))) return std::nullopt;
        if (v.count != 0 && load_u32(v.entries + 6 * (v.count - 1)) >= v.n) return std::nullopt;
        for (uint64_t e = 0; e < v.count; ++e) {
            const uint8_t *entry = v.entries + 6 * e;
            const float b = base_value(v.tiles, load_u32(entry)), value = load_f16(entry + 4);
            if (!same_bits(b + (value - b), value)) return std::nullopt;
        }
        return q1s_overlay_plan(v.entries, v.count, Q1sPassesLayout(t.shape[0], t.shape[1]));
    }
    // The first entry whose index is >= `index`, in a list that ascends.
    static uint64_t first_at(const Q1sView &v, uint64_t index) {
        uint64_t lo = 0, hi = v.count;
        while (lo < hi) {
            const uint64_t mid = lo + (hi - lo) / 2;
            if (load_u32(v.entries + 6 * mid) < index) lo = mid + 1;
            else hi = mid;
        }
        return lo;
    }
    // Whether the overlay's indices strictly ascend, for views that do not
    // carry kQ1sAscending (made by a caller that did not validate them with
    // this codec); remembered for the
    // matmul in progress on this thread (a nonzero x_id: no tensor can
    // change within one matmul), read in full otherwise. Up to 8 tensors per
    // matmul: a fused matmul_multi (q, k and v; gate and up) hands a thread
    // row ranges of several weights under one id. Each new matmul reads its
    // lists again (a token's 36 MB on the 0.6B shape, per thread: 7.6 % of a
    // q1s decode's samples with the 16-index kernel, 11.7 % with a scalar loop).
    static bool ascending(const Q1sView &v) {
        struct Seen {
            const uint8_t *entries;
            uint64_t count;
            bool ascending;
        };
        thread_local struct {
            uint64_t id = 0;
            Seen seen[8];
            unsigned n = 0;
        } memo;
        const uint64_t id = current_matmul_id();
        if (id != 0 && memo.id == id)
            for (unsigned i = 0; i < memo.n; ++i)
                if (memo.seen[i].entries == v.entries && memo.seen[i].count == v.count) return memo.seen[i].ascending;
        const bool up = kernels::q1s_ascending(v.entries, v.count);
        if (id == 0) return up;
        if (memo.id != id) memo.id = id, memo.n = 0;
        memo.seen[memo.n < 8 ? memo.n++ : 7] = {v.entries, v.count, up};
        return up;
    }

public:
    bool can_quantize() const override { return true; }
    // Option keep=F: outlier fraction (default 0.01, clamped to [0, 0.25]), as CMF_Q1S_KEEP upstream.
    void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                  std::vector<uint8_t> &out) const override {
        Options opt(params, name(), {"keep"});
        Matrix m = require_2d_groups(shape, name());
        uint64_t n = m.rows * m.cols;
        float keep = std::clamp(opt.get_float("keep", 0.01f), 0.0f, 0.25f);
        uint64_t n_out = std::min<uint64_t>(static_cast<uint64_t>(round_half_away(static_cast<float>(n) * keep)), n);
        std::vector<bool> outlier(n, false);
        if (n_out > 0) {
            std::vector<float> mags(n);
            for (uint64_t i = 0; i < n; ++i) {
                if (std::isnan(src[i]))
                    fail(CMF_ERR_INVALID_ARGUMENT, "q1s cannot select outliers in a tensor containing NaN");
                mags[i] = std::fabs(src[i]);
            }
            std::nth_element(mags.begin(), mags.begin() + static_cast<int64_t>(n - n_out), mags.end());
            float theta = mags[n - n_out];
            for (uint64_t i = 0; i < n; ++i) outlier[i] = std::fabs(src[i]) >= theta;
        }
        size_t base = out.size();
        uint64_t groups = groups_of(n);
        out.resize(base + 6 * groups);
        encode_q1_tiles(src, m, true, &outlier, out.data() + base);
        uint64_t count = static_cast<uint64_t>(std::count(outlier.begin(), outlier.end(), true));
        if (n > UINT32_MAX) fail(CMF_ERR_BOUNDS, "q1s tensors are limited to 2^32 elements (u32 indices)");
        put_u32(out, static_cast<uint32_t>(count));
        for (uint64_t i = 0; i < n; ++i)
            if (outlier[i]) {
                put_u32(out, static_cast<uint32_t>(i));
                put_u16(out, f32_to_f16(src[i]));
            }
    }
};

// ---- q1s_passes (memory-only: q1s's decode copy) --------------------------------
// The base is a q1_passes matrix and multiplies as one; the overlay is a
// slice's 16 rows in the 16 lanes of kernels::q1s_slice_sums, each row's
// products correction * x summed in its own lane and added to the row
// once. The file's list gathered each entry's tile (its base bit
// and scale) and summed a row's entries across lanes, four rows a pass:
// its overlay took 1.4x the base's time (docs/performance.md). Decodes to
// the values q1s decodes; multiplies with the same products (the base's
// as q1's BITALG kernel, the overlay's (value - base value) * x) summed in
// another order. No int8 view (an outlier is no multiple of its scale).
class Q1sPasses final : public Dtype {
    struct View {
        Q1sPassesLayout l;
        const uint8_t *table, *lane_row, *steps;
        uint32_t first(uint64_t s) const { return load_u32(table + 4 * s); }
        const uint8_t *step(uint64_t k) const { return steps + kQ1sStepBytes * k; }
    };
    // The copy's parts, its step table checked for the windows of rows
    // [r0, r1): it does not decrease nor pass the steps there are. With `rows_named` (validate) also
    // that each row there is named by at most one lane and a lane past the
    // tensor's rows by none, as decode_copy writes them; the members read
    // any lane_row safely (a lane naming no row of the range is left out,
    // a row named twice gets both lanes) and do not check it per call: per
    // decode token that was 4 % of a q1s run.
    View view_of(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, bool rows_named = false) const {
        expected_size(shape_of(t));
        View v{Q1sPassesLayout(t.shape[0], t.shape[1]), nullptr, nullptr, nullptr};
        if (t.nbytes < v.l.steps_at || (t.nbytes - v.l.steps_at) % kQ1sStepBytes != 0)
            fail(CMF_ERR_BOUNDS, "q1s_passes payload is " + std::to_string(t.nbytes) + " bytes: its base and tables need " +
                                     std::to_string(v.l.steps_at) + ", then whole steps of 96");
        v.table = bytes_of(t) + v.l.table_at;
        v.lane_row = bytes_of(t) + v.l.lanes_at;
        v.steps = bytes_of(t) + v.l.steps_at;
        const uint64_t n_steps = (t.nbytes - v.l.steps_at) / kQ1sStepBytes;
        if (v.first(0) != 0 || v.first(v.l.slices) != n_steps)
            fail(CMF_ERR_PARSE, "q1s_passes step table does not run from 0 to its " + std::to_string(n_steps) + " steps");
        for (uint64_t w0 = r0 / 64 * 64; w0 < r1; w0 += 64) {
            uint64_t named = 0;
            for (uint64_t s = w0 / 16; s < std::min(v.l.slices, w0 / 16 + 4); ++s) {
                if (v.first(s + 1) < v.first(s)) fail(CMF_ERR_PARSE, "q1s_passes step table decreases at slice " + std::to_string(s));
                if (v.first(s + 1) > n_steps)
                    fail(CMF_ERR_PARSE, "q1s_passes slice " + std::to_string(s) + " ends past the copy's " +
                                            std::to_string(n_steps) + " steps");
                for (unsigned lane = 0; rows_named && lane < 16; ++lane) {
                    const uint8_t r = v.lane_row[16 * s + lane];
                    if (r == kQ1sNoRow) continue;
                    if (r >= 64 || w0 + r >= v.l.rows || (named >> r & 1))
                        fail(CMF_ERR_PARSE, "q1s_passes lane " + std::to_string(lane) + " of slice " + std::to_string(s) +
                                                " names row " + std::to_string(r) + " of its window, out of range or named twice");
                    named |= uint64_t(1) << r;
                }
            }
        }
        return v;
    }
    static cmf_tensor_view base_of(const cmf_tensor_view &t, const View &v) {
        cmf_tensor_view b = t;
        b.dtype = CMF_DTYPE_MEM_Q1_PASSES;
        b.nbytes = v.l.base_bytes;
        return b;
    }
    static const Dtype &base_dtype() {
        static const Q1PassesOf<false> base;
        return base;
    }

public:
    int32_t id() const override { return CMF_DTYPE_MEM_Q1S_PASSES; }
    const char *name() const override { return "q1s_passes"; }
    uint32_t flags() const override { return CMF_CODEC_VARIABLE_SIZE; }
    uint64_t expected_size(Shape shape) const override {
        if (shape.size() != 2 || shape[1] % 512 != 0)
            fail(CMF_ERR_INVALID_ARGUMENT, "q1s_passes: 2-D with a multiple of 512 columns only");
        return CMF_SIZE_VARIABLE;
    }
    void validate(const cmf_tensor_view &t) const override { view_of(t, 0, t.ndim == 2 ? t.shape[0] : 0, true); }
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        if (r0 >= r1) return;
        const View v = view_of(t, r0, r1);
        base_dtype().dequantize_rows(base_of(t, v), r0, r1, dst);
        for (uint64_t w0 = r0 / 64 * 64; w0 < r1; w0 += 64)
            for (uint64_t s = w0 / 16; s < std::min(v.l.slices, w0 / 16 + 4); ++s)
                for (unsigned lane = 0; lane < 16; ++lane) {
                    const uint64_t r = w0 + v.lane_row[16 * s + lane];
                    if (v.lane_row[16 * s + lane] == kQ1sNoRow || r < r0 || r >= r1) continue;
                    for (uint32_t k = v.first(s); k < v.first(s + 1); ++k) {
                        const uint64_t c = load_u16(v.step(k) + 2 * lane);
                        float d;
                        std::memcpy(&d, v.step(k) + 32 + 4 * lane, 4);
                        if (c < v.l.cols) dst[(r - r0) * v.l.cols + c] += d;  // the base value there, then the value
                    }
                }
    }
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        if (r0 >= r1) return;
        const View v = view_of(w, r0, r1);
        base_dtype().matmul_rows(base_of(w, v), x, ldx, n_batch, r0, r1, y, ldy);
        // x's values xd[c / 32] * xq[c], made once per x for every row
        // range of its matmul on this thread
        const uint64_t cols = v.l.cols;
        const QuantizedX &xq = quantized_x(x, ldx, n_batch, cols, kernels::XOrder::natural);
        thread_local uint64_t made_from = 0;
        float *xf = static_cast<float *>(kernels::thread_room(kernels::RoomSlot::q1s_passes_x, 4 * n_batch * cols));
        if (made_from != xq.serial) {
            for (uint64_t b = 0; b < n_batch; ++b)
                for (uint64_t g = 0; g < cols / 32; ++g) {  // the block's scale held: a loop that vectorizes
                    const float d = xq.d(b)[g];
                    const int8_t *q = xq.q(b) + 32 * g;
                    for (unsigned k = 0; k < 32; ++k) xf[b * cols + 32 * g + k] = d * static_cast<float>(q[k]);
                }
            made_from = xq.serial;
        }
        // Every slice of each window the range touches (a window's rows lie
        // in any of its slices), its lanes added to the rows in the range.
        // (The base and the overlay window by window, side by side instead
        // of one after the other, streamed no faster: 75 % of the read
        // bandwidth on the 3072x1024 matrix on two threads, against 76 %.)
        alignas(64) float sums[16];
        for (uint64_t w0 = r0 / 64 * 64; w0 < r1; w0 += 64)
            for (uint64_t s = w0 / 16; s < std::min(v.l.slices, w0 / 16 + 4); ++s)
                for (uint64_t b = 0; b < n_batch; ++b) {
                    kernels::q1s_slice_sums(v.step(v.first(s)), v.first(s + 1) - v.first(s), cols, xf + b * cols, sums);
                    for (unsigned lane = 0; lane < 16; ++lane) {
                        const uint64_t r = w0 + v.lane_row[16 * s + lane];
                        if (v.lane_row[16 * s + lane] != kQ1sNoRow && r >= r0 && r < r1) y[b * ldy + r] += sums[lane];
                    }
                }
    }
};

// ---- q1t -----------------------------------------------------------------------
// Ternary digit k of a 7-byte group: 0 -> 0, 1 -> +s, 2 -> -s.
unsigned trit(const uint8_t *digits, unsigned k) {
    static constexpr unsigned kPow3[5] = {1, 3, 9, 27, 81};
    unsigned d = digits[k / 5] / kPow3[k % 5] % 3;
    if (k / 5 == 6 ? digits[6] > 8 : digits[k / 5] > 242)
        fail(CMF_ERR_PARSE, "q1t base-3 byte " + std::to_string(digits[k / 5]) + " is not a valid digit group");
    return d;
}
float trit_value(unsigned d, float s) { return d == 0 ? 0.0f : (d == 1 ? s : -s); }

// A group's 7 base-3 bytes -> the bits of its +1 and of its -1 weights,
// failing on a byte q1t's decoder rejects, with its message.
void q1t_group_bits(const uint8_t *digits, uint32_t *plus, uint32_t *minus) {
    struct Table {
        uint8_t plus[243], minus[243];
        constexpr Table() : plus(), minus() {
            for (unsigned v = 0; v < 243; ++v)
                for (unsigned k = 0, d = v; k < 5; ++k, d /= 3) {
                    plus[v] = static_cast<uint8_t>(plus[v] | (d % 3 == 1) << k);
                    minus[v] = static_cast<uint8_t>(minus[v] | (d % 3 == 2) << k);
                }
        }
    };
    static constexpr Table kTable;
    *plus = *minus = 0;
    for (unsigned j = 0; j < 7; ++j) {
        const unsigned byte = digits[j];
        if (j == 6 ? byte > 8 : byte > 242)
            fail(CMF_ERR_PARSE, "q1t base-3 byte " + std::to_string(byte) + " is not a valid digit group");
        *plus |= uint32_t(kTable.plus[byte]) << (5 * j);
        *minus |= uint32_t(kTable.minus[byte]) << (5 * j);
    }
}


struct Q1tView {
    Matrix m;
    uint64_t groups;
    const uint8_t *tiles, *row_ptr, *entries;
    uint32_t ptr(uint64_t r) const { return load_u32(row_ptr + 4 * r); }
};

// The payload's parts and the sizes they need (row_ptr[0] and the entry
// count read from row_ptr[rows]); the rows' own pointers and columns are
// checked by q1t_check_rows, for every row at load (validate) and for the
// rows a call reads otherwise: a whole-table check per call read all of
// row_ptr (600 KB for a 151936-row output layer) for each token's one
// embedding row and each thread's share of a matmul.
Q1tView q1t_view(const cmf_tensor_view &t) {
    Q1tView v;
    v.m = require_rows(shape_of(t), "q1t");
    v.groups = groups_of(v.m.rows * v.m.cols);
    uint64_t header = checked_mad(v.m.rows + 1, 4, checked_mad(v.groups, 9, 0, "q1t"), "q1t");
    if (t.nbytes < header)
        fail(CMF_ERR_BOUNDS, "q1t payload is " + std::to_string(t.nbytes) + " bytes, its tiles and row table need " +
                                 std::to_string(header));
    v.tiles = bytes_of(t);
    v.row_ptr = v.tiles + 9 * v.groups;
    v.entries = bytes_of(t) + header;
    if (v.ptr(0) != 0) fail(CMF_ERR_PARSE, "q1t row_ptr[0] is " + std::to_string(v.ptr(0)) + ", not 0");
    uint64_t total = header + 4 * static_cast<uint64_t>(v.ptr(v.m.rows));
    if (total != t.nbytes)
        fail(CMF_ERR_BOUNDS, "q1t payload is " + std::to_string(t.nbytes) + " bytes, its overlay needs " +
                                 std::to_string(total));
    return v;
}

// Rows [r0, r1): their row_ptr entries do not decrease and stay within the
// overlay, and their entries' columns are below cols.
void q1t_check_rows(const Q1tView &v, uint64_t r0, uint64_t r1) {
    for (uint64_t r = r0; r < r1; ++r)
        if (v.ptr(r + 1) < v.ptr(r))
            fail(CMF_ERR_PARSE, "q1t row_ptr decreases at row " + std::to_string(r));
    if (v.ptr(r1) > v.ptr(v.m.rows))
        fail(CMF_ERR_PARSE, "q1t row_ptr[" + std::to_string(r1) + "] is past the overlay's " +
                                std::to_string(v.ptr(v.m.rows)) + " entries");
    for (uint64_t e = v.ptr(r0); e < v.ptr(r1); ++e)
        if (load_u16(v.entries + 4 * e) >= v.m.cols)
            fail(CMF_ERR_PARSE, "q1t overlay entry " + std::to_string(e) + " has column " +
                                    std::to_string(load_u16(v.entries + 4 * e)) + " >= " + std::to_string(v.m.cols));
}

class Q1t final : public Dtype {
public:
    int32_t id() const override { return CMF_DTYPE_Q1T; }
    const char *name() const override { return "q1t"; }
    uint32_t flags() const override { return CMF_CODEC_VARIABLE_SIZE; }
    uint64_t expected_size(Shape shape) const override {
        require_rows(shape, name());
        return CMF_SIZE_VARIABLE;
    }
    void validate(const cmf_tensor_view &t) const override {
        const Q1tView v = q1t_view(t);
        q1t_check_rows(v, 0, v.m.rows);
    }
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        Q1tView v = q1t_view(t);
        q1t_check_rows(v, r0, r1);
        uint64_t cols = v.m.cols;
        for (uint64_t i = r0 * cols, end = r1 * cols; i < end;) {
            const uint8_t *tile = v.tiles + 9 * (i / 32);
            float s = load_f16(tile);
            if (i % 32 == 0 && end - i >= 32) {  // whole group: 5 digits per byte
                for (unsigned j = 0; j < 7; ++j) {
                    unsigned byte = tile[2 + j];
                    if (j == 6 ? byte > 8 : byte > 242)
                        fail(CMF_ERR_PARSE, "q1t base-3 byte " + std::to_string(byte) + " is not a valid digit group");
                    for (unsigned k = 0; k < (j == 6 ? 2u : 5u); ++k, byte /= 3) *dst++ = trit_value(byte % 3, s);
                }
                i += 32;
            } else {
                *dst++ = trit_value(trit(tile + 2, static_cast<unsigned>(i % 32)), s);
                ++i;
            }
        }
        dst -= (r1 - r0) * cols;
        for (uint64_t r = r0; r < r1; ++r)
            for (uint32_t e = v.ptr(r); e < v.ptr(r + 1); ++e)
                dst[(r - r0) * cols + load_u16(v.entries + 4 * e)] = load_f16(v.entries + 4 * e + 2);
    }
    bool can_quantize() const override { return true; }
    // Options: keep=F outlier fraction (default 0, the converter's choice),
    // correct=0|1 row scale correction (default 1; 0 = CMF_GPTQ_NOCORRECT=1).
    // params->act_rms (cols floats) weighs outlier scores and errors; default 1.
    void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                  std::vector<uint8_t> &out) const override;
    // The base rows through kernels::rows_q1t_xq against x quantized to
    // int8 blocks (the form before took f32 x through a table of 8 floats
    // per byte: docs/dtypes.md), then each overlay entry of the rows as a
    // correction (value - base value) * x against the same quantized x, so
    // a row is its decoded values against that x.
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        Q1tView v = q1t_view(w);
        q1t_check_rows(v, r0, r1);
        const uint64_t cols = v.m.cols;
        if (cols % 32 != 0) return matmul_by_decode(*this, w, x, ldx, n_batch, r0, r1, y, ldy);
        const uint64_t gpr = cols / 32;
        const QuantizedX &xq = quantized_x(x, ldx, n_batch, cols, kernels::XOrder::natural);
        for_row_tiles(r0, r1, n_batch, [&](uint64_t t0, uint64_t t1, uint64_t b) {
            kernels::rows_q1t_xq(v.tiles + 9 * t0 * gpr, xq.q(b), xq.d(b), gpr, t1 - t0, y + b * ldy + t0);
        }, 9 * gpr);
        if (v.ptr(r1) == v.ptr(r0)) return;
        for (uint64_t r = r0; r < r1; ++r)
            for (uint32_t e = v.ptr(r); e < v.ptr(r + 1); ++e) {
                const uint16_t c = load_u16(v.entries + 4 * e);
                const uint8_t *tile = v.tiles + 9 * (r * gpr + c / 32);
                const float delta = load_f16(v.entries + 4 * e + 2) - trit_value(trit(tile + 2, c % 32), load_f16(tile));
                for (uint64_t b = 0; b < n_batch; ++b)
                    y[b * ldy + r] += delta * (xq.d(b)[c / 32] * static_cast<float>(xq.q(b)[c]));
            }
    }
    // q1t_passes, for a matrix without an overlay whose rows are whole
    // steps of 16 groups, where its AVX-512 kernel runs; 10 bytes a group
    // where the file has 9 (docs/dtypes.md). A byte the decoder rejects
    // fails the copy with the decoder's error.
    int32_t decode_layout(const cmf_tensor_view &t, uint64_t *bytes) const override {
        *bytes = 0;
        if (!pass_steps_pay(t)) return -1;
        const Q1tView v = q1t_view(t);
        if (v.ptr(v.m.rows) != 0) return -1;
        *bytes = 10 * v.groups;
        return CMF_DTYPE_MEM_Q1T_PASSES;
    }
    void decode_copy(const cmf_tensor_view &t, uint8_t *dst) const override {
        uint64_t n = 0;
        if (decode_layout(t, &n) < 0) Dtype::decode_copy(t, dst);
        const Q1tView v = q1t_view(t);
        // Per lane and pass the code w+1 in two bits (0 for -1, 1 for 0, 2
        // for +1): bit 0 the zero weights' lane bit, bit 1 the +1 weights'.
        for (uint64_t k = 0; k < v.groups / 16; ++k, dst += 160) {
            uint32_t plus[16], zero[16];
            uint64_t p[8], z[8], halves[16];
            for (unsigned j = 0; j < 16; ++j) {
                const uint8_t *tile = v.tiles + 9 * (16 * k + j);
                uint32_t minus = 0;
                q1t_group_bits(tile + 2, &plus[j], &minus);
                zero[j] = ~(plus[j] | minus);
                std::memcpy(dst + 128 + 2 * j, tile, 2);
            }
            pass_lanes_from_bits(plus, p);
            pass_lanes_from_bits(zero, z);
            for (unsigned b = 0; b < 8; ++b) {
                halves[b] = spread_to_even_bits(z[b]) | spread_to_even_bits(p[b]) << 1;            // passes 0-3
                halves[8 + b] = spread_to_even_bits(z[b] >> 4) | spread_to_even_bits(p[b] >> 4) << 1;  // passes 4-7
            }
            std::memcpy(dst, halves, 128);
        }
    }
    // int8 view: codes -1, 0, +1 and the group's scale, for a tensor with
    // whole groups per row and no overlay (the converter's default keep of
    // 0 writes none; an overlay value is no multiple of its group's scale).
    bool has_int8_rows() const override { return true; }
    bool int8_view(const cmf_tensor_view &t) const override {
        return rows_of_int8_blocks(t) && q1t_view(t).ptr(t.shape[0]) == 0;
    }
    void int8_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) const override {
        Q1tView v = q1t_view(t);
        if (v.ptr(v.m.rows) != 0) fail(CMF_ERR_UNSUPPORTED, "q1t tensor with an overlay: no int8 view");
        const uint64_t gpr = v.m.cols / 32;
        kernels::unpack_q1t_groups(v.tiles + 9 * r0 * gpr, (r1 - r0) * gpr, codes, scales);
    }
};

void Q1t::quantize(Shape shape, const float *src, const cmf_quantize_params *params, std::vector<uint8_t> &out) const {
    Options opt(params, name(), {"keep", "correct"});
    Matrix m = require_2d_groups(shape, name());
    if (m.cols > 65536) fail(CMF_ERR_INVALID_ARGUMENT, "q1t needs cols <= 65536 (u16 overlay columns)");
    uint64_t n = m.rows * m.cols, gpr = m.cols / 32;
    float keep = opt.get_float("keep", 0.0f);
    if (!(keep >= 0.0f && keep <= 1.0f)) fail(CMF_ERR_INVALID_ARGUMENT, "q1t keep must be in [0, 1]");
    bool correct = opt.get_bool("correct", true);
    std::vector<float> act(m.cols, 1.0f);
    if (params && params->act_rms) {
        if (params->act_rms_len != m.cols)
            fail(CMF_ERR_INVALID_ARGUMENT, "q1t act_rms has " + std::to_string(params->act_rms_len) +
                                               " values, the tensor has " + std::to_string(m.cols) + " columns");
        std::copy(params->act_rms, params->act_rms + m.cols, act.begin());
    }
    // 1. outliers: the n_out largest |w|*act_rms[col], ties to the lower flat index.
    uint64_t n_out = static_cast<uint64_t>(round_half_away(static_cast<float>(n) * keep));
    std::vector<bool> outlier(n, false);
    if (n_out > 0 && n_out < n) {
        std::vector<float> score(n);
        for (uint64_t i = 0; i < n; ++i) {
            score[i] = std::fabs(src[i]) * act[i % m.cols];
            if (std::isnan(score[i]))
                fail(CMF_ERR_INVALID_ARGUMENT, "q1t cannot select outliers: NaN weight or activation RMS at element " +
                                                   std::to_string(i));
        }
        std::vector<uint64_t> idx(n);
        std::iota(idx.begin(), idx.end(), uint64_t{0});
        auto before = [&](uint64_t a, uint64_t b) { return score[a] != score[b] ? score[a] > score[b] : a < b; };
        std::nth_element(idx.begin(), idx.begin() + static_cast<int64_t>(n_out - 1), idx.end(), before);
        for (uint64_t k = 0; k < n_out; ++k) outlier[idx[k]] = true;
    }
    // 2. per group: legacy vs adaptive ternary, chosen by weighted error.
    std::vector<float> scales(m.rows * gpr);
    std::vector<int8_t> codes(n, 0);  // -1, 0, +1
    for (uint64_t r = 0; r < m.rows; ++r) {
        for (uint64_t g = 0; g < gpr; ++g) {
            uint64_t base = r * m.cols + 32 * g;
            const float *w = src + base;
            float sum = 0.0f;
            uint32_t count = 0;
            for (int i = 0; i < 32; ++i)
                if (!outlier[base + i]) sum += std::fabs(w[i]), ++count;
            float mean = count ? sum / static_cast<float>(count) : 0.0f;
            float s_l = f16_scale(mean);
            float tau = 0.7f * mean;
            double sd = 0.0, sdw = 0.0;
            for (int i = 0; i < 32; ++i)
                if (!outlier[base + i] && std::fabs(w[i]) >= tau) {
                    double d = static_cast<double>(act[32 * g + i]) * static_cast<double>(act[32 * g + i]);
                    sd += d;
                    sdw += d * static_cast<double>(std::fabs(w[i]));
                }
            float s_a = sd == 0.0 ? s_l : f16_scale(static_cast<float>(sdw / sd));
            int8_t leg[32], ada[32];
            double err_l = 0.0, err_a = 0.0;
            for (int i = 0; i < 32; ++i) {
                leg[i] = ada[i] = 0;
                if (outlier[base + i]) continue;
                leg[i] = w[i] >= 0.5f * s_l ? 1 : (w[i] <= -0.5f * s_l ? -1 : 0);
                if (std::fabs(w[i]) >= tau) ada[i] = w[i] >= 0.0f ? 1 : -1;
                double d = static_cast<double>(act[32 * g + i]) * static_cast<double>(act[32 * g + i]);
                double el = static_cast<double>(w[i]) - static_cast<double>(leg[i]) * static_cast<double>(s_l);
                double ea = static_cast<double>(w[i]) - static_cast<double>(ada[i]) * static_cast<double>(s_a);
                err_l += d * (el * el);
                err_a += d * (ea * ea);
            }
            bool adaptive = err_a < err_l;
            scales[r * gpr + g] = adaptive ? s_a : s_l;
            std::copy(adaptive ? ada : leg, (adaptive ? ada : leg) + 32, codes.begin() + static_cast<int64_t>(base));
        }
        // 3. row correction: least-squares common factor of the row's scales.
        if (correct) {
            double num = 0.0, den = 0.0;
            for (uint64_t c = 0; c < m.cols; ++c) {
                uint64_t i = r * m.cols + c;
                if (outlier[i] || codes[i] == 0) continue;
                double q = static_cast<double>(codes[i]) * static_cast<double>(scales[r * gpr + c / 32]);
                double d = static_cast<double>(act[c]) * static_cast<double>(act[c]);
                num += q * static_cast<double>(src[i]) * d;
                den += q * q * d;
            }
            if (den > 1e-20) {
                float alpha = static_cast<float>(std::clamp(num / den, 0.5, 2.0));
                for (uint64_t g = 0; g < gpr; ++g) scales[r * gpr + g] *= alpha;
            }
        }
    }
    // Tiles, row_ptr, entries.
    size_t at = out.size();
    out.resize(at + 9 * (n / 32));
    for (uint64_t g = 0; g < n / 32; ++g) {
        uint8_t *tile = out.data() + at + 9 * g;
        store_u16(tile, f32_to_f16(scales[g]));
        for (int k = 0; k < 32; ++k) {
            int8_t c = codes[32 * g + static_cast<uint64_t>(k)];
            static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
            tile[2 + k / 5] = static_cast<uint8_t>(tile[2 + k / 5] + (c == 0 ? 0 : (c > 0 ? 1 : 2)) * kPow3[k % 5]);
        }
    }
    uint32_t running = 0;
    put_u32(out, 0);
    for (uint64_t r = 0; r < m.rows; ++r) {
        for (uint64_t c = 0; c < m.cols; ++c) running += outlier[r * m.cols + c];
        put_u32(out, running);
    }
    for (uint64_t i = 0; i < n; ++i)
        if (outlier[i]) {
            put_u16(out, static_cast<uint16_t>(i % m.cols));
            put_u16(out, f32_to_f16(src[i]));
        }
}

}  // namespace

std::unique_ptr<Dtype> make_q1() { return std::make_unique<Q1>(); }
std::unique_ptr<Dtype> make_q1_passes() { return std::make_unique<Q1PassesOf<false>>(); }
std::unique_ptr<Dtype> make_q1s() { return std::make_unique<Q1s>(); }
std::unique_ptr<Dtype> make_q1s_passes() { return std::make_unique<Q1sPasses>(); }
std::unique_ptr<Dtype> make_q1t() { return std::make_unique<Q1t>(); }
std::unique_ptr<Dtype> make_q1t_passes() { return std::make_unique<Q1PassesOf<true>>(); }

}  // namespace cmf::codecs
