// Struct copying across the C ABI by struct_size (see docs/architecture.md):
// only the fields that fit in the caller's struct are read or written.
#pragma once

#include "common/error.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

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

// A malloc'd NUL-terminated copy for the caller (freed by cmf_string_free).
inline void give_string(const std::string &s, char **out, size_t *out_len = nullptr) {
    char *p = static_cast<char *>(std::malloc(s.size() + 1));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = '\0';
    *out = p;
    if (out_len) *out_len = s.size();
}

}  // namespace cmf::capi
