// The gemma arch plugin: registers the Gemma family's converter hooks.
// The run members (model/state/forward) are NULL: this plugin converts
// Gemma-family checkpoints; it does not run them.
#include "hf_import.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <memory>

namespace {

struct PluginState {
    const cmf_host_api *host;
    cmf_arch_vt vt;
};

const cmf_host_api *host_of(void *ctx) { return static_cast<PluginState *>(ctx)->host; }

cmf_error *vt_import_config(void *ctx, const char *json, size_t len, const cmf_byte_sink *out) {
    return cmf::archs::import_config_hook(host_of(ctx), json, len, out, cmf::archs::gemma::import_config);
}

cmf_error *vt_import_tensor(void *ctx, const char *arch_json, size_t arch_len, const char *hf_name, uint32_t ndim,
                            const uint64_t *shape, const cmf_byte_sink *out) {
    return cmf::archs::import_tensor_hook(host_of(ctx), arch_json, arch_len, hf_name, ndim, shape, out,
                                          cmf::archs::gemma::import_tensor);
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "gemma arch plugin needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto state = std::make_unique<PluginState>();
    state->host = host;
    cmf_arch_vt &vt = state->vt;
    vt = cmf_arch_vt{};
    vt.struct_size = sizeof(cmf_arch_vt);
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "gemma";
    vt.version = CMF_ARCH_VERSION;
    vt.arch_names = cmf::archs::gemma::kModelTypes;
    vt.hf_model_types = cmf::archs::gemma::kModelTypes;
    vt.import_config = vt_import_config;
    vt.import_tensor = vt_import_tensor;
    if (cmf_error *e = host->register_arch(reg, &vt, state.get())) return e;
    *plugin_state = state.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) { delete static_cast<PluginState *>(plugin_state); }
