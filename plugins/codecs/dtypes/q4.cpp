// q4_block (4) and q4_tiled (11): 4-bit codes per 32-element group with an f16
// scale (spec §3.2; docs/dtypes.md). Both flatten the tensor into groups of 32 (the
// last zero-padded); q4_block stores all nibble blocks then all scales,
// q4_tiled interleaves [f16 scale][16 B nibbles] per group. And q4_rows
// (CMF_DTYPE_MEM_Q4_ROWS), memory-only: q4_block's bytes with each row's
// scales after that row's nibbles, q4_block's decode_copy, so that a decode
// row range reads one stream (docs/performance.md: q4_block's second
// stream cost its one-token matmuls 10-18 % on the Zen 5 VM).
#include "dtypes/all.hpp"
#include "dtypes/common.hpp"
#include "kernels/kernels.hpp"

#include <algorithm>
#include <cstring>

namespace cmf::codecs {

namespace {

// One group: 32 values (already zero-padded) -> 16 nibble bytes, returns the f16 scale.
uint16_t quantize_q4_group(const float *w, uint8_t *nib) {
    float s = f16_scale(amax_of(w, 32) / 7.0f);
    for (int k = 0; k < 16; ++k) {
        int lo = rne_clamp(w[2 * k] / s, -8, 7) + 8;
        int hi = rne_clamp(w[2 * k + 1] / s, -8, 7) + 8;
        nib[k] = static_cast<uint8_t>(lo | (hi << 4));
    }
    return f32_to_f16(s);
}

enum class Q4Layout { split, tiled, rows };

template <Q4Layout L>
class Q4 final : public Dtype {
    static constexpr bool Tiled = L == Q4Layout::tiled;
    static constexpr bool Rows = L == Q4Layout::rows;

public:
    int32_t id() const override {
        return Tiled ? CMF_DTYPE_Q4_TILED : Rows ? CMF_DTYPE_MEM_Q4_ROWS : CMF_DTYPE_Q4_BLOCK;
    }
    const char *name() const override { return Tiled ? "q4_tiled" : Rows ? "q4_rows" : "q4_block"; }
    uint64_t expected_size(Shape shape) const override {
        if (Rows && (shape.size() != 2 || shape[1] % 32 != 0))
            fail(CMF_ERR_INVALID_ARGUMENT, "q4_rows: 2-D with a multiple of 32 columns only");
        return checked_mad(groups_of(elements(shape)), 18, 0, name());
    }

    // Groups per row: q4_rows keeps each row's scales after its nibbles.
    static uint64_t gpr_of(const cmf_tensor_view &t) { return Rows ? t.shape[1] / 32 : 0; }
    // Where group g's nibbles and scale live (gpr: gpr_of).
    static const uint8_t *nibbles(const uint8_t *p, uint64_t gpr, uint64_t g) {
        if (Rows) return p + 18 * gpr * (g / gpr) + 16 * (g % gpr);
        return Tiled ? p + 18 * g + 2 : p + 16 * g;
    }
    static float scale(const uint8_t *p, uint64_t groups, uint64_t gpr, uint64_t g) {
        if (Rows) return load_f16(p + 18 * gpr * (g / gpr) + 16 * gpr + 2 * (g % gpr));
        return load_f16(Tiled ? p + 18 * g : p + 16 * groups + 2 * g);
    }

    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        validate(t);  // never read past nbytes, even if the caller skipped validation
        uint64_t len = sdk::row_len_of(t);
        uint64_t groups = groups_of(elements(shape_of(t))), gpr = gpr_of(t);
        const uint8_t *p = bytes_of(t);
        uint64_t i = r0 * len, end = r1 * len;
        while (i < end) {
            uint64_t g = i / 32;
            const uint8_t *nib = nibbles(p, gpr, g);
            float s = scale(p, groups, gpr, g);
            if (i % 32 == 0 && end - i >= 32) {  // a run of whole groups (q4_rows: of one row), through the kernel
                float scales[64];
                const uint64_t n = std::min<uint64_t>({64, (end - i) / 32, Rows ? gpr - g % gpr : 64});
                for (uint64_t k = 0; k < n; ++k) scales[k] = scale(p, groups, gpr, g + k);
                kernels::dequant_q4_groups(nib, Tiled ? 18 : 16, scales, n, dst);
                dst += 32 * n;
                i += 32 * n;
                continue;
            }
            unsigned k = static_cast<unsigned>(i % 32);
            int q = (k & 1) ? (nib[k / 2] >> 4) : (nib[k / 2] & 15);
            *dst++ = static_cast<float>(q - 8) * s;
            ++i;
        }
    }
    bool can_quantize() const override { return !Rows; }
    // With whole groups per row (cols % 32 == 0) no group straddles two rows:
    // q4_tiled is one run of tiles, q4_block a run of nibbles then of scales.
    std::vector<uint64_t> row_sections(Shape shape) const override {
        if (shape.size() < 2 || shape[0] == 0) return {};
        uint64_t n = elements(shape), cols = n / shape[0];
        if (Rows || cols == 0 || cols % 32 != 0) return {};
        uint64_t groups = n / 32;
        if (Tiled) return {18 * groups};
        return {16 * groups, 2 * groups};
    }
    // int8 view: codes q-8 (-8..7) and the group's scale, when every row is
    // whole groups (cols % 32 == 0; otherwise groups straddle rows).
    bool has_int8_rows() const override { return true; }
    bool int8_view(const cmf_tensor_view &t) const override { return rows_of_int8_blocks(t); }
    void int8_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) const override {
        validate(t);
        const uint64_t gpr = t.shape[1] / 32, groups = groups_of(elements(shape_of(t)));
        const uint8_t *p = bytes_of(t);
        const uint64_t g0 = r0 * gpr, g1 = r1 * gpr;
        if (Rows) {  // row by row: its nibbles, then its scales
            for (uint64_t r = r0; r < r1; ++r, codes += 32 * gpr) {
                const uint8_t *row = p + 18 * gpr * r;
                kernels::unpack_q4_groups(row, 16, gpr, codes);
                for (uint64_t j = 0; j < gpr; ++j) *scales++ = load_f16(row + 16 * gpr + 2 * j);
            }
            return;
        }
        kernels::unpack_q4_groups(nibbles(p, gpr, g0), Tiled ? 18 : 16, g1 - g0, codes);
        for (uint64_t g = g0; g < g1; ++g) *scales++ = scale(p, groups, 0, g);
    }
    void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                  std::vector<uint8_t> &out) const override {
        Options opt(params, name(), {});
        uint64_t n = elements(shape);
        uint64_t groups = groups_of(n);
        size_t base = out.size();
        out.resize(base + expected_size(shape));
        uint8_t *p = out.data() + base;
        float w[32];
        for (uint64_t g = 0; g < groups; ++g) {
            uint64_t take = std::min<uint64_t>(32, n - 32 * g);
            std::fill(w, w + 32, 0.0f);
            std::copy(src + 32 * g, src + 32 * g + take, w);
            uint8_t *nib = Tiled ? p + 18 * g + 2 : p + 16 * g;
            uint16_t s = quantize_q4_group(w, nib);
            store_u16(Tiled ? p + 18 * g : p + 16 * groups + 2 * g, s);
        }
    }
    // Whole groups when every row is whole groups: the selected groups of
    // each row, tiles (or nibbles, then scales) in the output's order.
    uint64_t column_block(const cmf_tensor_view &t) const override {
        return !Rows && t.shape[1] > 0 && t.shape[1] % 32 == 0 ? 32 : 0;
    }
    void select_columns(const cmf_tensor_view &t, const uint64_t *blocks, uint64_t n,
                        std::vector<uint8_t> &out) const override {
        const uint64_t rows = t.shape[0], gpr = t.shape[1] / 32, groups = rows * gpr, out_groups = rows * n;
        const uint8_t *p = bytes_of(t);
        size_t at = out.size();
        out.resize(at + 18 * out_groups);
        uint8_t *dst = out.data() + at;
        uint64_t k = 0;
        for (uint64_t r = 0; r < rows; ++r)
            for (uint64_t i = 0; i < n; ++i, ++k) {
                const uint64_t g = r * gpr + blocks[i];
                if (Tiled) {
                    std::memcpy(dst + 18 * k, p + 18 * g, 18);
                } else {
                    std::memcpy(dst + 16 * k, p + 16 * g, 16);
                    std::memcpy(dst + 16 * out_groups + 2 * k, p + 16 * groups + 2 * g, 2);
                }
            }
    }
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        validate(w);
        uint64_t cols = sdk::row_len_of(w);
        if (cols % 32 != 0) return matmul_by_decode(*this, w, x, ldx, n_batch, r0, r1, y, ldy);
        uint64_t gpr = cols / 32;
        uint64_t groups = groups_of(elements(shape_of(w)));
        const uint8_t *p = bytes_of(w);
        const QuantizedX &xq = quantized_x(x, ldx, n_batch, cols, kernels::XOrder::q4_pair_blocks);
        for_row_tiles(r0, r1, n_batch, [&](uint64_t t0, uint64_t t1, uint64_t b) {
            float *yb = y + b * ldy + t0;
            if (Tiled)
                kernels::rows_q4_tiled_xq(p + 18 * t0 * gpr, xq.q(b), xq.offset(b), xq.d(b), gpr, t1 - t0, yb);
            else if (Rows)
                kernels::rows_q4_split_xq(p + 18 * t0 * gpr, 18 * gpr, p + 18 * t0 * gpr + 16 * gpr, 18 * gpr, xq.q(b),
                                          xq.offset(b), xq.d(b), gpr, t1 - t0, yb);
            else
                kernels::rows_q4_split_xq(p + 16 * t0 * gpr, 16 * gpr, p + 16 * groups + 2 * t0 * gpr, 2 * gpr, xq.q(b),
                                          xq.offset(b), xq.d(b), gpr, t1 - t0, yb);
        });
    }
    // q4_block: each row's nibbles, then its scales (q4_rows), when every
    // row is whole groups; the copy is as large as the payload.
    int32_t decode_layout(const cmf_tensor_view &t, uint64_t *bytes) const override {
        *bytes = 0;
        if (L != Q4Layout::split || t.ndim != 2 || t.shape[1] == 0 || t.shape[1] % 32 != 0) return -1;
        *bytes = t.nbytes;
        return CMF_DTYPE_MEM_Q4_ROWS;
    }
    void decode_copy(const cmf_tensor_view &t, uint8_t *dst) const override {
        uint64_t n = 0;
        if (decode_layout(t, &n) < 0) Dtype::decode_copy(t, dst);
        const uint64_t rows = t.shape[0], gpr = t.shape[1] / 32, groups = rows * gpr;
        const uint8_t *p = bytes_of(t);
        for (uint64_t r = 0; r < rows; ++r, dst += 18 * gpr) {
            std::memcpy(dst, p + 16 * gpr * r, 16 * gpr);
            std::memcpy(dst + 16 * gpr, p + 16 * groups + 2 * gpr * r, 2 * gpr);
        }
    }
};

}  // namespace

std::unique_ptr<Dtype> make_q4_block() { return std::make_unique<Q4<Q4Layout::split>>(); }
std::unique_ptr<Dtype> make_q4_tiled() { return std::make_unique<Q4<Q4Layout::tiled>>(); }
std::unique_ptr<Dtype> make_q4_rows() { return std::make_unique<Q4<Q4Layout::rows>>(); }

}  // namespace cmf::codecs
