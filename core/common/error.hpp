// Errors inside the C++ code of libcmf and how they cross the C ABI.
//
// Internally, failures are thrown as cmf::Error (code + message). At the C
// boundary every exported function runs its body through cmf::guard(), which
// turns any exception into a heap cmf_error: nothing ever unwinds into C.
#pragma once

#include <cmf/cmf_types.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

// The concrete type behind the opaque `cmf_error` of the ABI.
struct cmf_error {
    int32_t code;
    std::string message;
};

namespace cmf {

class Error : public std::exception {
public:
    Error(int32_t code, std::string message) : code_(code), message_(std::move(message)) {}
    int32_t code() const noexcept { return code_; }
    const std::string &message() const noexcept { return message_; }
    const char *what() const noexcept override { return message_.c_str(); }

private:
    int32_t code_;
    std::string message_;
};

// Stable name of an error code ("Bounds", "InvalidMagic", ...).
const char *error_code_name(int32_t code) noexcept;

// A new heap error for the C ABI; never throws (falls back to a static
// out-of-memory error object that cmf_error_free recognises).
cmf_error *make_error(int32_t code, const std::string &message) noexcept;
bool is_static_error(const cmf_error *e) noexcept;

// Converts the exception currently being handled into a cmf_error.
cmf_error *error_from_current_exception() noexcept;

// Run `body` (returns void) and map any exception to a cmf_error.
template <class F>
cmf_error *guard(F &&body) noexcept {
    try {
        body();
        return nullptr;
    } catch (...) {
        return error_from_current_exception();
    }
}

// Rethrow a cmf_error returned by a C callee (a plugin) as cmf::Error,
// freeing it. `context` is prefixed to the message when not empty.
void throw_if_error(cmf_error *e, const std::string &context = {});

}  // namespace cmf
