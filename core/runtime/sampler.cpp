#include "runtime/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cmf::runtime {

int32_t argmax(std::span<const float> v) {
    size_t best = 0;
    for (size_t i = 1; i < v.size(); ++i)
        if (v[i] > v[best]) best = i;
    return static_cast<int32_t>(best);
}

uint64_t Sampler::next_u64() {
    uint64_t z = (rng_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
    const size_t n = logits.size();
    if (n == 0) return -1;
    // 1. Penalties, once per distinct token of the history.
    if (p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f) {
        seen_.assign(n, 0);
        for (int32_t t : history) {
            if (t < 0 || size_t(t) >= n || seen_[size_t(t)]) continue;
            seen_[size_t(t)] = 1;
            float &l = logits[size_t(t)];
            if (p_.repetition_penalty != 1.0f) l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
            l -= p_.presence_penalty;
        }
    }
    if (p_.temperature < 1e-6f) return argmax(logits);
    // 2-3. Temperature and softmax.
    probs_.resize(n);
    float mx = -INFINITY;
    for (size_t i = 0; i < n; ++i) mx = std::max(mx, logits[i] / p_.temperature);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
        probs_[i] = std::exp(logits[i] / p_.temperature - mx);
        sum += probs_[i];
    }
    float pmax = 0;
    for (size_t i = 0; i < n; ++i) {
        probs_[i] = static_cast<float>(probs_[i] / sum);
        pmax = std::max(pmax, probs_[i]);
    }
    // 4. min-p.
    if (p_.min_p > 0)
        for (float &q : probs_)
            if (q < p_.min_p * pmax) q = 0;
    // 5. top-k: zero values strictly below the k-th largest (ties survive).
    if (p_.top_k > 0 && size_t(p_.top_k) < n) {
        std::vector<float> sorted(probs_);
        std::nth_element(sorted.begin(), sorted.begin() + (p_.top_k - 1), sorted.end(), std::greater<float>());
        float kth = sorted[size_t(p_.top_k - 1)];
        for (float &q : probs_)
            if (q < kth) q = 0;
    }
    // 6. top-p over the survivors, descending, un-renormalised cumulative.
    order_.clear();
    for (size_t i = 0; i < n; ++i)
        if (probs_[i] > 0) order_.push_back(static_cast<uint32_t>(i));
    if (order_.empty()) return argmax(logits);
    std::stable_sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) { return probs_[a] > probs_[b]; });
    if (p_.top_p < 1.0f) {
        double cum = 0;
        size_t keep = order_.size();
        for (size_t i = 0; i < order_.size(); ++i) {
            cum += probs_[order_[i]];
            if (cum >= p_.top_p) {
                keep = i + 1;
                break;
            }
        }
        order_.resize(keep);
    }
    // 7. Renormalise and draw by inverse CDF.
    double total = 0;
    for (uint32_t i : order_) total += probs_[i];
    if (!(total > 0)) return argmax(logits);
    double r = double(next_u64() >> 40) / double(1u << 24) * total;
    double acc = 0;
    for (uint32_t i : order_) {
        acc += probs_[i];
        if (r < acc) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(order_.back());
}

}  // namespace cmf::runtime
