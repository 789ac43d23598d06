#include "gemm_i8.hpp"
#include "kernels.hpp"

#include <cmf/block_quant.hpp>
#include <cmf/cpu_features.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(CMF_NATIVE_KERNELS) && defined(__x86_64__)
#include <immintrin.h>
#define CMF_X86 1
#endif

namespace cmf::cpu::i8 {

static_assert(kBlock == cmf::block_quant::kBlock, "the int8 GEMM quantizes x in the shared 32-blocks");

namespace {

// ---- activations ----------------------------------------------------------------

// Scatters one token's quantized block (32 codes as int16) into its packed
// place: 2-code words at a stride of kTokens words.
inline void scatter_block(const int16_t *q, int16_t *dst) {
    for (uint64_t s = 0; s < kSteps; ++s) std::memcpy(dst + s * kTokens * 2, q + 2 * s, 2 * sizeof(int16_t));
}

// Quantizes tiles [tile0, tile1) with Block(x, n, q16) -> d into xd, and
// hands each (tile, block, token)'s 32 codes to store(q, tile, b, j), which
// puts them in its set's packed layout.
template <float (*Block)(const float *, uint64_t, int16_t *), class Store>
inline void quantize_x_tiles(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t tile0,
                             uint64_t tile1, float *xd, Store store) {
    const uint64_t nb = blocks(cols);
    alignas(32) int16_t q[kBlock];
    for (uint64_t tile = tile0; tile < tile1; ++tile)
        for (uint64_t j = 0; j < kTokens; ++j) {
            const uint64_t t = tile * kTokens + j;
            for (uint64_t b = 0; b < nb; ++b) {
                const uint64_t c0 = b * kBlock, n = t < n_batch ? std::min(kBlock, cols - c0) : 0;
                xd[(tile * nb + b) * kTokens + j] = n > 0 ? Block(x + t * ldx + c0, n, q) : 0.0f;
                if (n == 0) std::memset(q, 0, sizeof q);
                store(q, tile, b, j);
            }
        }
}
// ... in the int16 layout of the portable and AVX2 sets.
template <float (*Block)(const float *, uint64_t, int16_t *)>
inline void quantize_x_body(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t tile0,
                            uint64_t tile1, int16_t *xq, float *xd) {
    const uint64_t nb = blocks(cols);
    quantize_x_tiles<Block>(x, ldx, n_batch, cols, tile0, tile1, xd,
                            [&](const int16_t *q, uint64_t tile, uint64_t b, uint64_t j) {
                                scatter_block(q, xq + (tile * nb + b) * kSteps * kTokens * 2 + j * 2);
                            });
}

// The activations are quantized by the one block quantizer the codecs'
// decode dots use too (cmf/block_quant.hpp), widened to int16 here.
float quantize_block_portable(const float *x, uint64_t n, int16_t *q16) {
    int8_t q[kBlock];
    const float d = cmf::block_quant::quantize_block(x, n, q);
    for (uint64_t e = 0; e < kBlock; ++e) q16[e] = q[e];
    return d;
}

void quantize_x_portable(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t tile0, uint64_t tile1,
                         int16_t *xq, float *xd) {
    quantize_x_body<quantize_block_portable>(x, ldx, n_batch, cols, tile0, tile1, xq, xd);
}

// ---- weights --------------------------------------------------------------------

void pack_w_portable(const int8_t *codes, const float *scales, uint64_t n_rows, uint64_t cols, int16_t *wp, float *wd) {
    const uint64_t nb = blocks(cols), ld = nb * kBlock;
    for (uint64_t g = 0; g < w_groups(n_rows); ++g)
        for (uint64_t b = 0; b < nb; ++b)
            for (uint64_t i = 0; i < kRows; ++i) {
                const uint64_t r = g * kRows + i;
                wd[(g * nb + b) * kRows + i] = r < n_rows ? scales[r * nb + b] : 0.0f;
                for (uint64_t s = 0; s < kSteps; ++s)
                    for (uint64_t k = 0; k < 2; ++k)
                        wp[((g * nb + b) * kSteps + s) * 16 + i * 2 + k] =
                            r < n_rows ? codes[r * ld + b * kBlock + 2 * s + k] : int16_t{0};
            }
}

// ---- GEMM -----------------------------------------------------------------------

// Writes the valid part of an 8-row x kTokens tile (acc[j][i] = row i, token j).
inline void store_tile(const float (*acc)[kRows], uint64_t rows, uint64_t tokens, float *y, uint64_t ldy) {
    for (uint64_t j = 0; j < tokens; ++j) std::memcpy(y + j * ldy, acc[j], rows * sizeof(float));
}

void gemm_portable(const int16_t *wp, const float *wd, uint64_t n_rows, uint64_t cols, const int16_t *xq,
                   const float *xd, uint64_t n_batch, float *y, uint64_t ldy) {
    const uint64_t nb = blocks(cols);
    for (uint64_t g = 0; g < w_groups(n_rows); ++g)
        for (uint64_t tile = 0; tile < x_tiles(n_batch); ++tile) {
            float acc[kTokens][kRows] = {};
            for (uint64_t b = 0; b < nb; ++b) {
                int32_t isum[kTokens][kRows] = {};
                for (uint64_t s = 0; s < kSteps; ++s) {
                    const int16_t *w = wp + ((g * nb + b) * kSteps + s) * 16;
                    const int16_t *xs = xq + ((tile * nb + b) * kSteps + s) * kTokens * 2;
                    for (uint64_t j = 0; j < kTokens; ++j)
                        for (uint64_t i = 0; i < kRows; ++i)
                            isum[j][i] += int32_t{w[i * 2]} * xs[j * 2] + int32_t{w[i * 2 + 1]} * xs[j * 2 + 1];
                }
                for (uint64_t j = 0; j < kTokens; ++j) {
                    const float sx = xd[(tile * nb + b) * kTokens + j];
                    for (uint64_t i = 0; i < kRows; ++i) {
                        const float sc = wd[(g * nb + b) * kRows + i] * sx;
                        acc[j][i] = std::fma(static_cast<float>(isum[j][i]), sc, acc[j][i]);
                    }
                }
            }
            store_tile(acc, std::min(kRows, n_rows - g * kRows), std::min(kTokens, n_batch - tile * kTokens),
                       y + tile * kTokens * ldy + g * kRows, ldy);
        }
}

const Kernels kPortable{"portable", quantize_x_portable, pack_w_portable, gemm_portable};

#ifdef CMF_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))

// The shared block quantizer in registers (cmf/block_quant.hpp; the compiler
// left the scalar one scalar, with a libm call per element: 8 % of a
// pp512), its int32 codes packed to int16 in element order.
AVX2 float quantize_block_avx2(const float *x, uint64_t n, int16_t *q16) {
    alignas(32) float v[kBlock] = {};
    std::memcpy(v, x, n * sizeof(float));
    __m256i qi[4];
    const float d = cmf::block_quant::quantize_block_avx2(v, qi);
    // packs interleaves 128-bit lanes; the permute restores element order.
    const __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[0], qi[1]), 0xD8);
    const __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2], qi[3]), 0xD8);
    _mm256_store_si256(reinterpret_cast<__m256i *>(q16), p0);
    _mm256_store_si256(reinterpret_cast<__m256i *>(q16 + 16), p1);
    return d;
}

AVX2 void quantize_x_avx2(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t tile0,
                          uint64_t tile1, int16_t *xq, float *xd) {
    quantize_x_body<quantize_block_avx2>(x, ldx, n_batch, cols, tile0, tile1, xq, xd);
}

// G (1 or 2) adjacent 8-row groups x one kTokens tile, blocks in order.
// Per 2-column step: each group's 8 rows of codes (one ymm of int16 pairs)
// and each token's 2 codes broadcast; vpmaddwd gives each row's 2-term sum
// as int32, added to that (group, token)'s accumulator. With G = 2: 8
// int32 accumulators, 2 weight vectors, 1 broadcast: 6 loads per 8
// vpmaddwd (8 rows x 4 tokens needed 5 per 4: load-port bound). The f32
// accumulators take one update per block and live in memory (L1).
template <int G>
AVX2 inline void tile_avx2(const int16_t *wg, const float *wdg, uint64_t nb, const int32_t *xt, const float *xdt,
                           float (*acc)[G * kRows]) {
    for (uint64_t j = 0; j < kTokens; ++j)
        for (int h = 0; h < G; ++h) _mm256_storeu_ps(acc[j] + h * kRows, _mm256_setzero_ps());
    const uint64_t gstride = nb * kSteps * 16;  // int16 codes between groups
    for (uint64_t b = 0; b < nb; ++b) {
        __m256i i00 = _mm256_setzero_si256(), i01 = i00, i02 = i00, i03 = i00;
        __m256i i10 = i00, i11 = i00, i12 = i00, i13 = i00;
        const int16_t *wb = wg + b * kSteps * 16;
        const int32_t *xb = xt + b * kSteps * kTokens;
#pragma GCC unroll 16
        for (uint64_t s = 0; s < kSteps; ++s) {
            const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(wb + s * 16));
            const int32_t *xs = xb + s * kTokens;
            if constexpr (G == 2) {
                const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(wb + gstride + s * 16));
                __m256i x = _mm256_set1_epi32(xs[0]);
                i00 = _mm256_add_epi32(i00, _mm256_madd_epi16(w0, x));
                i10 = _mm256_add_epi32(i10, _mm256_madd_epi16(w1, x));
                x = _mm256_set1_epi32(xs[1]);
                i01 = _mm256_add_epi32(i01, _mm256_madd_epi16(w0, x));
                i11 = _mm256_add_epi32(i11, _mm256_madd_epi16(w1, x));
                x = _mm256_set1_epi32(xs[2]);
                i02 = _mm256_add_epi32(i02, _mm256_madd_epi16(w0, x));
                i12 = _mm256_add_epi32(i12, _mm256_madd_epi16(w1, x));
                x = _mm256_set1_epi32(xs[3]);
                i03 = _mm256_add_epi32(i03, _mm256_madd_epi16(w0, x));
                i13 = _mm256_add_epi32(i13, _mm256_madd_epi16(w1, x));
                // Keeps the sums in registers step by step: without it GCC
                // reassociates the unrolled integer adds into a tree of live
                // products and spills them to the stack.
                __asm__("" : "+x"(i00), "+x"(i01), "+x"(i02), "+x"(i03), "+x"(i10), "+x"(i11), "+x"(i12), "+x"(i13));
            } else {
                i00 = _mm256_add_epi32(i00, _mm256_madd_epi16(w0, _mm256_set1_epi32(xs[0])));
                i01 = _mm256_add_epi32(i01, _mm256_madd_epi16(w0, _mm256_set1_epi32(xs[1])));
                i02 = _mm256_add_epi32(i02, _mm256_madd_epi16(w0, _mm256_set1_epi32(xs[2])));
                i03 = _mm256_add_epi32(i03, _mm256_madd_epi16(w0, _mm256_set1_epi32(xs[3])));
                __asm__("" : "+x"(i00), "+x"(i01), "+x"(i02), "+x"(i03));
            }
        }
        const float *sx = xdt + b * kTokens;
        const __m256i isum[2][kTokens] = {{i00, i01, i02, i03}, {i10, i11, i12, i13}};
        for (int h = 0; h < G; ++h) {
            const __m256 sw = _mm256_loadu_ps(wdg + h * nb * kRows + b * kRows);
            for (uint64_t j = 0; j < kTokens; ++j) {
                float *a = acc[j] + h * kRows;
                _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][j]),
                                                    _mm256_mul_ps(sw, _mm256_set1_ps(sx[j])), _mm256_loadu_ps(a)));
            }
        }
    }
}

AVX2 void gemm_avx2(const int16_t *wp, const float *wd, uint64_t n_rows, uint64_t cols, const int16_t *xq,
                    const float *xd, uint64_t n_batch, float *y, uint64_t ldy) {
    static_assert(kTokens == 4 && kRows == 8, "the AVX2 tile is 8 or 16 rows x 4 tokens");
    const uint64_t nb = blocks(cols), groups = w_groups(n_rows);
    // Token tiles outer: a tile (kTokens x cols int16, 8 KiB at 1024
    // columns) stays in L1 while it meets every row group of the panel,
    // which stays in L2.
    for (uint64_t tile = 0; tile < x_tiles(n_batch); ++tile) {
        const int32_t *xt = reinterpret_cast<const int32_t *>(xq) + tile * nb * kSteps * kTokens;
        const float *xdt = xd + tile * nb * kTokens;
        const uint64_t tokens = std::min(kTokens, n_batch - tile * kTokens);
        float *yt = y + tile * kTokens * ldy;
        for (uint64_t g = 0; g < groups; g += 2) {
            const int16_t *wg = wp + g * nb * kSteps * 16;
            const float *wdg = wd + g * nb * kRows;
            float acc[kTokens][2 * kRows];
            if (g + 1 < groups) tile_avx2<2>(wg, wdg, nb, xt, xdt, reinterpret_cast<float (*)[2 * kRows]>(acc));
            else tile_avx2<1>(wg, wdg, nb, xt, xdt, reinterpret_cast<float (*)[kRows]>(acc));
            const uint64_t rows = std::min(2 * kRows, n_rows - g * kRows);
            const uint64_t lda = g + 1 < groups ? 2 * kRows : kRows;
            for (uint64_t j = 0; j < tokens; ++j)
                std::memcpy(yt + j * ldy + g * kRows, &acc[0][0] + j * lda, rows * sizeof(float));
        }
    }
}

// 8x8 transpose of 32-bit lanes in registers: r[i] holds row i on entry,
// column i on exit (the f32 GEMM's pack in kernels.cpp has its own copy in
// that translation unit's anonymous namespace).
AVX2 inline void transpose8x32(__m256i r[8]) {
    __m256 v[8], t[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm256_castsi256_ps(r[i]);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    __m256 u[8];
    u[0] = _mm256_shuffle_ps(t[0], t[2], 0x44);
    u[1] = _mm256_shuffle_ps(t[0], t[2], 0xEE);
    u[2] = _mm256_shuffle_ps(t[1], t[3], 0x44);
    u[3] = _mm256_shuffle_ps(t[1], t[3], 0xEE);
    u[4] = _mm256_shuffle_ps(t[4], t[6], 0x44);
    u[5] = _mm256_shuffle_ps(t[4], t[6], 0xEE);
    u[6] = _mm256_shuffle_ps(t[5], t[7], 0x44);
    u[7] = _mm256_shuffle_ps(t[5], t[7], 0xEE);
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        r[i + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

// A block of 8 rows x 32 codes widened to int16 is an 8x16 matrix of
// 2-code words; packed step s is its column s: two 8x8 transposes. (A
// scalar loop here cost as much as a third of the GEMM at 512 tokens.)
AVX2 void pack_w_avx2(const int8_t *codes, const float *scales, uint64_t n_rows, uint64_t cols, int16_t *wp,
                      float *wd) {
    const uint64_t nb = blocks(cols), ld = nb * kBlock;
    for (uint64_t g = 0; g < w_groups(n_rows); ++g) {
        const uint64_t rows = std::min(kRows, n_rows - g * kRows);
        for (uint64_t b = 0; b < nb; ++b) {
            __m256i lo[8], hi[8];
            for (uint64_t i = 0; i < kRows; ++i) {
                if (i < rows) {
                    const int8_t *src = codes + (g * kRows + i) * ld + b * kBlock;
                    lo[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src)));
                    hi[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src + 16)));
                } else {
                    lo[i] = hi[i] = _mm256_setzero_si256();
                }
            }
            transpose8x32(lo);
            transpose8x32(hi);
            int16_t *dst = wp + (g * nb + b) * kSteps * 16;
            for (uint64_t s = 0; s < 8; ++s) {
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + s * 16), lo[s]);
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + (s + 8) * 16), hi[s]);
            }
            for (uint64_t i = 0; i < kRows; ++i)
                wd[(g * nb + b) * kRows + i] = i < rows ? scales[(g * kRows + i) * nb + b] : 0.0f;
        }
    }
}

const Kernels kAvx2{"avx2", quantize_x_avx2, pack_w_avx2, gemm_avx2};

// ---- AVX-512 VNNI ---------------------------------------------------------------
// Its own packed layout in the same buffers (gemm_i8.hpp has the sizes):
//   x, per (tile, block), 144 bytes at byte (tile * nb + b) * 144:
//     128 bytes of int8 codes, [s][j][k] = q(token tile*kTokens+j, column b*32 + 4s + k), s < 8;
//     then kTokens int32: 128 * (sum of that token's 32 codes);
//   w, per (16-row group, block), 512 bytes at byte (g * nb + b) * 512:
//     [s][i][k] = c(g*16+i, b*32 + 4s + k) + 128 as uint8, s < 8 (rows past
//     n_rows: code 0, i.e. byte 128, with scale 0);
//   wd[(g * nb + b) * 16 + i] = scale of row g*16+i, block b.
#define VNNI __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c")))
constexpr uint64_t kVRows = 16;        // rows per group: one zmm of int32 lanes
constexpr uint64_t kVSteps = kBlock / 4;  // 4-column steps per block
constexpr uint64_t kVXBlockBytes = kBlock * kTokens + 4 * kTokens;
static_assert(kVRows == kRowsAlloc, "the buffers are sized for 16-row groups");

// A tile's four tokens per block at a time: each token's 32 codes packed to
// bytes in element order in a register, the four turned into the [s][j]
// words of the layout by a 4x8 transpose of 32-bit words, 128 bytes stored
// at once. Quantized one token at a time with the scattering done byte by
// byte, 512 tokens of x took 14 % of a q4 pp512 run (perf: the block
// quantizer, the byte loop and a memmove per block), as much as a fifth of
// the GEMM beside it.
VNNI void quantize_x_vnni(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t tile0,
                          uint64_t tile1, int16_t *xq, float *xd) {
    const uint64_t nb = blocks(cols);
    auto *base = reinterpret_cast<uint8_t *>(xq);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    static_assert(kTokens == 4, "the transpose below is of four tokens");
    for (uint64_t tile = tile0; tile < tile1; ++tile)
        for (uint64_t b = 0; b < nb; ++b) {
            __m256i tok[kTokens];
            alignas(16) int32_t corr[kTokens];
            for (uint64_t j = 0; j < kTokens; ++j) {
                const uint64_t t = tile * kTokens + j, c0 = b * kBlock;
                const uint64_t n = t < n_batch ? std::min(kBlock, cols - c0) : 0;
                float &d = xd[(tile * nb + b) * kTokens + j];
                if (n == 0) {
                    d = 0.0f;
                    tok[j] = _mm256_setzero_si256();
                    corr[j] = 0;
                    continue;
                }
                __m256i qi[4];
                if (n == kBlock) {
                    d = cmf::block_quant::quantize_block_avx2(x + t * ldx + c0, qi);
                } else {  // the last block of a row, zero-padded
                    alignas(32) float v[kBlock] = {};
                    std::memcpy(v, x + t * ldx + c0, n * sizeof(float));
                    d = cmf::block_quant::quantize_block_avx2(v, qi);
                }
                // packs work within 128-bit lanes: words of elements [0-3 8-11 16-19 24-27 | 4-7 12-15 ...],
                // put back in order by one word permute.
                const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
                tok[j] = _mm256_permutevar8x32_epi32(w, order);
                const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
                __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
                s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
                s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
                corr[j] = 128 * _mm_cvtsi128_si32(s);
            }
            // Word s of every token side by side: rows [s=0 | s=4], [1 | 5], [2 | 6], [3 | 7].
            const __m256i a = _mm256_unpacklo_epi32(tok[0], tok[1]), c = _mm256_unpackhi_epi32(tok[0], tok[1]);
            const __m256i e = _mm256_unpacklo_epi32(tok[2], tok[3]), f = _mm256_unpackhi_epi32(tok[2], tok[3]);
            const __m256i r0 = _mm256_unpacklo_epi64(a, e), r1 = _mm256_unpackhi_epi64(a, e);
            const __m256i r2 = _mm256_unpacklo_epi64(c, f), r3 = _mm256_unpackhi_epi64(c, f);
            auto *blk = reinterpret_cast<__m256i *>(base + (tile * nb + b) * kVXBlockBytes);
            _mm256_storeu_si256(blk + 0, _mm256_permute2x128_si256(r0, r1, 0x20));
            _mm256_storeu_si256(blk + 1, _mm256_permute2x128_si256(r2, r3, 0x20));
            _mm256_storeu_si256(blk + 2, _mm256_permute2x128_si256(r0, r1, 0x31));
            _mm256_storeu_si256(blk + 3, _mm256_permute2x128_si256(r2, r3, 0x31));
            std::memcpy(reinterpret_cast<uint8_t *>(blk) + kBlock * kTokens, corr, sizeof corr);
        }
}

// Per (16-row group, block): the 16 rows' 32 codes as 8 words each, turned
// into the [s][i] words of the layout by two 8x8 word transposes, biased by
// +128 and stored as 512 contiguous bytes (it stored a word at a time:
// 2.5 % of a q4 pp512 run).
VNNI void pack_w_vnni(const int8_t *codes, const float *scales, uint64_t n_rows, uint64_t cols, int16_t *wp,
                      float *wd) {
    const uint64_t nb = blocks(cols), ld = nb * kBlock, groups = (n_rows + kVRows - 1) / kVRows;
    auto *base = reinterpret_cast<uint8_t *>(wp);
    const __m256i bias = _mm256_set1_epi32(int32_t(0x80808080u));
    for (uint64_t g = 0; g < groups; ++g)
        for (uint64_t b = 0; b < nb; ++b) {
            __m256i words[2][8];  // rows 0-7 and 8-15, then (transposed) word s of those rows
            for (uint64_t i = 0; i < kVRows; ++i) {
                const uint64_t r = g * kVRows + i;
                wd[(g * nb + b) * kVRows + i] = r < n_rows ? scales[r * nb + b] : 0.0f;
                words[i / 8][i % 8] = r < n_rows ? _mm256_loadu_si256(reinterpret_cast<const __m256i *>(codes + r * ld + b * kBlock))
                                                : _mm256_setzero_si256();
            }
            transpose8x32(words[0]);
            transpose8x32(words[1]);
            // Word s of rows 0-7, then of rows 8-15: 64 bytes per s.
            auto *dst = reinterpret_cast<__m256i *>(base + (g * nb + b) * kVSteps * kVRows * 4);
            for (uint64_t s = 0; s < kVSteps; ++s) {
                _mm256_storeu_si256(dst + 2 * s, _mm256_xor_si256(words[0][s], bias));
                _mm256_storeu_si256(dst + 2 * s + 1, _mm256_xor_si256(words[1][s], bias));
            }
        }
}

// G (1 or 2) adjacent 16-row groups x one kTokens tile, blocks in order, the
// f32 sums in registers. Per 4-column step: each group's 16 rows x 4 biased
// codes (one zmm) and each token's 4 codes broadcast; vpdpbusd adds the 4
// products of every row to that (group, token)'s int32 lanes.
template <int G>
VNNI inline void tile_vnni(const uint8_t *wg, const float *wdg, uint64_t nb, const uint8_t *xt, const float *xdt,
                           float *out, uint64_t ld_out) {
    __m512 acc[G][kTokens];
    for (int h = 0; h < G; ++h)
        for (uint64_t j = 0; j < kTokens; ++j) acc[h][j] = _mm512_setzero_ps();
    const uint64_t gstride = nb * kVSteps * kVRows * 4;  // bytes between groups
    for (uint64_t b = 0; b < nb; ++b) {
        __m512i is[G][kTokens];
        for (int h = 0; h < G; ++h)
            for (uint64_t j = 0; j < kTokens; ++j) is[h][j] = _mm512_setzero_si512();
        const uint8_t *wb = wg + b * kVSteps * kVRows * 4;
        const uint8_t *xb = xt + b * kVXBlockBytes;
#pragma GCC unroll 8
        for (uint64_t s = 0; s < kVSteps; ++s) {
            __m512i w[G];
            for (int h = 0; h < G; ++h) w[h] = _mm512_loadu_si512(wb + h * gstride + s * kVRows * 4);
            for (uint64_t j = 0; j < kTokens; ++j) {
                int32_t word;
                std::memcpy(&word, xb + (s * kTokens + j) * 4, 4);
                const __m512i xv = _mm512_set1_epi32(word);
                for (int h = 0; h < G; ++h) is[h][j] = _mm512_dpbusd_epi32(is[h][j], w[h], xv);
            }
        }
        const float *sx = xdt + b * kTokens;
        const int32_t *corr = reinterpret_cast<const int32_t *>(xb + kBlock * kTokens);
        for (int h = 0; h < G; ++h) {
            const __m512 sw = _mm512_loadu_ps(wdg + h * nb * kVRows + b * kVRows);
            for (uint64_t j = 0; j < kTokens; ++j) {
                const __m512i isum = _mm512_sub_epi32(is[h][j], _mm512_set1_epi32(corr[j]));
                // maskz with all lanes: the plain _mm512_cvtepi32_ps trips GCC 12's
                // -Wmaybe-uninitialized on its own _mm512_undefined_ps.
                const __m512 fsum = _mm512_maskz_cvtepi32_ps(0xFFFF, isum);
                acc[h][j] = _mm512_fmadd_ps(fsum, _mm512_mul_ps(sw, _mm512_set1_ps(sx[j])), acc[h][j]);
            }
        }
    }
    for (int h = 0; h < G; ++h)
        for (uint64_t j = 0; j < kTokens; ++j) _mm512_storeu_ps(out + j * ld_out + h * kVRows, acc[h][j]);
}

VNNI void gemm_vnni(const int16_t *wp, const float *wd, uint64_t n_rows, uint64_t cols, const int16_t *xq,
                    const float *xd, uint64_t n_batch, float *y, uint64_t ldy) {
    const uint64_t nb = blocks(cols), groups = (n_rows + kVRows - 1) / kVRows;
    const auto *wbase = reinterpret_cast<const uint8_t *>(wp);
    const auto *xbase = reinterpret_cast<const uint8_t *>(xq);
    // Token tiles outer, as the AVX2 GEMM: the tile stays in L1 while it
    // meets every row group of the panel.
    for (uint64_t tile = 0; tile < x_tiles(n_batch); ++tile) {
        const uint8_t *xt = xbase + tile * nb * kVXBlockBytes;
        const float *xdt = xd + tile * nb * kTokens;
        const uint64_t tokens = std::min(kTokens, n_batch - tile * kTokens);
        float *yt = y + tile * kTokens * ldy;
        for (uint64_t g = 0; g < groups; g += 2) {
            const uint8_t *wg = wbase + g * nb * kVSteps * kVRows * 4;
            const float *wdg = wd + g * nb * kVRows;
            alignas(64) float out[kTokens][2 * kVRows];
            const bool two = g + 1 < groups;
            if (two) tile_vnni<2>(wg, wdg, nb, xt, xdt, &out[0][0], 2 * kVRows);
            else tile_vnni<1>(wg, wdg, nb, xt, xdt, &out[0][0], 2 * kVRows);
            const uint64_t rows = std::min((two ? 2 : 1) * kVRows, n_rows - g * kVRows);
            for (uint64_t j = 0; j < tokens; ++j) std::memcpy(yt + j * ldy + g * kVRows, out[j], rows * sizeof(float));
        }
    }
}

const Kernels kAvx512Vnni{"avx512vnni", quantize_x_vnni, pack_w_vnni, gemm_vnni};
#endif

}  // namespace

const Kernels *kernels_for(const char *isa) {
    if (std::strcmp(isa, "portable") == 0) return &kPortable;
#ifdef CMF_X86
    if (std::strcmp(isa, "avx2") == 0 && cpu_has_avx2_fma_f16c()) return &kAvx2;
    if (std::strcmp(isa, "avx512vnni") == 0 && cpu_has_avx512_vnni()) return &kAvx512Vnni;
#endif
    return nullptr;
}

const Kernels &kernels() {
    static const Kernels *best = [] {
        for (const char *isa : {"avx512vnni", "avx2"})
            if (const Kernels *k = isa_allowed(isa) ? kernels_for(isa) : nullptr) return k;
        return &kPortable;
    }();
    return *best;
}

}  // namespace cmf::cpu::i8
