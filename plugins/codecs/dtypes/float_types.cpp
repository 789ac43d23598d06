// f32 (0), f16 (1), bf16 (2): row-major element arrays, little-endian.
#include "dtype.hpp"
#include "dtypes/all.hpp"
#include "half.hpp"
#include "kernels/kernels.hpp"

#include <cstring>

namespace cmf::codecs {

namespace {

// Element codecs differ only in the element width and the two conversions.
template <int Id, const char *Name, class Elem, float (*ToF32)(Elem), Elem (*FromF32)(float)>
class ElementDtype final : public Dtype {
public:
    int32_t id() const override { return Id; }
    const char *name() const override { return Name; }
    uint64_t expected_size(Shape shape) const override {
        uint64_t n = elements(shape);
        if (n > UINT64_MAX / sizeof(Elem)) fail(CMF_ERR_BOUNDS, std::string(Name) + " payload size overflows");
        return n * sizeof(Elem);
    }
    void dequantize_rows(const cmf_tensor_view &t, uint64_t r0, uint64_t r1, float *dst) const override {
        validate(t);  // never read past nbytes, even if the caller skipped validation
        uint64_t row_len = sdk::row_len_of(t);
        const unsigned char *src = static_cast<const unsigned char *>(t.data) + r0 * row_len * sizeof(Elem);
        uint64_t n = (r1 - r0) * row_len;
        for (uint64_t i = 0; i < n; ++i) {
            Elem e;
            std::memcpy(&e, src + i * sizeof(Elem), sizeof(Elem));  // unaligned-safe, little-endian host
            dst[i] = ToF32(e);
        }
    }
    bool can_quantize() const override { return true; }
    std::vector<uint64_t> row_sections(Shape shape) const override {
        if (shape.empty()) return {};
        return {expected_size(shape)};  // rows are runs of elements
    }
    void quantize(Shape shape, const float *src, const cmf_quantize_params *, std::vector<uint8_t> &out) const override {
        uint64_t n = elements(shape);
        size_t base = out.size();
        out.resize(base + n * sizeof(Elem));
        for (uint64_t i = 0; i < n; ++i) {
            Elem e = FromF32(src[i]);
            std::memcpy(out.data() + base + i * sizeof(Elem), &e, sizeof(Elem));
        }
    }
    // Any columns: each row's selected elements, in order.
    uint64_t column_block(const cmf_tensor_view &) const override { return 1; }
    void select_columns(const cmf_tensor_view &t, const uint64_t *cols, uint64_t n,
                        std::vector<uint8_t> &out) const override {
        const uint64_t rows = t.shape[0], w = t.shape[1];
        const unsigned char *src = static_cast<const unsigned char *>(t.data);
        size_t at = out.size();
        out.resize(at + rows * n * sizeof(Elem));
        for (uint64_t r = 0; r < rows; ++r)
            for (uint64_t i = 0; i < n; ++i, at += sizeof(Elem))
                std::memcpy(out.data() + at, src + (r * w + cols[i]) * sizeof(Elem), sizeof(Elem));
    }
    bool has_matmul() const override { return true; }
    void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch, uint64_t r0,
                     uint64_t r1, float *y, uint64_t ldy) const override {
        validate(w);
        uint64_t cols = sdk::row_len_of(w);
        const unsigned char *base = static_cast<const unsigned char *>(w.data);
        for (uint64_t r = r0; r < r1; ++r) {
            const void *row = base + r * cols * sizeof(Elem);
            for (uint64_t b = 0; b < n_batch; ++b) {
                const float *xb = x + b * ldx;
                float v;
                if constexpr (Id == CMF_DTYPE_F32) v = kernels::dot_f32(static_cast<const float *>(row), xb, cols);
                else if constexpr (Id == CMF_DTYPE_F16) v = kernels::dot_f16(static_cast<const uint16_t *>(row), xb, cols);
                else v = kernels::dot_bf16(static_cast<const uint16_t *>(row), xb, cols);
                y[b * ldy + r] = v;
            }
        }
    }
};

float f32_identity(float f) { return f; }
constexpr char kF32[] = "f32";
constexpr char kF16[] = "f16";
constexpr char kBF16[] = "bf16";

}  // namespace

std::unique_ptr<Dtype> make_f32() {
    return std::make_unique<ElementDtype<CMF_DTYPE_F32, kF32, float, f32_identity, f32_identity>>();
}
std::unique_ptr<Dtype> make_f16() {
    return std::make_unique<ElementDtype<CMF_DTYPE_F16, kF16, uint16_t, f16_to_f32, f32_to_f16>>();
}
std::unique_ptr<Dtype> make_bf16() {
    return std::make_unique<ElementDtype<CMF_DTYPE_BF16, kBF16, uint16_t, bf16_to_f32, f32_to_bf16>>();
}

}  // namespace cmf::codecs
