// C entry points of cmf.h's image section: text-to-image pipelines.
#include "common/c_api_util.hpp"
#include "common/error.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/container_source.hpp"
#include "runtime/image_pipeline.hpp"

#include <cmf/cmf.h>

#include <cstring>

using cmf::Error;
using cmf::guard;

struct cmf_image_pipeline {
    std::unique_ptr<cmf::runtime::ImagePipeline> impl;
};

extern "C" {

CMF_API void cmf_image_pipeline_options_init(cmf_image_pipeline_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API void cmf_image_pipeline_info_init(cmf_image_pipeline_info *i) {
    if (i == nullptr) return;
    std::memset(i, 0, sizeof *i);
    i->struct_size = sizeof *i;
}

CMF_API void cmf_imagine_options_init(cmf_imagine_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->width = o->height = 512;
    o->steps = 30;
    o->guidance_scale = 4.0f;
    o->cfg_trunc_ratio = 1.0f;
    o->cfg_normalization = 1;
}

CMF_API cmf_error *cmf_image_pipeline_create(cmf_runtime *rt, const cmf_model *m, const cmf_image_pipeline_options *opts,
                                             cmf_image_pipeline **out) {
    return guard([&] {
        if (rt == nullptr || m == nullptr || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_image_pipeline_create: NULL argument");
        const cmf_image_pipeline_options o = cmf::capi::copy_in(opts, cmf_image_pipeline_options_init);
        if (o.flags != 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_image_pipeline_create: flags must be 0");
        const void *vocab = nullptr;
        uint64_t vocab_len = 0;
        cmf::throw_if_error(cmf_model_vocab(m, &vocab, &vocab_len), "vocab section");
        auto p = std::make_unique<cmf_image_pipeline>();
        p->impl = std::make_unique<cmf::runtime::ImagePipeline>(
            *rt, cmf::runtime::make_container_source(m),
            std::string_view(static_cast<const char *>(vocab), vocab_len), o.backend ? o.backend : "",
            o.arch_options ? o.arch_options : "");
        *out = p.release();
    });
}

CMF_API void cmf_image_pipeline_free(cmf_image_pipeline *p) { delete p; }

CMF_API cmf_error *cmf_image_pipeline_get_info(const cmf_image_pipeline *p, cmf_image_pipeline_info *out) {
    return guard([&] {
        if (p == nullptr || !p->impl || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_image_pipeline_get_info: NULL argument");
        cmf::capi::copy_out(out, p->impl->info());
    });
}

CMF_API cmf_error *cmf_imagine(cmf_image_pipeline *p, const cmf_imagine_options *opts, uint8_t *rgb, uint64_t rgb_len) {
    return guard([&] {
        if (p == nullptr || !p->impl) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_imagine: NULL pipeline");
        const cmf_imagine_options o = cmf::capi::copy_in(opts, cmf_imagine_options_init);
        p->impl->imagine(o, rgb, rgb_len);
    });
}

}  // extern "C"
