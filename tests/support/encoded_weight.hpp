// A weight encoded by its dtype's codec (through the runtime's codec lookup,
// as the backend finds it), for tests that bind quantized weights.
#pragma once

#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

// The codec registered for `dtype` in runtime `rt`, or NULL.
inline const cmf_codec_vt *find_test_codec(cmf_runtime *rt, int32_t dtype, void **ctx) {
    return rt->host_api()->find_codec(rt->host_api()->host_ctx, dtype, ctx);
}

// A quantized weight: the codec's payload and its view.
struct Encoded {
    std::vector<uint8_t> bytes;
    cmf_tensor_view v{};
};

inline Encoded encode(const cmf_codec_vt *codec, void *ctx, int32_t dtype, size_t rows, size_t cols, const float *w) {
    Encoded e;
    cmf_byte_sink sink{sizeof(cmf_byte_sink), 0, &e.bytes, [](void *u, const void *d, size_t n) -> cmf_error * {
                           auto *v = static_cast<std::vector<uint8_t> *>(u);
                           v->insert(v->end(), static_cast<const uint8_t *>(d), static_cast<const uint8_t *>(d) + n);
                           return nullptr;
                       }};
    uint64_t shape[2] = {rows, cols};
    REQUIRE(codec->quantize(ctx, 2, shape, w, nullptr, &sink) == nullptr);
    e.v.struct_size = sizeof e.v;
    e.v.dtype = dtype;
    e.v.ndim = 2;
    e.v.shape[0] = rows;
    e.v.shape[1] = cols;
    e.v.data = e.bytes.data();
    e.v.nbytes = e.bytes.size();
    return e;
}
