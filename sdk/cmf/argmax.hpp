// argmax over a row of floats, fast enough to run on every decoded token.
#pragma once

#include <cmath>
#include <cstddef>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace cmf {

// The index of the largest value, the lowest one among equal maxima
// (torch.argmax's choice); a NaN never wins over a number; all NaN: 0.
// std::max_element's compare-and-branch loop, which GCC does not vectorize,
// took 274 us over a 151936-entry vocabulary on the 2-core Xeon VM (~1.6 %
// of a q4 decode step of the 0.6B shape); two SSE passes (the maximum, then
// the first index holding it) take ~25 us. SSE2 is in every x86-64, so no
// run-time dispatch; other CPUs take the scalar loops.
inline size_t argmax(const float *v, size_t n) {
    size_t i = 0;
    float m = -INFINITY;
#if defined(__SSE2__)
    // _mm_max_ps(x, acc) returns acc when x is NaN: NaNs drop out.
    __m128 a0 = _mm_set1_ps(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm_max_ps(_mm_loadu_ps(v + i), a0);
        a1 = _mm_max_ps(_mm_loadu_ps(v + i + 4), a1);
        a2 = _mm_max_ps(_mm_loadu_ps(v + i + 8), a2);
        a3 = _mm_max_ps(_mm_loadu_ps(v + i + 12), a3);
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(a0, a1), _mm_max_ps(a2, a3)));
    for (float x : lanes) m = x > m ? x : m;
#endif
    for (; i < n; ++i) m = v[i] > m ? v[i] : m;
    size_t b = 0;
#if defined(__SSE2__)
    const __m128 target = _mm_set1_ps(m);
    for (; b + 16 <= n; b += 16) {
        const __m128 e = _mm_or_ps(_mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(v + b), target),
                                             _mm_cmpeq_ps(_mm_loadu_ps(v + b + 4), target)),
                                   _mm_or_ps(_mm_cmpeq_ps(_mm_loadu_ps(v + b + 8), target),
                                             _mm_cmpeq_ps(_mm_loadu_ps(v + b + 12), target)));
        if (_mm_movemask_ps(e) != 0) break;
    }
#endif
    for (; b < n; ++b)
        if (v[b] == m) return b;
    return 0;
}

}  // namespace cmf
