// C entry points of cmf.h's batch section.
#include "common/c_api_util.hpp"
#include "common/error.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/batch.hpp"
#include "runtime/container_source.hpp"
#include "runtime/generate_options.hpp"

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <cstring>
#include <string>

using cmf::Error;
using cmf::guard;

struct cmf_batch {
    // Declared first so it is destroyed last: the bound weights view it.
    std::shared_ptr<const cmf_model_source> owned_source;  // set by cmf_batch_create_for_model
    std::unique_ptr<cmf::runtime::BatchEngine> impl;
};

namespace {
cmf::runtime::BatchEngine &engine_of(const cmf_batch *b, const char *fn) {
    if (b == nullptr || !b->impl) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(fn) + ": NULL batch");
    return *b->impl;
}
}  // namespace

extern "C" {

CMF_API void cmf_batch_options_init(cmf_batch_options *o) {
    if (o == nullptr) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    cmf::runtime::BatchConfig d;
    o->n_slots = d.n_slots;
    o->prefill_chunk = d.prefill_chunk;
    o->max_queue = d.max_queue;
}

CMF_API void cmf_batch_stats_init(cmf_batch_stats *s) {
    if (s == nullptr) return;
    std::memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
}

CMF_API cmf_error *cmf_batch_create(cmf_runtime *rt, const struct cmf_model_source *src, const cmf_batch_options *opts,
                                    cmf_batch **out) {
    return guard([&] {
        if (rt == nullptr || src == nullptr || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_batch_create: NULL argument");
        if (src->struct_size < offsetof(cmf_model_source, tensor_at) + sizeof(void *) || src->tensor_at == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_batch_create: the model source has no tensor_at");
        cmf_batch_options o = cmf::capi::copy_in(opts, cmf_batch_options_init);
        cmf::runtime::BatchConfig cfg;
        cfg.n_slots = o.n_slots;
        cfg.n_ctx = o.n_ctx;
        cfg.prefill_chunk = o.prefill_chunk;
        cfg.max_queue = o.max_queue;
        cfg.bind.backend = o.backend ? o.backend : "";
        cfg.bind.arch_options = o.arch_options ? o.arch_options : "";
        for (const char *sel : {o.task, o.skill, o.blend, o.moe_mask})
            if (sel != nullptr && *sel != '\0')
                throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_batch_create: task, skill, blend and moe_mask select from an "
                                                      "opened model (cmf_batch_create_for_model); a model source carries "
                                                      "its own task_mask");
        auto b = std::make_unique<cmf_batch>();
        b->impl = std::make_unique<cmf::runtime::BatchEngine>(*rt, *src, cfg);
        *out = b.release();
    });
}

CMF_API cmf_error *cmf_batch_create_for_model(cmf_runtime *rt, const cmf_model *m, const cmf_batch_options *opts,
                                              cmf_batch **out) {
    return guard([&] {
        if (rt == nullptr || m == nullptr || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_batch_create_for_model: NULL argument");
        cmf_batch_options o = cmf::capi::copy_in(opts, cmf_batch_options_init);
        auto src = cmf::runtime::make_container_source(
            m, cmf::runtime::selection_of(o.task, o.skill, o.blend, o.moe_mask, o.moe_mask_cover));
        o.task = o.skill = o.blend = o.moe_mask = nullptr;
        cmf_batch *b = nullptr;
        cmf::throw_if_error(cmf_batch_create(rt, src.get(), &o, &b));
        b->owned_source = std::move(src);
        *out = b;
    });
}

CMF_API void cmf_batch_free(cmf_batch *b) { delete b; }

CMF_API cmf_error *cmf_batch_submit(cmf_batch *b, const int32_t *prompt, size_t n_prompt,
                                    const cmf_generate_options *opts, cmf_done_fn on_done, uint64_t *id) {
    return guard([&] {
        auto &eng = engine_of(b, "cmf_batch_submit");
        if (prompt == nullptr && n_prompt > 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_batch_submit: NULL prompt");
        cmf_generate_options o = cmf::capi::copy_in(opts, cmf_generate_options_init);
        cmf::runtime::BatchRequest r;
        r.prompt.assign(prompt, prompt + n_prompt);
        r.max_tokens = o.max_tokens;
        r.sampler = cmf::runtime::sampler_params_of(o);
        if (o.stop_ids != nullptr) r.stop_ids.assign(o.stop_ids, o.stop_ids + o.n_stop_ids);
        r.on_token = cmf::runtime::token_callback_of(o);
        if (on_done != nullptr) {
            void *user = o.user;
            r.on_done = [on_done, user](const cmf::runtime::GenerateStats &st, const cmf_error *e) {
                const cmf_generate_stats c = cmf::runtime::c_stats_of(st, st.prompt_tokens + st.generated_tokens);
                on_done(user, &c, e);
            };
        }
        uint64_t got = eng.submit(std::move(r));
        if (id != nullptr) *id = got;
    });
}

CMF_API void cmf_batch_cancel(cmf_batch *b, uint64_t id) {
    if (b != nullptr && b->impl) b->impl->cancel(id);
}

CMF_API cmf_error *cmf_batch_step(cmf_batch *b, uint32_t wait_ms, uint32_t *n_pending) {
    return guard([&] {
        uint32_t n = engine_of(b, "cmf_batch_step").step(wait_ms / 1000.0);
        if (n_pending != nullptr) *n_pending = n;
    });
}

CMF_API void cmf_batch_wake(cmf_batch *b) {
    if (b != nullptr && b->impl) b->impl->wake();
}

CMF_API cmf_error *cmf_batch_get_stats(const cmf_batch *b, cmf_batch_stats *out) {
    return guard([&] {
        if (out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_batch_get_stats: NULL out");
        const auto &eng = engine_of(b, "cmf_batch_get_stats");
        cmf::runtime::BatchStats s = eng.stats();
        cmf_batch_stats c;
        cmf_batch_stats_init(&c);
        c.n_slots = eng.n_slots();
        c.n_ctx = eng.n_ctx();
        c.requests = s.requests;
        c.finished = s.finished;
        c.cancelled = s.cancelled;
        c.failed = s.failed;
        c.rejected = s.rejected;
        c.active = s.active;
        c.waiting = s.waiting;
        c.last_batch = s.last_batch;
        c.batched = eng.batched() ? 1 : 0;
        c.steps = s.steps;
        c.prompt_tokens = s.prompt_tokens;
        c.generated_tokens = s.generated_tokens;
        c.prefill_seconds = s.prefill_seconds;
        c.decode_seconds = s.decode_seconds;
        c.last_prefill_tok_s = s.last_prefill_tok_s;
        c.last_decode_tok_s = s.last_decode_tok_s;
        cmf::capi::copy_out(out, c);
    });
}

}  // extern "C"
