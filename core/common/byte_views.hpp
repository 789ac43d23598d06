// Small adapters between C++ containers and the ABI's byte structs, for the
// in-process code that calls codecs directly (converter, requant, tests,
// benchmarks): a cmf_byte_sink that appends to a std::vector, and a
// cmf_tensor_view over bytes in memory.
#pragma once

#include "common/error.hpp"

#include <cmf/cmf_plugin.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace cmf {

// cmf_byte_sink.write for a std::vector<uint8_t> *user. An allocation failure
// becomes CMF_ERR_OUT_OF_MEMORY through guard, not an exception across the ABI.
inline cmf_error *append_to_vector(void *user, const void *data, size_t n) {
    return guard([&] {
        auto *v = static_cast<std::vector<uint8_t> *>(user);
        v->insert(v->end(), static_cast<const uint8_t *>(data), static_cast<const uint8_t *>(data) + n);
    });
}

// A sink that appends to `out`; `out` must outlive the sink.
inline cmf_byte_sink vector_sink(std::vector<uint8_t> &out) {
    return cmf_byte_sink{sizeof(cmf_byte_sink), 0, &out, append_to_vector};
}

// A view of `nbytes` at `data` as a tensor of `dtype` and `shape` (at most
// CMF_MAX_DIMS dimensions; more throws CMF_ERR_INVALID_ARGUMENT). No copy:
// the bytes must outlive the view.
template <class Shape>
cmf_tensor_view tensor_view(int32_t dtype, const Shape &shape, const void *data, uint64_t nbytes) {
    cmf_tensor_view t{};
    t.struct_size = sizeof t;
    t.dtype = dtype;
    for (uint64_t d : shape) {
        if (t.ndim == CMF_MAX_DIMS) throw Error(CMF_ERR_INVALID_ARGUMENT, "tensor_view: too many dimensions");
        t.shape[t.ndim++] = d;
    }
    t.data = data;
    t.nbytes = nbytes;
    return t;
}
inline cmf_tensor_view tensor_view(int32_t dtype, std::initializer_list<uint64_t> shape,
                                   const std::vector<uint8_t> &bytes) {
    return tensor_view(dtype, shape, bytes.data(), bytes.size());
}

}  // namespace cmf
