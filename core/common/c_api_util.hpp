// Struct copying across the C ABI by struct_size (see docs/architecture.md):
// only the fields that fit in the caller's struct are read or written.
#pragma once

#include "common/error.hpp"

#include <algorithm>
#include <cstring>

namespace cmf::capi {

template <class T>
void copy_out(T *dst, const T &src) {
    uint32_t n = dst->struct_size;
    if (n < sizeof(uint32_t)) throw Error(CMF_ERR_INVALID_ARGUMENT, "struct_size not set (call the *_init function)");
    std::memcpy(reinterpret_cast<char *>(dst) + sizeof(uint32_t), reinterpret_cast<const char *>(&src) + sizeof(uint32_t),
                std::min<size_t>(n, sizeof(T)) - sizeof(uint32_t));
}

template <class T>
T copy_in(const T *src, void (*init)(T *)) {
    T out;
    init(&out);
    if (src == nullptr) return out;
    if (src->struct_size < sizeof(uint32_t)) throw Error(CMF_ERR_INVALID_ARGUMENT, "struct_size not set (call the *_init function)");
    std::memcpy(reinterpret_cast<char *>(&out) + sizeof(uint32_t), reinterpret_cast<const char *>(src) + sizeof(uint32_t),
                std::min<size_t>(src->struct_size, sizeof(T)) - sizeof(uint32_t));
    return out;
}

}  // namespace cmf::capi
