// Sampler: the original implementation's chain (docs/text.md) on small
// hand-computed logits.
#include <doctest/doctest.h>

#include "text/sampler.hpp"

#include <cmf/cmf.h>

#include <cmath>
#include <limits>
#include <algorithm>
#include <map>
#include <random>
#include <vector>

using cmf::text::Sampler;
using cmf::text::SamplerParams;

namespace {
SamplerParams off() {  // every filter off, temperature 1
    SamplerParams p;
    p.temperature = 1;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.repetition_penalty = 1;
    return p;
}
}  // namespace

TEST_CASE("sampler: greedy takes the lowest index among equal maxima") {
    SamplerParams p = off();
    p.temperature = 0;
    Sampler s(p);
    std::vector<float> l{1, 3, 3, 2};
    CHECK(s.sample(l) == 1);
}

TEST_CASE("sampler: repetition penalty divides positive and multiplies negative logits") {
    SamplerParams p = off();
    p.temperature = 0;
    p.repetition_penalty = 2;
    Sampler s(p);
    std::vector<int32_t> hist{0};
    s.accept(hist);
    // 3.0 / 2 = 1.5 < 2.0: id 1 wins
    std::vector<float> l{3, 2, -1};
    CHECK(s.sample(l) == 1);
    // now 0 and 1 are both seen: -1 * 2 = -2 for a seen negative
    Sampler t(p);
    std::vector<int32_t> h2{2};
    t.accept(h2);
    std::vector<float> l2{-1.5f, -1.9f, -1};
    CHECK(t.sample(l2) == 0);  // -1 -> -2 falls below -1.5
}

TEST_CASE("sampler: SplitMix64 draws, same seed same sequence") {
    SamplerParams p = off();
    p.seed = 42;
    Sampler a(p), b(p);
    // SplitMix64(42) first output 0xbdd732262feb6e95 -> top 24 bits / 2^24
    CHECK(a.next_uniform() == doctest::Approx(double(0xbdd732262feb6e95ull >> 40) / 16777216.0));
    b.next_uniform();
    std::vector<float> l{0.5f, 1.0f, 0.2f, 0.9f, 0.1f};
    for (int i = 0; i < 20; ++i) CHECK(a.sample(l) == b.sample(l));
}

TEST_CASE("sampler: top-k 1 and min-p near 1 are greedy; top-p keeps the shortest prefix") {
    std::vector<float> l{0.1f, 2.0f, 1.0f, 0.5f};
    SamplerParams k1 = off();
    k1.top_k = 1;
    k1.seed = 7;
    Sampler a(k1);
    for (int i = 0; i < 10; ++i) CHECK(a.sample(l) == 1);
    SamplerParams mp = off();
    mp.min_p = 0.99f;
    Sampler b(mp);
    for (int i = 0; i < 10; ++i) CHECK(b.sample(l) == 1);
    // probabilities of {ln 5, ln 3, ln 2} = {0.5, 0.3, 0.2}: top_p 0.75 keeps {0, 1} (0.5 < 0.75 <= 0.8)
    std::vector<float> l3{std::log(5.0f), std::log(3.0f), std::log(2.0f)};
    SamplerParams tp = off();
    tp.top_p = 0.75f;
    tp.seed = 3;
    Sampler c(tp);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 2000; ++i) seen[c.sample(l3)]++;
    CHECK(seen.count(2) == 0);
    CHECK(seen[0] > 1000);  // 0.5 / 0.8 = 62.5 %
    CHECK(seen[0] < 1500);
}

TEST_CASE("sampler: suppressed ids are never drawn; stop ids; the C API") {
    SamplerParams p = off();
    Sampler s(p);
    std::vector<int32_t> sup{1};
    s.suppress(sup);
    std::vector<float> l{0, 10, 0};
    for (int i = 0; i < 50; ++i) CHECK(s.sample(l) != 1);
    std::vector<int32_t> stops{2, 7};
    s.set_stop_ids(stops);
    CHECK(s.is_stop(7));
    CHECK_FALSE(s.is_stop(1));

    cmf_sampler_params cp;
    cmf_sampler_params_init(&cp);
    CHECK(cp.temperature == doctest::Approx(0.7));
    CHECK(cp.top_k == 40);
    cp.temperature = 0;
    cp.repetition_penalty = 1;
    cmf_sampler *cs = nullptr;
    REQUIRE(cmf_sampler_create(&cp, &cs) == nullptr);
    int32_t id = -1;
    float logits[3] = {0.f, 1.f, 5.f};
    REQUIRE(cmf_sampler_sample(cs, logits, 3, &id) == nullptr);
    CHECK(id == 2);
    int32_t eos = 2;
    REQUIRE(cmf_sampler_set_stop_ids(cs, &eos, 1) == nullptr);
    CHECK(cmf_sampler_is_stop(cs, id) == 1);
    cmf_sampler_free(cs);
    cp.temperature = -1;
    cmf_error *e = cmf_sampler_create(&cp, &cs);
    CHECK(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    cmf_error_free(e);
}

TEST_CASE("sampler: the inverse-CDF draw walks the survivors in id order (upstream categorical_sample)") {
    // Probabilities 0.2 / 0.5 / 0.3 at ids 0 / 1 / 2 (temperature 1, no
    // filters): with r from the same SplitMix64 stream, id order picks
    // 0 for r < 0.2, 1 for r < 0.7, else 2. A descending-probability walk
    // would pick 1 for r < 0.5, which differs for r in [0, 0.2) and [0.5, 0.7).
    std::vector<float> l{std::log(0.2f), std::log(0.5f), std::log(0.3f)};
    int differs = 0;
    for (uint64_t seed = 0; seed < 64; ++seed) {
        SamplerParams p = off();
        p.temperature = 1.0f;
        p.seed = seed;
        Sampler s(p), twin(p);
        const double r = twin.next_uniform();
        const int32_t want = r < 0.2 ? 0 : r < 0.7 ? 1 : 2;
        CAPTURE(seed);
        CHECK(s.sample(l) == want);
        differs += (r < 0.2) || (r >= 0.5 && r < 0.7);
    }
    CHECK(differs > 5);  // the seeds exercise the cases where the two orders disagree
}

TEST_CASE("sampler: argmax takes the lowest index on ties and never a NaN") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(cmf::text::argmax(std::vector<float>{1, 3, 3, -1}) == 1);
    CHECK(cmf::text::argmax(std::vector<float>{nan, 2, 5, 5}) == 2);
}

TEST_CASE("sampler: the SSE argmax equals a plain scan on every length and mix of NaN, +-inf, +-0 and ties") {
    // The plain scan argmax() replaced: lowest index of the maximum, NaN never over a number.
    auto scan = [](const std::vector<float> &v) {
        size_t best = 0;
        for (size_t i = 1; i < v.size(); ++i)
            if (v[i] > v[best] || (std::isnan(v[best]) && !std::isnan(v[i]))) best = i;
        return int32_t(best);
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> pick(0, 9);
    int bad = 0;
    for (int t = 0; t < 20000; ++t) {
        // Lengths across the 16-float blocks of both passes and their tails.
        std::vector<float> v(size_t(1 + t % 150));
        for (float &x : v) {
            const int k = pick(rng);
            x = k == 0 ? nan : k == 1 ? -inf : k == 2 ? inf : k == 3 ? -0.0f : k == 4 ? 0.0f : float(pick(rng) - 5);
        }
        if (t % 7 == 0) std::fill(v.begin(), v.end(), nan);
        if (t % 11 == 0) std::fill(v.begin(), v.end(), -inf);
        bad += cmf::text::argmax(v) != scan(v);
    }
    CHECK(bad == 0);
    // A vocabulary-sized row with its maximum in the first block, mid-way, in the tail.
    std::vector<float> big(151939);
    std::normal_distribution<float> normal;
    for (float &x : big) x = normal(rng);
    for (size_t at : {size_t(0), size_t(15), size_t(16), size_t(77777), big.size() - 3, big.size() - 1}) {
        std::vector<float> v = big;
        v[at] = 100.0f;
        CHECK(cmf::text::argmax(v) == int32_t(at));
        v[at / 2] = 100.0f;  // a tie earlier wins
        CHECK(cmf::text::argmax(v) == int32_t(at / 2));
    }
}
