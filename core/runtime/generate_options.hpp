// cmf_generate_options (cmf.h) as the runtime's types: shared by the C
// entry points of sessions and of batch engines.
#pragma once

#include "runtime/session.hpp"

#include <cmf/cmf.h>

namespace cmf::runtime {

inline text::SamplerParams sampler_params_of(const cmf_generate_options &o) {
    text::SamplerParams p;
    p.temperature = o.temperature;
    p.top_k = o.top_k;
    p.top_p = o.top_p;
    p.min_p = o.min_p;
    p.repetition_penalty = o.repetition_penalty;
    p.presence_penalty = o.presence_penalty;
    p.seed = o.seed;
    return p;
}

// The C callback as "false = stop" (nullptr when there is none).
inline std::function<bool(int32_t)> token_callback_of(const cmf_generate_options &o) {
    if (o.on_token == nullptr) return nullptr;
    cmf_token_fn fn = o.on_token;
    void *user = o.user;
    return [fn, user](int32_t t) { return fn(user, t) == 0; };
}

inline cmf_generate_stats c_stats_of(const GenerateStats &st, uint64_t n_past) {
    cmf_generate_stats out;
    cmf_generate_stats_init(&out);
    out.stop_reason = st.stop_reason;
    out.prompt_tokens = st.prompt_tokens;
    out.generated_tokens = st.generated_tokens;
    out.n_past = n_past;
    out.prefill_seconds = st.prefill_seconds;
    out.decode_seconds = st.decode_seconds;
    out.prefill_tok_s = st.prefill_tok_s();
    out.decode_tok_s = st.decode_tok_s();
    return out;
}

}  // namespace cmf::runtime
