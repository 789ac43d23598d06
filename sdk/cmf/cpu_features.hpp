// cmf/cpu_features.hpp — which x86 SIMD level the running CPU has, for
// plugins that pick kernels at run time. Header-only.
//
// F16C is read from CPUID.1:ECX directly: clang 14's __builtin_cpu_supports
// does not know "f16c" (GCC does), and the fuzz build is clang.
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace cmf {

// AVX2 + FMA + F16C: what every *_avx2 kernel of this project assumes.
inline bool cpu_has_avx2_fma_f16c() {
#if defined(__x86_64__)
    static const bool yes = [] {
        __builtin_cpu_init();
        unsigned a = 0, b = 0, c = 0, d = 0;
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
               (c & bit_F16C) != 0;
    }();
    return yes;
#else
    return false;
#endif
}

}  // namespace cmf
