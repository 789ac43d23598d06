// C entry points of cmf.h's MoE expert defrag and expert masks.
#include "common/c_api_util.hpp"
#include "common/error.hpp"
#include "convert/moe_defrag.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <cstring>

using cmf::Error;
using cmf::guard;

namespace {

cmf::convert::MoeDefragOptions options_of(cmf_runtime *rt, const cmf_moe_defrag_options *opts, const char *fn) {
    if (rt == nullptr || opts == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(fn) + ": NULL argument");
    const cmf_moe_defrag_options o = cmf::capi::copy_in(opts, cmf_moe_defrag_options_init);
    if (o.flags != 0) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(fn) + ": flags must be 0");
    if (o.input == nullptr || o.output == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(fn) + ": input and output are required");
    cmf::convert::MoeDefragOptions d;
    d.input = o.input;
    d.output = o.output;
    d.stats = o.stats ? o.stats : "";
    d.cover = o.cover == 0 ? 0.95 : o.cover;
    d.name = o.name ? o.name : "";
    d.say = [rt](const std::string &line) { rt->log(CMF_LOG_INFO, line); };
    return d;
}

}  // namespace

extern "C" {

CMF_API void cmf_moe_defrag_options_init(cmf_moe_defrag_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API cmf_error *cmf_moe_defrag(cmf_runtime *rt, const cmf_moe_defrag_options *opts, char **report_json) {
    return guard([&] {
        const cmf::convert::MoeDefragOptions o = options_of(rt, opts, "cmf_moe_defrag");
        const std::string r = cmf::convert::moe_defrag(*rt, o);
        if (report_json != nullptr) cmf::capi::give_string(r, report_json);
    });
}

CMF_API cmf_error *cmf_moe_mask(cmf_runtime *rt, const cmf_moe_defrag_options *opts, char **report_json) {
    return guard([&] {
        const cmf::convert::MoeDefragOptions o = options_of(rt, opts, "cmf_moe_mask");
        const std::string r = cmf::convert::moe_mask(*rt, o);
        if (report_json != nullptr) cmf::capi::give_string(r, report_json);
    });
}

}  // extern "C"
