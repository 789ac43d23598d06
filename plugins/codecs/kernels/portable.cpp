#include "kernels/portable.hpp"
#include "kernels/q1s_overlay.hpp"

#include <cmf/block_quant.hpp>

#include "half.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace cmf::codecs::kernels::portable {

namespace {
float f16_at(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
}
}  // namespace

float dot_f32(const float *a, const float *x, uint64_t n) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; ++i) acc += a[i] * x[i];
    return acc;
}
float dot_f16(const uint16_t *h, const float *x, uint64_t n) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; ++i) acc += f16_to_f32(h[i]) * x[i];
    return acc;
}
float dot_bf16(const uint16_t *h, const float *x, uint64_t n) {
    float acc = 0.0f;
    for (uint64_t i = 0; i < n; ++i) acc += bf16_to_f32(h[i]) * x[i];
    return acc;
}
// ---- int8 activations --------------------------------------------------------

namespace {
// Position of element e (0..31) inside a quantized block (kernels.hpp, XOrder).
unsigned position(XOrder order, unsigned e) {
    switch (order) {
    case XOrder::q4_pairs: return e / 2 + 16 * (e % 2);
    case XOrder::q2_quads: return 8 * (e % 4) + e / 4;
    default: return e;
    }
}
}  // namespace

// The reference q4 offset terms (kernels.hpp).
void q4_pair_offset(const int8_t *q, uint64_t blocks, int32_t *offset) {
    for (uint64_t k = 0; k < blocks / 2; ++k) {
        const int8_t *lo = q + 64 * k, *hi = q + 64 * k + 32;
        for (unsigned j = 0; j < 8; ++j) {
            int32_t s = 0;
            for (unsigned i = 4 * j; i < 4 * j + 4; ++i) s += lo[i] + hi[i];
            offset[8 * k + j] = -8 * s;
        }
    }
}

// The block quantizer the cpu backend's int8 GEMM shares (cmf/block_quant.hpp),
// its codes placed in `order`.
void quantize_x(const float *x, uint64_t n, XOrder order, int8_t *q, float *d) {
    for (uint64_t b = 0; b < x_blocks(n); ++b) {
        int8_t v[32];
        d[b] = cmf::block_quant::quantize_block(x + 32 * b, std::min<uint64_t>(32, n - 32 * b), v);
        for (unsigned e = 0; e < 32; ++e) q[32 * b + position(order, e)] = v[e];
    }
}

float dot_i8_xq(const int8_t *w, const int8_t *xq, const float *xd, uint64_t n) {
    float acc = 0.0f;
    for (uint64_t b = 0; 32 * b < n; ++b) {
        int32_t s = 0;
        for (uint64_t i = 32 * b; i < std::min<uint64_t>(n, 32 * b + 32); ++i) s += int32_t{w[i]} * xq[i];
        acc += xd[b] * static_cast<float>(s);
    }
    return acc;
}

void i8_offset(const int8_t *q, uint64_t blocks, int32_t *offset) {
    for (uint64_t l = 0; l < 8 * blocks; ++l) offset[l] = -128 * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
}

void rows_i8_xq(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *,
                const float *xd, uint64_t n, uint64_t rows, float *y) {
    for (uint64_t r = 0; r < rows; ++r) y[r] = f16_at(f16_scales + 2 * r) * dot_i8_xq(w + r * ld, xq, xd, n);
}

// Per token over 16-row tiles: the reference for the SIMD forms.
void rows_i8_xq_batch(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                      const float *xd, uint64_t n, uint64_t rows, uint64_t k, float *y, uint64_t ldy) {
    i8_tiles_per_token<&rows_i8_xq>(w, ld, f16_scales, xq, xboff, xd, n, rows, k, y, ldy);
}

void rows_q1_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *, const float *xd, uint64_t groups,
                uint64_t rows, float *y) {
    for (uint64_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (uint64_t g = 0; g < groups; ++g) {
            const uint8_t *t = tiles + 6 * (groups * r + g);
            uint32_t bits;
            std::memcpy(&bits, t + 2, 4);
            int32_t s = 0;
            for (unsigned k = 0; k < 32; ++k) s += ((bits >> k) & 1u) ? xq[32 * g + k] : -xq[32 * g + k];
            acc += f16_at(t) * xd[g] * static_cast<float>(s);
        }
        y[r] = acc;
    }
}

void unpack_q1_groups(const uint8_t *tiles, uint64_t groups, int8_t *codes, float *scales) {
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 6 * g;
        uint32_t bits;
        std::memcpy(&bits, t + 2, 4);
        for (unsigned k = 0; k < 32; ++k) codes[32 * g + k] = ((bits >> k) & 1u) ? 1 : -1;
        scales[g] = f16_at(t);
    }
}

void q1_passes_x(const int8_t *xq, uint64_t groups, uint8_t *xt) {
    for (uint64_t k = 0; k < groups / 16; ++k, xt += kQ1PassesXStepBytes) {
        const int8_t *x = xq + 512 * k;
        for (unsigned j = 0; j < 16; ++j) {
            int32_t sum = 0;
            for (unsigned e = 0; e < 32; ++e) {
                xt[64 * (e / 4) + 4 * j + e % 4] = static_cast<uint8_t>(x[32 * j + e]);
                sum += x[32 * j + e];
            }
            const int32_t start = -sum;
            std::memcpy(xt + 512 + 4 * j, &start, 4);
        }
    }
}

namespace {
// A step's codes in element order, element 4t+i of group j from lane byte
// 4j+i and pass t: +-1 by its bit t (q1_passes), or w = the two bits
// 2(t%4), 2(t%4)+1 of the lane byte of half t/4, less 1 (q1t_passes: -1, 0,
// +1, and +2 for the 3 a copy never holds, as the AVX-512 kernel reads it);
// and its 16 scales.
template <bool Ternary>
void q1_passes_unpack(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    constexpr uint64_t kStep = Ternary ? 160 : 96, kScales = Ternary ? 128 : 64;
    for (uint64_t k = 0; k < n; ++k, codes += 512, scales += 16) {
        const uint8_t *st = steps + kStep * k;
        for (unsigned t = 0; t < 8; ++t)
            for (unsigned j = 0; j < 16; ++j)
                for (unsigned i = 0; i < 4; ++i) {
                    const unsigned lane = 4 * j + i;
                    codes[32 * j + 4 * t + i] =
                        static_cast<int8_t>(Ternary ? int((st[64 * (t / 4) + lane] >> (2 * (t % 4))) & 3u) - 1
                                                    : ((st[lane] >> t) & 1u) ? 1 : -1);
                }
        for (unsigned j = 0; j < 16; ++j) scales[j] = f16_at(st + kScales + 2 * j);
    }
}
// Each step's codes (q1_passes_unpack) against x's passes: a group is
// s * d * (exact integer sum of w*q), the integers the AVX-512 kernel sums
// from its lane starts.
template <bool Ternary>
void q1_passes_rows(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows, float *y) {
    constexpr uint64_t kStep = Ternary ? 160 : 96;
    int8_t codes[512];
    float scales[16];
    for (uint64_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (uint64_t k = 0; k < groups / 16; ++k) {
            q1_passes_unpack<Ternary>(steps + kStep * (groups / 16 * r + k), 1, codes, scales);
            const uint8_t *xs = xt + kQ1PassesXStepBytes * k;
            for (unsigned j = 0; j < 16; ++j) {
                int32_t s = 0;
                for (unsigned e = 0; e < 32; ++e)
                    s += codes[32 * j + e] * static_cast<int8_t>(xs[64 * (e / 4) + 4 * j + e % 4]);
                acc += scales[j] * xd[16 * k + j] * static_cast<float>(s);
            }
        }
        y[r] = acc;
    }
}
}  // namespace

void unpack_q1_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    q1_passes_unpack<false>(steps, n, codes, scales);
}
void unpack_q1t_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    q1_passes_unpack<true>(steps, n, codes, scales);
}
void rows_q1_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                       float *y) {
    q1_passes_rows<false>(steps, xt, xd, groups, rows, y);
}
void rows_q1t_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                        float *y) {
    q1_passes_rows<true>(steps, xt, xd, groups, rows, y);
}

bool q1s_ascending(const uint8_t *entries, uint64_t count) { return q1s_ascending_from(entries, 0, count); }

void q1s_slice_sums(const uint8_t *steps, uint64_t n_steps, uint64_t cols, const float *xf, float *sums) {
    for (unsigned l = 0; l < 16; ++l) {
        float acc = 0.0f;
        for (uint64_t k = 0; k < n_steps; ++k) {
            const uint8_t *st = steps + 96 * k;
            uint16_t c;
            std::memcpy(&c, st + 2 * l, 2);
            if (c >= cols) continue;
            float d;
            std::memcpy(&d, st + 32 + 4 * l, 4);
            const float prod = d * xf[c];
            acc = acc + prod;
        }
        sums[l] = acc;
    }
}

// (One entry at a time, each row summed in one register: the same bits
// wherever a range begins; `phase` is for the AVX-512 form's steps.)
void q1s_overlay_xq(const uint8_t *tiles, const uint8_t *entries, uint64_t count, uint64_t /*phase*/, uint64_t begin,
                    uint64_t cols, uint64_t rows, const int8_t *xq, const float *xd, float *y) {
    q1s_overlay_rows<&f16_at>(tiles, entries, count, begin, cols, rows, xq, xd, y);
}

namespace {
// Group g (16 nibble bytes) of a row of `groups` against its block of a
// q4_pair_blocks x (kernels.hpp): sum (q-8)*xq, the offset taken from the
// codes themselves (no bias vector: an independent check of the AVX2 one).
int32_t q4_isum(const uint8_t *nib, const int8_t *xq, uint64_t g, uint64_t groups) {
    const int8_t *lo = xq + 64 * (g / 2) + 16 * (g % 2);  // the unpaired last block: 32*g
    const int8_t *hi = lo + ((g | 1) < groups ? 32 : 16);
    int32_t s = 0;
    for (int k = 0; k < 16; ++k) s += ((nib[k] & 15) - 8) * lo[k] + ((nib[k] >> 4) - 8) * hi[k];
    return s;
}
}  // namespace

float dot_q4_tiled_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *, const float *xd, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g)
        acc += f16_at(tiles + 18 * g) * xd[g] * static_cast<float>(q4_isum(tiles + 18 * g + 2, xq, g, groups));
    return acc;
}
float dot_q4_split_xq(const uint8_t *nibbles, const uint8_t *f16_scales, const int8_t *xq, const int32_t *,
                      const float *xd, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g)
        acc += f16_at(f16_scales + 2 * g) * xd[g] * static_cast<float>(q4_isum(nibbles + 16 * g, xq, g, groups));
    return acc;
}
void rows_q4_tiled_xq(const uint8_t *tiles, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                      uint64_t rows, float *y) {
    for (uint64_t r = 0; r < rows; ++r) y[r] = dot_q4_tiled_xq(tiles + 18 * groups * r, xq, xoff, xd, groups);
}

void rows_q4_split_xq(const uint8_t *nibbles, uint64_t nib_ld, const uint8_t *f16_scales, uint64_t scale_ld,
                      const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows, float *y) {
    for (uint64_t r = 0; r < rows; ++r)
        y[r] = dot_q4_split_xq(nibbles + nib_ld * r, f16_scales + scale_ld * r, xq, xoff, xd, groups);
}
void q4_pair_x_table(const int8_t *, const int32_t *, uint64_t, int8_t *) {}  // no table here

float dot_q4_groups_xq(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int32_t *,
                       const float *xd, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g)
        acc += scales[g] * xd[g] * static_cast<float>(q4_isum(nibbles + 16 * g, xq, g, groups));
    return acc;
}
void rows_q4_groups_xq(const uint8_t *nibbles, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups, uint64_t rows, float *y) {
    for (uint64_t r = 0; r < rows; ++r)
        y[r] = dot_q4_groups_xq(nibbles + 16 * groups * r, scales + groups * r, xq, xoff, xd, groups);
}
namespace {
// Row j's groups' rungs from its 32-rung table t.
void pick_rungs(const float *t, const uint8_t *codes, uint64_t groups, float *out) {
    for (uint64_t g = 0; g < groups; ++g) {
        const uint64_t bit = 5 * g;
        const uint8_t *c = codes + bit / 8;
        // The code's two bytes (the second only when the code crosses into it).
        const uint32_t v = c[0] | (bit % 8 > 3 ? uint32_t{c[1]} << 8 : 0u);
        out[g] = t[(v >> (bit % 8)) & 31u];
    }
}
}  // namespace

void ladder_scales(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes, uint64_t code_stride,
                   uint64_t groups, unsigned rows, float *out) {
    for (unsigned j = 0; j < rows; ++j) {
        float t[32];
        const int c0 = zero_rung ? 1 : 0;
        t[0] = 0.0f;
        t[c0] = first[j];
        for (int c = c0 + 1; c < 32; ++c) t[c] = t[c - 1] * ratio[j];
        pick_rungs(t, codes + code_stride * j, groups, out + groups * j);
    }
}
void ladder_scales_powers(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes,
                          uint64_t code_stride, uint64_t groups, unsigned rows, float *out) {
    for (unsigned j = 0; j < rows; ++j) {
        float p[5];  // r, r^2, r^4, r^8, r^16
        p[0] = ratio[j];
        for (int b = 1; b < 5; ++b) p[b] = p[b - 1] * p[b - 1];
        float t[32];
        const int c0 = zero_rung ? 1 : 0;
        t[0] = 0.0f;
        for (int c = c0; c < 32; ++c) {
            float v = first[j];
            for (int b = 0; b < 5; ++b)
                if ((c - c0) >> b & 1) v *= p[b];
            t[c] = v;
        }
        pick_rungs(t, codes + code_stride * j, groups, out + groups * j);
    }
}

namespace {
// q4tp / q2tp rows one by one: the row's scales (ladder_scales_powers), then its dot.
template <bool Two>
void tp_rows(const uint8_t *chunks, const float *first, const float *ratio, const uint8_t *codes, uint64_t code_stride,
             const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows, float *scratch,
             float *y) {
    for (uint64_t r = 0; r < rows; ++r) {
        ladder_scales_powers(first + r, ratio + r, Two, codes + code_stride * r, code_stride, groups, 1, scratch);
        y[r] = (Two ? dot_q2_groups_xq : dot_q4_groups_xq)(chunks + (Two ? 8 : 16) * groups * r, scratch, xq, xoff, xd,
                                                           groups);
    }
}
}  // namespace

void rows_q4tp_xq(const uint8_t *nibbles, const float *first, const float *ratio, const uint8_t *codes,
                  uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                  uint64_t rows, float *scratch, float *y) {
    tp_rows<false>(nibbles, first, ratio, codes, code_stride, xq, xoff, xd, groups, rows, scratch, y);
}
float dot_q2_groups_xq(const uint8_t *chunks, const float *scales, const int8_t *xq, const int32_t *,
                       const float *xd, uint64_t groups) {
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) {
        // (c - 1.5) * s = (2c - 3) * (s / 2): an integer sum, halved once.
        int32_t s = 0;
        for (int j = 0; j < 4; ++j)
            for (int k = 0; k < 8; ++k) s += (2 * ((chunks[8 * g + k] >> (2 * j)) & 3) - 3) * xq[32 * g + 8 * j + k];
        acc += 0.5f * scales[g] * xd[g] * static_cast<float>(s);
    }
    return acc;
}

void rows_q2_groups_xq(const uint8_t *chunks, const float *scales, const int8_t *xq, const int32_t *xoff,
                       const float *xd, uint64_t groups, uint64_t rows, float *y) {
    for (uint64_t r = 0; r < rows; ++r)
        y[r] = dot_q2_groups_xq(chunks + 8 * groups * r, scales + groups * r, xq, xoff, xd, groups);
}
void rows_q2tp_xq(const uint8_t *chunks, const float *first, const float *ratio, const uint8_t *codes,
                  uint64_t code_stride, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t groups,
                  uint64_t rows, float *scratch, float *y) {
    tp_rows<true>(chunks, first, ratio, codes, code_stride, xq, xoff, xd, groups, rows, scratch, y);
}

namespace {
// Weight of digit k of a q1t byte (kernels.hpp): floor(b / 3^k) mod 3 as 0, +1, -1.
int q1t_weight(unsigned b, unsigned k) {
    static constexpr unsigned kPow3[5] = {1, 3, 9, 27, 81};
    const unsigned d = b / kPow3[k] % 3;
    return d == 0 ? 0 : d == 1 ? 1 : -1;
}
}  // namespace

void unpack_q1t_groups(const uint8_t *tiles, uint64_t groups, int8_t *codes, float *scales) {
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *t = tiles + 9 * g;
        for (unsigned i = 0; i < 32; ++i) codes[32 * g + i] = static_cast<int8_t>(q1t_weight(t[2 + i / 5], i % 5));
        scales[g] = f16_at(t);
    }
}

// Each group's weights from its int8 view, against x.
void rows_q1t_xq(const uint8_t *tiles, const int8_t *xq, const float *xd, uint64_t groups, uint64_t rows, float *y) {
    for (uint64_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (uint64_t g = 0; g < groups; ++g) {
            int8_t w[32];
            float s;
            unpack_q1t_groups(tiles + 9 * (groups * r + g), 1, w, &s);
            int32_t sum = 0;
            for (unsigned i = 0; i < 32; ++i) sum += w[i] * xq[32 * g + i];
            acc += s * xd[g] * static_cast<float>(sum);
        }
        y[r] = acc;
    }
}

void dequant_q4_groups(const uint8_t *nibbles, uint64_t stride, const float *scales, uint64_t groups, float *dst) {
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *nib = nibbles + stride * g;
        const float s = scales[g];
        for (unsigned k = 0; k < 16; ++k) {
            *dst++ = static_cast<float>((nib[k] & 15) - 8) * s;
            *dst++ = static_cast<float>((nib[k] >> 4) - 8) * s;
        }
    }
}
void dequant_q2_groups(const uint8_t *chunks, const float *scales, uint64_t groups, float *dst) {
    for (uint64_t g = 0; g < groups; ++g)
        for (unsigned i = 0; i < 32; ++i)
            *dst++ = (static_cast<float>((chunks[8 * g + i / 4] >> (2 * (i % 4))) & 3u) - 1.5f) * scales[g];
}

// Codes read MSB-first through a bit window refilled a byte at a time; it
// never reads beyond the 4*b*groups bytes.
void dequant_vbit_groups(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, uint64_t groups, float *dst) {
    const int32_t L = (1 << (b - 1)) - 1;
    const uint32_t mask = (1u << b) - 1;
    uint32_t window = 0;
    unsigned have = 0;
    for (uint64_t g = 0; g < groups; ++g) {
        const float s = f16_at(f16_scales + 2 * g);
        for (int i = 0; i < 32; ++i) {
            while (have < b) window = (window << 8) | *codes++, have += 8;
            have -= b;
            *dst++ = static_cast<float>(static_cast<int32_t>((window >> have) & mask) - L) * s;
        }
    }
}

void unpack_vbit_groups(const uint8_t *codes, unsigned b, uint64_t groups, int8_t *out) {
    const int32_t L = (1 << (b - 1)) - 1;
    const uint32_t mask = (1u << b) - 1;
    uint32_t window = 0;
    unsigned have = 0;
    for (uint64_t i = 0; i < 32 * groups; ++i) {
        while (have < b) window = (window << 8) | *codes++, have += 8;
        have -= b;
        out[i] = static_cast<int8_t>(static_cast<int32_t>((window >> have) & mask) - L);
    }
}

float dot_vbit_xq(const uint8_t *codes, unsigned b, const uint8_t *f16_scales, const int8_t *xq, const int32_t *,
                  const float *xd, uint64_t groups) {
    const int32_t L = (1 << (b - 1)) - 1;
    const uint32_t mask = (1u << b) - 1;
    uint32_t window = 0;
    unsigned have = 0;
    float acc = 0.0f;
    for (uint64_t g = 0; g < groups; ++g) {
        int32_t s = 0;
        for (int i = 0; i < 32; ++i) {
            while (have < b) window = (window << 8) | *codes++, have += 8;
            have -= b;
            s += (static_cast<int32_t>((window >> have) & mask) - L) * xq[32 * g + i];
        }
        acc += f16_at(f16_scales + 2 * g) * xd[g] * static_cast<float>(s);
    }
    return acc;
}
void rows_vbit_xq(const uint8_t *const *codes, const uint8_t *widths, const uint8_t *f16_scales, const int8_t *xq,
                  const int32_t *xoff, const float *xd, uint64_t groups, uint64_t rows, const VbitRowsX &,
                  float *y) {
    for (uint64_t r = 0; r < rows; ++r)
        y[r] = dot_vbit_xq(codes[r], widths[r], f16_scales + 2 * groups * r, xq, xoff, xd, groups);
}

void unpack_q4_groups(const uint8_t *nibbles, uint64_t stride, uint64_t groups, int8_t *codes) {
    for (uint64_t g = 0; g < groups; ++g) {
        const uint8_t *nib = nibbles + stride * g;
        for (unsigned k = 0; k < 16; ++k) {
            *codes++ = static_cast<int8_t>((nib[k] & 15) - 8);
            *codes++ = static_cast<int8_t>((nib[k] >> 4) - 8);
        }
    }
}

}  // namespace cmf::codecs::kernels::portable
