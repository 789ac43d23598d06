// C entry points of cmf.h's session section.
#include "common/error.hpp"
#include "common/c_api_util.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/container_source.hpp"
#include "runtime/generate_options.hpp"
#include "runtime/session.hpp"

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

using cmf::Error;
using cmf::guard;

struct cmf_session {
    // Declared first so it is destroyed last: the bound weights view it.
    std::shared_ptr<const cmf_model_source> owned_source;  // set by cmf_session_create_for_model
    std::unique_ptr<cmf::runtime::Session> impl;
};

namespace {
using cmf::capi::copy_in;
using cmf::capi::copy_out;
cmf::runtime::Session &session_of(cmf_session *s) {
    if (s == nullptr || !s->impl) throw Error(CMF_ERR_INVALID_ARGUMENT, "NULL session");
    return *s->impl;
}
cmf::runtime::BackendProfile *profile_of(const cmf_session *s, const char *fn) {
    if (s == nullptr || !s->impl) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(fn) + ": NULL session");
    cmf::runtime::BackendProfile *p = s->impl->profile();
    if (p == nullptr)
        throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(fn) + ": the session was not created with CMF_SESSION_PROFILE");
    return p;
}
std::string hex(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%x", v);
    return buf;
}
}  // namespace

extern "C" {

CMF_API void cmf_session_options_init(cmf_session_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->n_batch = 512;
}

CMF_API void cmf_generate_options_init(cmf_generate_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    cmf::text::SamplerParams d;
    o->max_tokens = 256;
    o->temperature = d.temperature;
    o->top_k = d.top_k;
    o->top_p = d.top_p;
    o->min_p = d.min_p;
    o->repetition_penalty = d.repetition_penalty;
    o->presence_penalty = d.presence_penalty;
    o->seed = d.seed;
    o->speculative = 1;
}

CMF_API void cmf_generate_stats_init(cmf_generate_stats *s) {
    if (s == nullptr) return;
    std::memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
}

CMF_API cmf_error *cmf_session_create(cmf_runtime *rt, const struct cmf_model_source *src,
                                      const cmf_session_options *opts, cmf_session **out) {
    return guard([&] {
        if (rt == nullptr || src == nullptr || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_create: NULL argument");
        if (src->struct_size < offsetof(cmf_model_source, tensor_at) + sizeof(void *) || src->tensor_at == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_create: the model source has no tensor_at");
        cmf_session_options o = copy_in(opts, cmf_session_options_init);
        if (o.n_threads != 0 && o.n_threads != rt->pool().threads())
            throw Error(CMF_ERR_UNSUPPORTED, "cmf_session_create: sessions use the runtime's pool of " +
                                                 std::to_string(rt->pool().threads()) +
                                                 " threads; create the runtime with n_threads = " +
                                                 std::to_string(o.n_threads));
        cmf::runtime::SessionConfig cfg;
        cfg.n_ctx = o.n_ctx;
        cfg.n_batch = o.n_batch;
        cfg.backend = o.backend ? o.backend : "";
        cfg.arch_options = o.arch_options ? o.arch_options : "";
        if (o.flags & ~CMF_SESSION_PROFILE)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_create: unknown flags 0x" + hex(o.flags & ~CMF_SESSION_PROFILE));
        cfg.profile = (o.flags & CMF_SESSION_PROFILE) != 0;
        for (const char *sel : {o.task, o.skill, o.blend, o.moe_mask})
            if (sel != nullptr && *sel != '\0')
                throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_create: task, skill, blend and moe_mask select from an "
                                                      "opened model (cmf_session_create_for_model); a model source carries "
                                                      "its own task_mask");
        auto s = std::make_unique<cmf_session>();
        s->impl = std::make_unique<cmf::runtime::Session>(*rt, *src, cfg);
        *out = s.release();
    });
}

CMF_API cmf_error *cmf_session_create_for_model(cmf_runtime *rt, const cmf_model *m, const cmf_session_options *opts,
                                                cmf_session **out) {
    return guard([&] {
        if (rt == nullptr || m == nullptr || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_create_for_model: NULL argument");
        cmf_session_options o = copy_in(opts, cmf_session_options_init);
        auto src = cmf::runtime::make_container_source(
            m, cmf::runtime::selection_of(o.task, o.skill, o.blend, o.moe_mask, o.moe_mask_cover));
        o.task = o.skill = o.blend = o.moe_mask = nullptr;
        cmf_session *s = nullptr;
        cmf::throw_if_error(cmf_session_create(rt, src.get(), &o, &s));
        s->owned_source = std::move(src);
        *out = s;
    });
}

CMF_API void cmf_session_free(cmf_session *s) { delete s; }

CMF_API cmf_error *cmf_session_generate(cmf_session *s, const int32_t *prompt, size_t n_prompt,
                                        const cmf_generate_options *opts, cmf_generate_stats *stats) {
    return guard([&] {
        auto &sess = session_of(s);
        if (prompt == nullptr && n_prompt > 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_generate: NULL prompt");
        cmf_generate_options o = copy_in(opts, cmf_generate_options_init);
        cmf::runtime::GenerateConfig g;
        g.max_tokens = o.max_tokens;
        g.sampler = cmf::runtime::sampler_params_of(o);
        if (o.stop_ids != nullptr) g.stop_ids.assign(o.stop_ids, o.stop_ids + o.n_stop_ids);
        g.speculative = o.speculative != 0;
        g.on_token = cmf::runtime::token_callback_of(o);
        auto st = sess.generate(std::span<const int32_t>(prompt, n_prompt), g);
        if (stats != nullptr) copy_out(stats, cmf::runtime::c_stats_of(st, sess.n_past()));
    });
}

CMF_API void cmf_session_cancel(cmf_session *s) {
    if (s != nullptr && s->impl) s->impl->cancel();
}

CMF_API cmf_error *cmf_session_reset(cmf_session *s) {
    return guard([&] { session_of(s).truncate(0); });
}

CMF_API cmf_error *cmf_session_truncate(cmf_session *s, uint64_t n_keep) {
    return guard([&] { session_of(s).truncate(n_keep); });
}

CMF_API cmf_error *cmf_session_eval(cmf_session *s, const int32_t *tokens, size_t n, int32_t logits_mode, float *logits,
                                    size_t logits_len) {
    return guard([&] {
        auto &sess = session_of(s);
        if (tokens == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_eval: NULL tokens");
        size_t need = logits_mode == CMF_LOGITS_ALL ? n * sess.vocab_size()
                      : logits_mode == CMF_LOGITS_LAST ? sess.vocab_size()
                                                       : 0;
        if (logits_len < need)
            throw Error(CMF_ERR_BOUNDS, "cmf_session_eval: logits holds " + std::to_string(logits_len) + " floats, " +
                                            std::to_string(need) + " needed");
        sess.eval(std::span<const int32_t>(tokens, n), logits_mode, logits);
    });
}

CMF_API cmf_error *cmf_session_profile(const cmf_session *s, char **out_json) {
    return guard([&] {
        if (out_json == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_profile: NULL out_json");
        *out_json = nullptr;
        cmf::runtime::BackendProfile *p = profile_of(s, "cmf_session_profile");
        cmf::capi::give_string(p->to_json(), out_json);
    });
}

CMF_API cmf_error *cmf_session_profile_reset(cmf_session *s) {
    return guard([&] { profile_of(s, "cmf_session_profile_reset")->reset(); });
}

CMF_API cmf_error *cmf_session_route_stats(const cmf_session *s, char **out_json) {
    return guard([&] {
        if (out_json == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_route_stats: NULL out_json");
        *out_json = nullptr;
        if (s == nullptr || !s->impl) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_session_route_stats: NULL session");
        cmf::capi::give_string(s->impl->route_stats(), out_json);
    });
}

CMF_API uint64_t cmf_session_vocab_size(const cmf_session *s) { return s && s->impl ? s->impl->vocab_size() : 0; }
CMF_API uint64_t cmf_session_n_ctx(const cmf_session *s) { return s && s->impl ? s->impl->n_ctx() : 0; }
CMF_API uint64_t cmf_session_n_past(const cmf_session *s) { return s && s->impl ? s->impl->n_past() : 0; }

}  // extern "C"
