// The int8 prefill GEMM of the CPU backend: weights a codec hands over as
// int8 codes with an f32 scale per 32-column block (cmf_codec_vt.int8_rows)
// times activations quantized to int8 blocks of 32 with an f32 scale per
// (token, block). Each block's dot product is an exact int32 sum; it is
// converted to f32 and accumulated with scale_w(row, block) * scale_x(token,
// block), in block order, by an FMA:
//     acc = fma(float(isum_b), sw_b * sx_b, acc)   for b = 0, 1, ...
// Both ISAs evaluate exactly this sequence, so their results are identical.
//
// The codes are held as int16 in the packed operands: the AVX2 kernel
// multiplies with vpmaddwd (16 multiply-adds into 8 int32 lanes) and adds
// to int32 accumulators; per 32 multiply-adds that is 2 vpmaddwd + 2 vpaddd
// against 4 FMAs of the f32 GEMM. The usual int8 sequence (vpsignb,
// vpmaddubsw, vpmaddwd with ones) measured barely faster than the f32 GEMM
// on this Zen 3: a vpmaddubsw/vpmaddwd mix issues at under half the rate of
// either alone (docs/performance.md, "int8 prefill GEMM"). The int32 sums
// are the same either way (codes are int8; no saturation can occur).
//
// On CPUs with AVX-512 VNNI a third set packs its own denser layout into
// the same buffers (the sizes below cover it): one vpdpbusd multiplies 16
// rows x 4 codes by a token's 4 codes and adds into 16 int32 lanes, 64
// multiply-adds per instruction against 16 per vpmaddwd. vpdpbusd takes one
// operand unsigned, so the weight codes go in biased by +128 and each
// (token, block) carries 128 * (sum of its x codes) to take off the int32
// sum, which is then exactly the same integer; the f32 sequence per block is
// the same too, so all three sets agree bit for bit.
#pragma once

#include <cstdint>

namespace cmf::cpu::i8 {

constexpr uint64_t kBlock = 32;   // columns per scale block (CMF_INT8_BLOCK)
constexpr uint64_t kSteps = 16;   // 2-column steps per block
constexpr uint64_t kRows = 8;     // weight rows per packed group (one ymm holds 8 rows x 2 int16 codes)
constexpr uint64_t kTokens = 4;   // tokens per packed activation tile
constexpr uint64_t kRowsAlloc = 16;  // the widest row group of any set (avx512vnni: 16 rows per zmm)

inline uint64_t blocks(uint64_t cols) { return (cols + kBlock - 1) / kBlock; }
inline uint64_t x_tiles(uint64_t n_batch) { return (n_batch + kTokens - 1) / kTokens; }
inline uint64_t w_groups(uint64_t n_rows) { return (n_rows + kRows - 1) / kRows; }

// Packed activations, tile-major (tokens past n_batch and columns past cols
// are zero codes with scale 0):
//   xq (int16; read as one 32-bit word per (step, token)):
//     xq[(((tile * nb + b) * kSteps + s) * kTokens + j) * 2 + k] = q(token tile*kTokens+j, column b*32 + 2s + k)
//   xd[(tile * nb + b) * kTokens + j] = scale of that token's block b.
// Quantization exactly as the codecs' decode kernels (quantize_x): per
// block d = amax/127, q = clamp(rne(x * (1/d)), -127, 127); a block holding
// an inf or NaN gets d = NaN and zero codes, so its outputs are NaN.
inline uint64_t packed_xq_count(uint64_t n_batch, uint64_t cols) { return x_tiles(n_batch) * kTokens * blocks(cols) * kBlock; }
inline uint64_t packed_xd_floats(uint64_t n_batch, uint64_t cols) { return x_tiles(n_batch) * kTokens * blocks(cols); }

// Packed weights, group-major (rows past n_rows are zero codes, scale 0);
// each 2-column step of a block is 8 rows x 2 int16 codes:
//   wp[((g * nb + b) * kSteps + s) * 16 + i * 2 + k] = c(g*kRows+i, b*32+2s+k)
//   wd[(g * nb + b) * kRows + i] = scale of row g*kRows+i, block b.
// (Sized for kRowsAlloc-row groups, so the avx512vnni set's fit too.)
inline uint64_t alloc_rows(uint64_t n_rows) { return (n_rows + kRowsAlloc - 1) / kRowsAlloc * kRowsAlloc; }
inline uint64_t packed_w_count(uint64_t n_rows, uint64_t cols) { return alloc_rows(n_rows) * blocks(cols) * kBlock; }
inline uint64_t packed_wd_floats(uint64_t n_rows, uint64_t cols) { return alloc_rows(n_rows) * blocks(cols); }

// Quantize tokens of tiles [tile0, tile1) of x (n_batch tokens of cols
// floats, stride ldx) into xq/xd (whole packed buffers, layout above).
using QuantizeXFn = void (*)(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t tile0,
                             uint64_t tile1, int16_t *xq, float *xd);
// Pack n_rows rows given as int8_rows hands them over (codes row stride
// blocks(cols)*32, scales row stride blocks(cols)) into wp/wd.
using PackWFn = void (*)(const int8_t *codes, const float *scales, uint64_t n_rows, uint64_t cols, int16_t *wp,
                         float *wd);
// y[t*ldy + r] = sum_b fma-accumulated blocks (above) for r < n_rows, t < n_batch.
using GemmFn = void (*)(const int16_t *wp, const float *wd, uint64_t n_rows, uint64_t cols, const int16_t *xq,
                        const float *xd, uint64_t n_batch, float *y, uint64_t ldy);

struct Kernels {
    const char *isa;  // "avx512vnni", "avx2" or "portable"
    QuantizeXFn quantize_x;
    PackWFn pack_w;
    GemmFn gemm;
};

// The best set this CPU runs (portable when native kernels are off).
const Kernels &kernels();
// A specific set for tests ("portable", "avx2", "avx512vnni"); nullptr when
// unavailable. The avx512vnni set's packed layout is its own (gemm_i8.cpp);
// quantize_x, pack_w and gemm of one set go together.
const Kernels *kernels_for(const char *isa);

}  // namespace cmf::cpu::i8
