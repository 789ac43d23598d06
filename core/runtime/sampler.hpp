// The token sampler of the generation loop (ARCHS 6.1, upstream order):
// penalties -> temperature -> softmax -> min-p -> top-k -> top-p ->
// renormalise -> inverse-CDF draw with SplitMix64. Greedy (lowest index on
// ties, as torch.argmax) when temperature < 1e-6. Self-contained so it can
// be swapped for another implementation without touching the session.
#pragma once

#include "text/sampler.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace cmf::runtime {

// The same knobs as the text sampler's (one definition, one set of defaults).
using SamplerParams = cmf::text::SamplerParams;

class Sampler {
public:
    explicit Sampler(const SamplerParams &p) : p_(p), rng_(p.seed) {}

    // Picks a token from logits (modified in place by the penalties) given
    // the history (prompt + generated) the penalties look at.
    int32_t sample(std::span<float> logits, std::span<const int32_t> history);

    // Next value of SplitMix64, exposed for tests.
    uint64_t next_u64();

private:
    SamplerParams p_;
    uint64_t rng_;
    std::vector<uint8_t> seen_;
    std::vector<float> probs_;
    std::vector<uint32_t> order_;
};

// Index of the largest value, the lowest index on ties.
int32_t argmax(std::span<const float> v);

}  // namespace cmf::runtime
