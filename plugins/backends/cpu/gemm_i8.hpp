// The int8 prefill GEMM of the CPU backend: weights a codec hands over as
// int8 codes with an f32 scale per 32-column block (cmf_codec_vt.int8_rows)
// times activations quantized to int8 blocks of 32 with an f32 scale per
// (token, block). Each block's dot product is an exact int32 sum; it is
// converted to f32 and accumulated with scale_w(row, block) * scale_x(token,
// block), in block order, by an FMA:
//     acc = fma(float(isum_b), sw_b * sx_b, acc)   for b = 0, 1, ...
// Both ISAs evaluate exactly this sequence, so their results are identical.
//
// Why integers: the f32 GEMM needs 4 FMAs (2 FMA pipes) per 32
// multiply-adds; the AVX2 int8 step needs one vpmaddubsw + one vpmaddwd
// (the two vector multiply pipes) plus a vpsignb and a vpaddd (any pipe),
// and the operands are a quarter the size, so the weight group stays in L1.
#pragma once

#include <cstdint>

namespace cmf::cpu::i8 {

constexpr uint64_t kBlock = 32;   // columns per scale block (CMF_INT8_BLOCK)
constexpr uint64_t kSteps = 8;    // 4-column steps per block
constexpr uint64_t kRows = 8;     // weight rows per packed group (one ymm holds 8 rows x 4 codes)
constexpr uint64_t kTokens = 4;   // tokens per packed activation tile

inline uint64_t blocks(uint64_t cols) { return (cols + kBlock - 1) / kBlock; }
inline uint64_t x_tiles(uint64_t n_batch) { return (n_batch + kTokens - 1) / kTokens; }
inline uint64_t w_groups(uint64_t n_rows) { return (n_rows + kRows - 1) / kRows; }

// Packed activations, tile-major (tokens past n_batch and columns past cols
// are zero codes with scale 0):
//   xq (int8; read as one 32-bit word per (step, token)):
//     xq[(((tile * nb + b) * kSteps + s) * kTokens + j) * 4 + k] = q(token tile*kTokens+j, column b*32 + 4s + k)
//   xd[(tile * nb + b) * kTokens + j] = scale of that token's block b.
// Quantization exactly as the codecs' decode kernels (quantize_x): per
// block d = amax/127, q = clamp(rne(x * (1/d)), -127, 127); a block holding
// an inf or NaN gets d = NaN and zero codes, so its outputs are NaN.
inline uint64_t packed_xq_bytes(uint64_t n_batch, uint64_t cols) { return x_tiles(n_batch) * kTokens * blocks(cols) * kBlock; }
inline uint64_t packed_xd_floats(uint64_t n_batch, uint64_t cols) { return x_tiles(n_batch) * kTokens * blocks(cols); }

// Packed weights, group-major (rows past n_rows are zero codes, scale 0);
// each 4-column step of a block is 64 bytes, |codes| then codes:
//   wp[((g * nb + b) * kSteps + s) * 64 + i * 4 + k]      = |c(g*kRows+i, b*32+4s+k)|  (as uint8: |-128| = 128)
//   wp[((g * nb + b) * kSteps + s) * 64 + 32 + i * 4 + k] =  c(g*kRows+i, b*32+4s+k)
//   wd[(g * nb + b) * kRows + i] = scale of row g*kRows+i, block b.
inline uint64_t packed_w_bytes(uint64_t n_rows, uint64_t cols) { return w_groups(n_rows) * blocks(cols) * kSteps * 64; }
inline uint64_t packed_wd_floats(uint64_t n_rows, uint64_t cols) { return w_groups(n_rows) * blocks(cols) * kRows; }

// Quantize tokens of tiles [tile0, tile1) of x (n_batch tokens of cols
// floats, stride ldx) into xq/xd (whole packed buffers, layout above).
using QuantizeXFn = void (*)(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t tile0,
                             uint64_t tile1, int8_t *xq, float *xd);
// Pack n_rows rows given as int8_rows hands them over (codes row stride
// blocks(cols)*32, scales row stride blocks(cols)) into wp/wd.
using PackWFn = void (*)(const int8_t *codes, const float *scales, uint64_t n_rows, uint64_t cols, uint8_t *wp,
                         float *wd);
// y[t*ldy + r] = sum_b fma-accumulated blocks (above) for r < n_rows, t < n_batch.
using GemmFn = void (*)(const uint8_t *wp, const float *wd, uint64_t n_rows, uint64_t cols, const int8_t *xq,
                        const float *xd, uint64_t n_batch, float *y, uint64_t ldy);

struct Kernels {
    const char *isa;  // "avx2" or "portable"
    QuantizeXFn quantize_x;
    PackWFn pack_w;
    GemmFn gemm;
};

// The best set this CPU runs (portable when native kernels are off).
const Kernels &kernels();
// A specific set for tests ("portable", "avx2"); nullptr when unavailable.
const Kernels *kernels_for(const char *isa);

}  // namespace cmf::cpu::i8
