// The lumina2 architecture plugin: runs "lumina2-image" pipeline containers
// (Lumina-Image 2.0 text to image, pipeline.hpp) through the pipeline
// members of cmf_arch_vt. It has no text-model members and no converter
// hooks: the container is written by imagine-pack (core/convert).
#include "pipeline.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <algorithm>
#include <cstring>
#include <memory>

namespace {

using cmf::archs::lumina2::Pipeline;
using cmf::sdk::Error;

struct Plugin {
    const cmf_host_api *host = nullptr;
    cmf_arch_vt vt{};
};

const cmf_host_api *host_of(void *ctx) { return static_cast<Plugin *>(ctx)->host; }

cmf_error *vt_pipeline_create(void *ctx, const cmf_model_source *src, const cmf_backend_vt *backend, void *backend_ctx,
                              const cmf_arch_model_params *params, cmf_arch_pipeline **out) {
    return cmf::sdk::call(host_of(ctx), [&] {
        if (out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: NULL out");
        auto p = std::make_unique<Pipeline>(host_of(ctx), src, backend, backend_ctx,
                                            params != nullptr ? params->options : nullptr);
        *out = reinterpret_cast<cmf_arch_pipeline *>(p.release());
    });
}

void vt_pipeline_free(void *, cmf_arch_pipeline *p) { delete reinterpret_cast<Pipeline *>(p); }

cmf_error *vt_pipeline_info(void *ctx, const cmf_arch_pipeline *p, cmf_pipeline_info *out) {
    return cmf::sdk::call(host_of(ctx), [&] {
        if (p == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: NULL argument");
        cmf_pipeline_info info;
        reinterpret_cast<const Pipeline *>(p)->info(info);
        // Only what fits the caller's struct, which keeps its struct_size.
        const uint32_t caller = out->struct_size ? out->struct_size : uint32_t(sizeof info);
        std::memcpy(out, &info, std::min<size_t>(caller, sizeof info));
        out->struct_size = caller;
    });
}

cmf_error *vt_text_to_image(void *ctx, cmf_arch_pipeline *p, const cmf_text_to_image_args *args) {
    return cmf::sdk::call(host_of(ctx), [&] {
        if (p == nullptr || args == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: NULL argument");
        cmf_text_to_image_args a{};
        std::memcpy(&a, args, std::min<size_t>(args->struct_size, sizeof a));
        reinterpret_cast<Pipeline *>(p)->text_to_image(a);
    });
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "lumina2 arch plugin needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto pl = std::make_unique<Plugin>();
    pl->host = host;
    cmf_arch_vt &vt = pl->vt;
    vt.struct_size = sizeof(cmf_arch_vt);
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "lumina2";
    vt.version = CMF_ARCH_VERSION;
    vt.arch_names = "lumina2-image";
    vt.hf_model_types = "";
    vt.pipeline_create = vt_pipeline_create;
    vt.pipeline_free = vt_pipeline_free;
    vt.pipeline_info = vt_pipeline_info;
    vt.text_to_image = vt_text_to_image;
    if (cmf_error *e = host->register_arch(reg, &vt, pl.get())) return e;
    *plugin_state = pl.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) { delete static_cast<Plugin *>(plugin_state); }
