#include "runtime/session.hpp"

#include "common/error.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

namespace cmf::runtime {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

namespace {
BindConfig bind_config(const SessionConfig &cfg) {
    if (cfg.n_batch == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "session: n_batch must be > 0");
    return BindConfig{cfg.backend, cfg.arch_options, cfg.profile};
}
}  // namespace

Session::Session(Runtime &rt, const cmf_model_source &src, const SessionConfig &cfg)
    : cfg_(cfg), model_(rt, src, bind_config(cfg)) {
    vocab_ = model_.vocab_size();
    n_ctx_ = cfg_.n_ctx ? cfg_.n_ctx : model_.default_n_ctx();
    state_ = model_.state_create(n_ctx_);
}

Session::~Session() { model_.state_free(state_); }

void Session::forward(std::span<const int32_t> tokens, int32_t mode, float *logits) {
    cmf_forward_args a{};
    a.struct_size = sizeof a;
    a.n_tokens = static_cast<uint32_t>(tokens.size());
    a.tokens = tokens.data();
    a.pos = tokens_.size();
    a.logits_mode = mode;
    a.logits = logits;
    model_.forward(state_, a);
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

void Session::eval(std::span<const int32_t> tokens, int32_t mode, float *logits) {
    if (mode != CMF_LOGITS_NONE && mode != CMF_LOGITS_LAST && mode != CMF_LOGITS_ALL)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "eval: unknown logits mode " + std::to_string(mode));
    if (mode != CMF_LOGITS_NONE && logits == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "eval: NULL logits");
    if (tokens.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "eval: no tokens");
    if (tokens_.size() + tokens.size() > n_ctx_)
        throw Error(CMF_ERR_BOUNDS, "eval: " + std::to_string(tokens_.size() + tokens.size()) +
                                        " tokens exceed the session context of " + std::to_string(n_ctx_));
    for (size_t i = 0; i < tokens.size(); i += cfg_.n_batch) {
        size_t n = std::min<size_t>(cfg_.n_batch, tokens.size() - i);
        bool last = i + n == tokens.size();
        int32_t m = mode == CMF_LOGITS_ALL ? CMF_LOGITS_ALL : (last ? mode : CMF_LOGITS_NONE);
        forward(tokens.subspan(i, n), m, m == CMF_LOGITS_ALL ? logits + i * vocab_ : logits);
    }
}

std::vector<float> Session::probe(std::span<const int32_t> tokens, uint64_t n_layers, uint64_t hidden_size) {
    if (tokens.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "probe: no tokens");
    if (tokens.size() > n_ctx_)
        throw Error(CMF_ERR_BOUNDS, "probe: " + std::to_string(tokens.size()) + " tokens exceed the session context of " +
                                        std::to_string(n_ctx_));
    truncate(0);
    std::vector<double> acc(hidden_size, 0.0);
    std::vector<float> h;
    for (size_t i = 0; i < tokens.size(); i += cfg_.n_batch) {
        const size_t n = std::min<size_t>(cfg_.n_batch, tokens.size() - i);
        h.assign(n * hidden_size, 0.0f);
        cmf_forward_args a{};
        a.struct_size = sizeof a;
        a.n_tokens = static_cast<uint32_t>(n);
        a.tokens = tokens.data() + i;
        a.pos = tokens_.size();
        a.logits_mode = CMF_LOGITS_NONE;
        a.n_layers = n_layers;
        a.hidden = h.data();
        try {
            model_.forward(state_, a);
        } catch (...) {
            tokens_.clear();
            model_.state_truncate(state_, 0);
            throw;
        }
        tokens_.insert(tokens_.end(), tokens.begin() + long(i), tokens.begin() + long(i + n));
        for (size_t t = 0; t < n; ++t)
            for (uint64_t j = 0; j < hidden_size; ++j) acc[j] += h[t * hidden_size + j];
    }
    // The later layers hold none of these positions: start over.
    truncate(0);
    std::vector<float> mean(hidden_size);
    for (uint64_t j = 0; j < hidden_size; ++j) mean[j] = float(acc[j] / double(tokens.size()));
    return mean;
}

void Session::truncate(uint64_t n_keep) {
    if (n_keep > tokens_.size())
        throw Error(CMF_ERR_BOUNDS, "truncate: " + std::to_string(n_keep) + " > " + std::to_string(tokens_.size()) +
                                        " tokens in the context");
    try {
        model_.state_truncate(state_, n_keep);
    } catch (const Error &e) {
        if (e.code() != CMF_ERR_UNSUPPORTED || n_keep == 0) throw;
        // The state cannot drop those positions in place (a sliding-window
        // layer's ring no longer holds the window before n_keep, a gated
        // delta net keeps one position of history): rebuild it from the
        // kept tokens.
        const std::vector<int32_t> keep(tokens_.begin(), tokens_.begin() + std::ptrdiff_t(n_keep));
        model_.state_truncate(state_, 0);
        tokens_.clear();
        for (size_t i = 0; i < keep.size(); i += cfg_.n_batch)
            forward(std::span<const int32_t>(keep).subspan(i, std::min<size_t>(cfg_.n_batch, keep.size() - i)),
                    CMF_LOGITS_NONE, nullptr);
        return;
    }
    tokens_.resize(n_keep);
}

std::string Session::route_stats() const { return model_.route_stats(state_); }

GenerateStats Session::generate(std::span<const int32_t> prompt, const GenerateConfig &cfg) {
    cancel_.store(false);
    GenerateStats st;
    st.prompt_tokens = prompt.size();
    if (prompt.empty() && tokens_.empty())
        throw Error(CMF_ERR_INVALID_ARGUMENT, "generate: empty prompt and empty context");
    for (int32_t t : prompt)
        if (t < 0 || uint64_t(t) >= vocab_)
            throw Error(CMF_ERR_BOUNDS, "generate: prompt token " + std::to_string(t) + " outside the vocabulary of " +
                                            std::to_string(vocab_));
    std::vector<float> logits(vocab_);
    auto t0 = Clock::now();
    if (!prompt.empty()) {
        // Prefill in batches; cancel is checked between them.
        for (size_t i = 0; i < prompt.size(); i += cfg_.n_batch) {
            if (cancel_.load()) {
                st.stop_reason = CMF_STOP_CANCELLED;
                st.prefill_seconds = seconds_since(t0);
                return st;
            }
            size_t n = std::min<size_t>(cfg_.n_batch, prompt.size() - i);
            if (tokens_.size() + n > n_ctx_) {
                st.stop_reason = CMF_STOP_CONTEXT_FULL;
                st.prefill_seconds = seconds_since(t0);
                return st;
            }
            bool last = i + n == prompt.size();
            forward(prompt.subspan(i, n), last ? CMF_LOGITS_LAST : CMF_LOGITS_NONE, logits.data());
        }
    } else {
        // Continue from the context: recompute the last token's logits.
        int32_t last = tokens_.back();
        truncate(tokens_.size() - 1);
        forward(std::span<const int32_t>(&last, 1), CMF_LOGITS_LAST, logits.data());
    }
    st.prefill_seconds = seconds_since(t0);

    text::Sampler sampler(cfg.sampler);
    sampler.accept(tokens_);  // the penalties look at the whole context
    sampler.set_stop_ids(cfg.stop_ids);  // one stop rule: the sampler's, as for cmf_sampler users
    auto t1 = Clock::now();
    st.stop_reason = CMF_STOP_MAX_TOKENS;
    if (model_.has_draft() && cfg.speculative)
        speculative_loop(cfg, sampler, logits, st);
    else
        decode_loop(cfg, sampler, logits, st);
    st.decode_seconds = seconds_since(t1);
    return st;
}

void Session::decode_loop(const GenerateConfig &cfg, text::Sampler &sampler, std::vector<float> &logits,
                          GenerateStats &st) {
    while (cfg.max_tokens == 0 || st.generated_tokens < cfg.max_tokens) {
        if (cancel_.load()) {
            st.stop_reason = CMF_STOP_CANCELLED;
            break;
        }
        int32_t tok = sampler.sample(logits);  // also appends tok to the sampler's history
        if (sampler.is_stop(tok)) {
            st.stop_reason = CMF_STOP_EOS;
            break;
        }
        ++st.generated_tokens;
        bool go_on = !cfg.on_token || cfg.on_token(tok);
        if (tokens_.size() + 1 > n_ctx_) {
            st.stop_reason = CMF_STOP_CONTEXT_FULL;
            break;
        }
        // The token joins the context even when this is the last one, so a
        // later generate() continues after it.
        bool more = go_on && (cfg.max_tokens == 0 || st.generated_tokens < cfg.max_tokens);
        forward(std::span<const int32_t>(&tok, 1), more ? CMF_LOGITS_LAST : CMF_LOGITS_NONE, logits.data());
        if (!go_on) {
            st.stop_reason = CMF_STOP_CALLBACK;
            break;
        }
    }
}

void Session::draft(int32_t next, float *logits) {
    model_.draft(state_, next, logits);
}

// Speculative decoding with one drafted token per step (the MTP scheme):
// `tok`, sampled for position P = n_past, is forwarded together with the
// draft head's guess d for P + 1 in one two-position pass. The token for
// P + 1 is then chosen from the trunk's logits at P as plain decoding would
// choose it (greedy: their argmax; sampling: d kept with probability
// min(1, p(d) / q(d)), else a draw from max(0, p - q) renormalised, the
// standard speculative sampling rule, which leaves the distribution p). If
// it is d, the logits at P + 1 are valid too and the next token comes from
// them: two tokens for one pass. Otherwise d's position is dropped
// (state_truncate by one: the KV rows and the gated delta net's state go
// back) and the chosen token is forwarded with the next step's draft.
void Session::speculative_loop(const GenerateConfig &cfg, text::Sampler &sampler, std::vector<float> &logits,
                               GenerateStats &st) {
    const uint64_t V = vocab_;
    std::vector<float> draft_logits(V), pair(2 * V);
    std::vector<double> p, q;
    const bool greedy = cfg.sampler.temperature < 1e-6f;
    auto is_stop = [&](int32_t t) { return std::find(cfg.stop_ids.begin(), cfg.stop_ids.end(), t) != cfg.stop_ids.end(); };
    auto wants_more = [&](bool go_on) { return go_on && (cfg.max_tokens == 0 || st.generated_tokens < cfg.max_tokens); };
    if (cfg.max_tokens != 0 && st.generated_tokens >= cfg.max_tokens) return;
    int32_t tok = sampler.sample(logits);
    for (;;) {
        if (cancel_.load()) {
            st.stop_reason = CMF_STOP_CANCELLED;
            return;
        }
        if (is_stop(tok)) {
            st.stop_reason = CMF_STOP_EOS;
            return;
        }
        ++st.generated_tokens;
        bool go_on = !cfg.on_token || cfg.on_token(tok);
        if (tokens_.size() + 1 > n_ctx_) {
            st.stop_reason = CMF_STOP_CONTEXT_FULL;
            return;
        }
        if (!wants_more(go_on) || tokens_.size() + 2 > n_ctx_) {
            // No room (or no wish) for a second position: plain decoding.
            const bool more = wants_more(go_on);
            forward(std::span<const int32_t>(&tok, 1), more ? CMF_LOGITS_LAST : CMF_LOGITS_NONE, logits.data());
            if (!go_on) st.stop_reason = CMF_STOP_CALLBACK;
            if (!more) return;
            tok = sampler.sample(logits);
            continue;
        }
        // Draft d for P + 1 from the head's distribution q (the sampler's
        // chain over the draft logits, the same history).
        draft(tok, draft_logits.data());
        int32_t d = sampler.distribution(draft_logits, q);
        double qsum = 0;
        if (d < 0) {
            d = sampler.draw(q);
            for (double x : q) qsum += x;
        }
        ++st.draft_tokens;
        const int32_t both[2] = {tok, d};
        forward(both, CMF_LOGITS_ALL, pair.data());
        // The token of P + 1, as plain decoding picks it from the logits at P.
        int32_t next = sampler.distribution(std::span<const float>(pair.data(), V), p);
        if (greedy || next >= 0) {
            if (next < 0) next = sampler.draw(p);  // (greedy always gives next >= 0)
        } else {
            double psum = 0;
            for (double x : p) psum += x;
            const double pd = p[size_t(d)] / psum, qd = qsum > 0 ? q[size_t(d)] / qsum : 1.0;
            if (sampler.next_uniform() < std::min(1.0, pd / qd)) {
                next = d;
            } else {
                // The residual max(0, p - q), renormalised by draw.
                for (size_t i = 0; i < V; ++i) p[i] = std::max(0.0, p[i] / psum - (qsum > 0 ? q[i] / qsum : 0.0));
                p[size_t(d)] = 0;
                next = sampler.draw(p);
            }
        }
        sampler.push(next);
        if (next == d) {
            ++st.draft_accepted;
            if (is_stop(next)) {
                truncate(tokens_.size() - 1);
                st.stop_reason = CMF_STOP_EOS;
                return;
            }
            ++st.generated_tokens;
            go_on = !cfg.on_token || cfg.on_token(next);
            if (!wants_more(go_on)) {
                if (!go_on) st.stop_reason = CMF_STOP_CALLBACK;
                return;
            }
            if (cancel_.load()) {
                st.stop_reason = CMF_STOP_CANCELLED;
                return;
            }
            std::copy(pair.begin() + std::ptrdiff_t(V), pair.end(), logits.begin());
            tok = sampler.sample(logits);
        } else {
            truncate(tokens_.size() - 1);
            tok = next;
        }
    }
}

GenerateStats bench_pp_tg(Session &s, uint32_t n_prompt, uint32_t n_gen, uint64_t seed) {
    s.truncate(0);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> prompt(n_prompt);
    for (auto &t : prompt) t = static_cast<int32_t>(rng() % s.vocab_size());
    GenerateConfig g;
    g.max_tokens = n_gen;
    g.sampler.temperature = 0;
    g.sampler.repetition_penalty = 1.0f;
    return s.generate(prompt, g);
}

double perplexity(Session &s, std::span<const int32_t> tokens) {
    if (tokens.size() < 2) throw Error(CMF_ERR_INVALID_ARGUMENT, "perplexity: needs at least 2 tokens");
    const uint64_t V = s.vocab_size();
    const size_t window = static_cast<size_t>(s.n_ctx());
    double nll = 0;
    size_t count = 0;
    std::vector<float> logits;
    for (size_t w0 = 0; w0 + 1 < tokens.size(); w0 += window) {
        size_t n = std::min(window, tokens.size() - w0);
        if (n < 2) break;
        s.truncate(0);
        logits.resize(n * V);
        s.eval(tokens.subspan(w0, n), CMF_LOGITS_ALL, logits.data());
        for (size_t i = 0; i + 1 < n; ++i) {
            const float *l = logits.data() + i * V;
            float mx = *std::max_element(l, l + V);
            double z = 0;
            for (uint64_t j = 0; j < V; ++j) z += std::exp(double(l[j]) - mx);
            nll += std::log(z) + mx - l[tokens[w0 + i + 1]];
            ++count;
        }
    }
    s.truncate(0);
    return std::exp(nll / double(count));
}

}  // namespace cmf::runtime
