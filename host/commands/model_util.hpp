// Helpers shared by the container commands (info, verify, tensor, masks, ...).
#pragma once

#include "cli.hpp"

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace cmfhost {

struct ModelDeleter {
    void operator()(cmf_model *m) const { cmf_close(m); }
};
using ModelPtr = std::unique_ptr<cmf_model, ModelDeleter>;

inline ModelPtr open_model(cmf_runtime *rt, const std::string &path, uint32_t flags = 0) {
    cmf_open_options o;
    cmf_open_options_init(&o);
    o.flags = flags;
    cmf_model *m = nullptr;
    check(cmf_open(rt, path.c_str(), &o, &m), path);
    return ModelPtr(m);
}

inline const char *dtype_name(int32_t d) {
    static const char *names[] = {"f32",  "f16",     "bf16",  "q8_row",   "q4_block", "mix8_4", "u8",  "q4_col", "vbit",
                                  "q8_2f", "vbit_ro", "q4_tiled", "q1", "q1s", "q1t", "q4tp", "q2tp"};
    return (d >= 0 && d <= 16) ? names[d] : "?";
}

// The original tool's spelling of a dtype (its Rust enum's Debug form), as
// `info --tensors`, `diff` and `dequant` print it: Q8Row, Q4TiledP, ...
inline const char *debug_dtype_name(int32_t d) {
    static const char *names[] = {"F32", "F16",   "Bf16",   "Q8Row", "Q4Block", "Mix84",   "U8",       "Q4Col",   "Vbit",
                                  "Q8_2f", "VbitRo", "Q4Tiled", "Q1", "Q1S",    "Q1T",     "Q4TiledP", "Q2TiledP"};
    return (d >= 0 && d <= 16) ? names[d] : "?";
}

// "[1024, 2048]", as the original prints a shape.
inline std::string debug_shape(const cmf_tensor_info &t) {
    std::string s = "[";
    for (uint32_t k = 0; k < t.ndim; ++k) s += (k ? ", " : "") + std::to_string(t.shape[k]);
    return s + "]";
}

inline std::string shape_str(const cmf_tensor_info &t) {
    std::string s = "[";
    for (uint32_t k = 0; k < t.ndim; ++k) s += (k ? "," : "") + std::to_string(t.shape[k]);
    return s + "]";
}

inline std::string features_str(uint32_t f) {
    static const char *names[] = {"TENSOR_DIR", "BINARY_MASKS", "QUANT_2F", "DELTA_MASKS", "HOT_PACKS", "LOOP_MASKS", "SKILL_FILE"};
    std::string s;
    for (int b = 0; b < 32; ++b)
        if (f & (1u << b)) s += (s.empty() ? "" : "|") + std::string(b < 7 ? names[b] : ("bit" + std::to_string(b)).c_str());
    return s.empty() ? "none" : s;
}

inline std::string hex64(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
}

}  // namespace cmfhost
