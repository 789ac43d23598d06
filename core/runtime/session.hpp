// A generation session: one model bound by its arch plugin on a backend,
// one state (KV cache) and the tokens it holds, and the generate loop
// (prefill in batches, decode token by token, sample, stop, stream).
//
// The session sees a model only through a cmf_model_source, so it works on
// an opened container, a raw directory (tests, bench) or anything else that
// can list tensors. The source and everything it points to must outlive the
// session (bound weights reference the views).
#pragma once

#include "runtime/bound_model.hpp"
#include "text/sampler.hpp"

#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cmf::runtime {

struct SessionConfig {
    uint64_t n_ctx = 0;       // 0: min(max_position_embeddings, 4096), or 4096 if unknown
    uint32_t n_batch = 512;   // prefill tokens per forward call
    std::string backend;      // "" = the runtime's default backend
    std::string arch_options; // passed to the arch's model_create
    bool profile = false;     // time every backend operation (profile())
};

struct GenerateConfig {
    uint32_t max_tokens = 256;  // 0: until a stop id or the context is full
    text::SamplerParams sampler;
    std::vector<int32_t> stop_ids;
    // Called with each generated token (stop ids are not delivered);
    // returning false stops generation.
    std::function<bool(int32_t)> on_token;
};

struct GenerateStats {
    int32_t stop_reason = 0;  // CMF_STOP_*
    uint64_t prompt_tokens = 0;
    uint64_t generated_tokens = 0;
    double prefill_seconds = 0;
    double decode_seconds = 0;
    double prefill_tok_s() const { return prefill_seconds > 0 ? double(prompt_tokens) / prefill_seconds : 0; }
    // Every generated token is forwarded once (the last one too, so the
    // context holds it), so the decode rate is generated / decode time.
    double decode_tok_s() const { return decode_seconds > 0 ? double(generated_tokens) / decode_seconds : 0; }
};

class Session {
public:
    Session(Runtime &rt, const cmf_model_source &src, const SessionConfig &cfg);
    ~Session();
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    uint64_t vocab_size() const { return vocab_; }
    uint64_t n_ctx() const { return n_ctx_; }
    uint64_t n_past() const { return tokens_.size(); }
    const std::vector<int32_t> &tokens() const { return tokens_; }
    const std::string &arch_name() const { return model_.arch_name(); }

    // Appends `prompt` to the context, then generates. The generated tokens
    // also stay in the context (a later call continues the conversation).
    GenerateStats generate(std::span<const int32_t> prompt, const GenerateConfig &cfg);

    // Appends tokens and returns their logits: CMF_LOGITS_LAST (vocab floats)
    // or CMF_LOGITS_ALL (n * vocab floats), prefilled in n_batch chunks.
    void eval(std::span<const int32_t> tokens, int32_t logits_mode, float *logits);

    // Drops everything after the first n_keep tokens (0 = reset).
    void truncate(uint64_t n_keep);
    // Thread-safe: makes the running generate() return at the next token.
    void cancel() { cancel_.store(true); }

    // The backend profile (SessionConfig::profile), or nullptr.
    BackendProfile *profile() { return model_.profile(); }

private:
    void forward(std::span<const int32_t> tokens, int32_t mode, float *logits);

    SessionConfig cfg_;
    BoundModel model_;
    cmf_arch_state *state_ = nullptr;
    uint64_t vocab_ = 0;
    uint64_t n_ctx_ = 0;
    std::vector<int32_t> tokens_;
    std::atomic<bool> cancel_{false};
};

// Timing helpers for the CLI `bench` command and bench/: prefill n_prompt
// random tokens in n_batch chunks, then decode n_gen tokens greedily (each
// from the previous logits), from an empty context. Returns the stats.
GenerateStats bench_pp_tg(Session &s, uint32_t n_prompt, uint32_t n_gen, uint64_t seed);

// Perplexity of `tokens` (exp of the mean negative log-likelihood of tokens
// 1..n-1) evaluated from an empty context in windows of at most n_ctx.
double perplexity(Session &s, std::span<const int32_t> tokens);

}  // namespace cmf::runtime
