// What the fuzz targets share: splitting an input into parts, and a runtime
// with the build's plugins. Built only with -Dfuzz=true (docs/reliability.md).
#pragma once

#include <cmf/cmf.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace cmf::fuzz {

// The input up to its first NUL byte, and what follows it (empty when there
// is no NUL): how the text targets take two documents from one input, e.g.
// a template and its context. Seeds are written the same way
// (tests/fuzz/make_seeds.py).
inline std::pair<std::string_view, std::string_view> split_at_nul(const uint8_t *data, size_t size) {
    std::string_view all(reinterpret_cast<const char *>(data), size);
    const size_t nul = all.find('\0');
    if (nul == std::string_view::npos) return {all, {}};
    return {all.substr(0, nul), all.substr(nul + 1)};
}

// One runtime for the process: one thread, errors only, the plugins on
// CMF_PLUGIN_PATH (run.sh sets it to the build's codecs and arch plugins).
inline cmf_runtime *runtime() {
    static cmf_runtime *rt = [] {
        cmf_runtime_options o;
        cmf_runtime_options_init(&o);
        o.n_threads = 1;
        o.log_level = CMF_LOG_ERROR;
        cmf_runtime *r = nullptr;
        if (cmf_error *e = cmf_runtime_create(&o, &r)) {
            std::fprintf(stderr, "fuzz: cannot create a runtime: %s\n", cmf_error_message(e));
            std::abort();
        }
        return r;
    }();
    return rt;
}

}  // namespace cmf::fuzz
