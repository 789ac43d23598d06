// SplitMix64 (Steele, Lea, Flood 2014): the generator of the original's
// sampler and of its initial image noise, so the same seed gives the same
// draws here and there. The state starts at the seed.
#pragma once

#include <cstdint>

namespace cmf {

inline uint64_t splitmix64_next(uint64_t &state) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace cmf
