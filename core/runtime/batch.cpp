#include "runtime/batch.hpp"

#include "common/error.hpp"

#include <algorithm>
#include <chrono>

namespace cmf::runtime {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct ErrorDeleter {
    void operator()(cmf_error *e) const { cmf_error_free(e); }
};
using ErrorPtr = std::unique_ptr<cmf_error, ErrorDeleter>;
}  // namespace

struct BatchEngine::Seq {
    uint64_t id = 0;
    BatchRequest req;
    text::Sampler sampler;
    size_t slot = 0;
    cmf_arch_state *state = nullptr;
    size_t prefilled = 0;   // prompt tokens forwarded
    uint64_t n_past = 0;    // positions the state holds
    int32_t pending = -1;   // sampled and delivered, not yet forwarded
    bool done = false;
    GenerateStats st;
    std::vector<float> logits;

    Seq(uint64_t id_, BatchRequest &&r) : id(id_), req(std::move(r)), sampler(req.sampler) {
        sampler.set_stop_ids(req.stop_ids);  // one stop rule: the sampler's, as in Session::generate
    }
    bool prefilling() const { return !done && prefilled < req.prompt.size(); }
};

BatchEngine::BatchEngine(Runtime &rt, const cmf_model_source &src, const BatchConfig &cfg)
    : cfg_(cfg), model_(rt, src, cfg.bind) {
    if (cfg_.n_slots == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "batch: n_slots must be > 0");
    if (cfg_.prefill_chunk == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "batch: prefill_chunk must be > 0");
    n_ctx_ = cfg_.n_ctx ? cfg_.n_ctx : model_.default_n_ctx();
    // A pass of no sequences only asks whether this model can be batched.
    if (!model_.has_forward_batch()) {
        batched_ = false;
    } else if (ErrorPtr e{model_.forward_batch(0, nullptr, nullptr)}) {
        if (cmf_error_code(e.get()) != CMF_ERR_UNSUPPORTED) throw_if_error(e.release(), "batch");
        batched_ = false;
    }
    try {
        for (uint32_t i = 0; i < cfg_.n_slots; ++i) slots_.push_back(model_.state_create(n_ctx_));
    } catch (...) {
        for (cmf_arch_state *s : slots_) model_.state_free(s);
        throw;
    }
    slot_used_.assign(slots_.size(), false);
}

BatchEngine::~BatchEngine() {
    std::deque<std::unique_ptr<Seq>> queued;
    {
        std::lock_guard lk(mu_);
        queued.swap(queue_);
    }
    for (auto &q : active_)
        if (!q->done) finish(*q, CMF_STOP_CANCELLED, nullptr);
    for (auto &q : queued) finish(*q, CMF_STOP_CANCELLED, nullptr);
    for (cmf_arch_state *s : slots_) model_.state_free(s);
}

uint64_t BatchEngine::submit(BatchRequest req) {
    if (req.prompt.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "batch submit: empty prompt");
    for (int32_t t : req.prompt)
        if (t < 0 || uint64_t(t) >= model_.vocab_size())
            throw Error(CMF_ERR_INVALID_ARGUMENT, "batch submit: prompt token " + std::to_string(t) +
                                                      " outside the vocabulary of " + std::to_string(model_.vocab_size()));
    if (req.prompt.size() > n_ctx_)
        throw Error(CMF_ERR_BOUNDS, "batch submit: the prompt has " + std::to_string(req.prompt.size()) +
                                        " tokens, more than the context of " + std::to_string(n_ctx_));
    std::lock_guard lk(mu_);
    if (queue_.size() >= cfg_.max_queue) {
        ++stats_.rejected;
        throw Error(CMF_ERR_BUSY, "batch submit: " + std::to_string(queue_.size()) +
                                      " requests already wait for a slot (the queue holds " +
                                      std::to_string(cfg_.max_queue) + ")");
    }
    const uint64_t id = next_id_++;
    auto q = std::make_unique<Seq>(id, std::move(req));
    q->sampler.accept(q->req.prompt);  // the penalties look at the whole context
    q->logits.resize(model_.vocab_size());
    queue_.push_back(std::move(q));
    ++stats_.requests;
    cv_.notify_all();
    return id;
}

void BatchEngine::cancel(uint64_t id) {
    std::lock_guard lk(mu_);
    if (id == 0 || id >= next_id_) return;
    cancels_.insert(id);
    cv_.notify_all();
}

void BatchEngine::wake() {
    std::lock_guard lk(mu_);
    woken_ = true;
    cv_.notify_all();
}

BatchStats BatchEngine::stats() const {
    std::lock_guard lk(mu_);
    return stats_;
}

void BatchEngine::finish(Seq &q, int32_t reason, const cmf_error *error) {
    q.done = true;
    q.pending = -1;
    q.st.stop_reason = reason;
    q.st.prompt_tokens = q.req.prompt.size();
    {
        std::lock_guard lk(mu_);
        ++stats_.finished;
        if (reason == CMF_STOP_CANCELLED) ++stats_.cancelled;
        if (error != nullptr) ++stats_.failed;
    }
    if (q.req.on_done) q.req.on_done(q.st, error);
}

void BatchEngine::deliver(Seq &q, int32_t tok) {
    if (q.sampler.is_stop(tok)) {
        finish(q, CMF_STOP_EOS, nullptr);
        return;
    }
    ++q.st.generated_tokens;
    bool go_on = true;
    if (q.req.on_token) {
        try {
            go_on = q.req.on_token(tok);
        } catch (const std::exception &e) {
            ErrorPtr err{make_error(CMF_ERR_INTERNAL, std::string("batch: a token callback threw: ") + e.what())};
            finish(q, 0, err.get());
            return;
        }
    }
    if (!go_on)
        finish(q, CMF_STOP_CALLBACK, nullptr);
    else if (q.req.max_tokens != 0 && q.st.generated_tokens >= q.req.max_tokens)
        finish(q, CMF_STOP_MAX_TOKENS, nullptr);
    else if (q.n_past + 1 > n_ctx_)
        finish(q, CMF_STOP_CONTEXT_FULL, nullptr);
    else
        q.pending = tok;
}

// One forward pass over `seqs` (args[i] for seqs[i]): batched when the model
// allows, else one forward per sequence. A failure ends every sequence of
// the pass with the error.
void BatchEngine::run_pass(std::vector<Seq *> &seqs, std::vector<cmf_forward_args> &args, bool decode) {
    const auto t0 = Clock::now();
    ErrorPtr err;
    if (batched_) {
        std::vector<cmf_arch_state *> states;
        std::vector<const cmf_forward_args *> ap;
        for (size_t i = 0; i < seqs.size(); ++i) {
            states.push_back(seqs[i]->state);
            ap.push_back(&args[i]);
        }
        err.reset(model_.forward_batch(uint32_t(seqs.size()), states.data(), ap.data()));
    } else {
        for (size_t i = 0; i < seqs.size() && !err; ++i) {
            try {
                model_.forward(seqs[i]->state, args[i]);
            } catch (const Error &e) {
                err.reset(make_error(e.code(), e.what()));
            } catch (const std::bad_alloc &) {
                err.reset(make_error(CMF_ERR_OUT_OF_MEMORY, "batch: out of memory in a forward pass"));
            }
        }
    }
    const double t = seconds_since(t0);
    if (err) {
        for (Seq *q : seqs) finish(*q, 0, err.get());
        return;
    }
    uint64_t tokens = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        Seq &q = *seqs[i];
        q.n_past += args[i].n_tokens;
        tokens += args[i].n_tokens;
        (decode ? q.st.decode_seconds : q.st.prefill_seconds) += t;
        if (!decode) q.prefilled += args[i].n_tokens;
    }
    {
        std::lock_guard lk(mu_);
        if (decode) {
            stats_.decode_seconds += t;
            stats_.last_batch = uint32_t(seqs.size());
            stats_.last_decode_tok_s = t > 0 ? double(seqs.size()) / t : 0;
        } else {
            stats_.prefill_seconds += t;
            stats_.prompt_tokens += tokens;
            stats_.last_prefill_tok_s = t > 0 ? double(tokens) / t : 0;
        }
    }
    uint64_t delivered = 0;
    for (Seq *q : seqs) {
        if (q->done || (!decode && q->prefilling())) continue;
        const uint64_t before = q->st.generated_tokens;
        deliver(*q, q->sampler.sample(q->logits));
        delivered += q->st.generated_tokens - before;
    }
    std::lock_guard lk(mu_);
    stats_.generated_tokens += delivered;
}

uint32_t BatchEngine::step(double wait_seconds) {
    std::vector<std::unique_ptr<Seq>> dropped;  // cancelled while waiting
    std::unordered_set<uint64_t> cancels;
    {
        std::unique_lock lk(mu_);
        if (active_.empty() && queue_.empty() && !woken_ && wait_seconds > 0)
            cv_.wait_for(lk, std::chrono::duration<double>(wait_seconds),
                         [&] { return woken_ || !queue_.empty(); });
        woken_ = false;
        cancels.swap(cancels_);
        for (auto it = queue_.begin(); it != queue_.end();) {
            if (cancels.count((*it)->id)) {
                dropped.push_back(std::move(*it));
                it = queue_.erase(it);
            } else {
                ++it;
            }
        }
        // Admit waiting requests into free slots, first come first served.
        for (size_t s = 0; s < slots_.size() && !queue_.empty(); ++s) {
            if (slot_used_[s]) continue;
            auto q = std::move(queue_.front());
            queue_.pop_front();
            q->slot = s;
            q->state = slots_[s];
            slot_used_[s] = true;
            active_.push_back(std::move(q));
        }
    }
    for (auto &q : dropped) finish(*q, CMF_STOP_CANCELLED, nullptr);
    for (auto &q : active_) {
        if (q->done) continue;
        if (cancels.count(q->id)) {
            finish(*q, CMF_STOP_CANCELLED, nullptr);
            continue;
        }
        if (q->n_past == 0 && q->prefilled == 0) {
            // A fresh slot: empty the state the previous request left.
            try {
                model_.state_truncate(q->state, 0);
            } catch (const Error &e) {
                ErrorPtr err{make_error(e.code(), e.what())};
                finish(*q, 0, err.get());
            }
        }
    }

    // Decode: the next token of every sequence that has one, in one pass.
    std::vector<Seq *> seqs;
    std::vector<cmf_forward_args> args;
    auto add = [&](Seq &q, const int32_t *tokens, uint32_t n, int32_t mode) {
        cmf_forward_args a{};
        a.struct_size = sizeof a;
        a.n_tokens = n;
        a.tokens = tokens;
        a.pos = q.n_past;
        a.logits_mode = mode;
        a.logits = q.logits.data();
        seqs.push_back(&q);
        args.push_back(a);
    };
    for (auto &q : active_)
        if (!q->done && q->pending >= 0) add(*q, &q->pending, 1, CMF_LOGITS_LAST);
    if (!seqs.empty()) run_pass(seqs, args, true);

    // Prefill: whole chunks of the sequences still in their prompt, oldest
    // first, up to prefill_chunk tokens (at least one chunk). Each prompt
    // is cut at the same places whatever else runs.
    seqs.clear();
    args.clear();
    uint64_t budget = cfg_.prefill_chunk;
    for (auto &q : active_) {
        if (!q->prefilling()) continue;
        const uint64_t piece = std::min<uint64_t>(cfg_.prefill_chunk, q->req.prompt.size() - q->prefilled);
        if (!seqs.empty() && piece > budget) break;
        const bool last = q->prefilled + piece == q->req.prompt.size();
        add(*q, q->req.prompt.data() + q->prefilled, uint32_t(piece), last ? CMF_LOGITS_LAST : CMF_LOGITS_NONE);
        budget -= std::min(budget, piece);
        if (budget == 0) break;
    }
    if (!seqs.empty()) run_pass(seqs, args, false);

    // Finished sequences leave their slots.
    uint32_t remaining = 0;
    {
        std::lock_guard lk(mu_);
        for (auto &q : active_)
            if (q->done) slot_used_[q->slot] = false;
        std::erase_if(active_, [](const std::unique_ptr<Seq> &q) { return q->done; });
        ++stats_.steps;
        stats_.active = uint32_t(active_.size());
        stats_.waiting = uint32_t(queue_.size());
        remaining = stats_.active + stats_.waiting;
    }
    return remaining;
}

}  // namespace cmf::runtime
