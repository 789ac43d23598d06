// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c; only called
// after dispatch.cpp has checked the CPU. Accumulation order differs from the
// portable kernels (8 lanes, fused multiply-adds), so results agree with them
// to f32 rounding, not bit-for-bit. quantize_x is the exception: it performs
// the same f32 operations as the portable one and gives identical bytes.
#include "kernels/portable.hpp"
#include "kernels/q1s_overlay.hpp"

#include <immintrin.h>

#include <cmf/block_quant.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

// Compiled twice (meson.build): as kernels::avx2 with -mavx2 -mfma -mf16c,
// and as kernels::avx512vnni with AVX-512 VL/BW/VNNI added and
// CMF_CODECS_VNNI defined, where the q4 pair dots use vpdpbusd.
// Because the whole file is compiled with those flags, it calls no inline
// function of a shared header that other files compile too (such as
// cmf/cpu_features.hpp): the linker keeps one copy of an inline function
// per library, and if it kept this file's, code that runs before the CPU
// check (or on a CPU without AVX-512) would execute AVX-512 instructions.
// What it needs from there comes through kernels.hpp's plain functions.
#ifdef CMF_CODECS_VNNI
namespace cmf::codecs::kernels::avx512vnni {
#else
namespace cmf::codecs::kernels::avx2 {
#endif

namespace {

float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
int load_u16(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
}
float f16_scalar(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
}  // namespace

float dot_f32(const float *a, const float *x, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), s1);
    }
    float acc = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) acc += a[i] * x[i];
    return acc;
}

float dot_f16(const uint16_t *h, const float *x, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i + 8)));
        s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), s1);
    }
    float acc = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) acc += _cvtsh_ss(h[i]) * x[i];
    return acc;
}

float dot_bf16(const uint16_t *h, const float *x, uint64_t n) {
    __m256 s0 = _mm256_setzero_ps();
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i))), 16);
        s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(w), _mm256_loadu_ps(x + i), s0);
    }
    float acc = hsum(s0);
    for (; i < n; ++i) {
        uint32_t u = static_cast<uint32_t>(h[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        acc += f * x[i];
    }
    return acc;
}

// ---- int8 activations --------------------------------------------------------

void quantize_x(const float *x, uint64_t n, XOrder order, int8_t *q, float *d) {
    // Element order inside a block after the pack below: per 128-bit lane a
    // byte shuffle, then a 32-bit lane permute (kernels.hpp, XOrder).
    const __m256i pack_fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i pairs = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i quads = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                           0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (uint64_t b = 0; b < x_blocks(n); ++b) {
        alignas(32) float tail[32] = {};
        const float *v = x + 32 * b;
        if (n - 32 * b < 32) {
            std::memcpy(tail, v, (n - 32 * b) * sizeof(float));
            v = tail;
        }
        // The block quantizer the cpu backend's int8 GEMM shares
        // (cmf/block_quant.hpp), bit-identical to the portable quantize_x.
        __m256i i32[4];
        d[b] = cmf::block_quant::quantize_block_avx2(v, i32);
        // packs work per 128-bit lane: bytes come out as dwords 0,2,4,6,1,3,5,7 of the natural order.
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
        bytes = _mm256_permutevar8x32_epi32(bytes, pack_fix);
        if (order == XOrder::q4_pairs)
            bytes = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bytes, pairs), _MM_SHUFFLE(3, 1, 2, 0));
        else if (order == XOrder::q2_quads)
            bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(bytes, quads), pack_fix);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(q + 32 * b), bytes);
    }
}

namespace {
// The 8 int32 sums of 4 consecutive codes of 32 (the int32 lanes of a
// 32-byte dot): 1 x each code to int16 pairs (vpmaddubsw), pairs again
// (vpmaddwd); exact.
inline __m256i sums_of_4(const int8_t *p) {
    return _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))),
        _mm256_set1_epi16(1));
}
// -(s << shift): the offset terms are -8 or -128 times such sums.
template <int Shift>
inline void store_neg_shifted(int32_t *dst, __m256i s) {
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst),
                        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s, Shift)));
}
}  // namespace

// Each thread makes these for every new x of a q4 / q8 matmul before its
// first row: q4's scalar loop was 0.6 % of a q4 decode step (perf, 0.6B shape).
// Pair k's lane j sums bytes 4j..4j+3 of both its 32-byte halves.
void q4_pair_offset(const int8_t *q, uint64_t blocks, int32_t *offset) {
    for (uint64_t k = 0; k < blocks / 2; ++k)
        store_neg_shifted<3>(offset + 8 * k, _mm256_add_epi32(sums_of_4(q + 64 * k), sums_of_4(q + 64 * k + 32)));
}
void i8_offset(const int8_t *q, uint64_t blocks, int32_t *offset) {
    for (uint64_t b = 0; b < blocks; ++b) store_neg_shifted<7>(offset + 8 * b, sums_of_4(q + 32 * b));
}

namespace {
// Integer dot of one 32-block as 8 int32 partial sums, converted to f32:
// |w| (unsigned, -128 -> 128) times x with w's sign, pairs summed to int16
// (at most 2*128*127, no saturation), then to int32.
inline __m256 block_isum(__m256i w, __m256i xq) {
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}
// Decode streams weights from memory faster than the hardware prefetcher
// alone asks for them (it also stops at 4 KiB page boundaries): each weight
// stream is prefetched this far ahead, one line per 64 bytes read. The
// distance depends on the CPU (cmf/cpu_features.hpp has the measurements).
// (A run-time initializer, but only a call and a store: see kTrits.)
const long kPrefetchAhead = prefetch_ahead_light();
inline void prefetch_ahead(const void *p) {
    _mm_prefetch(static_cast<const char *>(p) + kPrefetchAhead, _MM_HINT_T0);
}
inline __m256i load32(const int8_t *p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)); }

// One q8 row's dot as 8 partial sums: whole blocks with four accumulators
// (one FMA chain per block would wait on its latency) and one prefetch per
// 64 bytes, a partial last block scalar into lane 0 (never read past the row).
// (The AVX-512 VNNI build's row kernel is rows_i8_xq below; this is its
// single-row dot_i8_xq.)
inline __m256 i8_acc(const int8_t *w, const int8_t *xq, const float *xd, uint64_t n) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    auto step = [&](uint64_t b, __m256 &a) {
        a = _mm256_fmadd_ps(_mm256_broadcast_ss(xd + b), block_isum(load32(w + 32 * b), load32(xq + 32 * b)), a);
    };
    const uint64_t full = n / 32;
    uint64_t b = 0;
    for (; b + 4 <= full; b += 4) {
        prefetch_ahead(w + 32 * b);
        prefetch_ahead(w + 32 * b + 64);
        step(b, acc[0]);
        step(b + 1, acc[1]);
        step(b + 2, acc[2]);
        step(b + 3, acc[3]);
    }
    for (; b < full; ++b) step(b, acc[0]);
    __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    if (32 * full < n) {
        int32_t s = 0;
        for (uint64_t i = 32 * full; i < n; ++i) s += int32_t{w[i]} * xq[i];
        sum = _mm256_add_ps(sum, _mm256_setr_ps(xd[full] * static_cast<float>(s), 0, 0, 0, 0, 0, 0, 0));
    }
    return sum;
}
}  // namespace

float dot_i8_xq(const int8_t *w, const int8_t *xq, const float *xd, uint64_t n) {
    return hsum(i8_acc(w, xq, xd, n));
}

namespace {
// Row-range kernels: rows are read one after another, each as one sequential
// stream (four rows read interleaved, sharing each x load, ran at two thirds
// of the speed: the stream stalls, perf annotate put it on rows 3 and 4's
// loads), but four rows' sums leave through one horizontal-add tree and one
// store, and the ISA dispatch is paid once per call, not per row. Against
// the per-row calls, tg64 on the 0.6B files, 2 threads, medians of 8
// alternating runs: q8 25.6 -> 26.9 tok/s, q4 34.5 -> 36.0; q8 on 1 thread
// (5 runs) 17.7 -> 18.4.
// `acc(r)` is row r's dot as 8 partial sums; y[r] = their sum.
// `quad(r, a)` fills a[0..4) with rows r..r+3 as 8 partial sums each (a
// kernel that runs four rows in one pass over x), `acc(r)` one row.
// y[0..4) = the sums of four rows' 8 partial sums (lane i of the 128-bit
// result is row i's sum).
inline void sum4_rows(const __m256 a[4], float *y) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}
// One row's sum, its lanes added in the order sum4_rows adds them, so a
// row's sum does not depend on where its range starts: the backend cuts row
// ranges differently for one weight than for several fused (matmul_multi),
// and both must give the same bits.
inline float sum1_row(__m256 a) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, a), a);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}
template <class Quad, class Acc>
inline void rows4_quads(uint64_t rows, float *y, Quad quad, Acc acc) {
    uint64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        __m256 a[4];
        quad(r, a);
        sum4_rows(a, y + r);
    }
    for (; r < rows; ++r) y[r] = sum1_row(acc(r));
}
template <class Acc>
inline void rows4(uint64_t rows, float *y, Acc acc) {
    rows4_quads(
        rows, y,
        [&](uint64_t r, __m256 *a) {
            a[0] = acc(r), a[1] = acc(r + 1), a[2] = acc(r + 2), a[3] = acc(r + 3);
        },
        acc);
}
}  // namespace

#ifdef CMF_CODECS_VNNI
namespace {
inline __m256 lo256(__m512 v) { return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, _mm512_castps_pd(v), 0)); }
// (Zero-masked forms with a full mask: see q4_pair_acc_rows_zmm below.)
inline __m256 hi256(__m512 v) { return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, _mm512_castps_pd(v), 1)); }
inline __m512 cvt_ps(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xFFFF, v); }
// The sum of 16 lanes, halves added first (the row kernels' last step).
inline float hsum512(__m512 v) { return hsum(_mm256_add_ps(lo256(v), hi256(v))); }
// Floats p[0 .. n), n <= 8, each in two lanes (2i, 2i+1), zero past them
// (nothing past them read): a per-group value beside 8 groups' lane pairs.
inline __m512 pairs_of8(const float *p, uint64_t n) {
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_maskz_permutexvar_ps(0xFFFF, dup, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p));
}
// The 32-byte x blocks of groups [g0, g0 + n), n <= 8, two a register,
// zero past them (nothing past them read): the VBMI kernels' x tables.
inline void load_x8(const int8_t *xq, uint64_t g0, uint64_t n, __m512i X[4]) {
    for (uint64_t i = 0; i < 4; ++i) {
        const uint64_t have = 2 * i < n ? std::min<uint64_t>(64, 32 * (n - 2 * i)) : 0;
        X[i] = _mm512_maskz_loadu_epi8(have == 64 ? ~uint64_t{0} : (uint64_t{1} << have) - 1, xq + 32 * g0 + 64 * i);
    }
}

// The q8 row kernel on AVX-512 VNNI. A q8 row's blocks share one scale per
// row, x has one per block, so each block's exact integer sum must meet its
// x scale in f32. Dotting one row at a time (64 columns, two blocks, per
// vpdpbusd) leaves 8 lane sums per block, and each vpdpbusd wanted a
// convert and an FMA of its own: on this VM a 512-bit vpdpbusd and an FMA
// share one issue slot, so that was two slots per 64 multiply-adds per
// token. Here 16 rows x 64 columns are loaded, biased to unsigned (+128;
// vpdpbusd's unsigned operand) and transposed in registers (T[s] lane i =
// row i's bytes 4s..4s+3), so one vpdpbusd against 4 codes of x broadcast
// adds into 16 rows' int32 sums, 8 of them make a block's exact sum for 16
// rows, started at the x's block offset (i8_block_offsets: -128 * the sum of
// its codes), and one convert and one FMA per block and token finish it.
// The transpose (64 shuffles) is paid once per tile for every token of a
// batch. Each row's arithmetic is the same whatever rows or tokens share its
// tile, so a row's bits depend on neither (kernels.hpp). Sixteen rows read
// side by side are sixteen streams, which the hardware prefetcher does not
// follow: each group prefetches the next group's rows (contiguous) as it
// goes, and the first group of a call prefetches each of its rows ahead.

// 16x16 floats transposed in registers: r[i] lane j -> r[j] lane i
// (unpack pairs, then quads within 128-bit lanes, then 128-bit lanes across
// registers: 64 shuffles).
inline void transpose16x16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_maskz_unpacklo_ps(0xFFFF, r[i], r[i + 1]);
        t[i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, r[i], r[i + 1]);
    }
    // u[4k + m], 128-bit lane L: column 4L + m of rows 4k .. 4k+3.
    for (int k = 0; k < 16; k += 4) {
        u[k] = _mm512_maskz_shuffle_ps(0xFFFF, t[k], t[k + 2], 0x44);
        u[k + 1] = _mm512_maskz_shuffle_ps(0xFFFF, t[k], t[k + 2], 0xEE);
        u[k + 2] = _mm512_maskz_shuffle_ps(0xFFFF, t[k + 1], t[k + 3], 0x44);
        u[k + 3] = _mm512_maskz_shuffle_ps(0xFFFF, t[k + 1], t[k + 3], 0xEE);
    }
    for (int m = 0; m < 4; ++m) {
        const __m512 a = _mm512_maskz_shuffle_f32x4(0xFFFF, u[m], u[4 + m], 0x44);
        const __m512 b = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + m], u[12 + m], 0x44);
        const __m512 c = _mm512_maskz_shuffle_f32x4(0xFFFF, u[m], u[4 + m], 0xEE);
        const __m512 d = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + m], u[12 + m], 0xEE);
        r[m] = _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, 0x88);
        r[4 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, 0xDD);
        r[8 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, c, d, 0x88);
        r[12 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, c, d, 0xDD);
    }
}
// The same for 16 registers of 16 dwords: T[s] lane i = r[i]'s dword s.
inline void transpose16(const __m512i r[16], __m512i T[16]) {
    __m512 f[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(r[i]);
    transpose16x16(f);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) T[i] = _mm512_castps_si512(f[i]);
}

// The 64 code bytes at column `col` of rows 0..R-1 (R <= 16; rows past R are
// left out), `cols` masking the bytes of a partial last chunk, as T[0..16).
inline void q8_tile(const int8_t *w, uint64_t ld, uint64_t R, uint64_t col, __mmask64 cols, __m512i T[16]) {
    const __m512i bias = _mm512_set1_epi8(char(0x80));
    __m512i r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
        r[i] = bias;
        if (uint64_t(i) < R) {
            r[i] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(cols, w + uint64_t(i) * ld + col), bias);
        }
    }
    transpose16(r, T);
}

inline int32_t x_word(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
// acc + float(16 rows' exact sums of block b) * d[b]: the 8 transposed
// words T[0..8) of the block against its 32 codes q.
inline __m512 q8_block(const __m512i *T, const int8_t *q, int32_t offset, float d, __m512 acc) {
    __m512i s = _mm512_set1_epi32(offset);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) s = _mm512_dpbusd_epi32(s, T[j], _mm512_set1_epi32(x_word(q + 4 * j)));
    return _mm512_fmadd_ps(cvt_ps(s), _mm512_set1_ps(d), acc);
}

// How a 16-row group's stream is prefetched: the next group's rows as one
// contiguous region, a share per 64-column step, into L1, unless a group
// is far larger than L1 (rows over 6 KB, a large model's down projection);
// then each row's line kQ8RowStepsAhead steps on is asked for. Streamed
// from memory on 2 threads, the group form against rows 8 steps ahead
// (Zen 5 VM, 2026-12-04, alternating pairs): 4096x12288 (196 KB groups)
// median 1.35x over eight pairs (1.06-1.53) and 1.03-1.09x over four more;
// 12288x4096 (64 KB) 1.03x and 0.98x (mixed, so it keeps the group form);
// at 48 KB (1024x3072) and 16 KB the group form was the faster one (37-45
// against 34-37 GB/s; q8 tg128 on the 0.6B file 0.83-0.88x in five of six
// pairs). 4, 8 and 12 steps on one thread: 8 the best or near it.
constexpr uint64_t kQ8GroupAheadBytes = 96 * 1024;
constexpr uint64_t kQ8RowStepsAhead = 8;
// Rows 0..R-1 (R <= 16) against K tokens (token t: codes xq + 32*nb*t,
// block offsets off + nb*t, scales xd + nb*t), y + t*ldy. The loops over
// tokens are unrolled by pragma so the accumulators stay in registers.
template <int K>
void q8_rows16(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *off,
               const float *xd, uint64_t n, uint64_t nb, uint64_t R, bool first, uint64_t next_rows, float *y,
               uint64_t ldy) {
    __m512 acc[K];
#pragma GCC unroll 8
    for (int t = 0; t < K; ++t) acc[t] = _mm512_setzero_ps();
    __m512i T[16];
    const uint64_t whole = n / 64;
    // The next group's rows of this call (next_rows * ld bytes, contiguous)
    // are prefetched a share per chunk, so they arrive one group ahead;
    // nothing past the call's rows (another thread's, or past the tensor).
    // A group larger than L1 would push its own prefetched lines out before
    // their turn: there each row's line kQ8RowStepsAhead steps on is asked
    // for instead, running into the next group's rows at the end.
    const char *next = reinterpret_cast<const char *>(w + 16 * ld);
    const uint64_t next_bytes = next_rows * ld, share = whole == 0 ? 0 : (next_bytes / whole + 63) / 64 * 64;
    const bool by_row = 16 * ld > kQ8GroupAheadBytes;
    if (by_row && first)  // the group's first steps, which no group before it asked for
        for (uint64_t i = 0; i < R; ++i)
            for (uint64_t c = 0; c < std::min(kQ8RowStepsAhead, whole); ++c)
                _mm_prefetch(reinterpret_cast<const char *>(w + i * ld + 64 * c), _MM_HINT_T0);
    for (uint64_t c = 0; c < whole; ++c) {
        if (by_row) {
            const uint64_t ahead = c + kQ8RowStepsAhead;
            for (uint64_t i = 0; i < 16; ++i) {
                if (ahead < whole) {
                    if (i < R) _mm_prefetch(reinterpret_cast<const char *>(w + i * ld + 64 * ahead), _MM_HINT_T0);
                } else if (i < next_rows && ahead - whole < whole) {
                    _mm_prefetch(next + i * ld + 64 * (ahead - whole), _MM_HINT_T0);
                }
            }
        } else {
            for (uint64_t p = c * share, e = std::min(next_bytes, p + share); p < e; p += 64)
                _mm_prefetch(next + p, _MM_HINT_T0);
            if (first)  // no group before it prefetched this one: each row's stream ahead
                for (uint64_t i = 0; i < R; ++i) prefetch_ahead(w + i * ld + 64 * c);
        }
        q8_tile(w, ld, R, 64 * c, ~__mmask64{0}, T);
#pragma GCC unroll 8
        for (int t = 0; t < K; ++t) {
            const uint64_t b = 2 * c + nb * uint64_t(t);  // token t's block 2c
            acc[t] = q8_block(T, xq + 32 * b, off[b], xd[b], acc[t]);
            acc[t] = q8_block(T + 8, xq + 32 * b + 32, off[b + 1], xd[b + 1], acc[t]);
        }
    }
    if (64 * whole < n) {  // 1..63 columns: one or two blocks, x zero-padded to the block
        const uint64_t left = n - 64 * whole, c = whole;
        q8_tile(w, ld, R, 64 * c, (uint64_t{1} << left) - 1, T);
#pragma GCC unroll 8
        for (int t = 0; t < K; ++t) {
            const uint64_t b = 2 * c + nb * uint64_t(t);
            acc[t] = q8_block(T, xq + 32 * b, off[b], xd[b], acc[t]);
            if (left > 32) acc[t] = q8_block(T + 8, xq + 32 * b + 32, off[b + 1], xd[b + 1], acc[t]);
        }
    }
    const __mmask16 rows = __mmask16((1u << R) - 1);
    const __m512 s = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_maskz_loadu_epi16(rows, f16_scales));
#pragma GCC unroll 8
    for (int t = 0; t < K; ++t) _mm512_mask_storeu_ps(y + uint64_t(t) * ldy, rows, _mm512_mul_ps(s, acc[t]));
}

}  // namespace

void rows_i8_xq(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                const float *xd, uint64_t n, uint64_t rows, float *y) {
    rows_i8_xq_batch(w, ld, f16_scales, xq, xboff, xd, n, rows, 1, y, 0);
}

// Tokens in groups of at most 8 (8 accumulators beside the 16 transposed
// words), as even as k allows, each 16-row group meeting every token group
// in turn: its rows are read from memory once (the first token group's
// pass prefetches the next row group), the later passes find them in L1.
void rows_i8_xq_batch(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                      const float *xd, uint64_t n, uint64_t rows, uint64_t k, float *y, uint64_t ldy) {
    const uint64_t nb = x_blocks(n);
    for (uint64_t r = 0; r < rows; r += 16) {
        const uint64_t R = std::min<uint64_t>(16, rows - r), next = rows - r > 16 ? std::min<uint64_t>(16, rows - r - 16) : 0;
        const int8_t *wr = w + r * ld;
        const uint8_t *sr = f16_scales + 2 * r;
        for (uint64_t t0 = 0; t0 < k;) {
            const uint64_t groups = (k - t0 + 7) / 8, g = (k - t0 + groups - 1) / groups;
            const int8_t *q = xq + t0 * 32 * nb;
            const int32_t *o = xboff + t0 * nb;
            const float *d = xd + t0 * nb;
            float *yt = y + t0 * ldy + r;
            // Only the first token group's pass reads the rows from memory.
            const bool first = t0 == 0 && r == 0;
            const uint64_t nx = t0 == 0 ? next : 0;
            switch (g) {
            case 1: q8_rows16<1>(wr, ld, sr, q, o, d, n, nb, R, first, nx, yt, ldy); break;
            case 2: q8_rows16<2>(wr, ld, sr, q, o, d, n, nb, R, first, nx, yt, ldy); break;
            case 3: q8_rows16<3>(wr, ld, sr, q, o, d, n, nb, R, first, nx, yt, ldy); break;
            case 4: q8_rows16<4>(wr, ld, sr, q, o, d, n, nb, R, first, nx, yt, ldy); break;
            case 5: q8_rows16<5>(wr, ld, sr, q, o, d, n, nb, R, first, nx, yt, ldy); break;
            case 6: q8_rows16<6>(wr, ld, sr, q, o, d, n, nb, R, first, nx, yt, ldy); break;
            case 7: q8_rows16<7>(wr, ld, sr, q, o, d, n, nb, R, first, nx, yt, ldy); break;
            default: q8_rows16<8>(wr, ld, sr, q, o, d, n, nb, R, first, nx, yt, ldy); break;
            }
            t0 += g;
        }
    }
}
#else
void rows_i8_xq(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *,
                const float *xd, uint64_t n, uint64_t rows, float *y) {
    rows4(rows, y, [&](uint64_t r) {
        return _mm256_mul_ps(_mm256_set1_ps(f16_scalar(f16_scales + 2 * r)), i8_acc(w + r * ld, xq, xd, n));
    });
}

// The single-token kernel per token (a k-token AVX2 form would hold the
// accumulators of three tokens in its 16 ymm registers: not written).
void rows_i8_xq_batch(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                      const float *xd, uint64_t n, uint64_t rows, uint64_t k, float *y, uint64_t ldy) {
    i8_tiles_per_token<&rows_i8_xq>(w, ld, f16_scales, xq, xboff, xd, n, rows, k, y, ldy);
}
#endif

namespace {
// 32 unsigned q4 codes (0..15) in q4_pairs order from 16 nibble bytes: the
// bytes in both lanes, the upper lane shifted down a nibble, then masked.
// (Only the unpaired last group of a q4 row takes this path.)
inline __m256i q4_codes_u(const uint8_t *nib) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(nib)));
    return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
}
// 32 q2 codes doubled (2c: 0, 2, 4, 6) in q2_quads order from 8 bytes: lane j
// holds bits [2j, 2j+2) of each byte. (Shifting the word left first to land
// on 2c directly would lose its top bit.)
inline __m256i q2_codes_2u(const uint8_t *chunk) {
    uint64_t v;
    std::memcpy(&v, chunk, 8);
    __m256i c = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<long long>(v)), _mm256_setr_epi64x(0, 2, 4, 6)),
                                 _mm256_set1_epi8(3));
    return _mm256_add_epi8(c, c);
}

// acc + s * <codes - Bias, x> for one 32-block, where the codes are unsigned
// bytes (so vpmaddubsw takes them as they are, without the two sign fix-ups
// a signed pair needs) and the bias comes off in int16:
// maddubs(codes, x) - maddubs(Bias, x), exact (pair sums stay under 2^15:
// at most 2*15*127).
template <int Bias>
inline __m256i biased_isum(__m256i codes, __m256i x) {
    __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(codes, x), _mm256_maddubs_epi16(_mm256_set1_epi8(Bias), x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
template <int Bias>
inline __m256 biased_step(__m256i codes, __m256i x, __m256 s, __m256 acc) {
    return _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(biased_isum<Bias>(codes, x)), acc);
}
// sum over groups of sx[g] * isum(g), isum(g) a group's int32 lane sums; sx[g]
// is the group's weight scale times x's block scale. Four accumulators: one
// FMA chain per group would run at the FMA latency.
template <class ISum>
inline float groups_dot(uint64_t groups, const float *sx, ISum isum) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    auto step = [&](uint64_t g, __m256 &a) { a = _mm256_fmadd_ps(_mm256_broadcast_ss(sx + g), _mm256_cvtepi32_ps(isum(g)), a); };
    uint64_t g = 0;
    for (; g + 4 <= groups; g += 4) {
        step(g, acc[0]);
        step(g + 1, acc[1]);
        step(g + 2, acc[2]);
        step(g + 3, acc[3]);
    }
    for (; g < groups; ++g) step(g, acc[0]);
    return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}
// groups_dot of <codes(g) - Bias, xq block g>.
template <int Bias, class Codes>
inline float biased_dot(uint64_t groups, const int8_t *xq, const float *sx, Codes codes) {
    return groups_dot(groups, sx, [&](uint64_t g) { return biased_isum<Bias>(codes(g), load32(xq + 32 * g)); });
}

// Runs `dot(g0, n, sx)` over the groups in slices of kSlice, with sx[i] =
// scale(g0 + i) * xd[g0 + i] filled first by `fill(g0, n, sx)`: the scale
// products come out of the dot's loop, where they were a scalar chain per
// group (q2; the q4 pair loop makes its products in registers instead).
constexpr uint64_t kSlice = 256;
// The sum is a float, or (for the row-range kernels) a vector of 8 partial sums.
template <class Fill, class Dot>
inline auto sliced(uint64_t groups, Fill fill, Dot dot) {
    alignas(32) float sx[kSlice];
    decltype(dot(0, 0, sx)) acc{};
    for (uint64_t g0 = 0; g0 < groups; g0 += kSlice) {
        uint64_t n = std::min(kSlice, groups - g0);
        fill(g0, n, sx);
        acc = acc + dot(g0, n, sx);
    }
    return acc;
}
inline void fill_f32_scales(const float *scales, const float *xd, uint64_t n, float *sx) {
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_store_ps(sx + i, _mm256_mul_ps(_mm256_loadu_ps(scales + i), _mm256_loadu_ps(xd + i)));
    for (; i < n; ++i) sx[i] = scales[i] * xd[i];
}

// q4 weights have their own prefetch distance: a q4 byte takes longer to
// compute than a q8 byte, so on AMD 1 KiB ahead no longer covers the memory
// latency. q4 tg64 on the 0.6B q4_block file, 2 threads, 2 MiB pages,
// medians of 6-8 alternating runs in three rounds (EPYC Zen 3, 19:00-19:05
// UTC, idle): 1 KiB ahead 39.6 / - / 42.0 tok/s, 2 KiB 45.4 / 46.0 / 41.3,
// 3 KiB - / 49.5 / 44.4, 4 KiB 43.2 / - / 45.8; 1 thread 31.4 (1 KiB) vs
// 36.6 (3 KiB). On the Intel VM 3 KiB is as good as any (cmf/cpu_features.hpp).
const long kQ4PrefetchAhead = prefetch_ahead_q4();
// ... and their own hint (prefetch_weights, which q2tp's and vbit_ro's
// rows take too): non-temporal on AMD with AVX-512, else into L1
// (cmf/cpu_features.hpp has the measurements). A template parameter of the
// kernels, chosen once per call: with a run-time test beside each prefetch
// the q4 kernels ran slower than with either hint fixed (q4_tiled decode
// 31 against 51 tok/s on the 0.6B file).
const bool kWeightsNta = prefetch_weights_nta();
template <bool Nta>
__attribute__((always_inline)) inline void prefetch_weights(const uint8_t *p) {
    if constexpr (Nta) _mm_prefetch(reinterpret_cast<const char *>(p), _MM_HINT_NTA);
    else _mm_prefetch(reinterpret_cast<const char *>(p), _MM_HINT_T0);
}

// q4 rows against a q4_pair_blocks x, two groups (A = 2k, B = 2k+1) per step:
// one 32-byte load holds both groups' nibbles (tiled: two 16-byte loads,
// vinserti128); masked it is [A lo codes | B lo codes], shifted a nibble
// [A hi | B hi], which the pair's x bytes [A lo | B lo], [A hi | B hi] meet
// lane for lane, so maddubs(lo, x0) + maddubs(hi, x1) holds A's pair sums in
// the low lane and B's in the high one (int16, at most 2*2*15*127 = 7620),
// vpmaddwd widens them to int32 lanes of 4+4 bytes, and the offset -8 comes
// on as the precomputed q4_pair_offset (x only, int32, exact). With AVX-512
// VNNI two vpdpbusd do all of that. Then cvt and one FMA with [sA x4 | sB x4],
// permuted in registers from one load of 8 groups' scale products per 4
// pairs, so a pair costs four 256-bit loads (nibbles, the two x halves, the
// offset; the old form took six per two groups). An odd last group takes the
// single-group step.
// Each group's integer sum is the same as before; only the f32 summation
// order changed.
// Against the per-group form (broadcast 16 B, srlv + and, two vpmaddubsw with
// the bias recomputed per row, three loads per group), measured on this
// machine (2-core EPYC Zen 3, AVX2), old and new kernels linked into one
// /tmp harness and run interleaved (16:00-16:20 UTC, other jobs running):
//  - L2-resident, 256 rows x 1024 columns, fastest of 3000 passes, TSC ticks
//    per row: split (q4_block) 105-108 -> 85-86, groups (q4tp) 105-108 ->
//    85-86, tiled 115-118 -> 107-108. In a slower state of the machine (all
//    figures ~25 % up) split 134 -> 113, tiled 148 -> 150: the tiled pair's
//    two 16-byte loads (a quarter of them split across lines) and its
//    strided scale gather keep most of the old cost.
//  - Streaming 151936 rows x 1024 (87 MB) from DRAM on 2 threads, median of
//    24 alternating passes: split 15.2-15.3 -> 15.5-16.4 GB/s; tiled 12.5-13.9
//    -> 12.7-13.4 GB/s (the same within the noise): at ~180 ticks per row the
//    stream is memory-bound either way.
// Group g's 16 nibble bytes are at nib + Stride*g (16: split q4_block and
// q4tp; 18: q4_tiled tiles, past their scale). scales8(r, g) gives row r's eight
// products weight scale x x block scale of groups g..g+7 as one register,
// scale1(r, g) one of them: made where the pair loop needs them rather than
// filled into a buffer first (sliced), which at 1024 columns (16 pairs a
// row) took a quarter of a row's time in fixed per-row work.
template <uint64_t Stride>
__attribute__((always_inline)) inline __m256i q4_pair_load(const uint8_t *w) {
    __m256i v;
    if constexpr (Stride == 16)
        v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(w));
    else
        v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(w))),
                                    _mm_loadu_si128(reinterpret_cast<const __m128i *>(w + Stride)), 1);
    // Keeps v in a register: GCC otherwise folds a second load of w
    // into the mask's vpand (one more load per pair).
    __asm__("" : "+x"(v));
    return v;
}
// One pair's int32 lane sums: v's low and high nibbles against the pair's
// two x halves, plus the offset o.
__attribute__((always_inline)) inline __m256i q4_pair_isum(__m256i v, __m256i x0, __m256i x1, __m256i o) {
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
#ifdef CMF_CODECS_VNNI
    // vpdpbusd: unsigned codes x signed x, four bytes per int32 lane,
    // added to the lane's offset: the same integer sums, in 3 ops.
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(o, lo, x0), hi, x1);
#else
    return _mm256_add_epi32(
        _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1)),
                          _mm256_set1_epi16(1)),
        o);
#endif
}
// R rows (row r's nibbles at nib + r*ld) in one pass over x: out[r] = row
// r as 8 partial sums. Each row takes the same operations in the same order
// whatever R is, so its bits do not depend on the rows beside it; what R > 1
// shares is x, its offsets and the loop. scales8(r, g) / scale1(r, g) are
// row r's products for groups g..g+7 / group g.
// Four rows per pass against one (AVX-512 VNNI build, 512x1024 L2-resident
// matrix, one thread, a /tmp harness with both forms linked in, 3 rounds of
// 400 alternating passes, 14:3x UTC): median 16.7-26.3 -> 18.8-28.1 GB/s,
// best 26.7-27.8 -> 29.3-29.6; 2048x1024 21.9-22.5 -> 25.4 (+13-16 %). Two
// rows per pass: no difference. In the model (0.6B q4 file, tg128, 2
// threads, --profile, 6 alternating rounds): every matmul faster in every
// round (gate+up 19.4-20.7 -> 19.7-22.7 GB/s, the head 21.0-22.8 -> 22.3-26.1),
// tg128 54.4-59.3 -> 54.7-64.2 tok/s.
// With R rows in flight, each row's stream is prefetched as far ahead as the
// same place R rows on (the next pass's row), at least the usual distance:
// with the usual 3 KiB alone, a row of 3072 columns (1.5 KiB of nibbles)
// prefetched into the middle of the pass after next, and down_proj went
// from 17.8-18.9 to 14.5-15.4 GB/s in the model (4 rounds).
// (Measured before the q4 streams were prefetched into L2; since then a
// range read from memory runs one row per pass, see q4_rows4.)
#ifdef CMF_CODECS_VNNI
constexpr bool kQ4Zmm = true;
// The AVX-512 form of the loop below for 16-byte strides (q4_block, q4tp):
// two pairs per 512-bit step. The 64 nibble bytes of pairs k, k+1 masked
// are [kA lo | kB lo | k1A lo | k1B lo] codes, shifted a nibble the hi
// codes; the x halves they meet are 128-bit lanes 0,1 of pair k's and pair
// k+1's 64 x bytes (and lanes 2,3 for hi), one lane shuffle each, made once
// per step for all R rows; the offsets of both pairs are one 64-byte load.
// int32 lane sums are the same integers as the 256-bit form's; the f32 sums
// are taken in another order (16 lanes, two accumulators per row).
// (GCC 12 flags the plain forms of several AVX-512 intrinsics as reading an
// uninitialized value, -Wuninitialized: the zero-masked forms with a full
// mask are the same instructions without that.)
// The loops over the R rows are unrolled by pragma (here and in the 256-bit
// form below): GCC 12 otherwise left the accumulators in a stack array
// that the row loop loaded and stored (--gemm 1024x1024 --pp 1, one thread,
// L2-resident: q4 24.1-24.5 -> 30.3-31.9 GB/s, q4tp 22 -> 24.7-24.8 in two
// of three pairs; streamed from memory it is the stream that bounds, and
// 2 threads read 2-4 % more).
// A row's pairs from k on (fewer than a 512-bit step's four) and an odd
// last group, one 256-bit pair at a time, scale1(g) being group g's scale
// product; then the row as 8 partial sums: acc's two accumulators' halves
// added, plus those.
template <uint64_t Stride, int Bias, class Scale1>
__attribute__((always_inline)) inline __m256 q4_pair_rest_zmm(const uint8_t *nb, const int8_t *x, const int32_t *off,
                                                              uint64_t k, uint64_t groups, Scale1 scale1,
                                                              const __m512 *acc) {
    __m256 rest = _mm256_setzero_ps();
    for (uint64_t kk = k; kk < groups / 2; ++kk) {
        const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(off + 8 * kk));
        const __m256i p = q4_pair_isum(q4_pair_load<Stride>(nb + 2 * Stride * kk), load32(x + 64 * kk),
                                       load32(x + 64 * kk + 32), o);
        const __m256 s = _mm256_set_m128(_mm_set1_ps(scale1(2 * kk + 1)), _mm_set1_ps(scale1(2 * kk)));
        rest = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), rest);
    }
    if (groups % 2) {  // the unpaired last group, its x block in q4_pairs order
        const uint64_t g = groups - 1;
        rest = biased_step<Bias>(q4_codes_u(nb + Stride * g), load32(x + 32 * g), _mm256_set1_ps(scale1(g)), rest);
    }
    const __m512d a = _mm512_castps_pd(_mm512_add_ps(acc[0], acc[1]));
    return _mm256_add_ps(_mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, a, 0)),
                                       _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, a, 1))),
                         rest);
}
// Four groups' 16 nibble bytes, groups Stride bytes apart, as one register
// in group order (16: one load; 18, q4_tiled: four, three of them inserted).
template <uint64_t Stride>
__attribute__((always_inline)) inline __m512i q4_quad_load(const uint8_t *w) {
    __m512i v;
    if constexpr (Stride == 16) {
        v = _mm512_loadu_si512(w);
    } else {
        auto q = [&](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i *>(w + Stride * i)); };
        v = _mm512_maskz_inserti32x4(0xFFFF, _mm512_zextsi128_si512(q(0)), q(1), 1);
        v = _mm512_maskz_inserti32x4(0xFFFF, v, q(2), 2);
        v = _mm512_maskz_inserti32x4(0xFFFF, v, q(3), 3);
    }
    __asm__("" : "+v"(v));  // one load each, kept in a register (see q4_pair_load)
    return v;
}
// What pairs kk, kk+1 of x give every row of a 512-bit step: the low and
// high 128-bit halves of each pair's 64 x bytes side by side (for the low
// and the high nibbles) and the two pairs' offsets.
struct Q4QuadX {
    __m512i lo, hi, off;
};
__attribute__((always_inline)) inline Q4QuadX q4_quad_x(const int8_t *x, const int32_t *off, uint64_t kk) {
    const __m512i x0 = _mm512_loadu_si512(x + 64 * kk), x1 = _mm512_loadu_si512(x + 64 * kk + 64);
    return {_mm512_maskz_shuffle_i64x2(0xFF, x0, x1, _MM_SHUFFLE(1, 0, 1, 0)),
            _mm512_maskz_shuffle_i64x2(0xFF, x0, x1, _MM_SHUFFLE(3, 2, 3, 2)), _mm512_loadu_si512(off + 8 * kk)};
}
// x's pair halves as the 512-bit pair loop meets them: for every even kk,
// q4_quad_x(x, off, kk)'s lo and hi at xt + 64*kk and xt + 64*kk + 64 (as
// many bytes as x's whole pairs of pairs), made once per row range
// (Q4XTable). One row a pass (a range read from memory, q4_rows4, and
// q4tp's fused loop), the loop made them anew for every row: 2 lane
// shuffles per 4 groups of ~11 vector operations.
inline void q4_x_table(const int8_t *x, const int32_t *off, uint64_t pairs, int8_t *xt) {
    for (uint64_t kk = 0; kk + 2 <= pairs; kk += 2) {
        const Q4QuadX q = q4_quad_x(x, off, kk);
        _mm512_storeu_si512(xt + 64 * kk, q.lo);
        _mm512_storeu_si512(xt + 64 * kk + 64, q.hi);
    }
}
// q4_quad_x(x, off, kk) from q4_x_table's xt (kk even).
__attribute__((always_inline)) inline Q4QuadX q4_quad_xt(const int8_t *xt, const int32_t *off, uint64_t kk) {
    return {_mm512_loadu_si512(xt + 64 * kk), _mm512_loadu_si512(xt + 64 * kk + 64), _mm512_loadu_si512(off + 8 * kk)};
}
// The int32 lane sums of four groups' nibbles v (q4_quad_load) against them.
__attribute__((always_inline)) inline __m512i q4_quad_isum(__m512i v, const Q4QuadX &xq, __m512i low4) {
    const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xq.off, lo, xq.lo), hi, xq.hi);
}
// xt: q4_x_table of x.
template <int R, bool Nta, uint64_t Stride, int Bias, class Scales8, class Scale1>
__attribute__((always_inline)) inline void q4_pair_acc_rows_zmm(const uint8_t *nib, uint64_t ld, const int8_t *x,
                                                                const int8_t *xt, const int32_t *off, uint64_t groups,
                                                                Scales8 scales8, Scale1 scale1, __m256 *out) {
    __m512 acc[R][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(15);
    // [s(g) x4 | s(g+1) x4 | s(g+2) x4 | s(g+3) x4] for g = 4j of 8 products broadcast to both halves.
    const __m512i sel[2] = {_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                            _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
    const uint64_t pairs = groups / 2;
    uint64_t k = 0;
    for (; k + 4 <= pairs; k += 4) {
        __m512 s8[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            // A line per 64 B of the 4 pairs' bytes (split 128 B: 2 lines; tiled 144 B: 3).
            for (uint64_t o = 0; o < 8 * Stride; o += 64)
                prefetch_weights<Nta>(nib + r * ld + 2 * Stride * k + o +
                                (R > 1 ? std::max(long(R * ld), kQ4PrefetchAhead) : kQ4PrefetchAhead));
            s8[r] = _mm512_castpd_ps(_mm512_maskz_broadcast_f64x4(0xFF, _mm256_castps_pd(scales8(r, 2 * k))));
        }
#pragma GCC unroll 2
        for (int j = 0; j < 2; ++j) {
            const uint64_t kk = k + 2 * j;
            const Q4QuadX xq = q4_quad_xt(xt, off, kk);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                const __m512i p = q4_quad_isum(q4_quad_load<Stride>(nib + r * ld + 2 * Stride * kk), xq, low4);
                acc[r][j] = _mm512_fmadd_ps(_mm512_maskz_permutexvar_ps(0xFFFF, sel[j], s8[r]), _mm512_maskz_cvtepi32_ps(0xFFFF, p),
                                            acc[r][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
        out[r] = q4_pair_rest_zmm<Stride, Bias>(nib + r * ld, x, off, k, groups, [&](uint64_t g) { return scale1(r, g); },
                                          acc[r]);
}
#endif

// xt: q4_x_table of x in the AVX-512 VNNI build (Q4XTable), else unused.
template <int R, bool Nta, uint64_t Stride, int Bias = 8, class Scales8, class Scale1>
__attribute__((always_inline)) inline void q4_pair_acc_rows(const uint8_t *nib, uint64_t ld, const int8_t *x,
                                                            [[maybe_unused]] const int8_t *xt, const int32_t *off,
                                                            uint64_t groups, Scales8 scales8, Scale1 scale1,
                                                            __m256 *out) {
#ifdef CMF_CODECS_VNNI
    if (kQ4Zmm) return q4_pair_acc_rows_zmm<R, Nta, Stride, Bias>(nib, ld, x, xt, off, groups, scales8, scale1, out);
#endif
    __m256 acc[R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
    // sA x4 | sB x4 for the pair whose products sit in lanes j, j+1 of an 8-float register.
    auto pair_scales = [](__m256 s8, int j) {
        return _mm256_permutevar8x32_ps(s8, _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1));
    };
    const uint64_t pairs = groups / 2;
    uint64_t k = 0;
    for (; k + 4 <= pairs; k += 4) {
        __m256 s8[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            // A line per 64 B of the 4 pairs' bytes (split 128 B: 2 lines; tiled 144 B: 3).
            for (uint64_t o = 0; o < 8 * Stride; o += 64)
                prefetch_weights<Nta>(nib + r * ld + 2 * Stride * k + o +
                                (R > 1 ? std::max(long(R * ld), kQ4PrefetchAhead) : kQ4PrefetchAhead));
            s8[r] = scales8(r, 2 * k);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(off + 8 * (k + j)));
            const __m256i x0 = load32(x + 64 * (k + j)), x1 = load32(x + 64 * (k + j) + 32);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                const __m256i p = q4_pair_isum(q4_pair_load<Stride>(nib + r * ld + 2 * Stride * (k + j)), x0, x1, o);
                acc[r][j] = _mm256_fmadd_ps(pair_scales(s8[r], 2 * j), _mm256_cvtepi32_ps(p), acc[r][j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        const uint8_t *nb = nib + r * ld;
        for (uint64_t kk = k; kk < pairs; ++kk) {
            const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(off + 8 * kk));
            const __m256i p = q4_pair_isum(q4_pair_load<Stride>(nb + 2 * Stride * kk), load32(x + 64 * kk),
                                           load32(x + 64 * kk + 32), o);
            const __m256 s = _mm256_set_m128(_mm_set1_ps(scale1(r, 2 * kk + 1)), _mm_set1_ps(scale1(r, 2 * kk)));
            acc[r][kk % 4] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[r][kk % 4]);
        }
        if (groups % 2) {  // the unpaired last group, its x block in q4_pairs order
            const uint64_t g = groups - 1;
            acc[r][3] = biased_step<Bias>(q4_codes_u(nb + Stride * g), load32(x + 32 * g), _mm256_set1_ps(scale1(r, g)),
                                       acc[r][3]);
        }
        out[r] = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
    }
}
// How many rows a q4 row-range kernel runs per pass: four rows' 16
// accumulators need the 32 vector registers of AVX-512 (EVEX encodings of
// ymm16-31); the AVX2 build has 16 and keeps one row per pass.
#ifdef CMF_CODECS_VNNI
constexpr int kQ4Rows = 4;
#else
constexpr int kQ4Rows = 1;
#endif
// Eight f16 scales Stride bytes apart (2: a scale array; 18: q4_tiled
// tiles) widened and multiplied by x's block scales xd[0..8).
#ifdef CMF_CODECS_VNNI
// Words 0, 9, .., 63: the eight scales of 8 q4_tiled tiles in their first 128 bytes.
struct TileScaleWords {
    alignas(64) uint16_t idx[32];
    constexpr TileScaleWords() : idx() {
        for (int i = 0; i < 8; ++i) idx[i] = uint16_t(9 * i);
    }
};
constexpr TileScaleWords kTileScaleWords;
#endif
template <uint64_t Stride>
inline __m256 f16_scales8(const uint8_t *h, const float *xd) {
    __m128i v;
#ifdef CMF_CODECS_VNNI
    if constexpr (Stride == 18) {
        // One word permute over the tiles' 128 bytes (lines the nibble
        // loads read too), where eight word inserts made a chain of
        // dependent operations in front of every step's products.
        const __m512i w = _mm512_maskz_permutex2var_epi16(~__mmask32(0), _mm512_loadu_si512(h),
                                                          _mm512_load_si512(kTileScaleWords.idx),
                                                          _mm512_loadu_si512(h + 64));
        return _mm256_mul_ps(_mm256_cvtph_ps(_mm512_maskz_extracti32x4_epi32(0xF, w, 0)), _mm256_loadu_ps(xd));
    }
#endif
    if constexpr (Stride == 2) {
        v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(h));
    } else {  // eight strided f16 scales into one register
        v = _mm_setzero_si128();
        v = _mm_insert_epi16(v, load_u16(h), 0);
        v = _mm_insert_epi16(v, load_u16(h + Stride), 1);
        v = _mm_insert_epi16(v, load_u16(h + 2 * Stride), 2);
        v = _mm_insert_epi16(v, load_u16(h + 3 * Stride), 3);
        v = _mm_insert_epi16(v, load_u16(h + 4 * Stride), 4);
        v = _mm_insert_epi16(v, load_u16(h + 5 * Stride), 5);
        v = _mm_insert_epi16(v, load_u16(h + 6 * Stride), 6);
        v = _mm_insert_epi16(v, load_u16(h + 7 * Stride), 7);
    }
    return _mm256_mul_ps(_mm256_cvtph_ps(v), _mm256_loadu_ps(xd));
}
// R rows of each q4 layout (row r at r rows past the first) as 8 partial sums each.
template <int R, bool Nta = false>
inline void q4_tiled_rows(const uint8_t *tiles, const int8_t *xq, const int8_t *xt, const int32_t *xoff,
                          const float *xd, uint64_t groups, __m256 *out) {
    const uint64_t ld = 18 * groups;
    q4_pair_acc_rows<R, Nta, 18>(
        tiles + 2, ld, xq, xt, xoff, groups,
        [&](int r, uint64_t g) { return f16_scales8<18>(tiles + r * ld + 18 * g, xd + g); },
        [&](int r, uint64_t g) { return f16_scalar(tiles + r * ld + 18 * g) * xd[g]; }, out);
}
// Split rows: row r's nibbles at nibbles + nib_ld*r, its scales at
// f16_scales + scale_ld*r.
template <int R, bool Nta = false, int Bias = 8>
inline void q4_split_rows(const uint8_t *nibbles, uint64_t nib_ld, const uint8_t *f16_scales, uint64_t scale_ld,
                          const int8_t *xq, const int8_t *xt, const int32_t *xoff, const float *xd, uint64_t groups,
                          __m256 *out) {
    q4_pair_acc_rows<R, Nta, 16, Bias>(
        nibbles, nib_ld, xq, xt, xoff, groups,
        [&](int r, uint64_t g) { return f16_scales8<2>(f16_scales + scale_ld * r + 2 * g, xd + g); },
        [&](int r, uint64_t g) { return f16_scalar(f16_scales + scale_ld * r + 2 * g) * xd[g]; }, out);
}
template <int R, bool Nta = false>
inline void q4_groups_rows(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int8_t *xt,
                           const int32_t *xoff, const float *xd, uint64_t groups, __m256 *out) {
    q4_pair_acc_rows<R, Nta, 16>(
        nibbles, 16 * groups, xq, xt, xoff, groups,
        [&](int r, uint64_t g) { return _mm256_mul_ps(_mm256_loadu_ps(scales + groups * r + g), _mm256_loadu_ps(xd + g)); },
        [&](int r, uint64_t g) { return scales[groups * r + g] * xd[g]; }, out);
}
// body(nta) with nta the prefetch hint (prefetch_weights) as an
// std::bool_constant (one instance of the row-range kernels per hint).
template <class Body>
inline void with_weights_hint(Body body) {
    if (kWeightsNta) body(std::true_type{});
    else body(std::false_type{});
}
// How many rows ahead a q4 layout's second stream (q4_block's f16 scales,
// 2 bytes per group in an array of their own) is prefetched. The nibble
// streams are prefetched in the pair loop; the scales were not, and the
// hardware prefetcher did not keep up with them: every row's first scale
// load waited on memory. Prefetched 16, 32 or 64 rows ahead (the same
// within the noise): q4 tg128 on the 0.6B file, 2 threads, old and new
// plugins alternating (16:40-16:55 UTC 2026-12-03): with the read at 46
// GB/s 90-101 -> 90-98 tok/s (pairs -1..+8 %, median +2 %), in a phase
// reading 70 GB/s 116-121 -> 133-140 (+15 %, two pairs); the q4 MoE file
// (its experts' rows are 768 wide: one scale line per row) the same.
constexpr uint64_t kQ4SideRowsAhead = 32;
// rows4_quads over a q4 layout: run(r, R, out) fills out[0..R) with rows
// r..r+R-1 as 8 partial sums each, R an std::integral_constant: R rows per
// pass for the groups of four, one for the last 1-3 rows. side (nullable):
// a second per-row stream of side_row bytes a row, prefetched
// kQ4SideRowsAhead rows ahead, one line per 64 bytes (past the range's end
// too: a prefetch never faults).
template <int R, bool Nta, class Run>
inline void q4_rows_by(uint64_t rows, float *y, const uint8_t *side, uint64_t side_row, Run run) {
    rows4_quads(
        rows, y,
        [&](uint64_t r, __m256 *a) {
            if (side != nullptr)
                for (uint64_t b = 0; b < 4 * side_row; b += 64) prefetch_weights<Nta>(side + (r + kQ4SideRowsAhead) * side_row + b);
            for (int i = 0; i < 4; i += R) run(r + i, std::integral_constant<int, R>{}, a + i);
        },
        [&](uint64_t r) {
            __m256 a;
            run(r, std::integral_constant<int, 1>{}, &a);
            return a;
        });
}
// The q4 layouts' row ranges. A range longer than the batched path's 16-row
// tile is a one-token matmul reading its rows from memory: one row per
// pass, a single stream. Four rows per pass (kQ4Rows) share each x load
// and shuffle, which wins where the rows come from cache (a tile, read once
// for up to 15 tokens: one core, weights in L2, q4 57 -> 62 GB/s, q4tp
// 35 -> 40, q4_tiled 31 -> 35), but four streams interleaved from memory
// read slower: 151936 x 1024 q4 on 2 threads, three alternating pairs,
// 36.6-38.3 -> 44.5-48.9 GB/s with one row per pass; in the model (0.6B
// shape, tg128, 2 threads, alternating) q4 98-102 -> 122-145 tok/s, q4tp
// 100-102 -> 104-107, q4_tiled 110-116 -> 125-128, the q4 MoE file
// 154-156 -> 161-171 (docs/performance.md, history, 2026-12-03 16:27-17:40).
// A row's operations and their order do not depend on how many share its
// pass, so both give the same bits (the batched decode equals one token's).
constexpr uint64_t kQ4CachedRows = 16;
template <bool Nta, class Run>
inline void q4_rows4(uint64_t rows, float *y, const uint8_t *side, uint64_t side_row, Run run) {
    if (rows > kQ4CachedRows)
        q4_rows_by<1, Nta>(rows, y, side, side_row, run);
    else
        q4_rows_by<kQ4Rows, Nta>(rows, y, side, side_row, run);
}
// The x table a q4 row range (or dot) reads (q4_x_table), made in a
// thread's own room (thread_room) once per call; none in the 256-bit build.
struct Q4XTable {
    const int8_t *p = nullptr;
    Q4XTable([[maybe_unused]] const int8_t *x, [[maybe_unused]] const int32_t *off, [[maybe_unused]] uint64_t groups) {
#ifdef CMF_CODECS_VNNI
        int8_t *room = static_cast<int8_t *>(thread_room(RoomSlot::q4_x_table, 32 * groups));
        q4_x_table(x, off, groups / 2, room);
        p = room;
#endif
    }
};
// Ranges of the compute-bound layouts (q1, q2tp): kQ4Rows rows per pass,
// streamed or not (their arithmetic per byte, not the stream, bounds them).
template <class Run>
inline void q4_rows4(uint64_t rows, float *y, Run run) {
    q4_rows_by<kQ4Rows, false>(rows, y, nullptr, 0, run);
}
}  // namespace

float dot_q4_tiled_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd,
                      uint64_t groups) {
    __m256 a;
    const Q4XTable xt(xq, xoff, groups);
    q4_tiled_rows<1>(tiles, xq, xt.p, xoff, xd, groups, &a);
    return hsum(a);
}

float dot_q4_split_xq(const uint8_t *nibbles, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xoff,
                      const float *xd, uint64_t groups) {
    __m256 a;
    const Q4XTable xt(xq, xoff, groups);
    q4_split_rows<1>(nibbles, 16 * groups, f16_scales, 2 * groups, xq, xt.p, xoff, xd, groups, &a);
    return hsum(a);
}

float dot_q4_groups_xq(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups) {
    __m256 a;
    const Q4XTable xt(xq, xoff, groups);
    q4_groups_rows<1>(nibbles, scales, xq, xt.p, xoff, xd, groups, &a);
    return hsum(a);
}

void rows_q4_tiled_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                      uint64_t rows, float *y) {
    const Q4XTable xt(xq, xoff, groups);
    with_weights_hint([&](auto nta) {
        q4_rows4<decltype(nta)::value>(rows, y, nullptr, 0, [&](uint64_t q, auto rn, __m256 *o) {
            q4_tiled_rows<decltype(rn)::value, decltype(nta)::value>(tiles + 18 * groups * q, xq, xt.p, xoff, xd, groups,
                                                                     o);
        });
    });
}

void rows_q4_split_xq(const uint8_t *nibbles, uint64_t nib_ld, const uint8_t *f16_scales, uint64_t scale_ld,
                      const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows, float *y) {
    const Q4XTable xt(xq, xoff, groups);
    // The scales are a stream of their own (q4_block) unless they sit in
    // the rows (q4_rows: equal strides), where the rows' stream brings them.
    const uint8_t *side = scale_ld == nib_ld ? nullptr : f16_scales;
    with_weights_hint([&](auto nta) {
        q4_rows4<decltype(nta)::value>(rows, y, side, scale_ld, [&](uint64_t q, auto rn, __m256 *o) {
            q4_split_rows<decltype(rn)::value, decltype(nta)::value>(nibbles + nib_ld * q, nib_ld, f16_scales + scale_ld * q,
                                                                    scale_ld, xq, xt.p, xoff, xd, groups, o);
        });
    });
}

void q4_pair_x_table([[maybe_unused]] const int8_t *xq, [[maybe_unused]] const int32_t *xoff,
                     [[maybe_unused]] uint64_t groups, [[maybe_unused]] int8_t *xt) {
#ifdef CMF_CODECS_VNNI
    q4_x_table(xq, xoff, groups / 2, xt);
#endif
}

// vbit_ro rows of width 4 whose codes follow one another, rows [0, rows)
// from codes on: q4_block's split layout with the nibbles swapped, met by an
// x whose block halves are swapped to match (kernels.hpp, vbit4_x), and a
// bias of 7, run as q4_rows4 runs q4_block's rows (its scales, a stream of
// their own, prefetched as q4_block's).
template <bool Nta>
__attribute__((always_inline)) inline void vbit4_rows(const uint8_t *codes, const uint8_t *f16_scales, const VbitRowsX &vx,
                                                      const float *xd, uint64_t groups, uint64_t rows, float *y) {
    q4_rows4<Nta>(rows, y, f16_scales, 2 * groups, [&](uint64_t q, auto rn, __m256 *o) {
        q4_split_rows<decltype(rn)::value, Nta, 7>(codes + 16 * groups * q, 16 * groups, f16_scales + 2 * groups * q,
                                                   2 * groups, vx.x4, vx.xt4, vx.off4, xd, groups, o);
    });
}
// The end of the run of 4-bit rows from row r (r's width 4): the rows after
// it of width 4 whose codes follow their predecessor's.
inline uint64_t vbit4_run_end(const uint8_t *const *codes, const uint8_t *widths, uint64_t r, uint64_t rows,
                              uint64_t groups) {
    uint64_t e = r + 1;
    while (e < rows && widths[e] == 4 && codes[e] == codes[e - 1] + 16 * groups) ++e;
    return e;
}

void rows_q4_groups_xq(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups, uint64_t rows, float *y) {
    const Q4XTable xt(xq, xoff, groups);
    with_weights_hint([&](auto nta) {
        q4_rows4<decltype(nta)::value>(rows, y, nullptr, 0, [&](uint64_t q, auto rn, __m256 *o) {
            q4_groups_rows<decltype(rn)::value, decltype(nta)::value>(nibbles + 16 * groups * q, scales + groups * q, xq,
                                                                     xt.p, xoff, xd, groups, o);
        });
    });
}


namespace {
// q1 rows against a natural-order x (rows_q1_xq). A group's int32 lanes are
// the sums of (2b-1)*q over 4 consecutive elements (lane j: elements
// 4j..4j+3), the same integers in every form; a group then adds
// s * d[g] * lane to 8 f32 lanes.
#ifdef CMF_CODECS_VNNI
// vpdpbusd of the bits as bytes 2b (a zero-masked move of 2s under the
// group's 32 bits as a k-mask) against x, started at the negated sums of
// 4 codes (xoff / 128): 2*sum(b*q) - sum(q) = sum((2b-1)*q), one operation
// per 32 weights where the f32 form it replaced took two 64-byte x loads,
// two masked sign flips and an add. 16 groups (96 bytes, 1.5 lines) per
// step: their 16 f16 scales picked from the tiles by one word permute,
// widened and multiplied by x's block scales once per row and step, then
// spread to [s(2j) x8 | s(2j+1) x8] per pair of groups. R rows share each
// x load; each row takes the same operations in the same order whatever R
// is (rows4_quads' contract).
template <int R>
__attribute__((always_inline)) inline void q1_acc_rows(const uint8_t *tiles, uint64_t ld, const int8_t *xq,
                                                       const int32_t *xoff, const float *xd, uint64_t groups,
                                                       __m256 *out) {
    alignas(64) static constexpr uint16_t kScaleWords[32] = {0,  3,  6,  9,  12, 15, 18, 21, 24, 27, 30,
                                                             33, 36, 39, 42, 45};
    const __m512i scale_words = _mm512_load_si512(kScaleWords);
    const __m512i twos = _mm512_set1_epi8(2);
    const __m512i pair0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const long ahead = R > 1 ? std::max(long(R * ld), kPrefetchAhead) : kPrefetchAhead;
    __m512 acc[R][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    uint64_t g0 = 0;
    for (; g0 + 16 <= groups; g0 += 16) {
        __m512 sc[R];
        const __m512 xd16 = _mm512_loadu_ps(xd + g0);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const uint8_t *t = tiles + r * ld + 6 * g0;
            _mm_prefetch(reinterpret_cast<const char *>(t + ahead), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char *>(t + ahead + 64), _MM_HINT_T0);
            const __m512i lo = _mm512_loadu_si512(t);
            const __m512i hi = _mm512_maskz_loadu_epi64(0x0F, t + 64);  // bytes 64..95, the 16th tile's end
            const __m256i h = _mm512_maskz_extracti64x4_epi64(0xF, _mm512_permutex2var_epi16(lo, scale_words, hi), 0);
            sc[r] = _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xFFFF, h), xd16);
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const uint64_t g = g0 + 2 * j;
            const __m512i xv = _mm512_loadu_si512(xq + 32 * g);
            const __m512i o = _mm512_maskz_srai_epi32(0xFFFF, _mm512_loadu_si512(xoff + 8 * g), 7);
            const __m512i sel = _mm512_add_epi32(pair0, _mm512_set1_epi32(2 * j));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                const uint8_t *t = tiles + r * ld + 6 * g;
                uint32_t b0, b1;
                std::memcpy(&b0, t + 2, 4);
                std::memcpy(&b1, t + 8, 4);
                const __m512i u = _mm512_maskz_mov_epi8(_cvtu64_mask64(uint64_t(b0) | uint64_t(b1) << 32), twos);
                const __m512i p = _mm512_dpbusd_epi32(o, u, xv);
                acc[r][j & 1] = _mm512_fmadd_ps(_mm512_maskz_permutexvar_ps(0xFFFF, sel, sc[r]),
                                                _mm512_maskz_cvtepi32_ps(0xFFFF, p), acc[r][j & 1]);
            }
        }
    }
    const __m256i twos8 = _mm256_set1_epi8(2);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        __m256 rest = _mm256_setzero_ps();
        for (uint64_t g = g0; g < groups; ++g) {  // the last groups short of 16, one at a time
            const uint8_t *t = tiles + r * ld + 6 * g;
            uint32_t b;
            std::memcpy(&b, t + 2, 4);
            const __m256i o = _mm256_srai_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(xoff + 8 * g)), 7);
            const __m256i p = _mm256_dpbusd_epi32(o, _mm256_maskz_mov_epi8(_cvtu32_mask32(b), twos8), load32(xq + 32 * g));
            rest = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(t) * xd[g]), _mm256_cvtepi32_ps(p), rest);
        }
        const __m512d a = _mm512_castps_pd(_mm512_add_ps(acc[r][0], acc[r][1]));
        out[r] = _mm256_add_ps(_mm256_add_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, a, 0)),
                                             _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, a, 1))),
                               rest);
    }
}
// The BITALG form (CPUs with AVX-512 BITALG, checked at run time): x
// transposed so that one vpdpbusd covers 4 elements of each of 16 groups,
// lane g accumulating group g: pass t (0..7) holds elements 4t..4t+3 of each
// group in its lane (x_passes, made once per call, then each group's lane
// started at minus the sum of its 32 codes). A row's 16 groups' bits (one
// word permute of the step's 96 bytes, dword g = group g's bits) become
// pass t's byte mask by one vpshufbitqmb (byte 4g+i <- bit 4t+i of dword g),
// a zero-masked move of 2s makes the bytes 2b, and vpdpbusd adds them
// against the pass: 3 operations per 64 weights, where the pair loop above
// takes a mask move, the vpdpbusd and three float operations (a permute of
// the scales, a convert, an FMA) per 64. The lanes then hold each group's
// sum((2b-1)*q), converted and multiplied by s*d once per 16 groups. A
// last step short of 16 groups reads only its groups (masked loads; the
// lanes past them are zero in x, the bits and the scales).
constexpr uint64_t kQ1StepBytes = 9 * 64;  // 8 passes of x, the lanes' starts
struct Q1BitalgTables {
    alignas(64) uint16_t bit_words[32] = {};  // dword g <- bytes 6g+2..6g+5 of 16 tiles
    alignas(64) uint16_t scale_words[32] = {};
    alignas(64) uint8_t pick[64] = {};  // pass 0: byte 8q+m <- bit m (m < 4) or 32+m-4 of qword q
    alignas(64) int32_t lane8[16] = {};
    constexpr Q1BitalgTables() {
        for (int g = 0; g < 16; ++g) {
            bit_words[2 * g] = static_cast<uint16_t>(3 * g + 1);
            bit_words[2 * g + 1] = static_cast<uint16_t>(3 * g + 2);
            scale_words[g] = static_cast<uint16_t>(3 * g);
            lane8[g] = 8 * g;
        }
        for (int q = 0; q < 8; ++q)
            for (int m = 0; m < 8; ++m) pick[8 * q + m] = static_cast<uint8_t>(m < 4 ? m : 32 + m - 4);
    }
};
constexpr Q1BitalgTables kQ1Bitalg;

void q1_x_passes(const int8_t *xq, uint64_t groups, uint8_t *xt) {
    const __m512i lane8 = _mm512_load_si512(kQ1Bitalg.lane8), ones = _mm512_set1_epi8(1);
    for (uint64_t g0 = 0; g0 < groups; g0 += 16) {
        const uint64_t n = std::min<uint64_t>(16, groups - g0);
        const __mmask16 live = static_cast<__mmask16>((1u << n) - 1);
        uint8_t *o = xt + kQ1StepBytes * (g0 / 16);
        __m512i sum = _mm512_setzero_si512();
        for (int t = 0; t < 8; ++t) {
            const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live,
                                                          _mm512_add_epi32(lane8, _mm512_set1_epi32(t)), xq + 32 * g0, 4);
            _mm512_store_si512(o + 64 * t, v);
            sum = _mm512_dpbusd_epi32(sum, ones, v);
        }
        _mm512_store_si512(o + 512, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
    }
}

template <int R>
__attribute__((target("avx512bitalg"), always_inline)) inline void q1_pass_bitalg(const uint8_t *tiles, uint64_t ld,
                                                                                  const uint8_t *xt, const float *xd,
                                                                                  uint64_t groups, float *y) {
    const __m512i bit_words = _mm512_load_si512(kQ1Bitalg.bit_words);
    const __m512i scale_words = _mm512_load_si512(kQ1Bitalg.scale_words);
    const __m512i pick0 = _mm512_load_si512(kQ1Bitalg.pick), four = _mm512_set1_epi8(4), twos = _mm512_set1_epi8(2);
    const long ahead = R > 1 ? std::max(long(R * ld), kPrefetchAhead) : kPrefetchAhead;
    __m512 acc[R];
#pragma GCC unroll 4
    for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
    for (uint64_t g0 = 0; g0 < groups; g0 += 16) {
        const uint64_t n = std::min<uint64_t>(16, groups - g0);
        const uint8_t *xs = xt + kQ1StepBytes * (g0 / 16);
        const uint64_t lo_bytes = std::min<uint64_t>(64, 6 * n), hi_bytes = 6 * n - lo_bytes;
        const __mmask64 lo_mask = lo_bytes == 64 ? ~uint64_t{0} : (uint64_t{1} << lo_bytes) - 1;
        const __mmask64 hi_mask = (uint64_t{1} << hi_bytes) - 1;  // at most 32 bytes
        const __m512 xd16 = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), xd + g0);
        __m512i bits[R], s[R];
        __m512 sc[R];
#pragma GCC unroll 4
        for (int q = 0; q < R; ++q) {
            const uint8_t *t = tiles + q * ld + 6 * g0;
            _mm_prefetch(reinterpret_cast<const char *>(t + ahead), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char *>(t + ahead + 64), _MM_HINT_T0);
            const __m512i lo = _mm512_maskz_loadu_epi8(lo_mask, t), hi = _mm512_maskz_loadu_epi8(hi_mask, t + 64);
            bits[q] = _mm512_permutex2var_epi16(lo, bit_words, hi);
            const __m256i h = _mm512_maskz_extracti64x4_epi64(0xF, _mm512_permutex2var_epi16(lo, scale_words, hi), 0);
            sc[q] = _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xFFFF, h), xd16);
            s[q] = _mm512_load_si512(xs + 512);
        }
        __m512i pick = pick0;
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
            const __m512i xv = _mm512_load_si512(xs + 64 * t);
#pragma GCC unroll 4
            for (int q = 0; q < R; ++q)
                s[q] = _mm512_dpbusd_epi32(s[q], _mm512_maskz_mov_epi8(_mm512_bitshuffle_epi64_mask(bits[q], pick), twos),
                                           xv);
            pick = _mm512_add_epi8(pick, four);
        }
#pragma GCC unroll 4
        for (int q = 0; q < R; ++q) acc[q] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, s[q]), sc[q], acc[q]);
    }
#pragma GCC unroll 4
    for (int q = 0; q < R; ++q) y[q] = hsum512(acc[q]);
}

__attribute__((target("avx512bitalg"))) void q1_rows_bitalg(const uint8_t *tiles, const uint8_t *xt, const float *xd,
                                                            uint64_t groups, uint64_t rows, float *y) {
    const uint64_t ld = 6 * groups;
    uint64_t r = 0;
    for (; r + 4 <= rows; r += 4) q1_pass_bitalg<4>(tiles + r * ld, ld, xt, xd, groups, y + r);
    for (; r < rows; ++r) q1_pass_bitalg<1>(tiles + r * ld, ld, xt, xd, groups, y + r);
}
#else
// One row: the group's bits spread to bytes (byte k = bit k), -1 where set
// and +1 where clear after an or with 1; vpsignb, vpmaddubsw against 1 and
// vpmaddwd against -1 give the same int32 lanes as the VNNI form.
inline __m256 q1_acc_row(const uint8_t *tiles, const int8_t *xq, const float *xd, uint64_t groups) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                            3, 3, 3, 3, 3, 3, 3);
    const __m256i bitsel = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    const __m256i one8 = _mm256_set1_epi8(1), minus_one16 = _mm256_set1_epi16(-1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 6 * g;
        if (g % 8 == 0) prefetch_ahead(t);
        uint32_t b;
        std::memcpy(&b, t + 2, 4);
        const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(b)), spread);
        const __m256i w = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bitsel), bitsel), one8);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, _mm256_sign_epi8(load32(xq + 32 * g), w)),
                                            minus_one16);
        acc[g & 1] = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(t) * xd[g]), _mm256_cvtepi32_ps(p), acc[g & 1]);
    }
    return _mm256_add_ps(acc[0], acc[1]);
}
#endif
}  // namespace

void unpack_q1_groups(const uint8_t *tiles, uint64_t groups, int8_t *codes, float *scales) {
#ifndef CMF_CODECS_VNNI
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                            3, 3, 3, 3, 3, 3, 3);
    const __m256i bitsel = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
#endif
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 6 * g;
        uint32_t b;
        std::memcpy(&b, t + 2, 4);
#ifdef CMF_CODECS_VNNI
        const __m256i c = _mm256_mask_blend_epi8(_cvtu32_mask32(b), _mm256_set1_epi8(-1), _mm256_set1_epi8(1));
#else
        // m: -1 where set, 0 where clear; m | 1: -1 / +1; negated: +1 / -1.
        const __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(b)), spread), bitsel),
                                            bitsel);
        const __m256i c = _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_or_si256(m, _mm256_set1_epi8(1)));
#endif
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(codes + 32 * g), c);
        scales[g] = f16_scalar(t);
    }
}

#ifdef CMF_CODECS_VNNI
// Steps of 16 entries aligned to the whole list, each in passes of the
// entries of up to four rows (one pass unless rows without entries lie
// within the step): their indices and values picked from the 6-byte
// records by two word permutes, each lane's row and column by at most three
// compares and masked subtractions of cols, the base tiles' scale and bits
// gathered (8 bytes a tile), x's value at each entry gathered from x made
// floats once per call, the products of the four rows summed across their
// lanes at once and added to the rows up to the pass's last entry's (a
// masked 4-float add: no branch on which rows a pass reached; the per-row
// branches, taken as unpredictably as rows end, cost 8 % of the kernel:
// 9.1-9.6 -> 10.1-10.4 GB/s, one core, L2). A pass begins at the row where
// the one before ended. Against 16-lane
// gathers of the scales, the bits, x's code dwords and its block scales:
// one core, weights in L2, 1024x1024, 7.2-7.4 -> 9.0-9.2 GB/s; against
// steps of one row's entries (a row has about cols/100 at the encoder's
// default keep of 1 %, so most steps had 6-10 of 16 lanes live) 11.1-11.2
// -> 12.9-13.4 GB/s, and 3072x1024 streamed on two threads 16.6 -> 19.6.
// The scalar loop (q1s_overlay_rows, the other builds) took ~20 cycles an
// entry, waiting on each load in turn. The lanes are summed in another order
// than the scalar loop's, so the bits differ from the AVX2 build's.
void q1s_overlay_xq(const uint8_t *tiles, const uint8_t *entries, uint64_t count, uint64_t phase, uint64_t begin,
                    uint64_t cols, uint64_t rows, const int8_t *xq, const float *xd, float *y) {
    alignas(64) static constexpr uint16_t kIndexWords[32] = {0,  1,  3,  4,  6,  7,  9,  10, 12, 13, 15,
                                                             16, 18, 19, 21, 22, 24, 25, 27, 28, 30, 31,
                                                             33, 34, 36, 37, 39, 40, 42, 43, 45, 46};
    alignas(64) static constexpr uint16_t kValueWords[32] = {2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 44, 47};
    const __m512i index_words = _mm512_load_si512(kIndexWords), value_words = _mm512_load_si512(kValueWords);
    const __m512i low5 = _mm512_set1_epi32(31), one = _mm512_set1_epi32(1);
    const __m512i sign = _mm512_set1_epi32(int32_t(0x80000000u));
    // x as floats, xd[c / 32] * xq[c] (the products the entries meet), made
    // once per call: one gather an entry from it where the codes' dwords and
    // the block scales took two.
    if (count == 0) return;
    float *xf = static_cast<float *>(thread_room(RoomSlot::q1s_x_floats, 4 * cols));
    for (uint64_t b = 0; b < cols / 32; ++b)
        for (int h = 0; h < 2; ++h)
            _mm512_storeu_ps(xf + 32 * b + 16 * h,
                             _mm512_mul_ps(_mm512_set1_ps(xd[b]),
                                           _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_cvtepi8_epi32(0xFFFF, _mm_loadu_si128(
                                                                   reinterpret_cast<const __m128i *>(xq + 32 * b + 16 * h))))));
    for (uint64_t c = cols / 32 * 32; c < cols; ++c) xf[c] = xd[c / 32] * static_cast<float>(xq[c]);
    uint64_t row = 0, row_begin = begin;
    const uint64_t end = begin + rows * cols;
    const __m512i cols32 = _mm512_set1_epi32(int32_t(uint32_t(std::min<uint64_t>(cols, UINT32_MAX))));
    // Steps of 16 entries aligned to the whole list (step s holds its
    // entries [16 s, 16 s + 16)), the lanes outside [0, count) masked off
    // and not read: a row's entries meet in the same steps and lanes, so
    // its sum has the same bits wherever the range begins (the backend
    // cuts a weight one way for matmul and another for matmul_multi).
    for (int64_t e0 = -int64_t(phase % 16); e0 < int64_t(count); e0 += 16) {
        const uint8_t *p = entries + 6 * e0;
        const unsigned a = unsigned(std::max<int64_t>(0, -e0)), b = unsigned(std::min<int64_t>(16, int64_t(count) - e0));
        const unsigned __int128 bytes = ((unsigned __int128)1 << (6 * b)) - ((unsigned __int128)1 << (6 * a));
        const __m512i lo = _mm512_maskz_loadu_epi8(__mmask64(uint64_t(bytes)), p);
        const __m512i hi = _mm512_maskz_loadu_epi8(__mmask64(uint64_t(bytes >> 64)), p + 64);
        const __m512i idx = _mm512_permutex2var_epi16(lo, index_words, hi);
        // A pass takes the step's lanes left to do that lie in the row of
        // the first of them and the next three; a step spans more rows
        // only where rows without entries lie within it.
        for (__mmask16 todo = __mmask16(((1u << b) - 1) & ~((1u << a) - 1)); todo != 0;) {
            uint32_t first;
            std::memcpy(&first, p + 6 * __builtin_ctz(todo), 4);
            if (first < row_begin || first >= end) {  // out of order or out of range: skipped (see kernels.hpp)
                todo &= __mmask16(todo - 1);
                continue;
            }
            if (first >= row_begin + 4 * cols) {
                const uint64_t skip = (first - row_begin) / cols;
                row += skip, row_begin += skip * cols;
            }
            const uint64_t reach = std::min<uint64_t>(std::min<uint64_t>(4 * cols, end - row_begin), UINT32_MAX);
            __m512i c = _mm512_maskz_sub_epi32(0xFFFF, idx, _mm512_set1_epi32(int32_t(uint32_t(row_begin))));
            __mmask16 k = todo & _mm512_cmplt_epu32_mask(c, _mm512_set1_epi32(int32_t(uint32_t(reach))));
            // and none below its start (a list out of order)
            k &= _mm512_cmpge_epu32_mask(idx, _mm512_set1_epi32(int32_t(uint32_t(row_begin))));
            todo &= __mmask16(~k);
            __mmask16 past[4] = {k, 0, 0, 0};  // past[j]: lanes of row j or later
            for (int j = 1; j < 4; ++j) {
                past[j] = _mm512_mask_cmpge_epu32_mask(past[j - 1], c, cols32);
                c = _mm512_mask_sub_epi32(c, past[j], c, cols32);
            }
            const __m512i tile = _mm512_maskz_mullo_epi32(0xFFFF, _mm512_maskz_srli_epi32(0xFFFF, idx, 5), _mm512_set1_epi32(6));
            // Each tile's scale and bits (6 of its bytes) by one 8-byte gather
            // a lane, two gathers of 8 lanes, not two of 16 (a gather's cost
            // is its lanes): the low words the scales, bits 16-47 the bits.
            const __m256i tile_lo = _mm512_maskz_extracti64x4_epi64(0xF, tile, 0), tile_hi = _mm512_maskz_extracti64x4_epi64(0xF, tile, 1);
            const __m512i q0 = _mm512_mask_i32gather_epi64(_mm512_setzero_si512(), __mmask8(k), tile_lo, tiles, 1);
            const __m512i q1 = _mm512_mask_i32gather_epi64(_mm512_setzero_si512(), __mmask8(k >> 8), tile_hi, tiles, 1);
            const __m512i low_dwords = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            const __m512i head = _mm512_maskz_permutex2var_epi32(0xFFFF, q0, low_dwords, q1);
            const __m512i bits = _mm512_maskz_permutex2var_epi32(0xFFFF, _mm512_maskz_srli_epi64(0xFF, q0, 16), low_dwords,
                                                                 _mm512_maskz_srli_epi64(0xFF, q1, 16));
            const __m512 s = _mm512_maskz_cvtph_ps(0xFFFF, _mm512_maskz_cvtepi32_epi16(0xFFFF, head));
            const __mmask16 set = _mm512_test_epi32_mask(_mm512_maskz_srlv_epi32(0xFFFF, bits, _mm512_maskz_and_epi32(0xFFFF, idx, low5)), one);
            const __m512 base = _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(s), __mmask16(~set),
                                                                          _mm512_castps_si512(s), sign));
            const __m512 value = _mm512_maskz_cvtph_ps(
                0xFFFF, _mm512_maskz_extracti64x4_epi64(0xF, _mm512_permutex2var_epi16(lo, value_words, hi), 0));
            const __m512 xc = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, c, xf, 4);
            const __m512 prod = _mm512_maskz_mul_ps(k, _mm512_maskz_sub_ps(0xFFFF, value, base), xc);
            // Each row's lanes summed (the four rows at once, no branch on
            // which rows the pass reached: a branch per row mispredicted as
            // often as rows end) and added to rows row .. row + last, last
            // the row of the pass's last entry, where the next pass begins.
            const __mmask16 top = __mmask16(1u << (31 - __builtin_clz(uint32_t(k))));
            const unsigned last = unsigned((past[1] & top) != 0) + unsigned((past[2] & top) != 0) + unsigned((past[3] & top) != 0);
            __m256 a[4];
            for (int j = 0; j < 4; ++j) {
                const __m512 v = _mm512_maskz_mov_ps(__mmask16(past[j] & ~(j < 3 ? past[j + 1] : 0)), prod);
                a[j] = _mm256_add_ps(lo256(v), hi256(v));
            }
            const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            const __mmask8 live = __mmask8((2u << last) - 1);
            _mm_mask_storeu_ps(y + row, live, _mm_add_ps(_mm_maskz_loadu_ps(live, y + row),
                                                         _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))));
            row += last, row_begin += last * cols;
        }
    }
}

// 16 indices at a time (the overlay's word permute), each against the one
// before it (valignd brings the previous step's last index in): the whole
// list is read once per thread and matmul, 6 bytes an entry, so the scalar
// loop's load, compare and branch per entry were a tenth of a q1s decode.
bool q1s_ascending(const uint8_t *entries, uint64_t count) {
    alignas(64) static constexpr uint16_t kIndexWords[32] = {0,  1,  3,  4,  6,  7,  9,  10, 12, 13, 15,
                                                             16, 18, 19, 21, 22, 24, 25, 27, 28, 30, 31,
                                                             33, 34, 36, 37, 39, 40, 42, 43, 45, 46};
    const __m512i index_words = _mm512_load_si512(kIndexWords);
    // Lane 15 of `prev`: the index before this step's first (none for entry 0).
    __m512i prev = _mm512_setzero_si512();
    uint64_t e = 0;
    for (; e + 16 <= count; e += 16) {
        const uint8_t *p = entries + 6 * e;
        const __m512i idx =
            _mm512_permutex2var_epi16(_mm512_loadu_si512(p), index_words, _mm512_maskz_loadu_epi64(0x0F, p + 64));
        const __m512i before = _mm512_maskz_alignr_epi32(0xFFFF, idx, prev, 15);  // lane i: index i-1; lane 0: prev's lane 15
        __mmask16 up = _mm512_cmpgt_epu32_mask(idx, before);
        if (e == 0) up |= 1;  // entry 0 has nothing before it
        if (up != 0xFFFF) return false;
        prev = idx;
    }
    return q1s_ascending_from(entries, e, count);
}
#else
bool q1s_ascending(const uint8_t *entries, uint64_t count) { return q1s_ascending_from(entries, 0, count); }

void q1s_overlay_xq(const uint8_t *tiles, const uint8_t *entries, uint64_t count, uint64_t /*phase*/, uint64_t begin,
                    uint64_t cols, uint64_t rows, const int8_t *xq, const float *xd, float *y) {
    q1s_overlay_rows<&f16_scalar>(tiles, entries, count, begin, cols, rows, xq, xd, y);
}
#endif

#ifdef CMF_CODECS_VNNI
namespace {
// vgf2p8affineqb (GFNI) by inline assembly: its intrinsic needs the gfni
// target on every function it is inlined through, and the same loops run
// without GFNI (on AVX-512 VNNI CPUs without it, Cascade Lake) by shifts.
// Byte k of the result: bit i = parity(byte 7-i of the qword of `a` AND
// byte k of x).
inline __m512i gf2p8_affine(__m512i x, __m512i a) {
    __m512i r;
    __asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(r) : "v"(x), "v"(a));
    return r;
}
// The bytes pass T of a q1_passes (q1t_passes) step multiplies x's pass T
// by, from its lane bytes (q1t_passes: the half holding pass T): 2 where bit
// T is set, else 0 (q1t_passes: w+1, bits 2(T%4) and 2(T%4)+1). One
// vgf2p8affineqb with the matrix that moves those bits to bits 1 (and 0);
// without GFNI a word shift and an and (bits from the next byte are masked
// off).
template <bool Ternary, bool Gfni, int T>
inline __m512i q1_pass_bytes(__m512i lanes) {
    if constexpr (Gfni) {
        constexpr uint64_t m =
            Ternary ? (uint64_t(1) << (2 * (T % 4)) << 56) | (uint64_t(1) << (2 * (T % 4) + 1) << 48) : uint64_t(1) << T << 48;
        return gf2p8_affine(lanes, _mm512_set1_epi64(int64_t(m)));
    } else if constexpr (Ternary) {
        return _mm512_and_si512(_mm512_srli_epi16(lanes, 2 * (T % 4)), _mm512_set1_epi8(3));
    } else if constexpr (T == 0) {
        return _mm512_and_si512(_mm512_add_epi8(lanes, lanes), _mm512_set1_epi8(2));
    } else {
        return _mm512_and_si512(_mm512_srli_epi16(lanes, T - 1), _mm512_set1_epi8(2));
    }
}
template <int... T, class F>
inline void for_passes(std::integer_sequence<int, T...>, F &&f) {
    (f(std::integral_constant<int, T>{}), ...);
}
// One pass of R q1_passes rows over a step's 16 groups: per row a load of
// its lane bytes (q1t: two), then per pass t the bytes it multiplies
// (q1_pass_bytes: one operation) and a vpdpbusd against pass t of x, 2
// vector operations per 64 weights and no mask register (a k-register
// load and a masked move per pass took 1.8 cycles a pass on the Intel VM of
// docs/performance.md, these 1.2); the lanes hold each group's
// sum((2b-1)*q), converted and multiplied by s*d once per step, as
// q1_pass_bitalg does them (the same bits). Ternary (q1t_passes): the
// bytes are w+1, against the same x and lane starts (sum((w+1)*q) - sum(q)
// = sum(w*q)).
template <int R, bool Ternary, bool Gfni>
inline void q1_passes_pass(const uint8_t *steps, uint64_t ld, const uint8_t *xt, const float *xd, uint64_t groups,
                           float *y) {
    constexpr uint64_t kStep = Ternary ? 160 : 96, kScales = Ternary ? 128 : 64;
    const long ahead = R > 1 ? std::max(long(R * ld), kPrefetchAhead) : kPrefetchAhead;
    __m512 acc[R];
#pragma GCC unroll 4
    for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
    for (uint64_t g0 = 0; g0 < groups; g0 += 16) {
        const uint8_t *xs = xt + kQ1PassesXStepBytes * (g0 / 16);
        const __m512 xd16 = _mm512_loadu_ps(xd + g0);
        __m512i lanes[R][Ternary ? 2 : 1], s[R];
        __m512 sc[R];
#pragma GCC unroll 4
        for (int q = 0; q < R; ++q) {
            const uint8_t *st = steps + q * ld + kStep * (g0 / 16);
            _mm_prefetch(reinterpret_cast<const char *>(st + ahead), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char *>(st + ahead + 64), _MM_HINT_T0);
            if (Ternary) _mm_prefetch(reinterpret_cast<const char *>(st + ahead + 128), _MM_HINT_T0);
            lanes[q][0] = _mm512_loadu_si512(st);
            if constexpr (Ternary) lanes[q][1] = _mm512_loadu_si512(st + 64);
            sc[q] = _mm512_mul_ps(
                _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(st + kScales))),
                xd16);
            s[q] = _mm512_load_si512(xs + 512);
        }
        for_passes(std::make_integer_sequence<int, 8>{}, [&](auto tc) {
            constexpr int t = decltype(tc)::value;
            const __m512i xv = _mm512_load_si512(xs + 64 * t);
#pragma GCC unroll 4
            for (int q = 0; q < R; ++q)
                s[q] = _mm512_dpbusd_epi32(s[q], q1_pass_bytes<Ternary, Gfni, t>(lanes[q][Ternary ? t / 4 : 0]), xv);
        });
#pragma GCC unroll 4
        for (int q = 0; q < R; ++q) acc[q] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, s[q]), sc[q], acc[q]);
    }
#pragma GCC unroll 4
    for (int q = 0; q < R; ++q) y[q] = hsum512(acc[q]);
}
template <bool Ternary, bool Gfni>
void q1_passes_rows(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                    float *y) {
    const uint64_t ld = (Ternary ? 10 : 6) * groups;
    uint64_t r = 0;
    for (; r + 4 <= rows; r += 4) q1_passes_pass<4, Ternary, Gfni>(steps + r * ld, ld, xt, xd, groups, y + r);
    for (; r < rows; ++r) q1_passes_pass<1, Ternary, Gfni>(steps + r * ld, ld, xt, xd, groups, y + r);
}
template <bool Ternary>
void q1_passes_rows_any(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                        float *y) {
    if (has_gfni()) return q1_passes_rows<Ternary, true>(steps, xt, xd, groups, rows, y);
    q1_passes_rows<Ternary, false>(steps, xt, xd, groups, rows, y);
}
}  // namespace

namespace {
// Codes of `n` steps in pass order (byte 4j+i of pass t: element 4t+i of
// group j), the kernel's bytes less 1, then each pair of groups' 64 codes
// in element order by one dword gather from them.
template <bool Ternary, bool Gfni>
void q1_passes_unpack(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    constexpr uint64_t kStep = Ternary ? 160 : 96, kScales = Ternary ? 128 : 64;
    const __m512i ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
    // Output lane l of pair o: group 2o + l/8, pass l%8: dword 16*(l%8) + 2o + l/8.
    const __m512i lane = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 1, 17, 33, 49, 65, 81, 97, 113);
    alignas(64) int8_t pass_order[512];
    for (uint64_t k = 0; k < n; ++k, codes += 512, scales += 16) {
        const uint8_t *st = steps + kStep * k;
        const __m512i lanes[2] = {_mm512_loadu_si512(st), Ternary ? _mm512_loadu_si512(st + 64) : zero};
        for_passes(std::make_integer_sequence<int, 8>{}, [&](auto tc) {
            constexpr int t = decltype(tc)::value;
            _mm512_store_si512(pass_order + 64 * t,
                               _mm512_sub_epi8(q1_pass_bytes<Ternary, Gfni, t>(lanes[Ternary ? t / 4 : 0]), ones));
        });
        for (int o = 0; o < 8; ++o)
            _mm512_storeu_si512(codes + 64 * o,
                                _mm512_mask_i32gather_epi32(zero, 0xFFFF, _mm512_add_epi32(lane, _mm512_set1_epi32(2 * o)),
                                                            pass_order, 4));
        _mm512_storeu_ps(scales, _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(st + kScales))));
    }
}
}  // namespace
void unpack_q1_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    if (has_gfni()) return q1_passes_unpack<false, true>(steps, n, codes, scales);
    q1_passes_unpack<false, false>(steps, n, codes, scales);
}
void unpack_q1t_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    if (has_gfni()) return q1_passes_unpack<true, true>(steps, n, codes, scales);
    q1_passes_unpack<true, false>(steps, n, codes, scales);
}
static_assert(kQ1StepBytes == kQ1PassesXStepBytes);
void q1_passes_x(const int8_t *xq, uint64_t groups, uint8_t *xt) { q1_x_passes(xq, groups, xt); }
void rows_q1_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                       float *y) {
    q1_passes_rows_any<false>(steps, xt, xd, groups, rows, y);
}
void rows_q1t_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                        float *y) {
    q1_passes_rows_any<true>(steps, xt, xd, groups, rows, y);
}
// A slice's 16 rows in the 16 lanes: per step a load of the columns, a
// gather of x, a product with the corrections and a sum; no lane waits on
// another and no row is summed across lanes (the
// file's list took each entry's tile by two 8-lane gathers, and a row's
// entries were summed across lanes, four rows a pass). Each lane adds its
// products in step order, as the portable loop does: the same bits.
void q1s_slice_sums(const uint8_t *steps, uint64_t n_steps, uint64_t cols, const float *xf, float *sums) {
    constexpr __mmask16 all = 0xFFFF;
    const __m512i ncols = _mm512_set1_epi32(int32_t(std::min<uint64_t>(cols, 0x10000)));
    __m512 acc = _mm512_setzero_ps();
    for (uint64_t k = 0; k < n_steps; ++k) {
        const uint8_t *st = steps + 96 * k;
        // The steps stream from memory, a slice's after the one before
        // (the call after this one reads on from here).
        _mm_prefetch(reinterpret_cast<const char *>(st + kPrefetchAhead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char *>(st + kPrefetchAhead + 64), _MM_HINT_T0);
        const __m512i c = _mm512_maskz_cvtepu16_epi32(all, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(st)));
        const __mmask16 live = _mm512_cmplt_epu32_mask(c, ncols);
        const __m512 xc = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, c, xf, 4);
        // masked-off lanes add +0: a sum that starts at +0 is never -0, so
        // adding +0 leaves its bits as the portable loop's skip does
        acc = _mm512_maskz_add_ps(all, acc, _mm512_maskz_mul_ps(live, _mm512_loadu_ps(st + 32), xc));
    }
    _mm512_storeu_ps(sums, acc);
}
#else
void q1s_slice_sums(const uint8_t *steps, uint64_t n_steps, uint64_t cols, const float *xf, float *sums) {
    portable::q1s_slice_sums(steps, n_steps, cols, xf, sums);
}
// q1_passes and q1t_passes are made only where the AVX-512 form runs
// (q1_passes_kernel): here the portable reference serves a view made
// elsewhere.
void q1_passes_x(const int8_t *xq, uint64_t groups, uint8_t *xt) { portable::q1_passes_x(xq, groups, xt); }
void rows_q1_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                       float *y) {
    portable::rows_q1_passes_xq(steps, xt, xd, groups, rows, y);
}
void rows_q1t_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                        float *y) {
    portable::rows_q1t_passes_xq(steps, xt, xd, groups, rows, y);
}
void unpack_q1_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    portable::unpack_q1_passes(steps, n, codes, scales);
}
void unpack_q1t_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    portable::unpack_q1t_passes(steps, n, codes, scales);
}
#endif

void rows_q1_xq(const uint8_t *tiles, const int8_t *xq, [[maybe_unused]] const int32_t *xoff, const float *xd,
                uint64_t groups, uint64_t rows, float *y) {
#ifdef CMF_CODECS_VNNI
    if (has_avx512_bitalg()) {
        if (rows == 0) return;
        uint8_t *xt = static_cast<uint8_t *>(thread_room(RoomSlot::q1_x_passes, kQ1StepBytes * ((groups + 15) / 16)));
        q1_x_passes(xq, groups, xt);
        return q1_rows_bitalg(tiles, xt, xd, groups, rows, y);
    }
    q4_rows4(rows, y, [&](uint64_t q, auto rn, __m256 *o) {
        q1_acc_rows<decltype(rn)::value>(tiles + 6 * groups * q, 6 * groups, xq, xoff, xd, groups, o);
    });
#else
    rows4(rows, y, [&](uint64_t r) { return q1_acc_row(tiles + 6 * groups * r, xq, xd, groups); });
#endif
}

// q4tp / q2tp rows with their scales from ladder_scales_powers
// (rows_q4tp_xq's and rows_q2tp_xq's contract), where the scales come
// first: a block of up to kLadderMaxRows rows' scales into scratch, then
// the block through the row-range kernel.
namespace {
template <bool Two>
void tp_rows_two_steps(const uint8_t *chunks, const float *first, const float *ratio, const uint8_t *codes,
                       uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                       uint64_t rows, float *scratch, float *y) {
    for (uint64_t r0 = 0; r0 < rows; r0 += kLadderMaxRows) {
        const unsigned n = unsigned(std::min<uint64_t>(kLadderMaxRows, rows - r0));
        ladder_scales_powers(first + r0, ratio + r0, Two, codes + code_stride * r0, code_stride, groups, n, scratch);
        (Two ? rows_q2_groups_xq : rows_q4_groups_xq)(chunks + (Two ? 8 : 16) * groups * r0, scratch, xq, xoff, xd,
                                                      groups, n, y + r0);
    }
}
}  // namespace

#ifdef CMF_CODECS_VNNI

namespace {
// Row j's group scales from its 32 rungs (lo: 0-15, hi: 16-31), 16 groups
// per step: their 80 code bits (10 bytes, a masked load that never reads
// past the row's codes) put two bytes per 32-bit lane by a byte shuffle,
// each lane shifted to its code, and the rungs picked by one two-register
// permute; a short last step stores through a mask.
// (Tables of constants, not filled per call: the compiler copied a filled
// stack table from a constant one with rep movsq every call.)
struct RungPicks {
    alignas(64) int8_t pick[64];  // group 4L + q of a step (lane 4L + q): its code's two bytes, (5(4L + q)) / 8 and the next
    alignas(64) int32_t shift[16];
    constexpr RungPicks() : pick(), shift() {
        for (int i = 0; i < 16; ++i) {
            const int bit = 5 * i;
            for (int b = 0; b < 4; ++b) pick[4 * i + b] = b < 2 ? int8_t(bit / 8 + b) : int8_t(-1);  // -1: a zero byte
            shift[i] = bit % 8;
        }
    }
};
constexpr RungPicks kRungPicks;
// Groups g .. g+15's rungs from lo (rungs 0-15) and hi (16-31) by their
// 5-bit codes (the row's codes at c; bytes: which of the 10 bytes from the
// first code's byte to read). pk, sh: kRungPicks' pick and shift.
__attribute__((always_inline)) inline __m512 pick16(__m512 lo, __m512 hi, const uint8_t *c, uint64_t g,
                                                    __mmask16 bytes, __m512i pk, __m512i sh) {
    const __m512i v = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_maskz_loadu_epi8(bytes, c + 5 * g / 8));
    // Not masked to 5 bits: vpermt2ps reads bits 0-4 of each index alone
    // (the next code's bits above them are ignored).
    const __m512i idx = _mm512_maskz_srlv_epi32(0xFFFF, _mm512_maskz_shuffle_epi8(__mmask64(~0ull), v, pk), sh);
    return _mm512_permutex2var_ps(lo, idx, hi);
}
inline void pick_rungs16(__m512 lo, __m512 hi, const uint8_t *c, uint64_t groups, float *o) {
    const __m512i pk = _mm512_load_si512(kRungPicks.pick), sh = _mm512_load_si512(kRungPicks.shift);
    // Groups g .. g+n-1 (n <= 16): their codes' ceil(5n/8) bytes, n scales stored.
    auto step = [&](uint64_t g, __mmask16 bytes, __mmask16 store) {
        _mm512_mask_storeu_ps(o + g, store, pick16(lo, hi, c, g, bytes, pk, sh));
    };
    uint64_t g = 0;
    for (; g + 16 <= groups; g += 16) step(g, 0x3FF, 0xFFFF);
    if (const uint64_t n = groups - g; n > 0)
        step(g, __mmask16((1u << ((5 * n + 7) / 8)) - 1u), __mmask16((1u << n) - 1u));
}
}  // namespace

// Up to 64 rows' ladders as four interleaved chains of 512-bit multiplies
// (lane j of chain k = row 16k + j). A row's 31 products are dependent,
// each waiting on the multiply latency: one chain costs the same for 1 row
// as for 16, and four independent chains cost about what one does (the
// multiplies of a rung issue together), so a block of 64 rows pays the
// latency once. Each chain's 32 rungs are then turned row-major by two
// 16x16 transposes in registers and each row's scales picked by
// pick_rungs16. Against the 8-row form (one chain per 8 rows, 8x8
// transposes through memory, 8 groups per step by two permutes, a test and
// a blend): docs/performance.md, q4tp decode.
void ladder_scales(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes, uint64_t code_stride,
                   uint64_t groups, unsigned rows, float *out) {
    constexpr int kChains = kLadderMaxRows / 16;
    rows = std::min(rows, kLadderMaxRows);
    alignas(64) float t[kChains][32][16];  // rung c of rows 16k .. 16k+15
    const int c0 = zero_rung ? 1 : 0;
    __m512 cur[kChains], ek[kChains];
    for (int k = 0; k < kChains; ++k) {
        // The chain's rows of first and ratio, 0 past the last row (masked
        // loads: a copy into zeroed arrays was two rep movsq a call).
        const unsigned left = rows > 16u * k ? std::min(rows - 16u * k, 16u) : 0u;
        const __mmask16 live = __mmask16((1u << left) - 1u);
        cur[k] = _mm512_maskz_loadu_ps(live, first + 16 * k);
        ek[k] = _mm512_maskz_loadu_ps(live, ratio + 16 * k);
        _mm512_store_ps(t[k][0], _mm512_setzero_ps());
        _mm512_store_ps(t[k][c0], cur[k]);
    }
    for (int c = c0 + 1; c < 32; ++c)
        for (int k = 0; k < kChains; ++k) {
            cur[k] = _mm512_mul_ps(cur[k], ek[k]);
            _mm512_store_ps(t[k][c], cur[k]);
        }
    for (unsigned k = 0; 16 * k < rows; ++k) {
        __m512 lo[16], hi[16];  // rungs 0-15, 16-31 of the chain's rows; transposed, register j is row 16k + j
        for (int c = 0; c < 16; ++c) lo[c] = _mm512_load_ps(t[k][c]), hi[c] = _mm512_load_ps(t[k][16 + c]);
        transpose16x16(lo);
        transpose16x16(hi);
        for (unsigned j = 0; j < 16 && 16 * k + j < rows; ++j)
            pick_rungs16(lo[j], hi[j], codes + code_stride * (16 * k + j), groups, out + groups * (16 * k + j));
    }
}

// Per row: r^2 .. r^16 by four squarings of a broadcast, rungs 0-15 by four
// multiplies under lane masks (lane c takes r^(2^b) where bit b of c is
// set, bits in ascending order), rungs 16-31 as those times r^16; with
// zero_rung both shift up a lane (valignd) behind a 0. Ten multiplies and
// no shuffle before the picks, where the chains above take two 16x16
// transposes (128 shuffles a 16 rows) and spill them.
namespace {
// One row's 32 rungs from its powers (ladder_scales_powers' contract): rungs
// 0-15 in lo, 16-31 in hi.
__attribute__((always_inline)) inline void powers_rungs(float first, float ratio, bool zero_rung, __m512 &lo,
                                                        __m512 &hi) {
    const __m512 r = _mm512_set1_ps(ratio);
    const __m512 r2 = _mm512_mul_ps(r, r), r4 = _mm512_mul_ps(r2, r2), r8 = _mm512_mul_ps(r4, r4),
                 r16 = _mm512_mul_ps(r8, r8);
    lo = _mm512_set1_ps(first);
    lo = _mm512_mask_mul_ps(lo, 0xAAAA, lo, r);
    lo = _mm512_mask_mul_ps(lo, 0xCCCC, lo, r2);
    lo = _mm512_mask_mul_ps(lo, 0xF0F0, lo, r4);
    lo = _mm512_mask_mul_ps(lo, 0xFF00, lo, r8);
    hi = _mm512_mul_ps(lo, r16);
    if (zero_rung) {
        const __m512i zero = _mm512_setzero_si512();
        hi = _mm512_castsi512_ps(_mm512_maskz_alignr_epi32(0xFFFF, _mm512_castps_si512(hi), _mm512_castps_si512(lo), 15));
        lo = _mm512_castsi512_ps(_mm512_maskz_alignr_epi32(0xFFFF, _mm512_castps_si512(lo), zero, 15));
    }
}
}  // namespace

void ladder_scales_powers(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes,
                          uint64_t code_stride, uint64_t groups, unsigned rows, float *out) {
    rows = std::min(rows, kLadderMaxRows);
    for (unsigned j = 0; j < rows; ++j) {
        __m512 lo, hi;
        powers_rungs(first[j], ratio[j], zero_rung, lo, hi);
        pick_rungs16(lo, hi, codes + code_stride * j, groups, out + groups * j);
    }
}

namespace {
// q4tp rows with each row's scales picked inside its pass over x, 16 groups
// (8 pairs) a step: their 16 codes (10 bytes), shuffled and shifted
// into rung indices, one permute from the row's 32 rungs held in two
// registers, times x's block scales; each pair of pairs then takes its four
// products by a lane permute, as q4_pair_acc_rows_zmm does from a load. The
// separate ladder pass (ladder_scales_powers for 64 rows, then the rows)
// spent 12 % of q4tp decode in the picks and 4 % around them (perf), with
// no weight loads among them. Every product, sum and their order are those
// of that pass and q4_pair_acc_rows_zmm<1>: the same bits.
// The loop's constants, made once per call rather than once per row.
struct Q4tpConsts {
    __m512i pk = _mm512_load_si512(kRungPicks.pick), sh = _mm512_load_si512(kRungPicks.shift),
            low4 = _mm512_set1_epi8(15);
    __m512i sel[4] = {_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                      _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
                      _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
                      _mm512_setr_epi32(12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15)};
};
template <bool Nta>
__attribute__((always_inline)) inline __m256 q4tp_row_zmm(const Q4tpConsts &cs, const uint8_t *nib, const int8_t *x,
                                                          const int8_t *xt, const int32_t *off, uint64_t groups,
                                                          float first, float ratio, const uint8_t *c, const float *xd) {
    __m512 lo, hi;
    powers_rungs(first, ratio, false, lo, hi);
    const __m512i pk = cs.pk, sh = cs.sh, low4 = cs.low4;
    // Groups g .. g+15's scale products (the lanes past `lanes` 0).
    auto pick = [&](uint64_t g, __mmask16 bytes, __mmask16 lanes) __attribute__((always_inline)) {
        return _mm512_mul_ps(pick16(lo, hi, c, g, bytes, pk, sh), _mm512_maskz_loadu_ps(lanes, xd + g));
    };
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    // Pairs kk, kk+1 with their products at lanes 4q .. 4q+3 of s (q = 0..3).
    auto two_pairs = [&](uint64_t kk, __m512 s, int q, int j) __attribute__((always_inline)) {
        const __m512i p = q4_quad_isum(q4_quad_load<16>(nib + 32 * kk), q4_quad_xt(xt, off, kk), low4);
        acc[j] = _mm512_fmadd_ps(_mm512_maskz_permutexvar_ps(0xFFFF, cs.sel[q], s), _mm512_maskz_cvtepi32_ps(0xFFFF, p),
                                 acc[j]);
    };
    const uint64_t pairs = groups / 2;
    // One base for the prefetches: with the distance added in the loop the
    // compiler kept three addresses' offsets in vector registers (6 moves
    // and adds a step).
    const uint8_t *ahead = nib + kQ4PrefetchAhead;
    uint64_t k = 0;
    for (; k + 8 <= pairs; k += 8) {
        for (uint64_t o = 0; o < 256; o += 64) prefetch_weights<Nta>(ahead + 32 * k + o);
        const __m512 s = pick(2 * k, 0x3FF, 0xFFFF);
        two_pairs(k, s, 0, 0);
        two_pairs(k + 2, s, 1, 1);
        two_pairs(k + 4, s, 2, 0);
        two_pairs(k + 6, s, 3, 1);
    }
    if (k + 4 <= pairs) {
        for (uint64_t o = 0; o < 128; o += 64) prefetch_weights<Nta>(ahead + 32 * k + o);
        const __m512 s = pick(2 * k, 0x1F, 0xFF);
        two_pairs(k, s, 0, 0);
        two_pairs(k + 2, s, 1, 1);
        k += 4;
    }
    alignas(64) float t[32];
    if (k < pairs || groups % 2) _mm512_store_ps(t, lo), _mm512_store_ps(t + 16, hi);
    return q4_pair_rest_zmm<16, 8>(nib, x, off, k, groups, [&](uint64_t g) {
        const uint64_t bit = 5 * g;
        const uint32_t v = c[bit / 8] | (bit % 8 > 3 ? uint32_t{c[bit / 8 + 1]} << 8 : 0u);
        return t[(v >> (bit % 8)) & 31u] * xd[g];
    }, acc);
}
}  // namespace

void rows_q4tp_xq(const uint8_t *nibbles, const float *first, const float *ratio, const uint8_t *codes,
                  uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                  uint64_t rows, float * /*scratch*/, float *y) {
    const Q4tpConsts cs;
    const Q4XTable xt(xq, xoff, groups);
    with_weights_hint([&](auto nta) {
        auto row = [&](uint64_t q) __attribute__((always_inline)) {
            return q4tp_row_zmm<decltype(nta)::value>(cs, nibbles + 16 * groups * q, xq, xt.p, xoff, groups, first[q],
                                                      ratio[q], codes + code_stride * q, xd);
        };
        rows4_quads(
            rows, y,
            [&](uint64_t q, __m256 *a) __attribute__((always_inline)) {
                for (int i = 0; i < 4; ++i) a[i] = row(q + i);
            },
            row);
    });
}
#else
// The eight rows' ladders as one chain of vector multiplies (lane j = row j:
// a single row's 31 dependent multiplies would wait on the multiply latency
// at every rung), turned row-major (four 8x8 transposes), then per row eight
// groups per step: their 40 code bits as two 32-bit words (bits 0-31 and
// 8-39), each lane shifted to its code, and the rungs picked from the row's
// 32 by a gather (the AVX-512 build has its own form above).
// Picked one by one in scalar code, the scales took about as long as the
// q4tp rows' dots themselves (perf, 3072x1024, one thread).
namespace {
// rows[0..8) (8 floats each) -> columns: out[ld*j + i] = rows[i][j].
inline void transpose8x8(const float *in, float *out, uint64_t ld) {
    __m256 r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_load_ps(in + 8 * i);
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(out + ld * i, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(out + ld * (i + 4), _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}
// Row j's group scales from its 32 rungs t: eight groups per step, their
// 40 code bits as two 32-bit words (bits 0-31 and 8-39), each lane shifted
// to its code, the rungs picked by a gather.
void pick_rungs8(const float *t, const uint8_t *c, uint64_t groups, float *o) {
    const __m256i shifts = _mm256_setr_epi32(0, 5, 10, 15, 20, 25, 22, 27);
    const __m256i mask = _mm256_set1_epi32(31);
    uint64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
        const uint8_t *p = c + 5 * g / 8;
        uint32_t w;
        std::memcpy(&w, p, 4);
        const uint32_t w8 = (w >> 8) | (uint32_t{p[4]} << 24);
        const __m256i v = _mm256_blend_epi32(_mm256_set1_epi32(int(w)), _mm256_set1_epi32(int(w8)), 0xC0);
        const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), mask);
        _mm256_storeu_ps(o + g, _mm256_i32gather_ps(t, idx, 4));
    }
    for (; g < groups; ++g) {
        const uint64_t bit = 5 * g;
        const uint32_t v = c[bit / 8] | (bit % 8 > 3 ? uint32_t{c[bit / 8 + 1]} << 8 : 0u);
        o[g] = t[(v >> (bit % 8)) & 31u];
    }
}
void ladder_scales8(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes, uint64_t code_stride,
                    uint64_t groups, unsigned rows, float *out) {
    alignas(32) float f8[8] = {}, e8[8] = {};
    for (unsigned j = 0; j < rows && j < 8; ++j) f8[j] = first[j], e8[j] = ratio[j];
    alignas(64) float t[32][8], lt[8][32];
    const int c0 = zero_rung ? 1 : 0;
    __m256 cur = _mm256_load_ps(f8);
    const __m256 e = _mm256_load_ps(e8);
    _mm256_store_ps(t[0], _mm256_setzero_ps());
    _mm256_store_ps(t[c0], cur);
    for (int c = c0 + 1; c < 32; ++c) {
        cur = _mm256_mul_ps(cur, e);
        _mm256_store_ps(t[c], cur);
    }
    for (int b = 0; b < 4; ++b) transpose8x8(&t[8 * b][0], &lt[0][8 * b], 32);
    for (unsigned j = 0; j < rows; ++j) pick_rungs8(lt[j], codes + code_stride * j, groups, out + groups * j);
}
}  // namespace

// Up to kLadderMaxRows rows, eight at a time.
void ladder_scales(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes, uint64_t code_stride,
                   uint64_t groups, unsigned rows, float *out) {
    for (unsigned j = 0; j < rows && j < kLadderMaxRows; j += 8)
        ladder_scales8(first + j, ratio + j, zero_rung, codes + code_stride * j, code_stride, groups,
                       std::min(rows - j, 8u), out + groups * j);
}

// Per row: rungs 0-7 by three multiplies under lane blends (lane c takes
// r^(2^b) where bit b of c is set, bits in ascending order), 8-15, 16-23
// and 24-31 as those times r^8, r^16 and r^8 then r^16, stored one lane up
// behind a 0 with zero_rung; then the gather picks.
void ladder_scales_powers(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes,
                          uint64_t code_stride, uint64_t groups, unsigned rows, float *out) {
    rows = std::min(rows, kLadderMaxRows);
    alignas(32) float t[33];
    t[0] = 0.0f;
    float *rung = t + (zero_rung ? 1 : 0);
    for (unsigned j = 0; j < rows; ++j) {
        const __m256 r = _mm256_set1_ps(ratio[j]);
        const __m256 r2 = _mm256_mul_ps(r, r), r4 = _mm256_mul_ps(r2, r2), r8 = _mm256_mul_ps(r4, r4),
                     r16 = _mm256_mul_ps(r8, r8);
        __m256 u = _mm256_set1_ps(first[j]);
        u = _mm256_blend_ps(u, _mm256_mul_ps(u, r), 0xAA);
        u = _mm256_blend_ps(u, _mm256_mul_ps(u, r2), 0xCC);
        u = _mm256_blend_ps(u, _mm256_mul_ps(u, r4), 0xF0);
        const __m256 u8 = _mm256_mul_ps(u, r8);
        _mm256_storeu_ps(rung, u);
        _mm256_storeu_ps(rung + 8, u8);
        _mm256_storeu_ps(rung + 16, _mm256_mul_ps(u, r16));
        _mm256_storeu_ps(rung + 24, _mm256_mul_ps(u8, r16));  // with zero_rung, t[32] is never picked
        pick_rungs8(t, codes + code_stride * j, groups, out + groups * j);
    }
}

// The rows' scales into scratch first, then the rows (the form the AVX-512
// build replaces by picking inside the row loop).
void rows_q4tp_xq(const uint8_t *nibbles, const float *first, const float *ratio, const uint8_t *codes,
                  uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                  uint64_t rows, float *scratch, float *y) {
    tp_rows_two_steps<false>(nibbles, first, ratio, codes, code_stride, xq, xoff, xd, groups, rows, scratch, y);
}
#endif

float dot_q2_groups_xq(const uint8_t *chunks, const float *scales, const int8_t *xq,
                       [[maybe_unused]] const int32_t *xoff, const float *xd, uint64_t groups) {
    // (c - 1.5) * s = (2c - 3) * (s / 2): an integer sum, halved once.
    return 0.5f * sliced(
                      groups, [&](uint64_t g0, uint64_t n, float *sx) { fill_f32_scales(scales + g0, xd + g0, n, sx); },
                      [&](uint64_t g0, uint64_t n, const float *sx) {
                          const uint8_t *ch = chunks + 8 * g0;
                          auto codes = [&](uint64_t g) {
                              if (g % 8 == 0) prefetch_ahead(ch + 8 * g);
                              return q2_codes_2u(ch + 8 * g);
                          };
#ifdef CMF_CODECS_VNNI
                          // vpdpbusd of the doubled codes (unsigned) against x,
                          // started at -3 * (sums of 4 x codes): the same
                          // int32 lane sums as biased_step's three
                          // multiply-adds and subtraction, in one operation.
                          const int8_t *q = xq + 32 * g0;
                          const int32_t *o = xoff + 8 * g0;
                          return groups_dot(n, sx, [&](uint64_t g) {
                              return _mm256_dpbusd_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(o + 8 * g)),
                                                         codes(g), load32(q + 32 * g));
                          });
#else
                          return biased_dot<3>(n, xq + 32 * g0, sx, codes);
#endif
                      });
}

#ifdef CMF_CODECS_VNNI
namespace {
// R q2tp rows per pass over x, two groups per 512-bit step: the two groups'
// 16 code bytes as qwords [g x4 | g+1 x4], shifted by 0, 2, 4, 6 and masked
// (q2_quads order, as q2_codes_2u), doubled, into one vpdpbusd against the
// pair's 64 x bytes started at their offsets (-3 * each 4 codes' sum); one
// FMA with [s(g) d(g) x8 | s(g+1) d(g+1) x8], 16 groups' products made at a
// time. The 256-bit form took a broadcast, shift, mask and add, a load of x
// and of the offsets, a scale broadcast and an FMA per group and row; here
// the x loads are shared by the R rows. Each row takes the same operations
// whatever R is (rows4_quads' contract).
template <int R, bool Nta>
__attribute__((always_inline)) inline void q2_acc_rows(const uint8_t *chunks, const float *scales, const int8_t *xq,
                                                       const int32_t *xoff, const float *xd, uint64_t groups,
                                                       __m256 *out) {
    const __m512i spread = _mm512_setr_epi64(0, 0, 0, 0, 1, 1, 1, 1), shifts = _mm512_setr_epi64(0, 2, 4, 6, 0, 2, 4, 6);
    const __m512i three = _mm512_set1_epi8(3);
    const __m512i pair0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const long ahead = R > 1 ? std::max(long(R * 8 * groups), kPrefetchAhead) : kPrefetchAhead;
    __m512 acc[R][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    uint64_t g0 = 0;
    for (; g0 + 16 <= groups; g0 += 16) {
        __m512 sc[R];
        const __m512 d16 = _mm512_loadu_ps(xd + g0);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const uint8_t *c = chunks + 8 * groups * r + 8 * g0;
            prefetch_weights<Nta>(c + ahead);
            prefetch_weights<Nta>(c + ahead + 64);
            sc[r] = _mm512_mul_ps(_mm512_loadu_ps(scales + groups * r + g0), d16);
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const uint64_t g = g0 + 2 * j;
            const __m512i xv = _mm512_loadu_si512(xq + 32 * g), o = _mm512_loadu_si512(xoff + 8 * g);
            const __m512i sel = _mm512_maskz_add_epi32(0xFFFF, pair0, _mm512_set1_epi32(2 * j));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                const __m512i v = _mm512_maskz_permutexvar_epi64(
                    0xFF, spread, _mm512_maskz_loadu_epi64(0x03, chunks + 8 * groups * r + 8 * g));
                const __m512i c = _mm512_maskz_and_epi32(0xFFFF, _mm512_maskz_srlv_epi64(0xFF, v, shifts), three);
                const __m512i p = _mm512_dpbusd_epi32(o, _mm512_maskz_add_epi8(~__mmask64{0}, c, c), xv);
                acc[r][j & 1] = _mm512_fmadd_ps(_mm512_maskz_permutexvar_ps(0xFFFF, sel, sc[r]),
                                                _mm512_maskz_cvtepi32_ps(0xFFFF, p), acc[r][j & 1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        __m256 rest = _mm256_setzero_ps();
        for (uint64_t g = g0; g < groups; ++g) {  // the last groups short of 16
            const __m256i p = _mm256_dpbusd_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(xoff + 8 * g)),
                                                  q2_codes_2u(chunks + 8 * groups * r + 8 * g), load32(xq + 32 * g));
            rest = _mm256_fmadd_ps(_mm256_set1_ps(scales[groups * r + g] * xd[g]), _mm256_cvtepi32_ps(p), rest);
        }
        const __m512 a = _mm512_add_ps(acc[r][0], acc[r][1]);
        // (c - 1.5) * s = (2c - 3) * (s / 2): the integer sums, halved once.
        out[r] = _mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_add_ps(_mm256_add_ps(lo256(a), hi256(a)), rest));
    }
}

// The GFNI form (CPUs with GFNI, checked at run time), 8 groups (64 code
// bytes, one load) a step: x transposed so that pass t (0..3) holds bytes
// 8t..8t+7 of each group's q2_quads block (the codes in bits 2t..2t+1 of the
// group's 8 bytes) in the group's qword (q2_x_passes, made once per call,
// then each lane started at -3 * the sum of the x codes it meets). One
// vgf2p8affineqb moves bits 2t, 2t+1 of every code byte to bits 1, 2, which
// is 2c: one affine and one vpdpbusd per 64 weights, where the pair loop above
// takes a permute, a shift, an and, a doubling and three float operations (a
// permute of the scales, a convert, an FMA) per 64, and a VBMI multishift
// with an and took three (one core, weights in L2, 1024x1024 on the Intel
// VM: docs/performance.md). The float work comes once per 8 groups (lanes
// 2g, 2g+1 hold group g's halves). A last step short of 8 groups reads only
// its groups (masked loads; zero x past them).
constexpr uint64_t kQ2StepBytes = 6 * 64;  // 4 passes of x, the lanes' starts, d per lane
// Pass t, group g: qword 4(g%4)+t of two x registers.
struct Q2PassQwords {
    alignas(64) int64_t v[4][8] = {};
    constexpr Q2PassQwords() {
        for (int t = 0; t < 4; ++t)
            for (int g = 0; g < 8; ++g) v[t][g] = 4 * (g % 4) + t;
    }
};
constexpr Q2PassQwords kQ2PassQwords;
// The affine matrix of pass t: result bit 1 from bit 2t, bit 2 from bit 2t+1
// (gf2p8_affine: result bit i reads byte 7-i of the matrix).
constexpr uint64_t q2_pass_matrix(int t) {
    return (uint64_t(1) << (2 * t) << 48) | (uint64_t(1) << (2 * t + 1) << 40);
}

// x's passes for one call, in this thread's room.
const uint8_t *q2_x_passes(const int8_t *xq, const float *xd, uint64_t groups) {
    uint8_t *xt = static_cast<uint8_t *>(thread_room(RoomSlot::q2_x_passes, kQ2StepBytes * ((groups + 7) / 8)));
    const __m512i ones = _mm512_set1_epi8(1);
    for (uint64_t g0 = 0; g0 < groups; g0 += 8) {
        const uint64_t n = std::min<uint64_t>(8, groups - g0);
        uint8_t *o = xt + kQ2StepBytes * (g0 / 8);
        __m512i X[4];
        load_x8(xq, g0, n, X);
        __m512i sum = _mm512_setzero_si512();
        for (int t = 0; t < 4; ++t) {
            const __m512i idx = _mm512_load_si512(kQ2PassQwords.v[t]);
            const __m512i v = _mm512_mask_blend_epi64(0xF0, _mm512_maskz_permutex2var_epi64(0xFF, X[0], idx, X[1]),
                                                      _mm512_maskz_permutex2var_epi64(0xFF, X[2], idx, X[3]));
            _mm512_store_si512(o + 64 * t, v);
            sum = _mm512_dpbusd_epi32(sum, ones, v);
        }
        // -3 * sum, the offset of codes doubled less 3: sum((2c - 3) * q)
        _mm512_store_si512(o + 256, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_add_epi32(sum, _mm512_add_epi32(sum, sum))));
        _mm512_store_ps(o + 320, pairs_of8(xd + g0, n));
    }
    return xt;
}

template <int R, bool Nta>
__attribute__((always_inline)) inline void q2_pass_gfni(const uint8_t *chunks, uint64_t ld, const float *scales,
                                                        const uint8_t *xt, uint64_t groups, float *y) {
    const long ahead = R > 1 ? std::max(long(R * ld), kPrefetchAhead) : kPrefetchAhead;
    __m512 acc[R];
#pragma GCC unroll 4
    for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
    for (uint64_t g0 = 0; g0 < groups; g0 += 8) {
        const uint64_t n = std::min<uint64_t>(8, groups - g0);
        const uint8_t *xs = xt + kQ2StepBytes * (g0 / 8);
        const __mmask8 live = static_cast<__mmask8>((1u << n) - 1);
        __m512i codes[R], s[R];
#pragma GCC unroll 4
        for (int q = 0; q < R; ++q) {
            const uint8_t *c = chunks + q * ld + 8 * g0;
            prefetch_weights<Nta>(c + ahead);
            codes[q] = _mm512_maskz_loadu_epi64(live, c);
            s[q] = _mm512_load_si512(xs + 256);
        }
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
            const __m512i m = _mm512_set1_epi64(int64_t(q2_pass_matrix(t))), xv = _mm512_load_si512(xs + 64 * t);
#pragma GCC unroll 4
            for (int q = 0; q < R; ++q) s[q] = _mm512_dpbusd_epi32(s[q], gf2p8_affine(codes[q], m), xv);
        }
        const __m512 d = _mm512_load_ps(xs + 320);
#pragma GCC unroll 4
        for (int q = 0; q < R; ++q) {
            acc[q] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, s[q]), _mm512_mul_ps(pairs_of8(scales + q * groups + g0, n), d),
                                     acc[q]);
        }
    }
    // (c - 1.5) * s = (2c - 3) * (s / 2): the integer sums, halved once.
#pragma GCC unroll 4
    for (int q = 0; q < R; ++q) y[q] = 0.5f * hsum512(acc[q]);
}

// The rows four a pass, then one by one; scales_of(r, n) gives the group
// scales of rows r .. r+n-1 (n * groups floats, row by row).
template <bool Nta, class ScalesOf>
void q2_rows_gfni(const uint8_t *chunks, const uint8_t *xt, uint64_t groups, uint64_t rows, float *y,
                  ScalesOf &&scales_of) {
    const uint64_t ld = 8 * groups;
    uint64_t r = 0;
    for (; r + 4 <= rows; r += 4) q2_pass_gfni<4, Nta>(chunks + r * ld, ld, scales_of(r, 4), xt, groups, y + r);
    for (; r < rows; ++r) q2_pass_gfni<1, Nta>(chunks + r * ld, ld, scales_of(r, 1), xt, groups, y + r);
}
}  // namespace
#endif

void rows_q2_groups_xq(const uint8_t *chunks, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups, uint64_t rows, float *y) {
#ifdef CMF_CODECS_VNNI
    if (has_gfni()) {
        if (rows == 0) return;
        const uint8_t *xt = q2_x_passes(xq, xd, groups);
        with_weights_hint([&](auto nta) {
            q2_rows_gfni<decltype(nta)::value>(chunks, xt, groups, rows, y,
                                               [&](uint64_t r, int) { return scales + r * groups; });
        });
        return;
    }
    with_weights_hint([&](auto nta) {
        q4_rows4(rows, y, [&](uint64_t q, auto rn, __m256 *o) {
            q2_acc_rows<decltype(rn)::value, decltype(nta)::value>(chunks + 8 * groups * q, scales + groups * q, xq,
                                                                   xoff, xd, groups, o);
        });
    });
#else
    for (uint64_t r = 0; r < rows; ++r)
        y[r] = dot_q2_groups_xq(chunks + 8 * groups * r, scales + groups * r, xq, xoff, xd, groups);
#endif
}

// With GFNI each pass of four rows picks its rows' scales just before it
// (into scratch, which stays in L1), where the two steps make a block of 64
// rows' scales first: a burst of arithmetic with no weight loads in it,
// a quarter of one core's time on 3072x1024 (perf), during which the
// weight stream of a one-token matmul stalls. The same picks, products and
// sums in the same order: the same bits.
void rows_q2tp_xq(const uint8_t *chunks, const float *first, const float *ratio, const uint8_t *codes,
                  uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                  uint64_t rows, float *scratch, float *y) {
#ifdef CMF_CODECS_VNNI
    if (has_gfni()) {
        if (rows == 0) return;
        const uint8_t *xt = q2_x_passes(xq, xd, groups);
        auto pick = [&](uint64_t r, int n) __attribute__((always_inline)) {
            for (int q = 0; q < n; ++q) {
                __m512 lo, hi;
                powers_rungs(first[r + q], ratio[r + q], true, lo, hi);
                pick_rungs16(lo, hi, codes + code_stride * (r + q), groups, scratch + groups * q);
            }
            return static_cast<const float *>(scratch);
        };
        with_weights_hint([&](auto nta) { q2_rows_gfni<decltype(nta)::value>(chunks, xt, groups, rows, y, pick); });
        return;
    }
#endif
    tp_rows_two_steps<true>(chunks, first, ratio, codes, code_stride, xq, xoff, xd, groups, rows, scratch, y);
}

// ---- q1t ------------------------------------------------------------------------
// A q1t group is 7 bytes of base-3 digits (element 5j+k = digit k of byte j,
// kernels.hpp) against x quantized to int8 blocks. Both forms make each
// group's exact integer sum of w*q and add s * d[g] * it to f32 lanes; the
// VBMI form sums 8 groups' lanes in another order than the AVX2 one.
namespace {
// The weights of a byte's 5 digits (0, +1, -1) in bytes 0..4 of an 8-byte
// row (5..7 zero): the AVX2 form's decode and every build's int8 view. 2 KiB,
// built at compile time: a run-time initializer here would be compiled with
// this file's ISA flags and run at library load, before any CPU check.
struct Q1tSigns {
    alignas(64) int8_t v[256][8] = {};
    constexpr Q1tSigns() {
        for (int b = 0; b < 256; ++b) {
            int x = b;
            for (int k = 0; k < 5; ++k, x /= 3) v[b][k] = static_cast<int8_t>(x % 3 == 0 ? 0 : x % 3 == 1 ? 1 : -1);
        }
    }
};
constexpr Q1tSigns kQ1tSigns;
inline int64_t q1t_signs(uint8_t b) {
    int64_t v;
    std::memcpy(&v, kQ1tSigns.v[b], 8);
    return v;
}

// The AVX2 form: a group's 7 bytes become 7 rows of kQ1tSigns, 8 bytes a
// byte (its 5 weights and 3 zeros), against x in the same slots: slot j of a
// group's 64 table bytes holds x's elements 5j..5j+4 and three zeros, made
// once per call by three byte shuffles a group. vpsignb, vpmaddubsw against
// 1 and vpmaddwd against 1 then give a group's int32 lanes.
struct Q1tSlotShuffles {
    alignas(32) int8_t lo_a[32] = {}, hi_a[32] = {}, hi_b[32] = {};
    constexpr Q1tSlotShuffles() {
        // Output byte p of slots 0-3 (a) and 4-7 (b): slot p/8, digit p%8.
        for (int p = 0; p < 32; ++p) {
            const int ka = p % 8, ea = 5 * (p / 8) + ka, eb = 5 * (4 + p / 8) + ka;
            lo_a[p] = static_cast<int8_t>(ka < 5 && ea < 16 ? ea : -128);
            hi_a[p] = static_cast<int8_t>(ka < 5 && ea >= 16 && ea < 32 ? ea - 16 : -128);
            hi_b[p] = static_cast<int8_t>(ka < 5 && eb < 32 ? eb - 16 : -128);
        }
    }
};
constexpr Q1tSlotShuffles kQ1tSlots;

void q1t_x_slots(const int8_t *xq, uint64_t groups, int8_t *xt) {
    const __m256i lo_a = _mm256_load_si256(reinterpret_cast<const __m256i *>(kQ1tSlots.lo_a));
    const __m256i hi_a = _mm256_load_si256(reinterpret_cast<const __m256i *>(kQ1tSlots.hi_a));
    const __m256i hi_b = _mm256_load_si256(reinterpret_cast<const __m256i *>(kQ1tSlots.hi_b));
    for (uint64_t g = 0; g < groups; ++g) {
        const __m256i lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(xq + 32 * g)));
        const __m256i hi =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(xq + 32 * g + 16)));
        _mm256_store_si256(reinterpret_cast<__m256i *>(xt + 64 * g),
                           _mm256_or_si256(_mm256_shuffle_epi8(lo, lo_a), _mm256_shuffle_epi8(hi, hi_a)));
        _mm256_store_si256(reinterpret_cast<__m256i *>(xt + 64 * g + 32), _mm256_shuffle_epi8(hi, hi_b));
    }
}

inline float q1t_row_slots(const uint8_t *tiles, const int8_t *xt, const float *xd, uint64_t groups) {
    const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 9 * g;
        if ((9 * g) % 64 < 9) prefetch_ahead(t);  // one group a line starts in
        const uint8_t *c = t + 2;
        const __m256i w0 = _mm256_setr_epi64x(q1t_signs(c[0]), q1t_signs(c[1]), q1t_signs(c[2]), q1t_signs(c[3]));
        const __m256i w1 = _mm256_setr_epi64x(q1t_signs(c[4]), q1t_signs(c[5]), q1t_signs(c[6]), 0);
        const __m256i s0 = _mm256_maddubs_epi16(one8, _mm256_sign_epi8(load32(xt + 64 * g), w0));
        const __m256i s1 = _mm256_maddubs_epi16(one8, _mm256_sign_epi8(load32(xt + 64 * g + 32), w1));
        const __m256i p = _mm256_madd_epi16(_mm256_add_epi16(s0, s1), one16);
        acc[g & 1] = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(t) * xd[g]), _mm256_cvtepi32_ps(p), acc[g & 1]);
    }
    return hsum(_mm256_add_ps(acc[0], acc[1]));
}

#ifdef CMF_CODECS_VNNI
// The VBMI form, 8 groups (72 bytes) a step: one byte permute over the
// step's two loads gathers the groups' 7 digit bytes into 8-byte slots (one
// a group), another their f16 scales into words 2g and 2g+1. A digit plane
// k (digit k of every byte) is then a byte-table lookup: u = 1, 2, 0 for the
// digits 0, 1, 2 (so u - 1 is the weight), straight into vpdpbusd against
// x's elements 5j+k laid out in the same slots, each lane started at minus
// the x codes it meets: the two lanes of a group then hold sum(w*q). A table of 256 entries takes two merge-masked
// vpermi2b (bytes below 128, at or above), one of 128 entries one: b mod 81
// (256) leaves digits 0-3, each one lookup (128), and digit 4 is its own
// 256-entry lookup on b: 8 permutes a step for 5 planes.
struct Q1tVbmiTables {
    alignas(64) uint8_t mod81[256] = {};
    alignas(64) uint8_t plane[4][128] = {};  // m -> u(digit k of m)
    alignas(64) uint8_t top[256] = {};       // b -> u(floor(b / 81) mod 3)
    alignas(64) uint8_t code_idx[64] = {};   // slot g, byte j: digit byte min(j, 6) of group g
    alignas(64) uint8_t scale_idx[64] = {};  // words 2g, 2g+1: group g's f16 scale
    alignas(64) uint8_t x_idx[5][64] = {};   // plane k, slot g, byte j: element 5j+k of group g (of 4 in two registers)
    uint64_t x_valid[5] = {};                // the slot bytes that hold an element
    static constexpr uint8_t u_of(int d) { return static_cast<uint8_t>(d == 0 ? 1 : d == 1 ? 2 : 0); }
    constexpr Q1tVbmiTables() {
        constexpr int kPow3[5] = {1, 3, 9, 27, 81};
        for (int b = 0; b < 256; ++b) {
            mod81[b] = static_cast<uint8_t>(b % 81);
            top[b] = u_of(b / 81 % 3);
        }
        for (int k = 0; k < 4; ++k)
            for (int m = 0; m < 128; ++m) plane[k][m] = u_of(m / kPow3[k] % 3);
        for (int g = 0; g < 8; ++g)
            for (int j = 0; j < 8; ++j) {
                code_idx[8 * g + j] = static_cast<uint8_t>(9 * g + 2 + (j < 6 ? j : 6));
                for (int k = 0; k < 5; ++k) {
                    const int e = 5 * j + k;
                    if (j < 7 && e < 32) {
                        x_idx[k][8 * g + j] = static_cast<uint8_t>(32 * (g % 4) + e);
                        x_valid[k] |= uint64_t{1} << (8 * g + j);
                    }
                }
            }
        for (int w = 0; w < 16; ++w)
            for (int h = 0; h < 2; ++h) scale_idx[2 * w + h] = static_cast<uint8_t>(9 * (w / 2) + h);
    }
};
constexpr Q1tVbmiTables kQ1tVbmi;
// A step's x: 5 planes of 64 bytes, then the 16 int32 starts (minus the
// sum of the x codes each lane meets over the planes: lanes 2g and 2g+1
// together minus group g's sum), then the 16 floats d[g] (lanes 2g, 2g+1);
// the groups past `groups` in the last step all zero.
constexpr uint64_t kQ1tStepBytes = 7 * 64;

__attribute__((target("avx512vbmi"))) void q1t_x_planes(const int8_t *xq, const float *xd, uint64_t groups,
                                                        uint8_t *xt) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (uint64_t g0 = 0; g0 < groups; g0 += 8) {
        const uint64_t n = std::min<uint64_t>(8, groups - g0);
        uint8_t *o = xt + kQ1tStepBytes * (g0 / 8);
        __m512i X[4];
        load_x8(xq, g0, n, X);
        __m512i sum = _mm512_setzero_si512();
        for (int k = 0; k < 5; ++k) {
            const __m512i idx = _mm512_load_si512(kQ1tVbmi.x_idx[k]);
            const uint64_t v = kQ1tVbmi.x_valid[k];
            const __m512i a = _mm512_maskz_permutex2var_epi8(v & 0xFFFFFFFFull, X[0], idx, X[1]);
            const __m512i b = _mm512_maskz_permutex2var_epi8(v & ~0xFFFFFFFFull, X[2], idx, X[3]);
            const __m512i plane = _mm512_or_si512(a, b);
            _mm512_store_si512(o + 64 * k, plane);
            sum = _mm512_dpbusd_epi32(sum, ones, plane);
        }
        _mm512_store_si512(o + 320, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
        _mm512_store_ps(o + 384, pairs_of8(xd + g0, n));
    }
}

// One step of 8 groups: lo = their bytes 0..63, hi = bytes 64..71 in its
// low 8 bytes; xs = the step's x (q1t_x_planes).
struct Q1tVbmiRegs {
    __m512i code_idx, scale_idx, mod81[4], top[4], plane[4][2];
};
__attribute__((target("avx512vbmi"), always_inline)) inline __m512 q1t_step(const Q1tVbmiRegs &T, __m512i lo,
                                                                            __m512i hi, const uint8_t *xs,
                                                                            __m512 acc) {
    const __m512i codes = _mm512_permutex2var_epi8(lo, T.code_idx, hi);
    const __m256i h = _mm512_maskz_extracti64x4_epi64(0xF, _mm512_permutex2var_epi8(lo, T.scale_idx, hi), 0);
    const __m512 sc = _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xFFFF, h), _mm512_load_ps(xs + 384));
    const __mmask64 high = _mm512_movepi8_mask(codes), low = _knot_mask64(high);
    // b >= 128 from the tables' upper halves first, then the rest.
    const __m512i m = _mm512_mask2_permutex2var_epi8(
        T.mod81[0], _mm512_mask2_permutex2var_epi8(T.mod81[2], codes, high, T.mod81[3]), low, T.mod81[1]);
    const __m512i u4 = _mm512_mask2_permutex2var_epi8(
        T.top[0], _mm512_mask2_permutex2var_epi8(T.top[2], codes, high, T.top[3]), low, T.top[1]);
    // Two chains of vpdpbusd (3 and 2 long) rather than one of 5.
    __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(xs + 320),
                                    _mm512_permutex2var_epi8(T.plane[0][0], m, T.plane[0][1]), _mm512_load_si512(xs));
    __m512i s2 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_permutex2var_epi8(T.plane[1][0], m, T.plane[1][1]),
                                     _mm512_load_si512(xs + 64));
    s = _mm512_dpbusd_epi32(s, _mm512_permutex2var_epi8(T.plane[2][0], m, T.plane[2][1]), _mm512_load_si512(xs + 128));
    s2 = _mm512_dpbusd_epi32(s2, _mm512_permutex2var_epi8(T.plane[3][0], m, T.plane[3][1]), _mm512_load_si512(xs + 192));
    s = _mm512_dpbusd_epi32(s, u4, _mm512_load_si512(xs + 256));
    return _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_add_epi32(s, s2)), sc, acc);
}

// R rows (t, t + ld, ...) of `steps` whole steps and a last one of `tail`
// groups; R = 2 shares each step's x loads between two rows (one core,
// weights in L2, 1024x1024: 21.6-22.0 -> 23.8-24.0 GB/s; four rows a pass
// were no faster).
template <int R, bool Nta>
__attribute__((target("avx512vbmi"), always_inline)) inline void q1t_pass(const Q1tVbmiRegs &T, const uint8_t *t,
                                                                          uint64_t ld, const uint8_t *xt,
                                                                          uint64_t steps, uint64_t tail, float *y) {
    __m512 acc[R];
#pragma GCC unroll 2
    for (int q = 0; q < R; ++q) acc[q] = _mm512_setzero_ps();
    for (uint64_t i = 0; i < steps; ++i) {
        const uint8_t *p = t + 72 * i, *xs = xt + kQ1tStepBytes * i;
#pragma GCC unroll 2
        for (int q = 0; q < R; ++q) {
            prefetch_weights<Nta>(p + q * ld + kPrefetchAhead);
            prefetch_weights<Nta>(p + q * ld + kPrefetchAhead + 64);
        }
#pragma GCC unroll 2
        for (int q = 0; q < R; ++q)
            acc[q] = q1t_step(T, _mm512_loadu_si512(p + q * ld), _mm512_maskz_loadu_epi8(0xFF, p + q * ld + 64), xs,
                              acc[q]);
    }
    if (tail != 0) {  // 9 * 7 = 63 bytes at most: one masked load
        const uint8_t *p = t + 72 * steps, *xs = xt + kQ1tStepBytes * steps;
#pragma GCC unroll 2
        for (int q = 0; q < R; ++q)
            acc[q] = q1t_step(T, _mm512_maskz_loadu_epi8((uint64_t{1} << (9 * tail)) - 1, p + q * ld),
                              _mm512_setzero_si512(), xs, acc[q]);
    }
#pragma GCC unroll 2
    for (int q = 0; q < R; ++q) y[q] = hsum512(acc[q]);
}

template <bool Nta>
__attribute__((target("avx512vbmi"))) void q1t_rows_vbmi(const uint8_t *tiles, const uint8_t *xt, uint64_t groups,
                                                         uint64_t rows, float *y) {
    Q1tVbmiRegs T;
    T.code_idx = _mm512_load_si512(kQ1tVbmi.code_idx);
    T.scale_idx = _mm512_load_si512(kQ1tVbmi.scale_idx);
    for (int i = 0; i < 4; ++i) {
        T.mod81[i] = _mm512_load_si512(kQ1tVbmi.mod81 + 64 * i);
        T.top[i] = _mm512_load_si512(kQ1tVbmi.top + 64 * i);
        T.plane[i][0] = _mm512_load_si512(kQ1tVbmi.plane[i]);
        T.plane[i][1] = _mm512_load_si512(kQ1tVbmi.plane[i] + 64);
    }
    const uint64_t ld = 9 * groups;
    uint64_t r = 0;
    for (; r + 2 <= rows; r += 2) q1t_pass<2, Nta>(T, tiles + r * ld, ld, xt, groups / 8, groups % 8, y + r);
    if (r < rows) q1t_pass<1, Nta>(T, tiles + r * ld, ld, xt, groups / 8, groups % 8, y + r);
}
#endif
}  // namespace

void rows_q1t_xq(const uint8_t *tiles, const int8_t *xq, const float *xd, uint64_t groups, uint64_t rows, float *y) {
    if (rows == 0) return;
#ifdef CMF_CODECS_VNNI
    if (has_avx512_vbmi()) {
        uint8_t *xt = static_cast<uint8_t *>(thread_room(RoomSlot::q1t_x_table, kQ1tStepBytes * ((groups + 7) / 8)));
        q1t_x_planes(xq, xd, groups, xt);
        with_weights_hint([&](auto nta) { q1t_rows_vbmi<decltype(nta)::value>(tiles, xt, groups, rows, y); });
        return;
    }
#endif
    int8_t *xt = static_cast<int8_t *>(thread_room(RoomSlot::q1t_x_table, 64 * groups));
    q1t_x_slots(xq, groups, xt);
    for (uint64_t r = 0; r < rows; ++r) y[r] = q1t_row_slots(tiles + 9 * groups * r, xt, xd, groups);
}

void unpack_q1t_groups(const uint8_t *tiles, uint64_t groups, int8_t *codes, float *scales) {
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 9 * g;
        int8_t *c = codes + 32 * g;
        // Bytes 0..4 of the group 8 bytes at a time (each row's 3 zeros
        // overwritten by the next), byte 5's 5 weights and byte 6's 2.
        for (int j = 0; j < 5; ++j) std::memcpy(c + 5 * j, kQ1tSigns.v[t[2 + j]], 8);
        std::memcpy(c + 25, kQ1tSigns.v[t[7]], 5);
        std::memcpy(c + 30, kQ1tSigns.v[t[8]], 2);
        scales[g] = f16_scalar(t);
    }
}

// ---- decode -------------------------------------------------------------------

void dequant_q4_groups(const uint8_t *nibbles, uint64_t stride, const float *scales, uint64_t groups, float *dst) {
    const __m128i mask = _mm_set1_epi8(15);
    const __m256i eight = _mm256_set1_epi32(8);
    for (uint64_t g = 0; g < groups; ++g) {
        __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(nibbles + stride * g));
        __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
        // Interleaved back to element order: low nibble = even element.
        __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
        const __m256 s = _mm256_set1_ps(scales[g]);
        const __m128i parts[4] = {e0, _mm_srli_si128(e0, 8), e1, _mm_srli_si128(e1, 8)};
        for (int k = 0; k < 4; ++k) {
            __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[k]), eight);
            _mm256_storeu_ps(dst + 32 * g + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
        }
    }
}

void dequant_q2_groups(const uint8_t *chunks, const float *scales, uint64_t groups, float *dst) {
    // Element 4k+j sits in bits [2j, 2j+2) of byte k: per 32-bit lane of
    // 4 elements, broadcast byte k and shift each lane by 2j.
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m256i three = _mm256_set1_epi32(3);
    const __m256 half3 = _mm256_set1_ps(1.5f);
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *c = chunks + 8 * g;
        const __m256 s = _mm256_set1_ps(scales[g]);
        for (int k = 0; k < 8; k += 2) {  // bytes k, k+1 -> elements 4k .. 4k+7
            __m256i v = _mm256_setr_epi32(c[k], c[k], c[k], c[k], c[k + 1], c[k + 1], c[k + 1], c[k + 1]);
            __m256i q = _mm256_and_si256(_mm256_srlv_epi32(v, shifts), three);
            _mm256_storeu_ps(dst + 32 * g + 4 * k, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(q), half3), s));
        }
    }
}

#ifdef CMF_CODECS_VNNI
namespace {
// Eight codes of b bits are b whole bytes, so each 128-bit lane takes its
// own b bytes (a masked load: nothing past a group is read) and holds 8
// codes: a byte shuffle puts code j's two bytes (k = j*b/8 and k+1)
// big-endian into 16-bit lane j, a per-lane shift and a mask leave the code.
// Then (u - L) widened to int32, converted and scaled: the scalar form's
// operations, so the same floats. each(g, lo, hi) gets group g's values
// 0-15 and 16-31.
// By width b: idx, the byte shuffle that puts code j's two bytes (k = j*b/8
// and k+1) big-endian into 16-bit lane j; shift, lane j's right shift.
// Made at compile time: made per call (per row in a decode), the scalar
// stores and the vector loads of them that could not forward took a
// quarter of a mixed-width vbit_ro row's time (perf, one core).
struct VbitWordTables {
    alignas(16) int8_t idx[9][16] = {};
    alignas(16) int16_t shift[9][8] = {};
    constexpr VbitWordTables() {
        for (unsigned b = 1; b <= 8; ++b)
            for (unsigned j = 0; j < 8; ++j) {
                const unsigned p = j * b, k = p / 8;
                idx[b][2 * j] = static_cast<int8_t>(k + 1 < b ? k + 1 : 0x80);  // the low byte; 0x80: a zero byte
                idx[b][2 * j + 1] = static_cast<int8_t>(k);
                shift[b][j] = static_cast<int16_t>(16 - p % 8 - b);
            }
    }
};
constexpr VbitWordTables kVbitWords;
template <class Each>
inline void vbit_groups(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, uint64_t groups, Each each) {
    const __m512i sh_idx = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_load_si128(reinterpret_cast<const __m128i *>(kVbitWords.idx[b])));
    const __m512i sh = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_load_si128(reinterpret_cast<const __m128i *>(kVbitWords.shift[b])));
    const __m512i mask = _mm512_set1_epi16(int16_t((1 << b) - 1)), L = _mm512_set1_epi16(int16_t((1 << (b - 1)) - 1));
    const __mmask16 bytes = __mmask16((1u << b) - 1);
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *c = codes + 4 * b * g;
        __m512i z = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_maskz_loadu_epi8(bytes, c));  // lane 0 (1-3 replaced below)
        z = _mm512_maskz_inserti32x4(0xFFFF, z, _mm_maskz_loadu_epi8(bytes, c + b), 1);
        z = _mm512_maskz_inserti32x4(0xFFFF, z, _mm_maskz_loadu_epi8(bytes, c + 2 * b), 2);
        z = _mm512_maskz_inserti32x4(0xFFFF, z, _mm_maskz_loadu_epi8(bytes, c + 3 * b), 3);
        z = _mm512_maskz_shuffle_epi8(__mmask64(~0ull), z, sh_idx);
        z = _mm512_sub_epi16(_mm512_and_si512(_mm512_maskz_srlv_epi16(0xFFFFFFFF, z, sh), mask), L);
        const __m512 s = _mm512_set1_ps(f16_scalar(f16_scales + 2 * g));
        const __m512i lo = _mm512_maskz_cvtepi16_epi32(0xFFFF, _mm512_maskz_extracti64x4_epi64(0xF, z, 0));
        const __m512i hi = _mm512_maskz_cvtepi16_epi32(0xFFFF, _mm512_maskz_extracti64x4_epi64(0xF, z, 1));
        each(g, _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, lo), s), _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, hi), s));
    }
}
}  // namespace

void dequant_vbit_groups(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, uint64_t groups, float *dst) {
    vbit_groups(codes, b, f16_scales, groups, [&](uint64_t g, __m512 lo, __m512 hi) {
        _mm512_storeu_ps(dst + 32 * g, lo);
        _mm512_storeu_ps(dst + 32 * g + 16, hi);
    });
}
namespace {
// A vbit group's 32 codes u as unsigned bytes in element order, and a pair
// of groups' 64 as one register: b = 8 the bytes themselves; b = 4 each
// byte's high nibble (element 2k, MSB-first) then its low one, the bytes
// widened to words and both nibbles put in place by one ternary logic op;
// the other widths through vbit_groups' word decode, narrowed (vpmovwb).
// B is b where it is 4 or 8 (a compile-time form each), 0 for the others.
template <unsigned B>
class VbitBytes {
public:
    explicit VbitBytes(unsigned b) : b_(b) {
        if constexpr (B == 0) {
            sh_idx_ = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_load_si128(reinterpret_cast<const __m128i *>(kVbitWords.idx[b])));
            sh_ = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_load_si128(reinterpret_cast<const __m128i *>(kVbitWords.shift[b])));
            mask_ = _mm512_set1_epi16(int16_t((1 << b) - 1));
            bytes_ = __mmask16((1u << b) - 1);
        }
    }
    __m256i group(const uint8_t *c) const {
        if constexpr (B == 8) return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(c));
        if constexpr (B == 4) {
            const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(c)));
            // (v >> 4) | ((v << 8) & 0x0F00): 0xF8 is A | (B & C), A the first operand.
            return _mm256_ternarylogic_epi32(_mm256_srli_epi16(v, 4), _mm256_slli_epi16(v, 8), _mm256_set1_epi16(0x0F00),
                                             0xF8);
        }
        __m512i z = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_maskz_loadu_epi8(bytes_, c));
        z = _mm512_maskz_inserti32x4(0xFFFF, z, _mm_maskz_loadu_epi8(bytes_, c + b_), 1);
        z = _mm512_maskz_inserti32x4(0xFFFF, z, _mm_maskz_loadu_epi8(bytes_, c + 2 * b_), 2);
        z = _mm512_maskz_inserti32x4(0xFFFF, z, _mm_maskz_loadu_epi8(bytes_, c + 3 * b_), 3);
        z = _mm512_maskz_shuffle_epi8(__mmask64(~0ull), z, sh_idx_);
        z = _mm512_maskz_and_epi32(0xFFFF, _mm512_maskz_srlv_epi16(0xFFFFFFFF, z, sh_), mask_);
        return _mm512_maskz_cvtepi16_epi8(0xFFFFFFFF, z);
    }
    __m512i pair(const uint8_t *c) const {  // groups g, g+1 at c, c + 4b
        if constexpr (B == 8) return _mm512_loadu_si512(c);
        if constexpr (B == 4) {
            const __m512i v = _mm512_maskz_cvtepu8_epi16(0xFFFFFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(c)));
            return _mm512_maskz_ternarylogic_epi32(0xFFFF, _mm512_maskz_srli_epi16(0xFFFFFFFF, v, 4),
                                                   _mm512_maskz_slli_epi16(0xFFFFFFFF, v, 8), _mm512_set1_epi16(0x0F00), 0xF8);
        }
        return _mm512_maskz_inserti64x4(0xFF, _mm512_maskz_inserti64x4(0xFF, _mm512_setzero_si512(), group(c), 0),
                                        group(c + 4 * b_), 1);
    }

private:
    unsigned b_;
    __m512i sh_idx_, sh_, mask_;
    __mmask16 bytes_ = 0;
};

// Two groups per 512-bit step: their code bytes against x in one vpdpbusd
// started at -L times each 4 x codes' sum (q8's offset / 128 is minus that
// sum; times L = 2^(b-1) - 1 as a shift and a subtraction), then one FMA
// with [s(g) d(g) x8 | s(g+1) d(g+1) x8], 16 groups' scale products made at
// a time. Where the f32 form widened every code to a float and met x in two
// FMAs per 16 weights, the codes stay bytes.
// Returns the dot as 8 partial sums. Lw: null, or the offsets -L times
// each 4 x codes' sum already made for this width (vbit_width_offsets),
// which a matmul makes once per x rather than once per row. Nta: the code
// stream's prefetch hint (prefetch_weights; a row range takes the CPU's, tg128 on
// the 0.6B vbit_ro file 2 % faster with NTA on the Zen 5 VM, four pairs).
// -L times each 4 x codes' sum of groups g, g+1 (16 lanes): Lw's, or made
// from xoff ((o1 << (b-1)) - o1 = L * o1, o1 = xoff >> 7; up = b - 1).
__attribute__((always_inline)) inline __m512i vbit_pair_offset(const int32_t *Lw, const int32_t *xoff, __m128i up,
                                                              uint64_t g) {
    if (Lw != nullptr) return _mm512_loadu_si512(Lw + 8 * g);
    const __m512i o1 = _mm512_maskz_srai_epi32(0xFFFF, _mm512_loadu_si512(xoff + 8 * g), 7);
    return _mm512_maskz_sub_epi32(0xFFFF, _mm512_maskz_sll_epi32(0xFFFF, o1, up), o1);
}
// One pair of groups' step of the 16-group loop: the pair's code bytes
// (64, element order) against x, started at the offsets, then one FMA
// with [s(g) d(g) x8 | s(g+1) d(g+1) x8] picked from sc (the 16 groups'
// scale products) into acc.
__attribute__((always_inline)) inline void vbit_pair_step(__m512i codes, __m512i offset, const int8_t *xq, __m512 sc,
                                                           int j, __m512 &acc) {
    const __m512i pair0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i p = _mm512_dpbusd_epi32(offset, codes, _mm512_loadu_si512(xq));
    acc = _mm512_fmadd_ps(_mm512_maskz_permutexvar_ps(0xFFFF, _mm512_maskz_add_epi32(0xFFFF, pair0, _mm512_set1_epi32(2 * j)), sc),
                          _mm512_maskz_cvtepi32_ps(0xFFFF, p), acc);
}
// The 16 groups' scale products from g0 on, and the step's prefetch.
template <bool Nta>
__attribute__((always_inline)) inline __m512 vbit_step_scales(const uint8_t *c0, unsigned b, const uint8_t *f16_scales,
                                                               const float *xd, uint64_t g0) {
    for (unsigned o = 0; o < 64 * b; o += 64) prefetch_weights<Nta>(c0 + o + kPrefetchAhead);
    return _mm512_mul_ps(
        _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(f16_scales + 2 * g0))),
        _mm512_loadu_ps(xd + g0));
}
// The last groups short of 16, one at a time, and the row's 8 partial sums.
template <unsigned B>
__attribute__((always_inline)) inline __m256 vbit_rest(const VbitBytes<B> &bytes, const uint8_t *codes, unsigned b, const uint8_t *f16_scales,
                 const int8_t *xq, const int32_t *xoff, const int32_t *Lw, const float *xd, uint64_t g0,
                 uint64_t groups, const __m512 *acc) {
    const __m128i up = _mm_cvtsi32_si128(int(b - 1));
    __m256 rest = _mm256_setzero_ps();
    for (uint64_t g = g0; g < groups; ++g) {  // the last groups short of 16
        __m256i o;
        if (Lw != nullptr) {
            o = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(Lw + 8 * g));
        } else {
            const __m256i o1 = _mm256_srai_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(xoff + 8 * g)), 7);
            o = _mm256_sub_epi32(_mm256_sll_epi32(o1, up), o1);
        }
        const __m256i p = _mm256_dpbusd_epi32(o, bytes.group(codes + 4 * b * g), load32(xq + 32 * g));
        rest = _mm256_fmadd_ps(_mm256_set1_ps(f16_scalar(f16_scales + 2 * g) * xd[g]), _mm256_cvtepi32_ps(p), rest);
    }
    const __m512 a = _mm512_add_ps(acc[0], acc[1]);
    return _mm256_add_ps(_mm256_add_ps(lo256(a), hi256(a)), rest);
}
template <unsigned B, bool Nta = false>
__m256 vbit_xq(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xoff,
               const int32_t *Lw, const float *xd, uint64_t groups) {
    const VbitBytes<B> bytes(b);
    const __m128i up = _mm_cvtsi32_si128(int(b - 1));
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    uint64_t g0 = 0;
    for (; g0 + 16 <= groups; g0 += 16) {
        const __m512 sc = vbit_step_scales<Nta>(codes + 4 * b * g0, b, f16_scales, xd, g0);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const uint64_t g = g0 + 2 * j;
            vbit_pair_step(bytes.pair(codes + 4 * b * g), vbit_pair_offset(Lw, xoff, up, g), xq + 32 * g, sc, j, acc[j & 1]);
        }
    }
    return vbit_rest(bytes, codes, b, f16_scales, xq, xoff, Lw, xd, g0, groups, acc);
}
// The VBMI form of the widths 3, 5 and 6 (CPUs with AVX-512 VBMI, checked
// at run time): a pair of groups' 8b code bytes in one masked load; one
// byte permute gives each qword its 8 codes' b bytes reversed (so that the
// qword read as a number holds them MSB-first from bit 63 down, as the row
// stores them), one vpmultishiftqb takes code i's bits from bit 64 - (i+1)b
// into byte i, and one and leaves the code: a load and 3 operations per 64
// codes where VbitBytes' word decode takes 8 loads and 18 (per 32: four
// lanes' masked loads put together by inserts, a shuffle, a shift, an and
// and a narrowing; two inserts to join the halves). The same bytes, so the same sums
// and floats as vbit_xq<0>. Its loop repeats vbit_xq's: the VBMI decode
// needs the target attribute, and GCC inlines a function built for VBMI
// only into one built for it, so the shared loop cannot take it as a
// template argument.
struct VbitVbmiTables {
    alignas(64) uint8_t idx[9][64] = {};   // by width: byte 8j+t <- code byte b*j + 7 - t
    alignas(64) uint8_t ctrl[9][64] = {};  // by width: byte 8j+i <- 8 bits from bit 64 - (i+1)*b of qword j
    uint64_t live[9] = {};                 // by width: the permute's bytes that take a code byte (7 - t < b)
    constexpr VbitVbmiTables() {
        for (unsigned b = 3; b <= 8; ++b)
            for (unsigned j = 0; j < 8; ++j)
                for (unsigned t = 0; t < 8; ++t) {
                    const unsigned m = 7 - t;
                    idx[b][8 * j + t] = static_cast<uint8_t>(m < b ? b * j + m : 0);
                    ctrl[b][8 * j + t] = static_cast<uint8_t>(64 - (t + 1) * b);
                    if (m < b) live[b] |= uint64_t{1} << (8 * j + t);
                }
    }
};
constexpr VbitVbmiTables kVbitVbmi;

template <bool Nta>
__attribute__((target("avx512vbmi"))) __m256 vbit_xq_vbmi(const uint8_t *codes, unsigned b, const uint8_t *f16_scales,
                                                          const int8_t *xq, const int32_t *xoff, const int32_t *Lw,
                                                          const float *xd, uint64_t groups) {
    const __m512i idx = _mm512_load_si512(kVbitVbmi.idx[b]), ctrl = _mm512_load_si512(kVbitVbmi.ctrl[b]);
    const __m512i mask = _mm512_set1_epi8(static_cast<char>((1u << b) - 1));
    const __mmask64 live = kVbitVbmi.live[b], pair_bytes = (uint64_t{1} << (8 * b)) - 1;
    const __m128i up = _mm_cvtsi32_si128(int(b - 1));
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    uint64_t g0 = 0;
    for (; g0 + 16 <= groups; g0 += 16) {
        const __m512 sc = vbit_step_scales<Nta>(codes + 4 * b * g0, b, f16_scales, xd, g0);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const uint64_t g = g0 + 2 * j;
            const __m512i raw = _mm512_maskz_loadu_epi8(pair_bytes, codes + 4 * b * g);
            const __m512i u = _mm512_and_si512(
                _mm512_maskz_multishift_epi64_epi8(~__mmask64{0}, ctrl, _mm512_maskz_permutexvar_epi8(live, idx, raw)), mask);
            vbit_pair_step(u, vbit_pair_offset(Lw, xoff, up, g), xq + 32 * g, sc, j, acc[j & 1]);
        }
    }
    return vbit_rest(VbitBytes<0>(b), codes, b, f16_scales, xq, xoff, Lw, xd, g0, groups, acc);
}
}  // namespace

void unpack_vbit_groups(const uint8_t *codes, unsigned b, uint64_t groups, int8_t *out) {
    auto run = [&](const auto &bytes) {
        const __m256i L = _mm256_set1_epi8(char((1 << (b - 1)) - 1));
        for (uint64_t g = 0; g < groups; ++g)
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + 32 * g), _mm256_sub_epi8(bytes.group(codes + 4 * b * g), L));
    };
    if (b == 4) run(VbitBytes<4>(b));
    else run(VbitBytes<0>(b));
}

float dot_vbit_xq(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xoff,
                  const float *xd, uint64_t groups) {
    if (b == 4) return hsum(vbit_xq<4>(codes, b, f16_scales, xq, xoff, nullptr, xd, groups));
    if (b == 8) return hsum(vbit_xq<8>(codes, b, f16_scales, xq, xoff, nullptr, xd, groups));
    if (has_avx512_vbmi()) return hsum(vbit_xq_vbmi<false>(codes, b, f16_scales, xq, xoff, nullptr, xd, groups));
    return hsum(vbit_xq<0>(codes, b, f16_scales, xq, xoff, nullptr, xd, groups));
}

// A row range: each width's offsets from the caller's table (made once per
// x: remade here when the width changed, they took a sixth of a matmul
// whose rows' widths mix as a trained matrix's do); runs of 4-bit rows
// summed four at a time as q4_rows4 sums them, other rows each alone (the
// same bits: sum1_row adds as sum4_rows does). Per-row calls of dot_vbit_xq spent
// a third of a one-token vbit_ro matmul outside the group loop (perf: the
// horizontal sum, the dispatch and the caller's loop), and a fifth of the
// loop's own operations remade the offsets. One core, weights in L2,
// 1024x1024: 28.6-28.9 -> 31.2-32.7 GB/s. The group loop stays a call of
// its own: inlined here (three forms) it ran faster in L2 but read a
// 3072x1024 stream from memory on 2 threads at 34-38 GB/s against 39-40.
void rows_vbit_xq(const uint8_t *const *codes, const uint8_t *widths, const uint8_t *f16_scales, const int8_t *xq,
                  const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows, const VbitRowsX &vx,
                  float *y) {
    // Runs of 4-bit rows through the q4 kernel (vbit4_rows); the other rows
    // one at a time, one instance of the group loop per width form.
    const bool vbmi = has_avx512_vbmi();
    with_weights_hint([&](auto nta) {
        constexpr bool Nta = decltype(nta)::value;
        for (uint64_t r = 0; r < rows;) {
            const unsigned b = widths[r];
            const uint8_t *sc = f16_scales + 2 * groups * r;
            if (b == 4) {
                const uint64_t e = vbit4_run_end(codes, widths, r, rows, groups);
                vbit4_rows<Nta>(codes[r], sc, vx, xd, groups, e - r, y + r);
                r = e;
                continue;
            }
            const int32_t *Lw = vx.width_offsets + 8 * groups * b;
            __m256 a;
            if (b == 8) a = vbit_xq<8, Nta>(codes[r], b, sc, xq, xoff, Lw, xd, groups);
            else if (vbmi) a = vbit_xq_vbmi<Nta>(codes[r], b, sc, xq, xoff, Lw, xd, groups);
            else a = vbit_xq<0, Nta>(codes[r], b, sc, xq, xoff, Lw, xd, groups);
            y[r++] = sum1_row(a);
        }
    });
}

#else
// No AVX2 form: the scalar bit window.
void unpack_vbit_groups(const uint8_t *codes, unsigned b, uint64_t groups, int8_t *out) {
    portable::unpack_vbit_groups(codes, b, groups, out);
}
float dot_vbit_xq(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xoff,
                  const float *xd, uint64_t groups) {
    return portable::dot_vbit_xq(codes, b, f16_scales, xq, xoff, xd, groups);
}
void rows_vbit_xq(const uint8_t *const *codes, const uint8_t *widths, const uint8_t *f16_scales, const int8_t *xq,
                  const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows, const VbitRowsX &vx,
                  float *y) {
    // Runs of 4-bit rows through the q4 kernel, the others by the portable bit window.
    with_weights_hint([&](auto nta) {
        for (uint64_t r = 0; r < rows;) {
            const uint8_t *sc = f16_scales + 2 * groups * r;
            if (widths[r] != 4) {
                y[r] = portable::dot_vbit_xq(codes[r], widths[r], sc, xq, xoff, xd, groups);
                ++r;
                continue;
            }
            const uint64_t e = vbit4_run_end(codes, widths, r, rows, groups);
            vbit4_rows<decltype(nta)::value>(codes[r], sc, vx, xd, groups, e - r, y + r);
            r = e;
        }
    });
}
void dequant_vbit_groups(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, uint64_t groups, float *dst) {
    portable::dequant_vbit_groups(codes, b, f16_scales, groups, dst);
}
#endif

void unpack_q4_groups(const uint8_t *nibbles, uint64_t stride, uint64_t groups, int8_t *codes) {
    const __m128i mask = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    for (uint64_t g = 0; g < groups; ++g) {
        __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(nibbles + stride * g));
        __m128i lo = _mm_sub_epi8(_mm_and_si128(b, mask), eight), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), mask), eight);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(codes + 32 * g), _mm_unpacklo_epi8(lo, hi));  // low nibble = even element
        _mm_storeu_si128(reinterpret_cast<__m128i *>(codes + 32 * g + 16), _mm_unpackhi_epi8(lo, hi));
    }
}

}  // namespace cmf::codecs::kernels::avx2 (or avx512vnni)
