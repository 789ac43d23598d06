// C entry points of cmf.h's skill tools.
#include "common/c_api_util.hpp"
#include "common/error.hpp"
#include "convert/skills.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <cstring>

using cmf::Error;
using cmf::guard;

namespace {
std::string str(const char *s) { return s ? s : ""; }
void report(const std::string &json, char **out) {
    if (out != nullptr) cmf::capi::give_string(json, out);
}
}  // namespace

extern "C" {

CMF_API void cmf_skill_add_options_init(cmf_skill_add_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->phi_layer = -1;
}

CMF_API cmf_error *cmf_skill_add(cmf_runtime *rt, const cmf_skill_add_options *opts, char **report_json) {
    return guard([&] {
        if (rt == nullptr || opts == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_skill_add: NULL argument");
        const cmf_skill_add_options o = cmf::capi::copy_in(opts, cmf_skill_add_options_init);
        if (o.flags != 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_skill_add: flags must be 0");
        cmf::convert::SkillAddOptions a;
        a.model = str(o.model);
        a.output = str(o.output);
        a.donor = str(o.donor_dir);
        a.id = str(o.id);
        a.name = str(o.name);
        if (o.layers) a.layers = o.layers;
        if (o.tensors) a.tensors = o.tensors;
        a.prompts = str(o.prompts_file);
        a.phi_layer = o.phi_layer;
        if (o.rank) a.rank = o.rank;
        a.min_delta = o.min_delta;
        a.skill_quant = str(o.skill_quant);
        a.quality = str(o.quality_file);
        if (o.quality_tokens) a.quality_tokens = o.quality_tokens;
        a.say = [rt](const std::string &line) { rt->log(CMF_LOG_INFO, line); };
        report(cmf::convert::skill_add(*rt, a), report_json);
    });
}

CMF_API cmf_error *cmf_skill_export(cmf_runtime *rt, const char *specialist, const char *base, const char *id,
                                    const char *name, const char *output, char **report_json) {
    return guard([&] {
        if (rt == nullptr || specialist == nullptr || base == nullptr || id == nullptr || output == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_skill_export: NULL argument");
        report(cmf::convert::skill_export(*rt, {specialist, base, id, str(name), output}), report_json);
    });
}

CMF_API cmf_error *cmf_skill_apply(cmf_runtime *rt, const char *base, const char *skill, const char *output,
                                   int32_t force, char **report_json) {
    return guard([&] {
        if (rt == nullptr || base == nullptr || skill == nullptr || output == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_skill_apply: NULL argument");
        report(cmf::convert::skill_apply(*rt, {base, skill, output, force != 0}), report_json);
    });
}

}  // extern "C"
