// q4tp (15) and q2tp (16): 4-/2-bit codes whose group scales come from a per-row
// geometric ladder (f16 lo, f16 step) indexed by a 5-bit code (spec §3.2 for
// q4tp; q2tp, which the original writes although the spec text omits it, in
// docs/dtypes.md). Layout: weight chunks (16 B / 8 B per (row, group)) | per row
// (f16 lo, f16 step) | per row ceil(5*gpr/8) bytes of 5-bit codes, LSB-first.
#include "dtypes/all.hpp"
#include "dtypes/common.hpp"
#include "kernels/kernels.hpp"

#include <array>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace cmf::codecs {

namespace {

// Rung values: q4tp t[c] = exp2f(lo) * exp2f(step)^c (31 sequential f32
// multiplies); q2tp puts an exact 0 at rung 0 and shifts the q4tp ladder up
// by one. The encoder's ladder of one row; dequantizing and the int8 view
// take their scales from kernels::ladder_scales, which makes the same
// products for up to 64 rows at a time, one row per vector lane (a single
// row's chain of 31 dependent multiplies cost about as much as its whole
// dot product in decode: ~100 of ~350 cycles per 1024-wide q4tp row); the
// decode matmuls from kernels::ladder_scales_powers (a few ulps away, see
// for_row_blocks).
constexpr unsigned kLadderRows = kernels::kLadderMaxRows;
template <bool Two>
std::array<float, 32> ladder(uint16_t lo_h, uint16_t step_h) {
    std::array<float, 32> t{};
    const int first = Two ? 1 : 0;
    const float e = exp2f_f16(step_h);
    t[first] = exp2f_f16(lo_h);
    for (int c = first + 1; c < 32; ++c) t[c] = t[c - 1] * e;
    return t;
}

void write_code(uint8_t *codes, uint64_t g, uint32_t code) {
    uint64_t bit = 5 * g;
    uint32_t v = code << (bit % 8);
    codes[bit / 8] |= static_cast<uint8_t>(v);
    if (v >> 8) codes[bit / 8 + 1] |= static_cast<uint8_t>(v >> 8);
}

// The ulp walk that makes `lo_r + steps*step >= top` hold (at most 64 increments).
uint16_t fit_step(float lo_r, float top, float steps) {
    uint16_t step_h = f32_to_f16(maxnum(top - lo_r, 0.0f) / steps);
    for (int i = 0; i < 64; ++i) {
        float v = f16_to_f32(step_h);
        if (v > 0.0f && lo_r + steps * v >= top) break;
        ++step_h;
    }
    return step_h;
}

template <bool Two>
class Tp final : public Dtype {
    static constexpr uint64_t kChunk = Two ? 8 : 16;

public:
    int32_t id() const override { return Two ? CMF_DTYPE_Q2TP : CMF_DTYPE_Q4TP; }
    const char *name() const override { return Two ? "q2tp" : "q4tp"; }
    static uint64_t stride(uint64_t gpr) { return (5 * gpr + 7) / 8; }
    uint64_t expected_size(Shape shape) const override {
        Matrix m = require_2d_groups(shape, name());
        uint64_t gpr = m.cols / 32;
        return checked_mad(m.rows, gpr * kChunk + 4 + stride(gpr), 0, name());
    }

    struct Layout {
        Matrix m;
        uint64_t gpr;
        const uint8_t *chunks, *params, *codes;
    };
    Layout layout(const cmf_tensor_view &t) const {
        validate(t);
        Layout l;
        l.m = require_2d_groups(shape_of(t), name());
        l.gpr = l.m.cols / 32;
        l.chunks = bytes_of(t);
        l.params = l.chunks + l.m.rows * l.gpr * kChunk;
        l.codes = l.params + 4 * l.m.rows;
        return l;
    }
    // The next block's (lo, step) pairs and codes, asked for while this
    // block's rows stream: the ladder's first loads of a block waited on
    // memory (perf, q4tp decode on the 0.6B shape: half of ladder_scales'
    // samples on its first code load, the pairs' loads most of the rest of
    // matmul_rows' own), the hardware prefetcher not following these two
    // short streams beside the long one of the weight chunks. Inlined
    // early on purpose: GCC takes a function that only prefetches for a
    // pure one and drops calls to it (a pure void call does nothing).
    [[gnu::always_inline]] static inline void prefetch_next_block(const Layout &l, uint64_t rb, uint64_t r1) {
        if (rb >= r1) return;
        const uint64_t n = std::min<uint64_t>(kLadderRows, r1 - rb);
        // Every 64-byte line of [p, p + bytes), from the line p falls in.
        auto lines = [](const uint8_t *p, uint64_t bytes) __attribute__((always_inline)) {
            const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
            for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64)
                __builtin_prefetch(reinterpret_cast<const void *>(a), 0, 3);
        };
        lines(l.params + 4 * rb, 4 * n);
        lines(l.codes + rb * stride(l.gpr), n * stride(l.gpr));
    }
    // Runs body(rb, n, first, ratio) for the rows [r0, r1) in blocks of up
    // to kLadderRows: rows rb .. rb+n-1 with their ladders' first rung and
    // ratio as f32.
    template <class F>
    static void for_ladder_blocks(const Layout &l, uint64_t r0, uint64_t r1, F &&body) {
        const float *exp2 = exp2f_f16_table();
        for (uint64_t rb = r0; rb < r1; rb += kLadderRows) {
            const unsigned n = static_cast<unsigned>(std::min<uint64_t>(kLadderRows, r1 - rb));
            float first[kLadderRows], ratio[kLadderRows];
            for (unsigned j = 0; j < n; ++j) {
                first[j] = exp2[load_u16(l.params + 4 * (rb + j))];
                ratio[j] = exp2[load_u16(l.params + 4 * (rb + j) + 2)];
            }
            // Past r1 too: the thread pool hands a thread its chunks of a
            // matrix in ascending order, and decode's chunks are often one
            // block long.
            prefetch_next_block(l, rb + kLadderRows, l.m.rows);
            body(rb, n, first, ratio);
        }
    }
    // Runs body(rb, n, scales) for the rows [r0, r1) in blocks of up to
    // kLadderRows: rows rb .. rb+n-1, scales holding their group scales
    // (gpr per row, row by row), picked from their ladders by their 5-bit
    // codes: the encoder's sequential products (kernels::ladder_scales), or
    // with powers, rungs made of the ratio's powers (ladder_scales_powers,
    // a few ulps away) for the decode matmuls.
    template <class F>
    static void for_row_blocks(const Layout &l, uint64_t r0, uint64_t r1, F &&body, bool powers = false) {
        // No rows, no scratch: a tensor of zero rows may declare billions of
        // groups per row (the vtable entries return before this too).
        if (r0 >= r1) return;
        std::vector<float> &scales = scratch(l);
        for_ladder_blocks(l, r0, r1, [&](uint64_t rb, unsigned n, const float *first, const float *ratio) {
            (powers ? kernels::ladder_scales_powers : kernels::ladder_scales)(
                first, ratio, Two, l.codes + rb * stride(l.gpr), stride(l.gpr), l.gpr, n, scales.data());
            body(rb, n, scales.data());
        });
    }
    // Room for a block's group scales, per thread.
    static std::vector<float> &scratch(const Layout &l) {
        thread_local std::vector<float> scales;
        scales.resize(kLadderRows * l.gpr);
        return scales;
    }

    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        Layout l = layout(t);
        for_row_blocks(l, r0, r1, [&](uint64_t rb, unsigned n, const float *scales) {
            for (unsigned j = 0; j < n; ++j) {
                const uint8_t *chunks = l.chunks + (rb + j) * l.gpr * kChunk;
                if (Two)
                    kernels::dequant_q2_groups(chunks, scales + j * l.gpr, l.gpr, dst);
                else
                    kernels::dequant_q4_groups(chunks, kChunk, scales + j * l.gpr, l.gpr, dst);
                dst += 32 * l.gpr;
            }
        });
    }
    bool can_quantize() const override { return true; }
    // Option search=0|1 (default 1; 0 = CMF_Q2TP_SEARCH=0 upstream).
    void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                  std::vector<uint8_t> &out) const override;
    // Weight chunks, (lo, step) pairs and code rows: each row has its own
    // ladder and a fixed share of every section.
    std::vector<uint64_t> row_sections(Shape shape) const override {
        if (shape.size() != 2 || shape[1] == 0 || shape[1] % 32 != 0) return {};
        uint64_t rows = shape[0], gpr = shape[1] / 32;
        elements(shape);  // overflow check
        return {rows * gpr * kChunk, 4 * rows, rows * stride(gpr)};
    }
    // The int8 view (the CPU backend's prefill GEMM): q4tp's codes q - 8 with
    // the group's rung t; q2tp's codes 2c - 3 with t / 2, whose products are
    // the values (c - 1.5) * t the decoder rounds once (t / 2 is exact unless
    // t is subnormal, where the decoder's value is within an ulp).
    bool has_int8_rows() const override { return true; }
    bool int8_view(const cmf_tensor_view &t) const override { return rows_of_int8_blocks(t); }
    void int8_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) const override {
        Layout l = layout(t);
        for_row_blocks(l, r0, r1, [&](uint64_t rb, unsigned n, const float *rungs) {
            const uint8_t *chunks = l.chunks + rb * l.gpr * kChunk;
            const uint64_t groups = n * l.gpr;
            if constexpr (Two) {
                unpack_q2_groups(chunks, groups, codes);
                for (uint64_t g = 0; g < groups; ++g) scales[g] = 0.5f * rungs[g];
            } else {
                kernels::unpack_q4_groups(chunks, kChunk, groups, codes);
                std::copy(rungs, rungs + groups, scales);
            }
            codes += 32 * groups;
            scales += groups;
        });
    }
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        Layout l = layout(w);
        const QuantizedX &xq = quantized_x(x, ldx, n_batch, l.m.cols, Two ? kernels::XOrder::q2_quads : kernels::XOrder::q4_pair_blocks);
        // Blocks of kLadderRows rows: their scales, then the block through
        // the row-range kernel, four rows per pass over x (q4tp as q4_block).
        // q4tp with one dot call per row and the scales picked one by one in
        // scalar code ran at about half of q4_block's speed on the same
        // shapes; q2tp one dot per row at 0.5 of its row-range kernel.
        // The rungs from the ratio's powers: x is rounded to int8 here (half
        // a step of 1/127 of its block's largest |x|), far coarser than the
        // few ulps the powers move a scale by, and the sequential ladder's
        // chains and transposes were a fifth of q4tp decode (docs/dtypes.md).
        if (n_batch == 1) {
            // One token: the rows' scales picked inside the row loop
            // (kernels::rows_q4tp_xq, rows_q2tp_xq), no block of scales
            // made first.
            if (r0 >= r1) return;
            float *room = scratch(l).data();
            for_ladder_blocks(l, r0, r1, [&](uint64_t rb, unsigned n, const float *first, const float *ratio) {
                (Two ? kernels::rows_q2tp_xq : kernels::rows_q4tp_xq)(
                    l.chunks + rb * l.gpr * kChunk, first, ratio, l.codes + rb * stride(l.gpr), stride(l.gpr), xq.q(0),
                    xq.offset(0), xq.d(0), l.gpr, n, room, y + rb);
            });
            return;
        }
        for_row_blocks(l, r0, r1, [&](uint64_t rb, unsigned n, const float *scales) {
            const uint8_t *chunks = l.chunks + rb * l.gpr * kChunk;
            for (uint64_t b = 0; b < n_batch; ++b) {
                float *yb = y + b * ldy + rb;
                if constexpr (Two) {
                    kernels::rows_q2_groups_xq(chunks, scales, xq.q(b), xq.offset(b), xq.d(b), l.gpr, n, yb);
                } else {
                    kernels::rows_q4_groups_xq(chunks, scales, xq.q(b), xq.offset(b), xq.d(b), l.gpr, n, yb);
                }
            }
        }, /*powers=*/true);
    }

private:
    // q2 chunks to int8 codes 2c - 3, weight 4k + j from bits 2j..2j+1 of
    // byte k: one table lookup per byte (prefill panels only; the GEMM that
    // consumes them does 32x the work per code).
    static void unpack_q2_groups(const uint8_t *chunks, uint64_t groups, int8_t *codes) {
        static const std::array<std::array<int8_t, 4>, 256> table = [] {
            std::array<std::array<int8_t, 4>, 256> t{};
            for (unsigned b = 0; b < 256; ++b)
                for (unsigned j = 0; j < 4; ++j) t[b][j] = static_cast<int8_t>(2 * int((b >> (2 * j)) & 3u) - 3);
            return t;
        }();
        for (uint64_t k = 0; k < 8 * groups; ++k, codes += 4) std::memcpy(codes, table[chunks[k]].data(), 4);
    }
    // Codes of one group for rung value t, and the f32 squared error.
    static float group_error(const float *w, float t) {
        float err = 0.0f;
        if (Two) {
            float inv = t > 0.0f ? 1.0f / t : 0.0f;
            for (int i = 0; i < 32; ++i) {
                float c = static_cast<float>(rne_clamp(w[i] * inv + 1.5f, 0, 3));
                float d = w[i] - (c - 1.5f) * t;
                err += d * d;
            }
        } else {
            float inv = 1.0f / t;
            for (int i = 0; i < 32; ++i) {
                float d = w[i] - static_cast<float>(rne_clamp(w[i] * inv, -8, 7)) * t;
                err += d * d;
            }
        }
        return err;
    }
    // First strictly smallest error over rungs [lo, hi]; `fallback` if none is finite-smaller.
    static uint32_t best_rung(const float *w, const std::array<float, 32> &t, int lo, int hi, uint32_t fallback,
                              float *best_err) {
        float best = std::numeric_limits<float>::infinity();
        uint32_t code = fallback;
        for (int c = lo; c <= hi; ++c) {
            float e = group_error(w, t[c]);
            if (e < best) best = e, code = static_cast<uint32_t>(c);
        }
        if (best_err) *best_err = best;
        return code;
    }
    static void encode_chunk(const float *w, float t, uint8_t *chunk) {
        if (Two) {
            float inv = t > 0.0f ? 1.0f / t : 0.0f;
            for (int i = 0; i < 32; ++i)
                chunk[i / 4] |= static_cast<uint8_t>(rne_clamp(w[i] * inv + 1.5f, 0, 3) << (2 * (i % 4)));
        } else {
            float inv = 1.0f / t;
            for (int i = 0; i < 32; ++i)
                chunk[i / 2] |= static_cast<uint8_t>((rne_clamp(w[i] * inv, -8, 7) + 8) << (4 * (i % 2)));
        }
    }
};

template <bool Two>
void Tp<Two>::quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                       std::vector<uint8_t> &out) const {
    Options opt(params, name(), {"search"});
    bool search = opt.get_bool("search", true);
    Matrix m = require_2d_groups(shape, name());
    uint64_t gpr = m.cols / 32, st = stride(gpr);
    size_t base = out.size();
    out.resize(base + expected_size(shape), 0);
    uint8_t *chunks = out.data() + base;
    uint8_t *params_out = chunks + m.rows * gpr * kChunk;
    uint8_t *codes_out = params_out + 4 * m.rows;
    const float levels = Two ? 1.5f : 7.0f;
    const float steps = Two ? 30.0f : 31.0f;
    std::vector<float> lg(gpr);
    std::vector<bool> live(gpr);
    for (uint64_t r = 0; r < m.rows; ++r) {
        const float *row = src + r * m.cols;
        float lo = 0.0f, hi = 0.0f;
        bool any = false;
        for (uint64_t g = 0; g < gpr; ++g) {
            float a = amax_of(row + 32 * g, 32);
            live[g] = a != 0.0f;
            lg[g] = log2f_f16(f32_to_f16(f16_scale(a / levels)));
            if (!live[g]) continue;
            if (!any || lg[g] < lo) lo = lg[g];
            if (!any || lg[g] > hi) hi = lg[g];
            any = true;
        }
        if (!any) lo = hi = lg[0];
        uint16_t lo_h = f32_to_f16(lo);
        float lo_r = f16_to_f32(lo_h);
        auto nominal = [&](uint64_t g, float step) -> int {
            if (!live[g]) return 0;
            if (Two) return step <= 0.0f ? 1 : 1 + rne_clamp((lg[g] - lo_r) / step, 0, 30);
            return step <= 0.0f ? 0 : rne_clamp((lg[g] - lo_r) / step, 0, 31);
        };
        float top = hi;
        if (Two && search && hi > lo_r) {
            static constexpr float kFractions[] = {1.0f, 0.9f, 0.8f, 0.7f};
            float best = std::numeric_limits<float>::infinity();
            for (float f : kFractions) {
                float top_f = lo_r + (hi - lo_r) * f;
                uint16_t step_h = fit_step(lo_r, top_f, steps);
                std::array<float, 32> t = ladder<Two>(lo_h, step_h);
                float score = 0.0f;
                for (uint64_t g = 0; g < gpr; ++g) {
                    if (!live[g]) continue;
                    int nom = nominal(g, f16_to_f32(step_h));
                    float e;
                    best_rung(row + 32 * g, t, std::max(nom - 2, 1), std::min(nom + 2, 31), 0, &e);
                    score += e;
                }
                if (score < best) best = score, top = top_f;
            }
        }
        uint16_t step_h = fit_step(lo_r, top, steps);
        float step = f16_to_f32(step_h);
        std::array<float, 32> t = ladder<Two>(lo_h, step_h);
        store_u16(params_out + 4 * r, lo_h);
        store_u16(params_out + 4 * r + 2, step_h);
        for (uint64_t g = 0; g < gpr; ++g) {
            int nom = nominal(g, step);
            uint32_t code = static_cast<uint32_t>(nom);
            if (search && live[g] && step > 0.0f)
                code = best_rung(row + 32 * g, t, std::max(nom - 2, Two ? 1 : 0), std::min(nom + 1, 31), code,
                                 nullptr);
            else if (Two && search && live[g])
                code = best_rung(row + 32 * g, t, std::max(nom - 2, 1), std::min(nom + 1, 31), code, nullptr);
            write_code(codes_out + r * st, g, code);
            encode_chunk(row + 32 * g, t[code], chunks + (r * gpr + g) * kChunk);
        }
    }
}

}  // namespace

std::unique_ptr<Dtype> make_q4tp() { return std::make_unique<Tp<false>>(); }
std::unique_ptr<Dtype> make_q2tp() { return std::make_unique<Tp<true>>(); }

}  // namespace cmf::codecs
