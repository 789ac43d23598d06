// vbit (8) and vbit_ro (10): per-row bit widths in {3,4,5,6,8}, f16 scales per
// (row, 32-group), codes packed MSB-first per row (spec §3.2; docs/dtypes.md).
// vbit_ro adds a u32 row-offset table so rows can be addressed directly.
//
// Width allocation calls the platform log2f on arbitrary f32 row maxima; the
// original ran on glibc, whose log2f is not correctly rounded, so identical
// widths at decision boundaries need glibc's log2f (this build links glibc).
#include "dtypes/all.hpp"
#include "dtypes/common.hpp"
#include "kernels/kernels.hpp"

#include <math.h>

namespace cmf::codecs {

namespace {

bool legal_width(uint8_t b) { return b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
uint64_t row_bytes(uint64_t cols, unsigned b) { return (cols * b + 7) / 8; }

// A validated view of a vbit/vbit_ro payload.
struct VbitView {
    Matrix m;
    uint64_t gpr;
    const uint8_t *widths;
    const uint8_t *scales;
    const uint8_t *packed;
    std::vector<uint64_t> row_start;  // rows+1 offsets into `packed`
};

template <bool RowOffsets>
VbitView view_of(const cmf_tensor_view &t, const char *dtype) {
    VbitView v;
    v.m = require_2d_groups(shape_of(t), dtype);
    v.gpr = v.m.cols / 32;
    uint64_t rows = v.m.rows;
    uint64_t header = checked_mad(rows, 2 * v.gpr, rows, dtype);
    if (RowOffsets) header = checked_mad(rows + 1, 4, header, dtype);
    if (t.nbytes < header)
        fail(CMF_ERR_BOUNDS, std::string(dtype) + " payload is " + std::to_string(t.nbytes) +
                                 " bytes, shorter than its " + std::to_string(header) + "-byte header");
    const uint8_t *p = bytes_of(t);
    v.widths = p;
    v.scales = p + rows;
    v.packed = p + header;
    v.row_start.resize(rows + 1);
    v.row_start[0] = 0;
    const uint8_t *offsets = p + rows + 2 * rows * v.gpr;
    if (RowOffsets && load_u32(offsets) != 0)
        fail(CMF_ERR_PARSE, std::string(dtype) + " row offset table does not start at 0");
    for (uint64_t r = 0; r < rows; ++r) {
        uint8_t b = v.widths[r];
        if (!legal_width(b))
            fail(CMF_ERR_PARSE, std::string(dtype) + " row " + std::to_string(r) + " has bit width " +
                                    std::to_string(b) + " (legal: 3, 4, 5, 6, 8)");
        v.row_start[r + 1] = v.row_start[r] + row_bytes(v.m.cols, b);
        if (RowOffsets && load_u32(offsets + 4 * (r + 1)) != v.row_start[r + 1])
            fail(CMF_ERR_PARSE, std::string(dtype) + " row offset " + std::to_string(r + 1) + " is " +
                                    std::to_string(load_u32(offsets + 4 * (r + 1))) + ", widths give " +
                                    std::to_string(v.row_start[r + 1]));
    }
    if (header + v.row_start[rows] != t.nbytes)
        fail(CMF_ERR_BOUNDS, std::string(dtype) + " payload is " + std::to_string(t.nbytes) +
                                 " bytes, its widths need " + std::to_string(header + v.row_start[rows]));
    return v;
}

// Per-row widths from the row maxima, as the original converter allocates them
// (docs/dtypes.md).
std::vector<uint8_t> allocate_widths(const float *src, Matrix m, float mean_bits_opt) {
    float clamped = mean_bits_opt < 3.0f ? 3.0f : (mean_bits_opt > 8.0f ? 8.0f : mean_bits_opt);
    int32_t thousandths = static_cast<int32_t>(clamped * 1000.0f);  // truncation, as stored upstream
    float mean_bits = static_cast<float>(thousandths) / 1000.0f;
    std::vector<float> a(m.rows);
    float sum = 0.0f;
    for (uint64_t r = 0; r < m.rows; ++r) {
        a[r] = ::log2f(maxnum(amax_of(src + r * m.cols, m.cols), 1e-12f));
        sum += a[r];
    }
    float mean = sum / static_cast<float>(m.rows);
    static constexpr uint8_t kLevels[] = {3, 4, 5, 6, 8};
    std::vector<uint8_t> widths(m.rows);
    for (uint64_t r = 0; r < m.rows; ++r) {
        float raw = mean_bits + (a[r] - mean);
        uint8_t best = 3;
        float best_d = std::fabs(raw - 3.0f);
        for (uint8_t l : kLevels) {
            float d = std::fabs(raw - static_cast<float>(l));
            if (d < best_d) best = l, best_d = d;
        }
        widths[r] = best;
    }
    return widths;
}

// vbit_ro's rows through its offset table: a row is checked when it is
// read (the whole table was checked when the tensor was loaded), not every
// row of the tensor on every call, which for the 151936-row head read the
// table and the widths once per row range (4 % of a decode).
struct RowTable {
    Matrix m;
    uint64_t gpr, header, packed_bytes;
    const uint8_t *widths, *scales, *offsets, *packed;
    const char *dtype;
    RowTable(const cmf_tensor_view &t, const char *name) : dtype(name) {
        m = require_2d_groups(shape_of(t), name);
        gpr = m.cols / 32;
        header = checked_mad(m.rows + 1, 4, checked_mad(m.rows, 2 * gpr, m.rows, name), name);
        if (t.nbytes < header)
            fail(CMF_ERR_BOUNDS, std::string(name) + " payload is " + std::to_string(t.nbytes) + " bytes, shorter than its " +
                                     std::to_string(header) + "-byte header");
        widths = bytes_of(t);
        scales = widths + m.rows;
        offsets = scales + 2 * m.rows * gpr;
        packed = widths + header;
        packed_bytes = t.nbytes - header;
    }
    const uint8_t *codes(uint64_t r) const {
        const uint8_t b = widths[r];
        const uint64_t start = load_u32(offsets + 4 * r);
        if (!legal_width(b) || start > packed_bytes || packed_bytes - start < row_bytes(m.cols, b))
            fail(CMF_ERR_PARSE, std::string(dtype) + " row " + std::to_string(r) + " (width " + std::to_string(b) +
                                    ", offset " + std::to_string(start) + ") does not fit its payload");
        return packed + start;
    }
};

template <bool RowOffsets>
class Vbit final : public Dtype {
public:
    int32_t id() const override { return RowOffsets ? CMF_DTYPE_VBIT_RO : CMF_DTYPE_VBIT; }
    const char *name() const override { return RowOffsets ? "vbit_ro" : "vbit"; }
    uint32_t flags() const override { return CMF_CODEC_VARIABLE_SIZE; }
    uint32_t required_features() const override { return RowOffsets ? 0 : CMF_FEATURE_QUANT_2F; }
    uint64_t expected_size(Shape shape) const override {
        require_2d_groups(shape, name());
        return CMF_SIZE_VARIABLE;
    }
    void validate(const cmf_tensor_view &t) const override { view_of<RowOffsets>(t, name()); }
    // A row is gpr whole groups of 4*b code bytes (kernels::dequant_vbit_groups
    // reads exactly those).
    static void decode_row(const VbitView &v, uint64_t r, float *dst) {
        kernels::dequant_vbit_groups(v.packed + v.row_start[r], v.widths[r], v.scales + 2 * r * v.gpr, v.gpr, dst);
    }
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        if constexpr (RowOffsets) {
            // Through the offset table, checking only the rows read: the
            // whole-table view walks every row (0.2 ms for the 151936-row
            // embedding, which decode reads a row of per token).
            const RowTable rows(t, name());
            for (uint64_t r = r0; r < r1; ++r, dst += rows.m.cols)
                kernels::dequant_vbit_groups(rows.codes(r), rows.widths[r], rows.scales + 2 * r * rows.gpr, rows.gpr,
                                             dst);
        } else {
            VbitView v = view_of<RowOffsets>(t, name());
            for (uint64_t r = r0; r < r1; ++r, dst += v.m.cols) decode_row(v, r, dst);
        }
    }
    bool can_quantize() const override { return true; }
    void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                  std::vector<uint8_t> &out) const override {
        Options opt(params, name(), {"mean_bits"});
        Matrix m = require_2d_groups(shape, name());
        uint64_t gpr = m.cols / 32;
        std::vector<uint8_t> widths = m.rows ? allocate_widths(src, m, opt.get_float("mean_bits", 4.25f))
                                             : std::vector<uint8_t>{};
        std::vector<uint8_t> scales(2 * m.rows * gpr);
        std::vector<uint8_t> packed;
        std::vector<uint32_t> offsets{0};
        for (uint64_t r = 0; r < m.rows; ++r) {
            unsigned b = widths[r];
            int32_t L = (1 << (b - 1)) - 1;
            int32_t umax = (1 << b) - 1;
            uint64_t start = packed.size();
            packed.resize(start + row_bytes(m.cols, b), 0);
            uint64_t bit = 0;
            for (uint64_t g = 0; g < gpr; ++g) {
                const float *w = src + r * m.cols + 32 * g;
                float s = f16_scale(amax_of(w, 32) / static_cast<float>(L));
                store_u16(scales.data() + 2 * (r * gpr + g), f32_to_f16(s));
                for (int i = 0; i < 32; ++i) {
                    uint32_t u = static_cast<uint32_t>(sat_cast(rne(w[i] / s) + static_cast<float>(L), 0, umax));
                    for (int k = static_cast<int>(b) - 1; k >= 0; --k, ++bit)
                        if ((u >> k) & 1u) packed[start + bit / 8] |= static_cast<uint8_t>(0x80u >> (bit % 8));
                }
            }
            if (packed.size() > UINT32_MAX) fail(CMF_ERR_BOUNDS, std::string(name()) + " payload exceeds 4 GiB");
            offsets.push_back(static_cast<uint32_t>(packed.size()));
        }
        out.insert(out.end(), widths.begin(), widths.end());
        out.insert(out.end(), scales.begin(), scales.end());
        if (RowOffsets)
            for (uint32_t o : offsets) put_u32(out, o);
        out.insert(out.end(), packed.begin(), packed.end());
    }
    bool has_matmul() const override { return RowOffsets; }
    // int8 view (vbit_ro; vbit has no row table to find a panel's rows
    // without summing every width before them): codes u - L with the group's
    // scale, exact while no row is 8 bits wide (u - L reaches 128 there).
    bool has_int8_rows() const override { return RowOffsets; }
    bool int8_view(const cmf_tensor_view &t) const override {
        if (!RowOffsets) return false;
        const VbitView v = view_of<RowOffsets>(t, name());  // once per bind
        for (uint64_t r = 0; r < v.m.rows; ++r)
            if (v.widths[r] > 6) return false;
        return true;
    }
    void int8_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, int8_t *codes, float *scales) const override {
        const RowTable rows(t, name());
        for (uint64_t r = r0; r < r1; ++r) {
            if (rows.widths[r] > 6)
                fail(CMF_ERR_UNSUPPORTED, std::string(name()) + " row " + std::to_string(r) + " is 8 bits wide: no int8 view");
            kernels::unpack_vbit_groups(rows.codes(r), rows.widths[r], rows.gpr, codes);
            codes += 32 * rows.gpr;
            for (uint64_t g = 0; g < rows.gpr; ++g) *scales++ = load_f16(rows.scales + 2 * (r * rows.gpr + g));
        }
    }
    // Rows against x quantized to int8 blocks (kernels::rows_vbit_xq), the
    // same kernel per activation row whatever the batch, so a batched decode
    // gives each sequence the bits it gets alone. (vbit has no matmul: its
    // rows are found by summing every width before them.)
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        if constexpr (!RowOffsets) return matmul_by_decode(*this, w, x, ldx, n_batch, r0, r1, y, ldy);
        if (r0 >= r1) return;
        const RowTable rows(w, name());
        const QuantizedX &xq = quantized_x(x, ldx, n_batch, rows.m.cols, kernels::XOrder::natural);
        // What the rows read of x beyond its codes (kernels::VbitRowsX),
        // each made once per x when the first row that needs it comes: the
        // 4-bit rows' x in the q4 kernel's order (kernels::vbit4_x) and its
        // pair-half table, the other widths' offsets
        // (kernels::vbit_width_offsets). A row range of one width makes
        // nothing for the other kind. The pair-half tables sit in a 64-byte
        // aligned room (kernels::thread_room, a slot only this reads): the
        // kernel's 64-byte loads of them stay in one line.
        thread_local std::vector<int8_t> x4;
        thread_local int8_t *x4_table = nullptr;
        thread_local std::vector<int32_t> off4, width_off;
        thread_local uint64_t x4_serial = 0, width_serial = 0;  // the xq.serial each was made from (0: none)
        const uint64_t blocks = xq.blocks, per_off = 8 * (blocks / 2), per_width = kernels::kVbitWidthOffsets * 8 * blocks;
        auto need_x4 = [&] {
            if (x4_serial == xq.serial) return;
            x4_serial = xq.serial;
            x4.resize(n_batch * 32 * blocks);
            x4_table = static_cast<int8_t *>(kernels::thread_room(kernels::RoomSlot::vbit4_x_table, n_batch * 32 * blocks));
            off4.resize(n_batch * per_off);
            for (uint64_t b = 0; b < n_batch; ++b) {
                kernels::vbit4_x(xq.q(b), blocks, x4.data() + b * 32 * blocks, off4.data() + b * per_off);
                kernels::q4_pair_x_table(x4.data() + b * 32 * blocks, off4.data() + b * per_off, blocks,
                                         x4_table + b * 32 * blocks);
            }
        };
        auto need_width_offsets = [&] {
            if (width_serial == xq.serial) return;
            width_serial = xq.serial;
            width_off.resize(n_batch * per_width);
            for (uint64_t b = 0; b < n_batch; ++b)
                kernels::vbit_width_offsets(xq.offset(b), blocks, width_off.data() + b * per_width);
        };
        // Blocks of rows (each checked against the payload as it is found),
        // each block in one kernel call per token, whatever its rows' widths.
        constexpr uint64_t kBlock = 64;
        const uint8_t *codes[kBlock];
        for (uint64_t rb = r0; rb < r1; rb += kBlock) {
            const uint64_t n = std::min(kBlock, r1 - rb);
            // The next block's widths and offsets (two short streams beside
            // the codes that the hardware prefetcher left to miss: perf put
            // 7 % of a vbit_ro decode on the offset loads below). A
            // prefetch never faults; past the table it reads nothing useful.
            __builtin_prefetch(rows.widths + rb + kBlock);
            for (uint64_t o = 0; o < 4 * kBlock; o += 64) __builtin_prefetch(rows.offsets + 4 * (rb + kBlock) + o);
            bool four = false, other = false;
            for (uint64_t j = 0; j < n; ++j) {
                codes[j] = rows.codes(rb + j);
                (rows.widths[rb + j] == 4 ? four : other) = true;
            }
            if (four) need_x4();
            if (other) need_width_offsets();
            const uint8_t *sc = rows.scales + 2 * rb * rows.gpr;
            for (uint64_t b = 0; b < n_batch; ++b) {
                kernels::VbitRowsX vx;
                if (four) {
                    vx.x4 = x4.data() + b * 32 * blocks;
                    vx.off4 = off4.data() + b * per_off;
                    vx.xt4 = x4_table + b * 32 * blocks;
                }
                if (other) vx.width_offsets = width_off.data() + b * per_width;
                kernels::rows_vbit_xq(codes, rows.widths + rb, sc, xq.q(b), xq.offset(b), xq.d(b), rows.gpr, n, vx,
                                      y + b * ldy + rb);
            }
        }
    }
};

}  // namespace

std::unique_ptr<Dtype> make_vbit() { return std::make_unique<Vbit<false>>(); }
std::unique_ptr<Dtype> make_vbit_ro() { return std::make_unique<Vbit<true>>(); }

}  // namespace cmf::codecs
