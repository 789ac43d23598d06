// Seeded standard-normal test data, shared by the unit tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

inline std::vector<float> random_vec(size_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v) x = d(gen);
    return v;
}
