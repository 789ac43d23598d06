// What the batched-forward and batch-engine tests (tests/runtime) share:
// forward arguments, a prompt's greedy continuation from a session alone,
// a greedy engine request, and stepping an engine until it is idle.
#pragma once

#include "runtime/batch.hpp"
#include "runtime/session.hpp"

#include <cmf/cmf.h>

#include <cstdint>
#include <vector>

inline cmf_forward_args forward_args(const int32_t *tokens, uint32_t n, uint64_t pos, int32_t mode, float *logits) {
    cmf_forward_args a{};
    a.struct_size = sizeof a;
    a.tokens = tokens;
    a.n_tokens = n;
    a.pos = pos;
    a.logits_mode = mode;
    a.logits = logits;
    return a;
}

// `prompt`'s greedy continuation of max_tokens tokens, the session emptied first.
inline std::vector<int32_t> greedy_session_tokens(cmf::runtime::Session &s, const std::vector<int32_t> &prompt,
                                                  uint32_t max_tokens) {
    s.truncate(0);
    cmf::runtime::GenerateConfig g;
    g.max_tokens = max_tokens;
    g.sampler.temperature = 0;
    g.sampler.repetition_penalty = 1;
    std::vector<int32_t> got;
    g.on_token = [&got](int32_t t) {
        got.push_back(t);
        return true;
    };
    s.generate(prompt, g);
    return got;
}

// A greedy engine request whose tokens are appended to `out`.
inline cmf::runtime::BatchRequest greedy_batch_request(const std::vector<int32_t> &prompt, uint32_t max_tokens,
                                                       std::vector<int32_t> &out) {
    cmf::runtime::BatchRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampler.temperature = 0;
    r.sampler.repetition_penalty = 1;
    r.on_token = [&out](int32_t t) {
        out.push_back(t);
        return true;
    };
    return r;
}

inline void run_until_idle(cmf::runtime::BatchEngine &eng) {
    for (int i = 0; i < 10000 && eng.step(0) > 0; ++i) {
    }
}
