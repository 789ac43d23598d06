// C entry points of cmf.h for versions, errors, the runtime and its plugins.
#include "common/error.hpp"
#include "common/c_api_util.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <cstring>

#ifndef CMF_VERSION
#error "CMF_VERSION must be set by the build"
#endif

using cmf::Error;
using cmf::guard;

using cmf::capi::copy_in;
using cmf::capi::copy_out;

extern "C" {

CMF_API uint32_t cmf_abi_version(void) { return CMF_ABI_VERSION; }
CMF_API uint32_t cmf_plugin_abi_version(void) { return CMF_PLUGIN_ABI_VERSION; }
CMF_API uint32_t cmf_plugin_abi_min_version(void) { return CMF_PLUGIN_ABI_MIN; }
CMF_API const char *cmf_version_string(void) { return CMF_VERSION; }

CMF_API int32_t cmf_error_code(const cmf_error *e) { return e ? e->code : 0; }
CMF_API const char *cmf_error_message(const cmf_error *e) { return e ? e->message.c_str() : ""; }
CMF_API void cmf_error_free(cmf_error *e) {
    if (e && !cmf::is_static_error(e)) delete e;
}
CMF_API const char *cmf_error_code_name(int32_t code) { return cmf::error_code_name(code); }

CMF_API void cmf_runtime_options_init(cmf_runtime_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->log_level = CMF_LOG_WARN;
}

CMF_API cmf_error *cmf_runtime_create(const cmf_runtime_options *opts, cmf_runtime **out) {
    return guard([&] {
        if (!out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_runtime_create: out is NULL");
        cmf_runtime_options o = copy_in(opts, cmf_runtime_options_init);
        if (!(o.flags & CMF_RUNTIME_IGNORE_ENV) && o.n_threads <= 0) {
            if (const char *env = std::getenv("CMF_THREADS")) o.n_threads = std::atoi(env);
        }
        auto rt = std::make_unique<cmf_runtime>(o);
        rt->load_configured_plugins();
        *out = rt.release();
    });
}

CMF_API void cmf_runtime_free(cmf_runtime *rt) { delete rt; }

CMF_API cmf_error *cmf_runtime_load_plugin(cmf_runtime *rt, const char *path) {
    return guard([&] {
        if (!rt || !path) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_runtime_load_plugin: NULL argument");
        rt->load_plugin(path, true);
    });
}

CMF_API int32_t cmf_runtime_threads(const cmf_runtime *rt) { return rt ? rt->pool().threads() : 0; }

CMF_API void cmf_plugin_info_init(cmf_plugin_info *info) {
    if (!info) return;
    std::memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

CMF_API size_t cmf_runtime_plugin_count(const cmf_runtime *rt) { return rt ? rt->plugin_count() : 0; }

CMF_API cmf_error *cmf_runtime_plugin_info(const cmf_runtime *rt, size_t index, cmf_plugin_info *out) {
    return guard([&] {
        if (!rt || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_runtime_plugin_info: NULL argument");
        cmf_plugin_info tmp;
        cmf_plugin_info_init(&tmp);
        if (!rt->plugin_info(index, tmp))
            throw Error(CMF_ERR_INVALID_ARGUMENT, "plugin index " + std::to_string(index) + " out of range");
        copy_out(out, tmp);
    });
}

CMF_API const char *cmf_plugin_in_progress(void) { return cmf::Runtime::plugin_in_progress(); }

CMF_API void cmf_component_info_init(cmf_component_info *info) {
    if (!info) return;
    std::memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    info->dtype_id = -1;
}

CMF_API size_t cmf_runtime_component_count(const cmf_runtime *rt, int32_t kind) {
    return rt ? rt->component_count(kind) : 0;
}

CMF_API cmf_error *cmf_runtime_component_info(const cmf_runtime *rt, int32_t kind, size_t index,
                                              cmf_component_info *out) {
    return guard([&] {
        if (!rt || !out) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_runtime_component_info: NULL argument");
        cmf_component_info tmp;
        cmf_component_info_init(&tmp);
        if (!rt->component_info(kind, index, tmp))
            throw Error(CMF_ERR_INVALID_ARGUMENT,
                        "component kind " + std::to_string(kind) + " index " + std::to_string(index) + " out of range");
        copy_out(out, tmp);
    });
}

}  // extern "C"
