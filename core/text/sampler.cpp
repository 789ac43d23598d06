#include "text/sampler.hpp"

#include "common/error.hpp"
#include "common/splitmix64.hpp"

#include <cmf/argmax.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace cmf::text {

int32_t argmax(std::span<const float> v) { return int32_t(cmf::argmax(v.data(), v.size())); }

Sampler::Sampler(const SamplerParams &p) : p_(p), state_(p.seed) {
    if (!(p.temperature >= 0) || !(p.top_p > 0) || p.min_p < 0 || !(p.repetition_penalty > 0))
        throw Error(CMF_ERR_INVALID_ARGUMENT,
                    "sampler: temperature must be >= 0, top_p > 0, min_p >= 0 and repetition_penalty > 0");
}

void Sampler::accept(std::span<const int32_t> ids) {
    for (int32_t id : ids) {
        history_.push_back(id);
        seen_.insert(id);
    }
}
void Sampler::suppress(std::span<const int32_t> ids) { suppressed_.insert(ids.begin(), ids.end()); }
void Sampler::set_stop_ids(std::span<const int32_t> ids) {
    stop_.clear();
    stop_.insert(ids.begin(), ids.end());
}

double Sampler::next_uniform() { return double(splitmix64_next(state_) >> 40) / double(1u << 24); }

int32_t Sampler::sample(std::span<const float> logits) {
    if (logits.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "sampler: no logits");
    const size_t n = logits.size();
    work_.assign(logits.begin(), logits.end());
    // 1. suppress, repetition and presence penalties
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int32_t id : suppressed_)
        if (id >= 0 && size_t(id) < n) work_[size_t(id)] = ninf;
    for (int32_t id : seen_) {
        if (id < 0 || size_t(id) >= n) continue;
        float &l = work_[size_t(id)];
        if (p_.repetition_penalty != 1.0f) l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
        l -= p_.presence_penalty;
    }
    int32_t pick;
    if (p_.temperature < 1e-6f) {
        pick = argmax(work_);
    } else {
        // 2-3. temperature, softmax
        float mx = *std::max_element(work_.begin(), work_.end());
        std::vector<double> &prob = prob_;
        prob.assign(n, 0.0);
        double sum = 0;
        if (std::isfinite(mx)) {
            for (size_t i = 0; i < n; ++i) {
                prob[i] = std::exp(double(work_[i] - mx) / double(p_.temperature));
                sum += prob[i];
            }
            for (auto &x : prob) x /= sum;
        }
        // 4. min-p
        double pmax = *std::max_element(prob.begin(), prob.end());
        if (p_.min_p > 0)
            for (auto &x : prob)
                if (x < double(p_.min_p) * pmax) x = 0;
        // 5. top-k (ties at the threshold survive)
        if (p_.top_k > 0 && size_t(p_.top_k) < n) {
            std::vector<double> sorted(prob);
            std::nth_element(sorted.begin(), sorted.begin() + (p_.top_k - 1), sorted.end(), std::greater<>());
            double kth = sorted[size_t(p_.top_k - 1)];
            for (auto &x : prob)
                if (x < kth) x = 0;
        }
        // 6. top-p over the survivors, un-renormalised
        if (p_.top_p < 1) {
            std::vector<int32_t> order;
            for (size_t i = 0; i < n; ++i)
                if (prob[i] > 0) order.push_back(int32_t(i));
            std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[size_t(a)] > prob[size_t(b)]; });
            double cum = 0;
            size_t keep = order.size();
            for (size_t k = 0; k < order.size(); ++k) {
                cum += prob[size_t(order[k])];
                if (cum >= double(p_.top_p)) {
                    keep = k + 1;
                    break;
                }
            }
            for (size_t k = keep; k < order.size(); ++k) prob[size_t(order[k])] = 0;
        }
        // 7. renormalise and draw
        double total = std::accumulate(prob.begin(), prob.end(), 0.0);
        if (!(total > 0)) {
            pick = argmax(logits);
        } else {
            double r = next_uniform() * total;
            double cum = 0;
            pick = -1;
            int32_t last = -1;
            for (size_t i = 0; i < n; ++i) {
                if (prob[i] <= 0) continue;
                last = int32_t(i);
                cum += prob[i];
                if (r < cum) {
                    pick = int32_t(i);
                    break;
                }
            }
            if (pick < 0) pick = last;  // rounding at the top end
        }
    }
    history_.push_back(pick);
    seen_.insert(pick);
    return pick;
}

}  // namespace cmf::text
