// cmf/plugin.hpp — header-only C++ helpers for plugin authors.
//
// Only depends on abi/cmf/cmf_plugin.h: a plugin built with this header needs
// nothing else from cmf (it never links libcmf). It gives:
//  - cmf::sdk::Error, thrown inside plugin code;
//  - cmf::sdk::call(host, body): runs body, turning any exception into a
//    host-made cmf_error (exceptions must never cross the C boundary);
//  - small shape helpers for tensor views.
#pragma once

#include <cmf/cmf_plugin.h>

#include <cstdint>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace cmf::sdk {

class Error : public std::runtime_error {
public:
    Error(int32_t code, const std::string &message) : std::runtime_error(message), code_(code) {}
    int32_t code() const noexcept { return code_; }

private:
    int32_t code_;
};

// Carries an error the host already made (e.g. from a byte sink) back out
// through call() unchanged.
struct HostError {
    cmf_error *error;
};

template <class F>
cmf_error *call(const cmf_host_api *host, F &&body) noexcept {
    try {
        body();
        return nullptr;
    } catch (const HostError &e) {
        return e.error;
    } catch (const Error &e) {
        return host->error_create(e.code(), e.what());
    } catch (const std::bad_alloc &) {
        return host->error_create(CMF_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception &e) {
        return host->error_create(CMF_ERR_INTERNAL, e.what());
    } catch (...) {
        return host->error_create(CMF_ERR_INTERNAL, "unknown exception in plugin");
    }
}

// Rows of a tensor as codecs see them: shape[0] for ndim >= 2, else 1.
inline uint64_t rows_of(const cmf_tensor_view &t) noexcept { return t.ndim >= 2 ? t.shape[0] : 1; }

// Elements per row: the product of shape[1..] (or of the whole shape for ndim < 2).
inline uint64_t row_len_of(const cmf_tensor_view &t) noexcept {
    uint64_t n = 1;
    for (uint32_t i = (t.ndim >= 2 ? 1u : 0u); i < t.ndim; ++i) n *= t.shape[i];
    return n;
}

// Product of a shape with overflow detection; false on overflow.
inline bool shape_elements(uint32_t ndim, const uint64_t *shape, uint64_t *out) noexcept {
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; ++i) {
        if (shape[i] != 0 && n > UINT64_MAX / shape[i]) return false;
        n *= shape[i];
    }
    *out = n;
    return true;
}

// Append bytes to a sink; a sink error travels out of call() unchanged.
inline void sink_append(const cmf_byte_sink *sink, const void *data, size_t n) {
    if (cmf_error *e = sink->append(sink->user, data, n)) throw HostError{e};
}

}  // namespace cmf::sdk
