// Token sampler with the original implementation's chain order:
//   1. suppressed ids -> -inf; repetition penalty once per distinct token of
//      the history (logit > 0: / penalty, else * penalty); presence penalty
//      (subtract once per distinct seen token);
//   2. greedy (lowest index among equal maxima, torch.argmax's choice) when
//      temperature < 1e-6; else logit / T;
//   3. softmax; 4. min-p: zero probs < min_p * max_prob;
//   5. top-k: zero probs strictly below the k-th largest (ties survive);
//   6. top-p: sort survivors descending, keep the shortest prefix whose
//      cumulative (un-renormalised) probability reaches top_p;
//   7. renormalise; draw r in [0,1) from SplitMix64 ((next >> 40) / 2^24)
//      by inverse CDF over survivors in id order (as upstream's
//      categorical_sample does). Nothing left: argmax of the raw logits.
// The one sampler of the project: the C API's cmf_sampler and the
// generation loop (core/runtime) both use it.
// The history is prompt + generated ids (accept()); sample() appends its pick.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_set>
#include <vector>

namespace cmf::text {

struct SamplerParams {
    float temperature = 0.7f;
    int32_t top_k = 40;               // <= 0: off
    float top_p = 0.9f;               // >= 1: off
    float min_p = 0.05f;              // <= 0: off
    float repetition_penalty = 1.1f;  // 1: off
    float presence_penalty = 0.0f;    // 0: off
    uint64_t seed = 0;
};

// Index of the largest value, the lowest index on ties (torch.argmax), a
// NaN never winning over a number.
int32_t argmax(std::span<const float> v);

class Sampler {
public:
    explicit Sampler(const SamplerParams &p);
    void accept(std::span<const int32_t> ids);
    void suppress(std::span<const int32_t> ids);
    void set_stop_ids(std::span<const int32_t> ids);
    bool is_stop(int32_t id) const { return stop_.count(id) != 0; }
    // Picks the next id from `logits` (one per vocabulary entry).
    int32_t sample(std::span<const float> logits);
    // Next SplitMix64 draw as r in [0, 1) (exposed for tests).
    double next_uniform();

private:
    SamplerParams p_;
    uint64_t state_;
    std::vector<int32_t> history_;
    std::unordered_set<int32_t> seen_, suppressed_, stop_;
    std::vector<float> work_;
    std::vector<double> prob_;  // scratch, kept between calls: no allocation per token
};

}  // namespace cmf::text
