// One CMF dtype as the codecs module implements it. The plugin glue
// (plugin.cpp) turns each Dtype into a cmf_codec_vt; implementations throw
// cmf::sdk::Error and never see the C ABI's error plumbing.
#pragma once

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace cmf::codecs {

using Shape = std::span<const uint64_t>;

class Dtype {
public:
    virtual ~Dtype() = default;
    virtual int32_t id() const = 0;
    virtual const char *name() const = 0;
    virtual uint32_t flags() const { return 0; }
    virtual uint32_t required_features() const { return 0; }

    // Payload size for a shape, or CMF_SIZE_VARIABLE; throws if the shape is illegal.
    virtual uint64_t expected_size(Shape shape) const = 0;
    // Structural check of a payload; the default checks the expected size.
    virtual void validate(const cmf_tensor_view &t) const;
    // validate, returning the facts (cmf_tensor_view.facts) this dtype's
    // kernels may later rely on; the default has none.
    virtual uint32_t validate_facts(const cmf_tensor_view &t) const {
        validate(t);
        return 0;
    }
    virtual void dequantize_rows(const cmf_tensor_view &t, uint64_t row_begin, uint64_t row_end,
                                 float *dst) const = 0;
    virtual bool can_quantize() const { return false; }
    virtual void quantize(Shape shape, const float *src, const cmf_quantize_params *params,
                          std::vector<uint8_t> &out) const;
    // Row-separable layouts (cmf_codec_vt.quantize_rows): the byte sizes of
    // the payload's sections for `shape`, when every row encodes on its own
    // and each section is the concatenation of the rows' parts; empty when
    // this shape is not row-separable. quantize_rows then needs no code of
    // its own per dtype: it quantizes the sub-tensor of the rows and splits
    // that payload by these sizes (computed for the sub-shape).
    virtual std::vector<uint64_t> row_sections(Shape) const { return {}; }
    virtual bool has_matmul() const { return false; }
    virtual void matmul_rows(const cmf_tensor_view &w, const float *x, uint64_t ldx, uint64_t n_batch,
                             uint64_t row_begin, uint64_t row_end, float *y, uint64_t ldy) const;
    // cmf_codec_vt.int8_rows: has_int8_rows says whether the dtype ever has
    // an exact int8 view (codes x f32 scale per CMF_INT8_BLOCK columns),
    // int8_view whether this 2-D tensor has one, int8_rows writes rows
    // [row_begin, row_end) in the layout cmf_plugin.h documents (the glue
    // checks the shape, the row range and int8_view first).
    virtual bool has_int8_rows() const { return false; }
    virtual bool int8_view(const cmf_tensor_view &) const { return false; }
    virtual void int8_rows(const cmf_tensor_view &t, uint64_t row_begin, uint64_t row_end, int8_t *codes,
                           float *scales) const;
    // cmf_codec_vt.select_columns: column_block is the granularity at which
    // columns of this 2-D tensor can be selected (0: not at all);
    // select_columns appends the payload of the [rows, n * column_block]
    // tensor of the listed blocks (the glue checks the shape, the order and
    // the range of `blocks` first).
    virtual uint64_t column_block(const cmf_tensor_view &) const { return 0; }
    virtual void select_columns(const cmf_tensor_view &t, const uint64_t *blocks, uint64_t n,
                                std::vector<uint8_t> &out) const;
    // cmf_codec_vt.decode_copy: decode_layout returns the id of the
    // memory-only layout (a Dtype of this module with an id in
    // CMF_DTYPE_MEMORY_FIRST..LAST) t has a copy in, with the copy's size in
    // *bytes, or -1 when it has none (the default); decode_copy writes that
    // copy to dst (*bytes of room). The glue validates t first.
    virtual int32_t decode_layout(const cmf_tensor_view &, uint64_t *bytes) const {
        *bytes = 0;
        return -1;
    }
    virtual void decode_copy(const cmf_tensor_view &t, uint8_t *dst) const;
};

// Every dtype this module provides, in id order.
std::vector<std::unique_ptr<Dtype>> make_all_dtypes();

// Shape helpers shared by the dtypes.
uint64_t elements(Shape shape);                       // throws Bounds on overflow
inline Shape shape_of(const cmf_tensor_view &t) { return Shape(t.shape, t.ndim); }
[[noreturn]] void fail(int32_t code, const std::string &message);

}  // namespace cmf::codecs
