// The gemma architecture plugin: gemma, gemma2 and gemma3 (text) on the
// shared decoder (../common/decoder.hpp) with the Gemma choices
// (choices.hpp), and their converter hooks (hf_import.cpp).
#include "hf_import.hpp"
#include "choices.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <memory>

namespace {

const cmf_host_api *host_of(void *ctx) { return static_cast<cmf::archs::ArchPlugin *>(ctx)->host; }

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
    auto pl = std::make_unique<cmf::archs::ArchPlugin>();
    pl->host = host;
    pl->family = "gemma";
    pl->choose = cmf::archs::gemma::choices;
    cmf_arch_vt &vt = pl->vt;
    vt = cmf_arch_vt{};
    vt.struct_size = sizeof(cmf_arch_vt);
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "gemma";
    vt.version = CMF_ARCH_VERSION;
    vt.arch_names = cmf::archs::gemma::kModelTypes;
    vt.hf_model_types = cmf::archs::gemma::kModelTypes;
    vt.import_config = vt_import_config;
    vt.import_tensor = vt_import_tensor;
    cmf::archs::set_decoder_run_members(vt);
    if (cmf_error *e = host->register_arch(reg, &vt, pl.get())) return e;
    *plugin_state = pl.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) {
    delete static_cast<cmf::archs::ArchPlugin *>(plugin_state);
}
