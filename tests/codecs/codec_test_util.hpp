// Helpers shared by the codec tests: find a dtype by id, encode, decode.
#pragma once

#include "common/byte_views.hpp"
#include "dtypes/all.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

namespace codec_test {

using cmf::codecs::Dtype;

inline const Dtype &dtype(int32_t id) {
    static const auto all = cmf::codecs::make_all_dtypes();
    for (const auto &d : all)
        if (d->id() == id) return *d;
    FAIL("no dtype " << id);
    throw 0;
}

// A runtime with the standard plugins (found through CMF_PLUGIN_PATH, which
// the test environment sets), shared by the tests that go through the
// registry's vtables.
inline cmf::Runtime &runtime() {
    static cmf_runtime *rt = [] {
        cmf_runtime_options o;
        cmf_runtime_options_init(&o);
        o.log_level = -1;
        cmf_runtime *r = nullptr;
        if (cmf_error *e = cmf_runtime_create(&o, &r)) FAIL(cmf_error_message(e));
        return r;
    }();
    return *static_cast<cmf::Runtime *>(rt);
}

inline cmf_tensor_view view(int32_t id, const std::vector<uint64_t> &shape, const std::vector<uint8_t> &bytes) {
    return cmf::tensor_view(id, shape, bytes.data(), bytes.size());
}

inline std::vector<uint8_t> encode(int32_t id, const std::vector<uint64_t> &shape, const float *src,
                                   const std::string &options = "", const float *act_rms = nullptr,
                                   uint64_t act_len = 0) {
    cmf_quantize_params p{};
    p.struct_size = sizeof p;
    p.options = options.c_str();
    p.act_rms = act_rms;
    p.act_rms_len = act_len;
    std::vector<uint8_t> out;
    dtype(id).quantize(shape, src, &p, out);
    return out;
}

inline std::vector<float> decode(int32_t id, const std::vector<uint64_t> &shape, const std::vector<uint8_t> &bytes) {
    cmf_tensor_view t = view(id, shape, bytes);
    uint64_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<float> out(n);
    const Dtype &d = dtype(id);
    d.validate(t);
    d.dequantize_rows(t, 0, cmf::sdk::rows_of(t), out.data());
    return out;
}

inline std::string hex(const std::vector<uint8_t> &b) {
    static const char *digits = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < b.size(); ++i) {
        if (i) s += ' ';
        s += digits[b[i] >> 4];
        s += digits[b[i] & 15];
    }
    return s;
}

inline uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

}  // namespace codec_test
