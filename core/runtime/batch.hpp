// Continuous batching: many generations over one bound model, advanced
// together. Each request gets a slot (its own arch state: KV cache); every
// step runs one batched forward (cmf_arch_vt.forward_batch) over the next
// token of every decoding sequence, so the weights are read once per step
// for all of them, then a second one over the next prompt chunks of the
// sequences still in prefill (at most `prefill_chunk` tokens in all), so a
// long prompt never stalls the others for more than a chunk. Requests join
// at the next step and leave when done; a queue holds those waiting for a
// slot.
//
// Why decode and prefill are two passes, not one: a decode-only pass keeps
// each sequence's decode matmuls on the kernels a single sequence uses
// (codec dtypes below 16 rows: docs/runtime.md "Matmul paths"), so a
// greedy request gives the same tokens whatever else runs beside it. The
// price is one more read of the weights per step while a prompt is being
// prefilled.
//
// Threads: submit, cancel, wake and stats from any thread; step from one
// thread at a time. The request callbacks run on the stepping thread.
#pragma once

#include "runtime/bound_model.hpp"
#include "runtime/session.hpp"
#include "text/sampler.hpp"

#include <cmf/cmf.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace cmf::runtime {

struct BatchConfig {
    uint32_t n_slots = 4;          // sequences decoded together
    uint64_t n_ctx = 0;            // context per slot; 0 = min(max_position_embeddings, 4096)
    uint32_t prefill_chunk = 128;  // prompt tokens per step, over all prefilling sequences
    uint32_t max_queue = 64;       // requests waiting for a slot; more: CMF_ERR_BUSY
    BindConfig bind;
};

struct BatchRequest {
    std::vector<int32_t> prompt;  // not empty
    uint32_t max_tokens = 256;    // 0: until a stop id or the context is full
    text::SamplerParams sampler;
    std::vector<int32_t> stop_ids;
    // Each generated token (stop ids are not delivered); false stops after it.
    std::function<bool(int32_t)> on_token;
    // Called once, last: the stats (stop_reason CMF_STOP_*), and the error
    // when the model failed (stop_reason 0), else nullptr.
    std::function<void(const GenerateStats &, const cmf_error *)> on_done;
};

struct BatchStats {
    uint64_t requests = 0;        // accepted by submit
    uint64_t finished = 0;        // on_done called (any reason)
    uint64_t cancelled = 0;       // of them: cancelled
    uint64_t failed = 0;          // of them: a model error
    uint64_t rejected = 0;        // refused by submit (queue full)
    uint32_t active = 0;          // in a slot now
    uint32_t waiting = 0;         // queued for a slot now
    uint32_t last_batch = 0;      // sequences in the last decode pass
    uint64_t steps = 0;
    uint64_t prompt_tokens = 0;   // prefilled
    uint64_t generated_tokens = 0;
    double prefill_seconds = 0;   // in prefill passes
    double decode_seconds = 0;    // in decode passes
    double last_prefill_tok_s = 0;  // of the last prefill pass
    double last_decode_tok_s = 0;   // of the last decode pass: its sequences / its time
};

class BatchEngine {
public:
    BatchEngine(Runtime &rt, const cmf_model_source &src, const BatchConfig &cfg);
    ~BatchEngine();  // outstanding requests get on_done(CMF_STOP_CANCELLED)
    BatchEngine(const BatchEngine &) = delete;
    BatchEngine &operator=(const BatchEngine &) = delete;

    uint64_t vocab_size() const { return model_.vocab_size(); }
    uint64_t n_ctx() const { return n_ctx_; }
    uint32_t n_slots() const { return uint32_t(slots_.size()); }
    bool batched() const { return batched_; }

    // Queues a request; returns its id (> 0). CMF_ERR_BUSY when max_queue
    // requests already wait, CMF_ERR_BOUNDS when the prompt does not fit a
    // slot's context, CMF_ERR_INVALID_ARGUMENT for an empty prompt or a token
    // outside the vocabulary. on_done is called only for accepted requests.
    uint64_t submit(BatchRequest req);
    // The request leaves at the next step (on_done: CMF_STOP_CANCELLED).
    // Unknown or finished ids are ignored.
    void cancel(uint64_t id);
    // Makes a step waiting for work return.
    void wake();
    // One step; when there is no work, waits up to wait_seconds for some
    // first. Returns the number of requests in slots or waiting afterwards.
    uint32_t step(double wait_seconds);
    BatchStats stats() const;

private:
    struct Seq;
    void finish(Seq &q, int32_t reason, const cmf_error *error);
    void deliver(Seq &q, int32_t token);
    void run_pass(std::vector<Seq *> &seqs, std::vector<cmf_forward_args> &args, bool decode);

    BatchConfig cfg_;
    BoundModel model_;
    uint64_t n_ctx_ = 0;
    bool batched_ = true;  // forward_batch works for this model (else one forward per sequence)
    std::vector<cmf_arch_state *> slots_;
    std::vector<std::unique_ptr<Seq>> active_;  // in slots, admission order
    std::vector<bool> slot_used_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Seq>> queue_;  // waiting, FIFO
    std::unordered_set<uint64_t> cancels_;
    uint64_t next_id_ = 1;
    bool woken_ = false;
    BatchStats stats_;
};

}  // namespace cmf::runtime
