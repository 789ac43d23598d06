// Dot-product kernels behind Dtype::matmul_rows. Each entry point picks the
// AVX2+FMA+F16C implementation when the CPU has those features (checked once)
// and the portable one otherwise. All are reentrant and allocation-free.
//
// Numerics. The float kernels (dot_f32/f16/bf16) accumulate
// in f32 against f32 activations: they match the reference decode followed by
// an f32 dot product up to summation order. The int8 kernels (*_xq, used by
// q8_row, q8_2f, q4_block, q4_tiled, q4tp, q2tp, q1, q1s, q1t, vbit, vbit_ro) first quantize the
// activations with quantize_x: per block of 32, d = amax/127 and
// q = clamp(rne(x * (1/d)), -127, 127), so each activation moves by at most
// d/2. A block then contributes (weight scale) * d * (exact integer sum of
// weight code * q). Both implementations quantize bit-identically, so they
// agree with each other up to f32 summation order; against the reference
// decode + f32 dot the difference is bounded by
// sum over blocks of (d/2) * sum |decoded weight| (see tests/codecs).
#pragma once

#include <cstdint>

namespace cmf::codecs::kernels {

float dot_f32(const float *a, const float *x, uint64_t n);
float dot_f16(const uint16_t *h, const float *x, uint64_t n);
float dot_bf16(const uint16_t *h, const float *x, uint64_t n);

// ---- int8 activations ---------------------------------------------------------
constexpr uint64_t kXBlock = 32;
inline uint64_t x_blocks(uint64_t n) { return (n + kXBlock - 1) / kXBlock; }

// Byte order of each quantized 32-block, chosen so a weight block unpacks
// with whole-register shifts (position p of the block holds element e):
//   natural:  p = e
//   q4_pairs: p = e/2 + 16*(e%2)   (low nibbles, then high nibbles)
//   q2_quads: p = 8*(e%4) + e/4    (bits 0-1 of the 8 bytes, then 2-3, 4-5, 6-7)
//   q4_pair_blocks: blocks 2k and 2k+1 (A, B) stored together as 64 bytes
//             [A lo | B lo | A hi | B hi], lo/hi being the two 16-byte halves
//             of the block in q4_pairs order (the q4_pairs pair with its middle
//             two 16-byte quarters swapped): one 32-byte load of two q4 groups'
//             nibbles masked gives [A lo codes | B lo codes], shifted a nibble
//             [A hi | B hi], so both groups go through one vpmaddubsw pair with
//             A in the low 128-bit lane and B in the high one. With an odd
//             block count the last block has no partner and stays in q4_pairs
//             order. Element e of block b sits at
//               64*(b/2) + 16*(b%2) + 32*(e%2) + e/2   (b paired: (b|1) < blocks)
//               32*b + 16*(e%2) + e/2                  (b the unpaired last block)
enum class XOrder : int { natural, q4_pairs, q2_quads, q4_pair_blocks };

// x[0..n) -> q[0 .. 32*x_blocks(n)) (tail block zero-padded) and d[0..x_blocks(n)).
// A block holding an inf or NaN gets d = NaN (and q = 0), so the result is NaN
// as an f32 dot would be. q4_pair_blocks is made by a post-pass over the
// q4_pairs bytes (identical on both ISAs); the per-ISA quantize_x
// (portable.hpp) take only the other three orders.
void quantize_x(const float *x, uint64_t n, XOrder order, int8_t *q, float *d);

// The q4 offset term of a q4_pair_blocks x, per pair: offset[8*k + j] =
// -8 * (sum of the eight codes at positions 4j..4j+3 and 32+4j..32+4j+3 of
// pair k), the int32 lane j of a pair's dot (the bytes 4j..4j+3 of both its
// 32-byte halves): j < 4 belongs to block 2k (the 8 elements 8j..8j+7), j >= 4
// to block 2k+1 (elements 8(j-4)..8(j-4)+7). |offset| <= 8*8*127 = 8128.
// Added to the lane sums of unsigned codes it makes them sums of (code - 8).
// Depends on x only, so it is made once per x (QuantizedX) instead of once
// per weight row.
// q: 32*blocks codes in q4_pair_blocks order -> offset[0 .. 8*(blocks/2)).
void q4_pair_offset(const int8_t *q, uint64_t blocks, int32_t *offset);

// The q8 offset term of a natural-order x, per block of 32 codes:
// offset[8*b + j] = -128 * (q[32b+4j] + ... + q[32b+4j+3]), the int32 lane j
// of a block's dot. Added to the lane sums of (w + 128) x q (unsigned weight
// bytes, as vpdpbusd takes them) it makes them sums of w x q, exactly.
// q: 32*blocks codes (a tail block zero-padded) -> offset[0 .. 8*blocks).
void i8_offset(const int8_t *q, uint64_t blocks, int32_t *offset);

// All return the sum over blocks of (weight scale) * d[b] * sum_p w[p]*q[p].
// q8: int8 codes, natural order, n elements (any n); row scale applied by the caller.
float dot_i8_xq(const int8_t *w, const int8_t *xq, const float *xd, uint64_t n);
// The q8 offset term of a natural-order x per block: offset[b] = -128 *
// (the sum of block b's 32 codes), the int32 that vpdpbusd's sums of
// (w + 128) x q over the block need added to become the sum of w x q.
// q: 32*blocks codes (a tail block zero-padded) -> offset[0 .. blocks).
void i8_block_offsets(const int8_t *q, uint64_t blocks, int32_t *offset);
// q8 rows: y[r] = (f16 scale r) * (the row's dot with x) for r < rows,
// f16_scales holding `rows` little-endian f16 values. One call per row range.
// xboff = i8_block_offsets of xq (the AVX-512 VNNI form uses it; the others
// ignore it). The AVX2 and portable forms give s * dot_i8_xq (AVX2: four
// rows at a time). The AVX-512 VNNI form takes 16 rows at a time, 64 columns
// of each, transposed in registers so that one vpdpbusd multiplies 16 rows
// by 4 codes of x: each block's sum is an exact int32 for 16 rows at once,
// and a row's result is
//     acc = 0; acc = fma(float(isum_b), d[b], acc) for b = 0, 1, ...; y = s * acc
// (one FMA per block instead of one per 4 codes), the same for every row
// whatever rows share its call.
void rows_i8_xq(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                const float *xd, uint64_t n, uint64_t rows, float *y);
// The same rows against k activation rows at once (a batched decode pass of
// k < 16 tokens): token t's x at xq + t*32*B, xboff + t*B, xd + t*B
// (B = x_blocks(n), the QuantizedX layout), its results at y + t*ldy;
// y[t*ldy + r] is what rows_i8_xq gives for token t alone, bit for bit (the
// same integer block sums, the same f32 operations in the same order), so a
// batched decode equals each sequence decoded alone. The AVX-512 VNNI form
// transposes each 16-row x 64-column tile once for up to 8 tokens; the
// others run rows_i8_xq per token over 16-row tiles that stay in L1.
void rows_i8_xq_batch(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                      const float *xd, uint64_t n, uint64_t rows, uint64_t k, float *y, uint64_t ldy);
// One vbit row (width b in {3, 4, 5, 6, 8}; `groups` groups of 4*b code bytes,
// MSB-first, a code u meaning (u - L) * s with L = 2^(b-1) - 1; its f16
// group scales) against a natural-order int8 x: the sum over groups of
// s * d[g] * (exact integer sum of (u - L) * q). xoff = i8_offset of xq (the
// AVX-512 VNNI form starts its vpdpbusd lanes at L * xoff / 128, -L times
// each 4 codes' sum; the others ignore it).
float dot_vbit_xq(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xoff,
                  const float *xd, uint64_t groups);
// What a vbit_ro row range reads of x beyond xq, xoff and xd, made once
// per x for every range of its matmul (a trained matrix's rows mix widths,
// so a range's runs of one width are short). Only the AVX2 and AVX-512
// forms read them.
struct VbitRowsX {
    // vbit_width_offsets of xoff, for the rows of widths other than 4
    // (the AVX-512 form starts a width-b row's lanes at its b-th table).
    const int32_t *width_offsets = nullptr;
    // For the 4-bit rows, which take the q4 row kernel (their 16 code bytes
    // a group are q4_block's split layout with each byte's nibbles the other
    // way round, element 2k in the high one): vbit4_x of xq, and
    // q4_pair_x_table of that (xt4).
    const int8_t *x4 = nullptr;
    const int32_t *off4 = nullptr;
    const int8_t *xt4 = nullptr;
};
// Rows of the one above (vbit_ro): row r's codes at codes[r], width
// widths[r], f16 scales at f16_scales + 2*groups*r; y[r] for r < rows. The
// SIMD forms run a 4-bit row as rows_q4_split_xq runs a q4_block row, the
// exact integer sums of (u - 7) * q per group times s * d summed as it sums
// them, against vx.x4. A row's sum is dot_vbit_xq's up to the order its
// partial sums are added in (exactly, portable), and depends on its width
// alone, not on the rows beside it.
void rows_vbit_xq(const uint8_t *const *codes, const uint8_t *widths, const uint8_t *f16_scales, const int8_t *xq,
                  const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows, const VbitRowsX &vx,
                  float *y);
// For every width b (3..8), -L times each 4 x codes' sum (L = 2^(b-1) - 1;
// xoff = i8_offset of x, -128 times that sum): table[8*groups*b + i] =
// L * (xoff[i] / 128), kVbitWidthOffsets * 8*groups int32 in all, made once
// per x for every row range of its matmul (the same integers on every ISA).
constexpr unsigned kVbitWidthOffsets = 9;
void vbit_width_offsets(const int32_t *xoff, uint64_t groups, int32_t *table);
// vbit codes of width b <= 6 as int8 values u - L in element order (the
// int8 view; |u - L| <= 32), 32 per group.
void unpack_vbit_groups(const uint8_t *codes, unsigned b, uint64_t groups, int8_t *out);
// q1 rows against a natural-order x: row r is the `groups` tiles at
// tiles + 6*groups*r, tile g = [f16 s][4 B bits, LSB-first], element k of
// the group +s where bit k is set and -s where it is clear; y[r] for r <
// rows = the sum over groups of s * d[g] * (exact integer sum of (2b-1)*q).
// xoff = i8_offset of xq (the AVX-512 VNNI form uses xoff/128, the negated
// sums of 4 codes, as the start of its vpdpbusd lanes; the others ignore it).
// Against f32 activations (the form this replaced) it trades the x rounding
// bounded above for a 1-bit row that no longer costs two 64-byte x loads
// and two masked sign flips per 32 weights in every row.
void rows_q1_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                uint64_t rows, float *y);
// q1 tiles -> the int8 view the prefill GEMM takes: codes[32*g + k] = +1
// where bit k of tile g is set, -1 where clear; scales[g] = its f16 scale.
void unpack_q1_groups(const uint8_t *tiles, uint64_t groups, int8_t *codes, float *scales);
// q1_passes (CMF_DTYPE_MEM_Q1_PASSES, q1's decode copy): a row is
// groups / 16 steps of 96 bytes, step k holding groups 16k..16k+15 as 64
// lane bytes (bit t of byte 4j+i = bit 4t+i of group j's 32 bits: the
// weight that pass t multiplies by lane 4j+i of x's pass t) then their 16
// f16 scales; groups % 16 == 0. Pass t's bytes are bit t of every lane
// byte, one vgf2p8affineqb (or a shift and an and) where the AVX-512
// kernel of rows_q1_xq makes them from a step's tiles with a word permute
// and a vpshufbitqmb per pass (two shuffle-port operations per 64 weights;
// on the Intel VM of docs/performance.md its bound).
// q1_passes_x: x (natural order, exactly `groups` blocks) as the kernel's
// passes: per step 576 bytes, pass t (64 bytes) holding codes 4t..4t+3 of
// the step's group j in bytes 4j..4j+3, then 16 int32: minus the sum of
// each group's 32 codes. xt 64-byte aligned.
void q1_passes_x(const int8_t *xq, uint64_t groups, uint8_t *xt);
constexpr uint64_t kQ1PassesXStepBytes = 576;
// The rows of a q1_passes matrix against q1_passes_x's passes of x and the
// block scales xd: y[r] = the sum over groups of s * d[g] * (exact integer
// sum of (2b-1)*q), the integers rows_q1_xq sums. steps 8-byte aligned.
void rows_q1_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                       float *y);
// q1t_passes (CMF_DTYPE_MEM_Q1T_PASSES, q1t's decode copy of a matrix
// without an overlay): steps of 160 bytes, 64 lane bytes for passes 0-3,
// 64 for passes 4-7, then the 16 f16 scales; bits 2(t%4) and 2(t%4)+1 of
// byte 4j+i of half t/4 hold w+1 of element 4t+i of group j (0 for -1, 1
// for 0, 2 for +1; a 3, which no copy holds, reads as +2 in every member),
// against the same passes of x. y[r] = the sum over groups of s * d[g] *
// (exact integer sum of w*q), the integers rows_q1t_xq sums.
void rows_q1t_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                        float *y);
// `n` steps of q1_passes (q1t_passes) -> the int8 view the prefill GEMM
// takes, 512 codes and 16 scales a step: codes +-1 (q1t: -1, 0, +1; +2 for a 3) in
// element order, scales the f16 scales.
void unpack_q1_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales);
void unpack_q1t_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales);
// Whether rows_q1_passes_xq and rows_q1t_passes_xq run their AVX-512 form
// on this CPU (q1 and q1t make their copies only then: the other forms
// decode the lane bytes one bit at a time).
bool q1_passes_kernel();
// q1t rows against a natural-order x: row r is the `groups` tiles at
// tiles + 9*groups*r, tile g = [f16 s][7 B base-3 digits]; element 5j+k of
// the group (k < 5; byte 6 holds elements 30 and 31 as its digits 0 and 1)
// is digit k of byte j, floor(b / 3^k) mod 3: 0 -> 0, 1 -> +s, 2 -> -s.
// y[r] = the sum over groups of s * d[g] * (exact integer sum of w*q): the
// base only (the caller adds the row's overlay). A byte the decoder rejects
// (> 242, or > 8 in the last place) reads by the same rule, so any bytes
// give a defined sum. Only the tiles of the `rows` rows are read.
// Against f32 activations (the form this replaced, a table of 8 floats per
// byte) it trades the x rounding bounded above for whole registers of
// digits: with AVX-512 VBMI each digit plane of 8 groups is a byte-table
// lookup and one vpdpbusd.
void rows_q1t_xq(const uint8_t *tiles, const int8_t *xq, const float *xd, uint64_t groups, uint64_t rows, float *y);
// q1t tiles -> the int8 view the prefill GEMM takes (a tensor without an
// overlay): codes[32*g + i] = the weight of element i by the rule above
// (-1, 0, +1), scales[g] = its f16 scale.
void unpack_q1t_groups(const uint8_t *tiles, uint64_t groups, int8_t *codes, float *scales);
// q1s_passes (CMF_DTYPE_MEM_Q1S_PASSES, q1s's decode copy): its base is a
// q1_passes matrix, its overlay slices of 16 rows stored lane by lane. The
// overlay sums of one slice: over its n_steps steps of 96 bytes in order
// (16 u16 columns, then 16 f32 corrections; lane l's slot is column and
// correction l), lane l gets the products d * xf[c] of its live slots, a
// slot live where its column c < cols. sums[l] starts at 0 and adds the
// products in step order (the same bits on every ISA). xf holds cols
// floats, x's values xd[c / 32] * xq[c].
void q1s_slice_sums(const uint8_t *steps, uint64_t n_steps, uint64_t cols, const float *xf, float *sums);
// Whether the u32 indices of `count` 6-byte q1s overlay entries strictly ascend.
bool q1s_ascending(const uint8_t *entries, uint64_t count);
// q1s's overlay on the rows_q1_xq base of a row range: y[r] += (value - base
// value) * d[c/32] * q[c] for each entry (6 B: u32 element index, f16 value;
// `count` of them, strictly ascending, all in [begin, begin + rows*cols)),
// row r of the range holding elements [begin + r*cols, begin + (r+1)*cols),
// tiles the whole tensor's q1 base (every index below its element count),
// followed by at least 2 readable bytes (in a q1s payload, its entry count:
// the AVX-512 form reads each tile's 6 bytes as 8).
// `phase` is entries[0]'s position in its whole list, modulo 16: the AVX-512
// form takes the list in steps of 16 entries aligned to it, so that a row's
// entries fall into the same steps, and its sum gets the same bits, wherever
// a range begins (nothing before entries[0] is read).
// Memory-safe for any list: an entry below the row being summed (a list
// that does not ascend) or past the range is skipped, so nothing outside
// x, y's `rows` and the tiles is touched; such a list's sums are wrong,
// which the caller prevents (it checks the list, q1s_ascending).
void q1s_overlay_xq(const uint8_t *tiles, const uint8_t *entries, uint64_t count, uint64_t phase, uint64_t begin,
                    uint64_t cols, uint64_t rows, const int8_t *xq, const float *xd, float *y);
// q4: 16 B of nibbles (even element low) per group, value (q-8)*scale; x in
// q4_pair_blocks order over exactly `groups` blocks, xoff = q4_pair_offset of it
// (the portable kernels recompute the offset from the codes and ignore xoff).
float dot_q4_tiled_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd,
                      uint64_t groups);  // [f16 s][16 B]
float dot_q4_split_xq(const uint8_t *nibbles, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xoff,
                      const float *xd, uint64_t groups);
// Row ranges of the two above, one call per range (the AVX2 forms sum four
// rows at a time, as rows_i8_xq): y[r] for r < rows, row r being the
// `groups` groups starting at group groups*r (tiles: 18 B each); split:
// row r's 16 B of nibbles a group at nibbles + nib_ld*r, its f16 scales at
// f16_scales + scale_ld*r (q4_block: 16*groups and 2*groups; q4_rows, the
// scales after each row's nibbles: 18*groups both).
void rows_q4_tiled_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                      uint64_t rows, float *y);
void rows_q4_split_xq(const uint8_t *nibbles, uint64_t nib_ld, const uint8_t *f16_scales, uint64_t scale_ld,
                      const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows, float *y);
// What the q4 row kernels make of a q4_pair_blocks x (xq and its offsets)
// before their rows: 32*groups bytes at xt, 64-byte aligned (the AVX-512
// VNNI form's pair-half table; the others write nothing and read nothing
// of it).
void q4_pair_x_table(const int8_t *xq, const int32_t *xoff, uint64_t groups, int8_t *xt);
// A natural-order x's codes (blocks of 32) in the order vbit_ro's 4-bit rows take:
// q4_pair_blocks positions with each block's odd elements where its even
// ones go (element e of a paired block b at 64*(b/2) + 16*(b%2) +
// 32*(1 - e%2) + e/2, of the unpaired last one at 32*b + 16*(1 - e%2) +
// e/2), and offset[8*k + j] = -7 * (the sums q4_pair_offset takes).
void vbit4_x(const int8_t *natural, uint64_t blocks, int8_t *q, int32_t *offset);
float dot_q4_groups_xq(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups);
// Row range of the one above (q4tp): row r's nibbles at nibbles + 16*groups*r,
// its f32 group scales at scales + groups*r; y[r] for r < rows, four rows at
// a time as rows_q4_split_xq.
void rows_q4_groups_xq(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups, uint64_t rows, float *y);
// q4tp / q2tp group scales of up to kLadderMaxRows rows: row j's ladder of 32 rungs is
// t[0] = first[j], t[c] = t[c-1] * ratio[j] (with zero_rung, q2tp's: t[0] = 0,
// t[1] = first[j], then the same products), each product rounded to f32 in
// that order, as the encoder builds it; out[groups*j + g] = t[c], c being row
// j's 5-bit code of group g (row j's codes at codes + code_stride*j,
// LSB-first). The same f32 products and pure lookups: every implementation
// gives the same bits.
constexpr unsigned kLadderMaxRows = 64;
void ladder_scales(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes, uint64_t code_stride,
                   uint64_t groups, unsigned rows, float *out);
// ladder_scales for the decode matmuls, whose x is rounded to int8 (by up
// to half a step of 1/127 of its block's largest |x|): rung c's power e = c (c - 1 with
// zero_rung; rung 0 then 0) is first * r^b0 * r2^b1 * r4^b2 * r8^b3 *
// r16^b4, multiplied in that order, b0..b4 being e's bits and r2 = r*r,
// r4 = r2*r2, r8 = r4*r4, r16 = r8*r8 (r = ratio[j]). Each rung is at most
// five products from first and the powers, so the rungs of a row come
// without a chain of 31 dependent multiplies or a transpose; they differ
// from ladder_scales' sequential products by a few f32 ulps (the tests
// bound it), and every implementation gives the same bits.
void ladder_scales_powers(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes,
                          uint64_t code_stride, uint64_t groups, unsigned rows, float *out);
// q4tp rows with their scales from ladder_scales_powers: y[r] for r < rows
// is rows_q4_groups_xq of row r (nibbles + 16*groups*r) with the scales
// ladder_scales_powers(first + r, ratio + r, false, codes + code_stride*r,
// ...) gives, the same bits. scratch: room for min(rows, kLadderMaxRows) *
// groups floats, which the builds that pick the scales first fill (the
// AVX-512 VNNI build picks them inside the row loop and leaves it alone).
void rows_q4tp_xq(const uint8_t *nibbles, const float *first, const float *ratio, const uint8_t *codes,
                  uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                  uint64_t rows, float *scratch, float *y);
// q2tp: 8 B per group, weight 4k+j in bits [2j, 2j+2) of byte k, value (c-1.5)*scale; q2_quads order.
// xoff = q2_offset of xq (the AVX-512 VNNI form uses it; the others ignore it).
float dot_q2_groups_xq(const uint8_t *chunks, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups);
// Rows of the one above: row r's chunks at chunks + 8*groups*r, its f32 group
// scales at scales + groups*r; y[r] for r < rows (four rows a pass sharing
// x on AVX-512 VNNI).
void rows_q2_groups_xq(const uint8_t *chunks, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups, uint64_t rows, float *y);
// q2tp rows with their scales from ladder_scales_powers: y[r] for r < rows
// is rows_q2_groups_xq of row r (chunks + 8*groups*r) with the scales
// ladder_scales_powers(first + r, ratio + r, true, codes + code_stride*r,
// ...) gives, the same bits. scratch: room for min(rows, kLadderMaxRows) *
// groups floats.
void rows_q2tp_xq(const uint8_t *chunks, const float *first, const float *ratio, const uint8_t *codes,
                  uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                  uint64_t rows, float *scratch, float *y);
// -3 * (sum of each 4 consecutive codes) of every x block (8 int32 per
// block, exact): the offset term of Σ(2c - 3)·x, which the VNNI q2 dot
// starts its integer sums from.
void q2_offset(const int8_t *q, uint64_t blocks, int32_t *offset);

// ---- decode (prefill widens weight panels to f32 through these) --------------
// Whole groups of 32 in natural element order, bit-identical to the scalar
// formulas: q4 (q - 8) * scale from 16 nibble bytes per group (even element
// in the low nibble; groups `stride` bytes apart: 16 split, 18 tiled);
// q2 (c - 1.5) * scale from 8 bytes per group (element 4k+j in bits [2j, 2j+2) of byte k).
void dequant_q4_groups(const uint8_t *nibbles, uint64_t stride, const float *scales, uint64_t groups, float *dst);
void dequant_q2_groups(const uint8_t *chunks, const float *scales, uint64_t groups, float *dst);
// vbit/vbit_ro: `groups` groups of 32 codes of b bits (b in 3..8), packed
// MSB-first, 4*b bytes per group, value (u - L) * scale with L = 2^(b-1) - 1
// and one f16 scale per group; reads exactly 4*b*groups code bytes.
void dequant_vbit_groups(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, uint64_t groups, float *dst);
// The q4 codes themselves, q - 8 in natural element order (int8_rows).
void unpack_q4_groups(const uint8_t *nibbles, uint64_t stride, uint64_t groups, int8_t *codes);

// Which implementation the dispatcher chose ("avx512vnni", "avx2" or "portable").
const char *active_isa();

// How far ahead (bytes) the SIMD decode kernels prefetch a weight stream:
// cmf::prefetch_ahead_bytes for light streams (q8 codes) and q4 nibbles,
// passed through plain functions so that avx2.cpp need not include
// cmf/cpu_features.hpp (avx2.cpp says why).
long prefetch_ahead_light();
long prefetch_ahead_q4();
bool prefetch_weights_nta();
// cmf::cpu_has_avx512_vbmi (and not capped by CMF_CODECS_ISA), for the
// kernels with a VBMI form inside the AVX-512 VNNI build; read at each
// call of such a kernel.
bool has_avx512_vbmi();
// cmf::cpu_has_avx512_bitalg, the same way.
bool has_avx512_bitalg();
// cmf::cpu_has_gfni, the same way.
bool has_gfni();
// Off: the AVX-512 VNNI build runs its forms without VBMI, BITALG and GFNI
// whatever the CPU has (tests hold both against the portable kernels).
void set_avx512_extensions(bool on);

// A thread's scratch room for the SIMD kernels, `bytes` long and 64-byte
// aligned, valid until the same thread asks for the same slot again (each
// kernel keeps to its own slot). Here rather than a thread_local
// std::vector in avx2.cpp: the vector's members would be instantiated
// there, compiled with AVX-512 flags, as weak symbols another file's copy
// could be merged with (tests/codecs/no_shared_inline_copies.sh).
enum class RoomSlot { q4_x_table, q1s_x_floats, q1s_passes_x, q1t_x_table, q1_x_passes, q1_passes_x, q2_x_passes, vbit4_x_table, count };
void *thread_room(RoomSlot slot, uint64_t bytes);

}  // namespace cmf::codecs::kernels
