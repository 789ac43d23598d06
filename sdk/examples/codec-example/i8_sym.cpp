// An out-of-tree codec plugin: dtype 200 "i8_sym", a made-up format used to
// show (and test) that third parties can add dtypes with nothing but the SDK
// header (sdk/cmf/plugin.hpp) and the plugin ABI (abi/cmf/cmf_plugin.h).
//
// Layout: n int8 codes (row-major) followed by one little-endian f32 scale;
// value = code * scale. The encoder uses scale = max|w| / 127 and rounds to
// nearest (ties to even), clamping to [-127, 127].
#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int32_t kDtype = 200;

struct State {
    const cmf_host_api *host;
    cmf_codec_vt vt;
};

uint64_t elements(uint32_t ndim, const uint64_t *shape) {
    uint64_t n = 0;
    if (!cmf::sdk::shape_elements(ndim, shape, &n) || n > UINT64_MAX - 4)
        throw cmf::sdk::Error(CMF_ERR_BOUNDS, "i8_sym: shape too large");
    return n;
}

cmf_error *expected_size(void *ctx, uint32_t ndim, const uint64_t *shape, uint64_t *out) {
    return cmf::sdk::call(static_cast<State *>(ctx)->host, [&] { *out = elements(ndim, shape) + 4; });
}

cmf_error *validate(void *ctx, const cmf_tensor_view *t) {
    return cmf::sdk::call(static_cast<State *>(ctx)->host, [&] {
        uint64_t want = elements(t->ndim, t->shape) + 4;
        if (t->nbytes != want)
            throw cmf::sdk::Error(CMF_ERR_BOUNDS, "i8_sym payload is " + std::to_string(t->nbytes) +
                                                      " bytes, shape needs " + std::to_string(want));
    });
}

cmf_error *dequantize_rows(void *ctx, const cmf_tensor_view *t, uint64_t r0, uint64_t r1, float *dst) {
    return cmf::sdk::call(static_cast<State *>(ctx)->host, [&] {
        uint64_t n = elements(t->ndim, t->shape);
        if (t->nbytes != n + 4) throw cmf::sdk::Error(CMF_ERR_BOUNDS, "i8_sym payload size does not match its shape");
        uint64_t len = cmf::sdk::row_len_of(*t);
        const auto *p = static_cast<const unsigned char *>(t->data);
        float scale;
        std::memcpy(&scale, p + n, 4);
        for (uint64_t i = r0 * len; i < r1 * len; ++i) *dst++ = static_cast<float>(static_cast<int8_t>(p[i])) * scale;
    });
}

cmf_error *quantize(void *ctx, uint32_t ndim, const uint64_t *shape, const float *src, const cmf_quantize_params *,
                    const cmf_byte_sink *out) {
    return cmf::sdk::call(static_cast<State *>(ctx)->host, [&] {
        uint64_t n = elements(ndim, shape);
        float amax = 0.0f;
        for (uint64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(src[i]));
        float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
        std::vector<unsigned char> bytes(n + 4);
        for (uint64_t i = 0; i < n; ++i) {
            float q = std::nearbyint(src[i] / scale);
            q = std::isnan(q) ? 0.0f : std::fmin(127.0f, std::fmax(-127.0f, q));
            bytes[i] = static_cast<unsigned char>(static_cast<int8_t>(q));
        }
        std::memcpy(bytes.data() + n, &scale, 4);
        cmf::sdk::sink_append(out, bytes.data(), bytes.size());
    });
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "i8_sym needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto *s = new State{};
    s->host = host;
    s->vt.struct_size = sizeof(cmf_codec_vt);
    s->vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    s->vt.name = "i8_sym";
    s->vt.version = "1.0";
    s->vt.dtype_id = kDtype;
    s->vt.expected_size = expected_size;
    s->vt.validate = validate;
    s->vt.dequantize_rows = dequantize_rows;
    s->vt.quantize = quantize;
    if (cmf_error *e = host->register_codec(reg, &s->vt, s)) {
        delete s;
        return e;
    }
    *plugin_state = s;
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) { delete static_cast<State *>(plugin_state); }
