// Numeric primitives and byte helpers shared by the quantized dtypes. Every
// rule here is pinned by the original's bytes (docs/dtypes.md): its NaN-ignoring max, the f16
// scale floor, RNE then a saturating cast, and the exp2f/log2f values glibc
// gives at f16 arguments. This file is compiled with -ffp-contract=off (see
// meson.build): the original never fuses a multiply and an add.
#pragma once

#include "dtype.hpp"
#include "half.hpp"
#include "kernels/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace cmf::codecs {

// IEEE maxNum as Rust's f32::max: a NaN operand is ignored.
inline float maxnum(float a, float b) noexcept {
    if (std::isnan(a)) return b;
    if (std::isnan(b)) return a;
    return a > b ? a : b;
}
inline double maxnum(double a, double b) noexcept {
    if (std::isnan(a)) return b;
    if (std::isnan(b)) return a;
    return a > b ? a : b;
}

// max |w| over a range, NaN ignored, starting at 0.
inline float amax_of(const float *w, uint64_t n) noexcept {
    float m = 0.0f;
    for (uint64_t i = 0; i < n; ++i) m = maxnum(m, std::fabs(w[i]));
    return m;
}

constexpr float kF16MinNormal = 6.103515625e-05f;  // 2^-14, f16 0x0400

// Every quantizer's scale: rounded to f16 first, floored at 2^-14 (NaN -> floor).
inline float f16_scale(float x) noexcept { return maxnum(f16_to_f32(f32_to_f16(x)), kF16MinNormal); }

// RNE (the default rounding mode; nothing here changes it).
inline float rne(float x) noexcept { return std::nearbyint(x); }

// Rust's saturating `as` cast of an already-rounded float: NaN -> 0.
inline int32_t sat_cast(float x, int32_t lo, int32_t hi) noexcept {
    if (std::isnan(x)) return 0;
    if (x <= static_cast<float>(lo)) return lo;
    if (x >= static_cast<float>(hi)) return hi;
    return static_cast<int32_t>(x);
}
// clamp(RNE(x), lo, hi) as an integer, NaN -> 0.
inline int32_t rne_clamp(float x, int32_t lo, int32_t hi) noexcept { return sat_cast(rne(x), lo, hi); }

// Rust f32::round: half away from zero.
inline float round_half_away(float x) noexcept { return std::round(x); }

// glibc-exact exp2f/log2f at f16 arguments (double exp2/log2 rounded to f32, plus the tables of the f16
// arguments where glibc is one ulp off).
float exp2f_f16(uint16_t h) noexcept;
// exp2f_f16 of every f16 argument, indexed by its bits (built on first use):
// for loops that take two values per weight row, without a call each.
const float *exp2f_f16_table() noexcept;
float log2f_f16(uint16_t h) noexcept;

// ---- little-endian byte access ---------------------------------------------
inline uint16_t load_u16(const uint8_t *p) noexcept {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
inline uint32_t load_u32(const uint8_t *p) noexcept {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline float load_f16(const uint8_t *p) noexcept { return f16_to_f32(load_u16(p)); }
inline void put_u16(std::vector<uint8_t> &out, uint16_t v) {
    out.push_back(static_cast<uint8_t>(v));
    out.push_back(static_cast<uint8_t>(v >> 8));
}
inline void put_u32(std::vector<uint8_t> &out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void store_u16(uint8_t *p, uint16_t v) noexcept { std::memcpy(p, &v, 2); }
inline void store_u32(uint8_t *p, uint32_t v) noexcept { std::memcpy(p, &v, 4); }

inline const uint8_t *bytes_of(const cmf_tensor_view &t) noexcept { return static_cast<const uint8_t *>(t.data); }

// ---- shapes ------------------------------------------------------------------
struct Matrix {
    uint64_t rows, cols;
};
// 2-D shape with cols % 32 == 0 and cols > 0 (q4tp, q2tp, vbit and the writers of
// q4_tiled/q1*); throws a clear error otherwise.
Matrix require_2d_groups(Shape shape, const char *dtype);
// Whether a 2-D tensor's rows are whole CMF_INT8_BLOCK-column blocks: the
// shape a grouped dtype's int8 view (Dtype::int8_view) needs, its groups
// then never straddling two rows.
inline bool rows_of_int8_blocks(const cmf_tensor_view &t) {
    return t.ndim == 2 && t.shape[1] > 0 && t.shape[1] % CMF_INT8_BLOCK == 0;
}
// ndim >= 2: rows = shape[0], cols = product of the rest (q8_row, q8_2f).
Matrix require_rows(Shape shape, const char *dtype);
inline uint64_t groups_of(uint64_t n) noexcept { return n / 32 + (n % 32 != 0); }
// a * b + c with overflow -> Bounds error naming the dtype.
uint64_t checked_mad(uint64_t a, uint64_t b, uint64_t c, const char *dtype);

// ---- encoder options ("key=value,key=value") ----------------------------------
class Options {
public:
    // Throws InvalidArgument on syntax errors or keys outside `allowed`.
    Options(const cmf_quantize_params *params, const char *dtype, std::initializer_list<const char *> allowed);
    bool has(const std::string &key) const { return values_.count(key) != 0; }
    float get_float(const std::string &key, float fallback) const;
    bool get_bool(const std::string &key, bool fallback) const;

private:
    std::string dtype_;
    std::map<std::string, std::string> values_;
};

// The n_batch activation rows of a matmul_rows call quantized to int8 blocks
// (kernels::quantize_x), cached per thread: the CPU backend splits one matmul
// into many row chunks (as few as 4 rows) on each thread, all with the same x,
// and quantizing x costs about as much as 10 rows of int8 dots. The cache is
// keyed by the bytes of x (compared in full, so a reused buffer with new
// contents is never mistaken) or by the caller's x_id, its shape and the
// block order.
struct QuantizedX {
    uint64_t blocks = 0;
    // Changes whenever the codes are made anew (a caller's own derived
    // copy of them is current while this is the value it was made at).
    uint64_t serial = 0;
    std::vector<int8_t> codes;  // n_batch * 32 * blocks
    std::vector<float> scales;  // n_batch * blocks
    // The offset terms of each activation row b's codes, offsets_per_row
    // int32 each: XOrder::q4_pair_blocks kernels::q4_pair_offset (8 per pair
    // of blocks; an unpaired last block has none), XOrder::natural
    // kernels::i8_offset (8 per block), XOrder::q2_quads kernels::q2_offset
    // (8 per block), other orders none.
    std::vector<int32_t> offsets;
    uint64_t offsets_per_row = 0;
    // XOrder::natural: each row's kernels::i8_block_offsets (one int32 per
    // block), what the q8 row kernels take; empty otherwise.
    std::vector<int32_t> block_offsets;
    const int8_t *q(uint64_t b) const { return codes.data() + b * 32 * blocks; }
    const float *d(uint64_t b) const { return scales.data() + b * blocks; }
    const int32_t *offset(uint64_t b) const { return offsets.data() + b * offsets_per_row; }
    const int32_t *block_offset(uint64_t b) const { return block_offsets.data() + b * blocks; }
};
// The x_id and x of the cmf_codec_vt.matmul_rows_x call running on this
// thread (id 0: none, x is compared in full), set for the length of the call:
// the dtypes' matmul_rows take no id, and quantized_x below is where it counts.
class XIdScope {
public:
    XIdScope(uint64_t id, const float *x);
    ~XIdScope();
    XIdScope(const XIdScope &) = delete;
    XIdScope &operator=(const XIdScope &) = delete;

private:
    uint64_t saved_id_;
    const float *saved_x_;
};
// The x_id of the matmul_rows_x call running on this thread (0: none, or a
// plain matmul_rows): one matmul, whatever row ranges it is split into.
uint64_t current_matmul_id();
// Valid until the calling thread's next call. With a nonzero x_id in scope
// that matches the cached entry's, the entry is reused without comparing x
// (the caller promised the same contents); otherwise x is compared in full,
// so q, k and v projections of one x still share one quantization. The id
// speaks only for the caller's x: an array a dtype derives from it (q8_2f
// folds its column field into a copy) is always compared in full.
const QuantizedX &quantized_x(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, kernels::XOrder order);

// The row loop of the row-range kernels (kernels::rows_*): kernel(t0, t1, b)
// computes rows [t0, t1) against activation row b. In decode (n_batch 1) that
// is one call for the whole range; with a batch the rows go in 16-row tiles
// (at most 48 KiB of q8 at 3072 columns) that stay in L2 while every
// activation row passes over them. A kernel that makes a table of x per
// call (q1 and q1t with AVX-512: x transposed or in digit planes) takes
// tiles of kTableTileBytes / row_bytes rows (at least 16) instead, so the
// table is made once per tile and activation row, not per 16 rows.
constexpr uint64_t kTableTileBytes = 64 * 1024;
template <class Kernel>
void for_row_tiles(uint64_t r0, uint64_t r1, uint64_t n_batch, Kernel kernel, uint64_t row_bytes = 0) {
    const uint64_t tile = n_batch == 1 ? r1 - r0 : row_bytes == 0 ? 16 : std::max<uint64_t>(16, kTableTileBytes / row_bytes);
    for (uint64_t t0 = r0; t0 < r1; t0 += tile) {
        const uint64_t t1 = std::min(r1, t0 + tile);
        for (uint64_t b = 0; b < n_batch; ++b) kernel(t0, t1, b);
    }
}

// Portable matmul through the reference decoder (used where no faster path exists).
void matmul_by_decode(const Dtype &d, const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch,
                      uint64_t r0, uint64_t r1, float *y, uint64_t ldy);

}  // namespace cmf::codecs
