// Kernels of the CPU backend, with a portable version and AVX2/AVX-512
// versions chosen once at run time from the CPU's features.
//
// Two matmul shapes matter for transformers:
//  - decode (few tokens): y = W x is memory-bound; the *_rows kernels stream
//    each weight row once, converting f16/bf16 in registers (F16C / shifts);
//  - prefill (many tokens): compute-bound; the caller converts a panel of
//    weight rows to f32 once (convert_*), then gemm_panel packs it k-major
//    and runs a 16-row x 6-token outer-product kernel over all tokens with
//    the packed panel in L2.
#pragma once

#include <cstdint>

namespace cmf::cpu {

// y[b*ldy + r] = dot(W[r, :cols], x[b*ldx, :cols]) for r in [r0, r1), b < n_batch.
using MatmulF32Fn = void (*)(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch,
                             uint64_t r0, uint64_t r1, float *y, uint64_t ldy);
// The same over 16-bit weights (f16 or bf16 bits, row stride `cols`).
using MatmulH16Fn = void (*)(const uint16_t *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch,
                             uint64_t r0, uint64_t r1, float *y, uint64_t ldy);
// Widen n 16-bit values to f32.
using ConvertH16Fn = void (*)(const uint16_t *src, uint64_t n, float *dst);
// y[b*ldy + r] = dot(panel[r], x[b]) for r < n_rows (panel rows contiguous,
// stride cols), b < n_batch. Tiled for reuse: the caller keeps n_rows small
// enough for the panel to stay in L2 (see cpu_backend.cpp).
using GemmPanelFn = void (*)(const float *panel, uint64_t n_rows, uint64_t cols, const float *x, uint64_t ldx,
                             uint64_t n_batch, float *y, uint64_t ldy);
using DotFn = float (*)(const float *a, const float *b, uint64_t n);
// y[i] += a * x[i]
using AxpyFn = void (*)(float a, const float *x, float *y, uint64_t n);

struct Kernels {
    const char *isa;  // "avx512", "avx2" or "portable"
    MatmulF32Fn matmul_f32;
    MatmulH16Fn matmul_f16;
    MatmulH16Fn matmul_bf16;
    ConvertH16Fn convert_f16;
    ConvertH16Fn convert_bf16;
    GemmPanelFn gemm_panel;
    DotFn dot;
    AxpyFn axpy;
};

// The best kernels this CPU runs (portable only when native kernels are off).
const Kernels &kernels();
// A specific set, for tests comparing ISAs ("portable", "avx2", "avx512");
// nullptr when this CPU or build lacks it.
const Kernels *kernels_for(const char *isa);

}  // namespace cmf::cpu
