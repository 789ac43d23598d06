// C entry point of cmf.h's dense FFN defrag.
#include "common/c_api_util.hpp"
#include "common/error.hpp"
#include "convert/defrag.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <cstring>

using cmf::Error;
using cmf::guard;

extern "C" {

CMF_API void cmf_defrag_options_init(cmf_defrag_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API cmf_error *cmf_defrag(cmf_runtime *rt, const cmf_defrag_options *opts, char **report_json) {
    return guard([&] {
        if (rt == nullptr || opts == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_defrag: NULL argument");
        const cmf_defrag_options o = cmf::capi::copy_in(opts, cmf_defrag_options_init);
        if (o.flags != 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_defrag: flags must be 0");
        if (o.input == nullptr || o.output == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_defrag: input and output are required");
        cmf::convert::DefragOptions d;
        d.input = o.input;
        d.output = o.output;
        d.task = o.task ? o.task : "";
        d.keep_npy = o.keep_file ? o.keep_file : "";
        d.source = o.source ? o.source : "";
        d.say = [rt](const std::string &line) { rt->log(CMF_LOG_INFO, line); };
        const std::string r = cmf::convert::defrag_ffn(*rt, d);
        if (report_json != nullptr) cmf::capi::give_string(r, report_json);
    });
}

}  // extern "C"
