#include "dtype.hpp"

#include <string>

namespace cmf::codecs {

[[noreturn]] void fail(int32_t code, const std::string &message) { throw sdk::Error(code, message); }

uint64_t elements(Shape shape) {
    uint64_t n = 0;
    if (!sdk::shape_elements(static_cast<uint32_t>(shape.size()), shape.data(), &n))
        fail(CMF_ERR_BOUNDS, "shape element count overflows 64 bits");
    return n;
}

void Dtype::validate(const cmf_tensor_view &t) const {
    uint64_t want = expected_size(shape_of(t));
    if (want != CMF_SIZE_VARIABLE && want != t.nbytes)
        fail(CMF_ERR_BOUNDS, std::string(name()) + " payload is " + std::to_string(t.nbytes) + " bytes, shape needs " +
                                 std::to_string(want));
}

void Dtype::quantize(Shape, const float *, const cmf_quantize_params *, std::vector<uint8_t> &) const {
    fail(CMF_ERR_UNSUPPORTED, std::string("dtype ") + name() + " has no encoder");
}

void Dtype::matmul_rows(const cmf_tensor_view &, const float *, uint64_t, uint64_t, uint64_t, uint64_t, float *,
                        uint64_t) const {
    fail(CMF_ERR_UNSUPPORTED, std::string("dtype ") + name() + " has no matmul kernel");
}

void Dtype::int8_rows(const cmf_tensor_view &, uint64_t, uint64_t, int8_t *, float *) const {
    fail(CMF_ERR_UNSUPPORTED, std::string("dtype ") + name() + " has no int8 view");
}

void Dtype::select_columns(const cmf_tensor_view &, const uint64_t *, uint64_t, std::vector<uint8_t> &) const {
    fail(CMF_ERR_UNSUPPORTED, std::string("dtype ") + name() + " cannot select columns");
}

void Dtype::decode_copy(const cmf_tensor_view &, uint8_t *) const {
    fail(CMF_ERR_UNSUPPORTED, std::string("dtype ") + name() + " has no decode layout");
}

}  // namespace cmf::codecs
