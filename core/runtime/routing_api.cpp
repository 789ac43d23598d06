// C entry points of cmf.h's routing section.
#include "common/c_api_util.hpp"
#include "common/error.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/routing.hpp"

#include <cmf/cmf.h>

#include <cmath>
#include <cstring>

using cmf::Error;
using cmf::guard;

struct cmf_route {
    cmf::runtime::Routing routing;
};

extern "C" {

CMF_API void cmf_route_options_init(cmf_route_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

CMF_API void cmf_route_info_init(cmf_route_info *i) {
    if (i == nullptr) return;
    std::memset(i, 0, sizeof *i);
    i->struct_size = sizeof *i;
}

CMF_API void cmf_route_score_init(cmf_route_score *s) {
    if (s == nullptr) return;
    std::memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
}

CMF_API cmf_error *cmf_route_prompt(cmf_runtime *rt, const cmf_model *m, const int32_t *tokens, size_t n_tokens,
                                    const cmf_route_options *opts, cmf_route **out) {
    return guard([&] {
        if (rt == nullptr || m == nullptr || out == nullptr || (n_tokens > 0 && tokens == nullptr))
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_route_prompt: NULL argument");
        const cmf_route_options o = cmf::capi::copy_in(opts, cmf_route_options_init);
        const float tau = o.novelty_tau > 0 ? o.novelty_tau : 0.30f;
        auto r = std::make_unique<cmf_route>();
        r->routing = cmf::runtime::route(*rt, m, std::span<const int32_t>(tokens, n_tokens), tau);
        *out = r.release();
    });
}

CMF_API void cmf_route_free(cmf_route *r) { delete r; }

CMF_API cmf_error *cmf_route_get_info(const cmf_route *r, cmf_route_info *out) {
    return guard([&] {
        if (r == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_route_get_info: NULL argument");
        cmf_route_info i;
        cmf_route_info_init(&i);
        const auto &g = r->routing;
        i.calibrated = g.calibrated;
        i.is_novel = g.is_novel;
        i.confidence = g.confidence;
        i.margin = g.margin;
        i.novelty = g.novelty;
        i.tau = g.tau;
        i.score_count = g.scores.size();
        i.skipped_count = g.skipped.size();
        cmf::capi::copy_out(out, i);
    });
}

CMF_API cmf_error *cmf_route_score_at(const cmf_route *r, size_t i, cmf_route_score *out) {
    return guard([&] {
        if (r == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_route_score_at: NULL argument");
        if (i >= r->routing.scores.size()) throw Error(CMF_ERR_INVALID_ARGUMENT, "route score " + std::to_string(i) + " out of range");
        const auto &s = r->routing.scores[i];
        cmf_route_score o;
        cmf_route_score_init(&o);
        o.error = s.error;
        o.raw_error = s.raw_error;
        o.probability = s.probability;
        o.id = s.id.c_str();
        cmf::capi::copy_out(out, o);
    });
}

CMF_API cmf_error *cmf_route_skipped_at(const cmf_route *r, size_t i, const char **id, const char **why) {
    return guard([&] {
        if (r == nullptr || id == nullptr || why == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_route_skipped_at: NULL argument");
        if (i >= r->routing.skipped.size()) throw Error(CMF_ERR_INVALID_ARGUMENT, "skipped skill " + std::to_string(i) + " out of range");
        *id = r->routing.skipped[i].first.c_str();
        *why = r->routing.skipped[i].second.c_str();
    });
}

CMF_API cmf_error *cmf_route_auto_blend(const cmf_route *r, char **out) {
    return guard([&] {
        if (r == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_route_auto_blend: NULL argument");
        cmf::capi::give_string(cmf::runtime::auto_blend(r->routing), out);
    });
}

}  // extern "C"
