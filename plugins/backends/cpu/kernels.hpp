// Kernels of the CPU backend, with a portable version and AVX2/AVX-512
// versions chosen once at run time from the CPU's features.
//
// Two matmul shapes matter for transformers:
//  - decode (few tokens): y = W x is memory-bound; the *_rows kernels stream
//    each weight row once, converting f16/bf16 in registers (F16C / shifts);
//  - prefill (many tokens): compute-bound; the activations are packed once
//    per matmul (pack_x) and shared by the threads, each 16-row panel of
//    weights is widened to f32 and packed (pack_w), and gemm_packed runs a
//    16-row x 6-token outer-product micro-kernel over every token block with
//    the packed panel in L2.
#pragma once

#include <cstdint>

namespace cmf::cpu {

// Packed operands of the prefill GEMM; the layout is the same for every ISA
// (only the arithmetic differs), so a packing of one ISA feeds another.
//  - weights: panels of kGemmRows rows, each k-major:
//      wp[(p * cols + k) * kGemmRows + i] = W[p*kGemmRows + i][k]
//    (rows past n_rows are zero);
//  - activations: blocks of kGemmTokens tokens, each k-major:
//      xp[(b * cols + k) * kGemmTokens + t] = x[(b*kGemmTokens + t) * ldx + k]
//    (tokens past n_batch are zero).
constexpr uint64_t kGemmRows = 16, kGemmTokens = 6;
inline uint64_t gemm_x_blocks(uint64_t n_batch) { return (n_batch + kGemmTokens - 1) / kGemmTokens; }
inline uint64_t packed_w_floats(uint64_t n_rows, uint64_t cols) {
    return (n_rows + kGemmRows - 1) / kGemmRows * kGemmRows * cols;
}
inline uint64_t packed_x_floats(uint64_t n_batch, uint64_t cols) { return gemm_x_blocks(n_batch) * kGemmTokens * cols; }

// y[b*ldy + r] = dot(W[r, :cols], x[b*ldx, :cols]) for r in [r0, r1), b < n_batch.
using MatmulF32Fn = void (*)(const float *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch,
                             uint64_t r0, uint64_t r1, float *y, uint64_t ldy);
// The same over 16-bit weights (f16 or bf16 bits, row stride `cols`).
using MatmulH16Fn = void (*)(const uint16_t *w, uint64_t cols, const float *x, uint64_t ldx, uint64_t n_batch,
                             uint64_t r0, uint64_t r1, float *y, uint64_t ldy);
// Widen n 16-bit values to f32.
using ConvertH16Fn = void (*)(const uint16_t *src, uint64_t n, float *dst);
// y[b*ldy + r] = dot(panel[r], x[b]) for r < n_rows (panel rows contiguous,
// stride cols), b < n_batch: pack_w + pack_x + gemm_packed in one call, for
// callers that use each operand once (attention's blocks).
using GemmPanelFn = void (*)(const float *panel, uint64_t n_rows, uint64_t cols, const float *x, uint64_t ldx,
                             uint64_t n_batch, float *y, uint64_t ldy);
// Pack rows [0, n_rows) of w (row stride ldw) into wp / token blocks
// [b0, b1) of x (stride ldx, n_batch tokens in all) into xp; layouts above.
using PackWFn = void (*)(const float *w, uint64_t ldw, uint64_t n_rows, uint64_t cols, float *wp);
using PackXFn = void (*)(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t b0, uint64_t b1,
                         float *xp);
// y[b*ldy + r] = dot(W[r], x[b]) for r < n_rows, b < n_batch, from packed
// operands (wp from pack_w of n_rows rows, xp from pack_x of n_batch tokens).
using GemmPackedFn = void (*)(const float *wp, uint64_t n_rows, uint64_t cols, const float *xp, uint64_t n_batch,
                              float *y, uint64_t ldy);
// x[i] = exp(x[i] - sub) (0 where x[i] is -inf), returns the sum: the
// softmax numerator. The AVX2 version evaluates exp as a polynomial
// (Cephes' expf, ~1 ulp); std::exp per element cost ~5 % of a prefill.
using ExpSumFn = float (*)(float *x, uint64_t n, float sub);
// out[i] = g[i] / (1 + exp(-g[i])) * u[i] (SiLU-gated product).
using SiluMulFn = void (*)(const float *g, const float *u, uint64_t n, float *out);
// out[i] = x[i] / (1 + exp(-x[i])) (SiLU; out may equal x).
using SiluFn = void (*)(const float *x, uint64_t n, float *out);
// x[i] *= scale for i < n, then the largest x[i] (-inf when n == 0; a NaN
// may or may not win): decode attention's scores, scaled, and their max.
using ScaleMaxFn = float (*)(float *x, uint64_t n, float scale);
using DotFn = float (*)(const float *a, const float *b, uint64_t n);
// y[i] += a * x[i]
using AxpyFn = void (*)(float a, const float *x, float *y, uint64_t n);

// The KV cache in f16 (cmf_backend_vt.kv_write / attention_kv): dot(a, h)
// and y += a * h over f16 bits, and f32 -> f16 rounded to nearest even
// (subnormals too; overflow -> inf, NaN stays NaN).
using DotF16Fn = float (*)(const float *a, const uint16_t *h, uint64_t n);
using AxpyF16Fn = void (*)(float a, const uint16_t *h, float *y, uint64_t n);
using NarrowF16Fn = void (*)(const float *src, uint64_t n, uint16_t *dst);
// The KV cache in q8 blocks (CMF_KV_DTYPE_Q8_32, cmf_plugin.h: per 32
// elements an f16 scale and 32 int8 codes, 34 bytes): n_blocks blocks from
// f32 (the layout's rounding; the same function in every set, so a cache
// holds the same bytes whichever ISA wrote it), and back to f32 (d * q, one
// multiply per element: every set gives the same bits).
using QuantQ8Fn = void (*)(const float *src, uint64_t n_blocks, uint8_t *dst);
using DequantQ8Fn = void (*)(const uint8_t *src, uint64_t n_blocks, float *dst);
// heads_dot / heads_axpy over q8 rows whose heads are whole blocks
// (hd % 32 == 0): row j at rows + j * ld_bytes, KV head k's blocks at
// k * (hd / 32) * 34 bytes into it. Per block the codes are widened once
// for every query head of the group: dot = sum over blocks of d * (q . c),
// axpy adds (a * d) * c per key in key order. Rounds differently from
// widening to f32 first (the scale is applied per block, not per element).
using HeadsDotQ8Fn = void (*)(const float *q, const uint8_t *rows, uint64_t ld_bytes, uint64_t n_keys,
                              uint32_t n_heads, uint32_t group, uint32_t head_dim, float *out, uint64_t ldo);
using HeadsAxpyQ8Fn = void (*)(const float *a, uint64_t lda, const uint8_t *rows, uint64_t ld_bytes,
                               uint64_t n_keys, uint32_t n_heads, uint32_t group, uint32_t head_dim, float *o);

// Decode attention over a run of n_keys KV-cache rows (`ldrow` elements
// apart, each holding every KV head `head_dim` apart), f32 or f16 bits, for
// `n_heads` query heads of which each `group` share a KV head:
//   out[h * ldo + j] = dot(q + h*head_dim, rows + j*ldrow + (h/group)*head_dim)
// for j < n_keys: one call per run instead of one dot per (key, head); and
// heads_axpy, below, over the same run. A key's scores do not depend on the
// run it is in (the same operations whatever n_keys and j).
using HeadsDotFn = void (*)(const float *q, const float *rows, uint64_t ldrow, uint64_t n_keys, uint32_t n_heads,
                            uint32_t group, uint32_t head_dim, float *out, uint64_t ldo);
using HeadsDotF16Fn = void (*)(const float *q, const uint16_t *rows, uint64_t ldrow, uint64_t n_keys,
                               uint32_t n_heads, uint32_t group, uint32_t head_dim, float *out, uint64_t ldo);
// heads_axpy takes a run of n_keys cache rows (ldrow elements apart) at once:
//   o[h*head_dim + d] += sum over j < n_keys of a[h*lda + j] * rows[j*ldrow + (h/group)*head_dim + d],
// the keys added in order, each as one multiply-add per element (as n_keys
// single-row axpys would); the SIMD forms hold a block of o in registers
// across the run instead of loading and storing it per key.
using HeadsAxpyFn = void (*)(const float *a, uint64_t lda, const float *rows, uint64_t ldrow, uint64_t n_keys,
                             uint32_t n_heads, uint32_t group, uint32_t head_dim, float *o);
using HeadsAxpyF16Fn = void (*)(const float *a, uint64_t lda, const uint16_t *rows, uint64_t ldrow, uint64_t n_keys,
                                uint32_t n_heads, uint32_t group, uint32_t head_dim, float *o);

struct Kernels {
    const char *isa;  // "avx512", "avx2" or "portable"
    MatmulF32Fn matmul_f32;
    MatmulH16Fn matmul_f16;
    MatmulH16Fn matmul_bf16;
    ConvertH16Fn convert_f16;
    ConvertH16Fn convert_bf16;
    GemmPanelFn gemm_panel;  // packs both operands (thread-local buffers), then gemm_packed
    PackWFn pack_w;
    PackXFn pack_x;
    GemmPackedFn gemm_packed;
    DotFn dot;
    AxpyFn axpy;
    ExpSumFn exp_sum;
    ScaleMaxFn scale_max;
    SiluMulFn silu_mul;
    DotF16Fn dot_f16;
    AxpyF16Fn axpy_f16;
    NarrowF16Fn narrow_f16;
    HeadsDotFn heads_dot;
    HeadsDotF16Fn heads_dot_f16;
    HeadsAxpyFn heads_axpy;
    HeadsAxpyF16Fn heads_axpy_f16;
    QuantQ8Fn quant_q8_32;
    DequantQ8Fn dequant_q8_32;
    HeadsDotQ8Fn heads_dot_q8;
    HeadsAxpyQ8Fn heads_axpy_q8;
    SiluFn silu;
    SiluMulFn sigmoid_mul;  // out[i] = u[i] / (1 + exp(-g[i])): a sigmoid gate
};

// The best kernels this CPU runs (portable only when native kernels are off).
const Kernels &kernels();
// Whether kernels() (and the int8 GEMM's) may pick this ISA: CMF_CPU_ISA=avx2
// in the environment rules out the AVX-512 sets, =portable every SIMD set
// (A/B runs, and testing the AVX2 paths on an AVX-512 machine).
bool isa_allowed(const char *isa);
// A specific set, for tests comparing ISAs ("portable", "avx2", "avx512");
// nullptr when this CPU or build lacks it.
const Kernels *kernels_for(const char *isa);

}  // namespace cmf::cpu
