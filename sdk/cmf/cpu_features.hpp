// cmf/cpu_features.hpp — which x86 SIMD level the running CPU has, and how
// far ahead its decode kernels prefetch, for plugins that pick kernels at
// run time. Header-only.
//
// F16C is read from CPUID.1:ECX directly: clang 14's __builtin_cpu_supports
// does not know "f16c" (GCC does), and the fuzz build is clang.
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <cstring>

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

// AVX-512 F + VL + BW + VNNI (with AVX2 + FMA + F16C): what the avx512vnni
// kernel sets (the codecs' and the CPU backend's int8 GEMM) assume.
inline bool cpu_has_avx512_vnni() {
#if defined(__x86_64__)
    static const bool yes = cpu_has_avx2_fma_f16c() && __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vnni");
    return yes;
#else
    return false;
#endif
}

// AVX-512 VBMI (byte permutes across a whole register, vpermb/vpermt2b),
// on top of cpu_has_avx512_vnni: the codecs' q1t rows look their base-3
// digits up in 128-entry byte tables with it (Ice Lake and later, Zen 4 and
// later; Cascade Lake has VNNI without it).
inline bool cpu_has_avx512_vbmi() {
#if defined(__x86_64__)
    static const bool yes = cpu_has_avx512_vnni() && __builtin_cpu_supports("avx512vbmi");
    return yes;
#else
    return false;
#endif
}

// AVX-512 BITALG (vpshufbitqmb: 64 bits picked from qwords by byte
// indices into a mask), on top of cpu_has_avx512_vnni: the codecs' q1 rows
// turn 16 groups' bits into vpdpbusd masks with it (Ice Lake and later,
// Zen 4 and later).
inline bool cpu_has_avx512_bitalg() {
#if defined(__x86_64__)
    static const bool yes = cpu_has_avx512_vnni() && __builtin_cpu_supports("avx512bitalg");
    return yes;
#else
    return false;
#endif
}

// GFNI (vgf2p8affineqb: a bit matrix applied to every byte), on top of
// cpu_has_avx512_vnni: the codecs' q1 and q1t decode copies take each
// pass's bytes from a step's lane bytes with it (Ice Lake and later, Zen 4
// and later; Cascade Lake has VNNI without it). Read from CPUID.(7,0):ECX
// bit 8 directly, as F16C is above.
inline bool cpu_has_gfni() {
#if defined(__x86_64__)
    static const bool yes = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        return cpu_has_avx512_vnni() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 8)) != 0;
    }();
    return yes;
#else
    return false;
#endif
}

// AVX-512 F + BF16 (with AVX2 + FMA + F16C): the CPU backend's bf16 GEMM
// (vdpbf16ps, two bf16 products per f32 lane).
inline bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
    static const bool yes =
        cpu_has_avx2_fma_f16c() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    return yes;
#else
    return false;
#endif
}

// The SIMD level an environment variable caps a plugin's kernel choice at
// (CMF_CODECS_ISA, CMF_CPU_ISA): "portable" 0, "avx2" 1, "avx512vnni" 2
// (AVX-512 VNNI kernels, not their VBMI and BITALG forms), unset or
// anything else 3 (no cap). Read when called; callers keep the answer.
inline int isa_cap_from_env(const char *name) {
    const char *env = std::getenv(name);
    if (env != nullptr && std::strcmp(env, "portable") == 0) return 0;
    if (env != nullptr && std::strcmp(env, "avx2") == 0) return 1;
    if (env != nullptr && std::strcmp(env, "avx512vnni") == 0) return 2;
    return 3;
}

// Decode kernels stream weights from memory and software-prefetch each
// stream this many bytes ahead of the loads. The best distance depends on
// the memory system more than on the kernel, so it is chosen per CPU
// vendor. Measured with cmfhost bench (tg64, the 0.6B-shaped files, 2
// threads; docs/performance.md, history, 2026-12-01 04:40 and
// 2026-11-30 18:54):
//  - AMD (EPYC Zen 3 VM): 1 KiB for the light streams (f16/bf16/f32 rows,
//    q8 codes, the low-bit formats' rows); 512 B and 2 KiB were slower. q4
//    3 KiB (1 KiB: -5-15 %).
//  - Intel (Xeon with AVX-512 VM): 1 KiB left a quarter of the bandwidth
//    unused; two alternating rounds, 1 KiB -> 4 and 8 KiB: f16 14.7-15.4
//    -> 18.0-19.5 tok/s, q8 26.6-28.0 -> 32.3-34.1.
//    q4 3 KiB, as on AMD (2-6 KiB: the same or slower).
//  - AMD with AVX-512 (EPYC Zen 5 VM): the q4 streams (and q2tp's rows)
//    are prefetched non-temporally (NTA hint, prefetch_weights_nta), 6 KiB
//    ahead. With the T0 hint the q4 row kernels streamed 9.5-11 GB/s on
//    one core whatever the distance (1-24 KiB), under a third of the
//    core's read pass; into L2 (T1), tg128 on the 0.6B q4 file went 59-60
//    -> 77-78 tok/s (history, 2026-12-03). NTA streams as fast as T1 in
//    the matmul benchmark, and the model runs faster around it: a layer's
//    activations and KV cache are no longer pushed out of L2 and L3 by
//    weights read once (tg128 alternating, five pairs: q4 +2-10 %, median
//    +9 %, its attention loop 9.3 -> 7.6 us and matmul loops 64 -> 58 us
//    a call; q4tp and q4_tiled +1-11 %, q2tp four pairs +3-12 %; q8, f16
//    even: they keep T0. History, 2026-12-04).
//    The light streams 8 KiB ahead, as on Intel: in a phase of the VM
//    reading ~70 GB/s, 1 -> 8 KiB, tg64 alternating, six pairs each: bf16
//    39-50 -> 48-60 tok/s, f16 44-50 -> 55-60; three pairs: q2tp (its q2
//    rows) 81-86 -> 108-109, vbit_ro 101-103 -> 108-111, q1t +0-3 %, q8
//    even (its 16-row tiles prefetch their next tile); reading ~50 GB/s
//    f16/bf16 were even (~94 % of the read either way). History,
//    2026-12-03 16:27-17:40.
// CMF_PREFETCH_AHEAD=BYTES (64..65536) overrides every distance, for A/B
// runs on a new machine.
enum class PrefetchStream {
    light,  // little arithmetic per byte: f16/bf16/f32 rows, q8 codes
    q4,     // q4 nibbles: about twice the arithmetic per byte
};

inline bool cpu_is_amd() {
#if defined(__x86_64__)
    static const bool yes = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
        char vendor[13];
        std::memcpy(vendor, &b, 4);
        std::memcpy(vendor + 4, &d, 4);
        std::memcpy(vendor + 8, &c, 4);
        vendor[12] = '\0';
        return std::strcmp(vendor, "AuthenticAMD") == 0 || std::strcmp(vendor, "HygonGenuine") == 0;
    }();
    return yes;
#else
    return false;
#endif
}

// An AMD CPU with AVX-512: Zen 4 and later (the Zen 5 VM above).
inline bool cpu_is_amd_avx512() {
#if defined(__x86_64__)
    static const bool yes = cpu_is_amd() && __builtin_cpu_supports("avx512f");
    return yes;
#else
    return false;
#endif
}

// Whether the q4 streams and q2tp's rows are prefetched non-temporally
// (NTA) rather than into L1 (T0): AMD CPUs with AVX-512 (Zen 4 and later;
// measured on Zen 5, above). Zen 3 and the Intel VM were tuned with L1
// prefetches and stay so. CMF_PREFETCH_NTA=0 or =1 overrides (A/B runs).
inline bool prefetch_weights_nta() {
    static const bool yes = [] {
        const char *env = std::getenv("CMF_PREFETCH_NTA");
        if (env != nullptr && (std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0)) return env[0] == '1';
        return cpu_is_amd_avx512();
    }();
    return yes;
}

inline long prefetch_ahead_bytes(PrefetchStream stream) {
    static const long forced = [] {
        const char *env = std::getenv("CMF_PREFETCH_AHEAD");
        long v = env != nullptr ? std::atol(env) : 0;
        return v >= 64 && v <= 65536 ? v : 0;
    }();
    if (forced != 0) return forced;
    if (stream == PrefetchStream::q4) return prefetch_weights_nta() ? 6144 : 3072;
    return cpu_is_amd() && !cpu_is_amd_avx512() ? 1024 : 8192;
}

}  // namespace cmf
