// The qwen architecture plugin: qwen2 (q/k/v biases) and qwen3 (q/k-norm)
// dense decoders on the shared decoder (../common/decoder.hpp) with the
// qwen choices (choices.hpp), and the converter hooks of every Qwen family
// (hf_import.cpp).
#include "hf_import.hpp"
#include "choices.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <memory>

namespace {

// Converter hooks: the HF config -> arch block mapping and tensor plans
// (hf_import.cpp, shared machinery in ../common).
cmf_error *vt_import_config(void *ctx, const char *json, size_t len, const cmf_byte_sink *out) {
    return cmf::archs::import_config_hook(static_cast<cmf::archs::ArchPlugin *>(ctx)->host, json, len, out,
                                          cmf::archs::qwen::import_config);
}

cmf_error *vt_import_tensor(void *ctx, const char *arch_json, size_t arch_len, const char *hf_name, uint32_t ndim,
                            const uint64_t *shape, const cmf_byte_sink *out) {
    return cmf::archs::import_tensor_hook(static_cast<cmf::archs::ArchPlugin *>(ctx)->host, arch_json, arch_len,
                                          hf_name, ndim, shape, out, cmf::archs::qwen::import_tensor);
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "qwen arch needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto pl = std::make_unique<cmf::archs::ArchPlugin>();
    pl->host = host;
    pl->family = "qwen";
    pl->choose = cmf::archs::qwen::choices;
    cmf_arch_vt &vt = pl->vt;
    vt = cmf_arch_vt{};
    vt.struct_size = sizeof vt;
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "qwen";
    vt.version = CMF_QWEN_VERSION;
    vt.arch_names = "qwen2,qwen3";
    // Runs the dense families; converts every Qwen family (MoE and hybrid
    // files convert now and run once their forward passes land).
    vt.hf_model_types = cmf::archs::qwen::kModelTypes;
    vt.import_config = vt_import_config;
    vt.import_tensor = vt_import_tensor;
    cmf::archs::set_decoder_run_members(vt);
    if (cmf_error *e = host->register_arch(reg, &pl->vt, pl.get())) return e;
    *plugin_state = pl.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) {
    delete static_cast<cmf::archs::ArchPlugin *>(plugin_state);
}
