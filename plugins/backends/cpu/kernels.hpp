// f32 kernels of the CPU backend, with a portable version and AVX2/AVX-512
// versions chosen once at run time from the CPU's features.
#pragma once

#include <cstdint>

namespace cmf::cpu {

// y[b*ldy + r] = dot(W[r, :cols], x[b*ldx, :cols]) for r in [r0, r1), b < n_batch.
using MatmulF32Fn = void (*)(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch,
                             uint64_t r0, uint64_t r1, float *y, uint64_t ldy);

struct Kernels {
    const char *isa;  // "avx512", "avx2" or "portable"
    MatmulF32Fn matmul_f32;
};

// The best kernels this CPU runs (portable only when native kernels are off).
const Kernels &kernels();
// A specific set, for tests comparing ISAs ("portable", "avx2", "avx512");
// nullptr when this CPU or build lacks it.
const Kernels *kernels_for(const char *isa);

}  // namespace cmf::cpu
