// The bf16 prefill GEMM of the CPU backend, for weights stored as bf16 on
// CPUs with AVX-512 BF16: vdpbf16ps multiplies 16 rows x one pair of bf16
// weights by a token's pair of bf16 activations and adds both products
// into 16 f32 lanes, 32 multiply-adds per instruction against the f32
// GEMM's 16 (the weights widened to f32 first). The weights go in as
// stored; the activations are rounded to bf16 (nearest even), as llama.cpp
// does for its BF16 matmuls. That rounding (relative 2^-9 per element) is
// what this path adds to the f32 GEMM's result; the instruction also reads
// bf16 subnormals as 0 and flushes subnormal sums to 0. Results therefore
// differ from the f32 GEMM over the same weights (within the runtime's
// parity tolerances; docs/runtime.md); CMF_CPU_BF16_GEMM=0 in the
// environment, or an ISA cap below AVX-512 (CMF_CPU_ISA), keeps the f32 GEMM.
#pragma once

#include <cstdint>

namespace cmf::cpu::bf16 {

constexpr uint64_t kRows = 16;    // weight rows per packed panel (one zmm: 16 rows x a bf16 pair)
constexpr uint64_t kTokens = 6;   // tokens per packed activation block

inline uint64_t pairs(uint64_t cols) { return (cols + 1) / 2; }
inline uint64_t x_blocks(uint64_t n_batch) { return (n_batch + kTokens - 1) / kTokens; }
inline uint64_t packed_x_words(uint64_t n_batch, uint64_t cols) { return x_blocks(n_batch) * kTokens * pairs(cols); }
inline uint64_t packed_w_words(uint64_t n_rows, uint64_t cols) {
    return (n_rows + 2 * kRows - 1) / (2 * kRows) * 2 * kRows * pairs(cols);
}

// Packed activations, block-major, one 32-bit word per (column pair, token):
//   xp[(b * pairs + j) * kTokens + t] = bf16(x[tok][2j]) | bf16(x[tok][2j+1]) << 16,  tok = b*kTokens + t,
// rounded to nearest even as codecs::f32_to_bf16 does (a NaN stays a NaN;
// the converter's rounding); columns past cols and tokens
// past n_batch are 0. Packs blocks [b0, b1).
void pack_x(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t b0, uint64_t b1, uint32_t *xp);
// Packed weights, panel-major, one word per (row, column pair):
//   wp[(p * pairs + j) * kRows + i] = w[p*kRows + i][2j] | w[p*kRows + i][2j+1] << 16
// (bf16 bits as stored). pack_w writes n rows (row stride ldw elements) at
// packed rows [row0, row0 + n) and leaves the others as they are; the
// caller zeroes rows it does not fill.
void pack_w(const uint16_t *w, uint64_t ldw, uint64_t n, uint64_t cols, uint64_t row0, uint32_t *wp);
// y[t*ldy + r] = sum over columns of w[r][k] * x[t][k] for r < n_rows (at
// most 2 * kRows: the two panels of wp), t < n_batch, from packed operands.
using GemmFn = void (*)(const uint32_t *wp, uint64_t n_rows, uint64_t cols, const uint32_t *xp, uint64_t n_batch,
                        float *y, uint64_t ldy);
// The AVX-512 BF16 kernel, or nullptr where the CPU, the build or the
// environment (CMF_CPU_BF16_GEMM=0, CMF_CPU_ISA below avx512) rules it out;
// on CPUs other than AMD's only with CMF_CPU_BF16_GEMM=1 (there the f32
// GEMM over widened panels was faster: gemm_bf16.cpp).
GemmFn gemm();
// The kernel whatever the environment says (tests); nullptr without the CPU
// feature or native kernels.
GemmFn gemm_native();

}  // namespace cmf::cpu::bf16
