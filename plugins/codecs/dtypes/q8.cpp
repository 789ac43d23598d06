// q8_row (3) and q8_2f (9): int8 codes with f16 row scales (spec §3.2; docs/dtypes.md).
#include "dtypes/all.hpp"
#include "dtypes/common.hpp"
#include "kernels/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace cmf::codecs {

namespace {

// The decode loop both layouts share: y[b][r] = scale_r * sum_c q[r][c] * x[b][c]
// over int8 rows `codes` (stride cols) with f16 row scales, x quantized to
// int8 blocks once per call (kernels.hpp). A batched decode pass (several
// activation rows) takes the k-token kernel, which gives each row's result
// the bits it has alone.
void scaled_i8_rows(const uint8_t *codes, const uint8_t *f16_scales, uint64_t cols, const float *x, uint64_t ldx,
                    uint64_t n_batch, uint64_t r0, uint64_t r1, float *y, uint64_t ldy) {
    const QuantizedX &xq = quantized_x(x, ldx, n_batch, cols, kernels::XOrder::natural);
    const int8_t *q = reinterpret_cast<const int8_t *>(codes);
    if (n_batch > 1)
        return kernels::rows_i8_xq_batch(q + r0 * cols, cols, f16_scales + 2 * r0, xq.q(0), xq.block_offset(0),
                                         xq.d(0), cols, r1 - r0, n_batch, y + r0, ldy);
    for_row_tiles(r0, r1, n_batch, [&](uint64_t t0, uint64_t t1, uint64_t b) {
        kernels::rows_i8_xq(q + t0 * cols, cols, f16_scales + 2 * t0, xq.q(b), xq.block_offset(b), xq.d(b), cols, t1 - t0,
                            y + b * ldy + t0);
    });
}

// The selected columns of an int8 code matrix with f16 row scales (and,
// with `col_field`, the f16 column field after them): codes gathered per
// row, row scales as they are, the column field gathered.
void select_i8_columns(const cmf_tensor_view &t, const uint64_t *cols, uint64_t n, bool col_field,
                       std::vector<uint8_t> &out) {
    const uint64_t rows = t.shape[0], w = t.shape[1];
    const uint8_t *p = bytes_of(t);
    size_t at = out.size();
    out.resize(at + rows * n + 2 * rows + (col_field ? 2 * n : 0));
    uint8_t *dst = out.data() + at;
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t i = 0; i < n; ++i) *dst++ = p[r * w + cols[i]];
    std::memcpy(dst, p + rows * w, 2 * rows);
    dst += 2 * rows;
    if (col_field)
        for (uint64_t i = 0; i < n; ++i, dst += 2) std::memcpy(dst, p + rows * w + 2 * rows + 2 * cols[i], 2);
}

// Layout [i8 rows*cols][f16 rows].
class Q8Row final : public Dtype {
public:
    int32_t id() const override { return CMF_DTYPE_Q8_ROW; }
    const char *name() const override { return "q8_row"; }
    uint64_t expected_size(Shape shape) const override {
        Matrix m = require_rows(shape, name());
        return checked_mad(m.rows, 2, m.rows * m.cols, name());
    }
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        validate(t);  // never read past nbytes, even if the caller skipped validation
        Matrix m = require_rows(shape_of(t), name());
        const uint8_t *p = bytes_of(t);
        const uint8_t *scales = p + m.rows * m.cols;
        for (uint64_t r = r0; r < r1; ++r) {
            float s = load_f16(scales + 2 * r);
            const int8_t *q = reinterpret_cast<const int8_t *>(p + r * m.cols);
            for (uint64_t c = 0; c < m.cols; ++c) *dst++ = static_cast<float>(q[c]) * s;
        }
    }
    bool can_quantize() const override { return true; }
    // Codes, then one scale per row: both sections run row by row.
    std::vector<uint64_t> row_sections(Shape shape) const override {
        if (shape.size() < 2) return {};
        uint64_t n = elements(shape);
        return {n, 2 * shape[0]};
    }
    // int8 view: the codes as stored, the row's f16 scale in every block.
    bool has_int8_rows() const override { return true; }
    bool int8_view(const cmf_tensor_view &) const override { return true; }
    void int8_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) const override {
        validate(t);
        Matrix m = require_rows(shape_of(t), name());
        const uint64_t nb = (m.cols + CMF_INT8_BLOCK - 1) / CMF_INT8_BLOCK, ld = nb * CMF_INT8_BLOCK;
        const uint8_t *p = bytes_of(t);
        for (uint64_t r = r0; r < r1; ++r) {
            int8_t *dst = codes + (r - r0) * ld;
            std::memcpy(dst, p + r * m.cols, m.cols);
            std::memset(dst + m.cols, 0, ld - m.cols);
            std::fill(scales + (r - r0) * nb, scales + (r - r0 + 1) * nb, load_f16(p + m.rows * m.cols + 2 * r));
        }
    }
    // Any columns: the codes of the selected columns, the same row scales.
    uint64_t column_block(const cmf_tensor_view &) const override { return 1; }
    void select_columns(const cmf_tensor_view &t, const uint64_t *cols, uint64_t n,
                        std::vector<uint8_t> &out) const override {
        select_i8_columns(t, cols, n, false, out);
    }
    void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                  std::vector<uint8_t> &out) const override {
        Options opt(params, name(), {});
        Matrix m = require_rows(shape, name());
        size_t base = out.size();
        out.resize(base + expected_size(shape));
        uint8_t *q = out.data() + base;
        uint8_t *scales = q + m.rows * m.cols;
        for (uint64_t r = 0; r < m.rows; ++r) {
            const float *w = src + r * m.cols;
            float s = f16_scale(amax_of(w, m.cols) / 127.0f);
            for (uint64_t c = 0; c < m.cols; ++c)
                q[r * m.cols + c] = static_cast<uint8_t>(static_cast<int8_t>(rne_clamp(w[c] / s, -128, 127)));
            store_u16(scales + 2 * r, f32_to_f16(s));
        }
    }
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        validate(w);
        Matrix m = require_rows(shape_of(w), name());
        const uint8_t *p = bytes_of(w);
        scaled_i8_rows(p, p + m.rows * m.cols, m.cols, x, ldx, n_batch, r0, r1, y, ldy);
    }
};

// Layout [i8 rows*cols][f16 row scales][f16 col field].
class Q82F final : public Dtype {
public:
    int32_t id() const override { return CMF_DTYPE_Q8_2F; }
    const char *name() const override { return "q8_2f"; }
    uint32_t required_features() const override { return CMF_FEATURE_QUANT_2F; }
    uint64_t expected_size(Shape shape) const override {
        Matrix m = require_rows(shape, name());
        return checked_mad(m.rows + m.cols, 2, m.rows * m.cols, name());
    }
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        validate(t);  // never read past nbytes, even if the caller skipped validation
        Matrix m = require_rows(shape_of(t), name());
        const uint8_t *p = bytes_of(t);
        const uint8_t *rs = p + m.rows * m.cols;
        const uint8_t *cf = rs + 2 * m.rows;
        for (uint64_t r = r0; r < r1; ++r) {
            float s = load_f16(rs + 2 * r);
            const int8_t *q = reinterpret_cast<const int8_t *>(p + r * m.cols);
            for (uint64_t c = 0; c < m.cols; ++c) *dst++ = static_cast<float>(q[c]) * s * load_f16(cf + 2 * c);
        }
    }
    // Any columns: codes and column field gathered, the same row scales.
    uint64_t column_block(const cmf_tensor_view &) const override { return 1; }
    void select_columns(const cmf_tensor_view &t, const uint64_t *cols, uint64_t n,
                        std::vector<uint8_t> &out) const override {
        select_i8_columns(t, cols, n, true, out);
    }
    bool can_quantize() const override { return true; }
    void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                  std::vector<uint8_t> &out) const override {
        Options opt(params, name(), {});
        Matrix m = require_rows(shape, name());
        size_t base = out.size();
        out.resize(base + expected_size(shape));
        uint8_t *q = out.data() + base;
        uint8_t *rs = q + m.rows * m.cols;
        uint8_t *cf = rs + 2 * m.rows;
        // Column field: f64 sum of squares in fixed 256-row blocks, block sums added in order.
        std::vector<double> total(m.cols, 0.0), block(m.cols);
        for (uint64_t b0 = 0; b0 < m.rows; b0 += 256) {
            std::fill(block.begin(), block.end(), 0.0);
            uint64_t b1 = std::min<uint64_t>(m.rows, b0 + 256);
            for (uint64_t r = b0; r < b1; ++r)
                for (uint64_t c = 0; c < m.cols; ++c) {
                    double v = static_cast<double>(src[r * m.cols + c]);
                    block[c] += v * v;
                }
            for (uint64_t c = 0; c < m.cols; ++c) total[c] += block[c];
        }
        std::vector<float> col(m.cols);
        for (uint64_t c = 0; c < m.cols; ++c) {
            double rms = maxnum(std::sqrt(total[c] / static_cast<double>(m.rows)), 1e-12);
            col[c] = maxnum(f16_to_f32(f32_to_f16(static_cast<float>(rms))), kF16MinNormal);
            store_u16(cf + 2 * c, f32_to_f16(col[c]));
        }
        std::vector<float> u(m.cols);
        for (uint64_t r = 0; r < m.rows; ++r) {
            const float *w = src + r * m.cols;
            for (uint64_t c = 0; c < m.cols; ++c) u[c] = w[c] / col[c];
            float s = f16_scale(maxnum(amax_of(u.data(), m.cols), 1e-12f) / 127.0f);
            for (uint64_t c = 0; c < m.cols; ++c)
                q[r * m.cols + c] = static_cast<uint8_t>(static_cast<int8_t>(rne_clamp(u[c] / s, -127, 127)));
            store_u16(rs + 2 * r, f32_to_f16(s));
        }
    }
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        validate(w);
        Matrix m = require_rows(shape_of(w), name());
        const uint8_t *p = bytes_of(w);
        const uint8_t *rs = p + m.rows * m.cols;
        const uint8_t *cf = rs + 2 * m.rows;
        // Fold the column field into the activations once per call, before
        // they are quantized: y = s_r * sum q * (col * x).
        std::vector<float> xc(m.cols * n_batch);
        for (uint64_t b = 0; b < n_batch; ++b)
            for (uint64_t c = 0; c < m.cols; ++c) xc[b * m.cols + c] = load_f16(cf + 2 * c) * x[b * ldx + c];
        scaled_i8_rows(p, rs, m.cols, xc.data(), m.cols, n_batch, r0, r1, y, ldy);
    }
};

}  // namespace

std::unique_ptr<Dtype> make_q8_row() { return std::make_unique<Q8Row>(); }
std::unique_ptr<Dtype> make_q8_2f() { return std::make_unique<Q82F>(); }

}  // namespace cmf::codecs
