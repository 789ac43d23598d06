// Picks at run time the AVX-512 VNNI build of the SIMD kernels, else the
// AVX2+FMA+F16C one, else the portable kernels, and makes the ISA-independent
// q4_pair_blocks x order and its offset terms.
#include "kernels/kernels.hpp"
#include "kernels/portable.hpp"

#include <cmf/cpu_features.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace cmf::codecs::kernels {

namespace {
// CMF_CODECS_ISA=avx512vnni, =avx2 or =portable caps the kernels at that
// level (A/B benchmarks, or a way around a suspected SIMD bug; avx512vnni
// leaves out the VBMI and BITALG forms); unset or anything else: the best
// the CPU runs.
int isa_cap() {
    static const int cap = cmf::isa_cap_from_env("CMF_CODECS_ISA");
    return cap;
}
bool has_avx2() {
#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX2)
    return isa_cap() >= 1 && cmf::cpu_has_avx2_fma_f16c();
#else
    return false;
#endif
}
// What the avx512vnni build of avx2.cpp was compiled for (meson.build).
bool has_avx512vnni() {
#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX512VNNI)
    return isa_cap() >= 2 && cmf::cpu_has_avx512_vnni();
#else
    return false;
#endif
}
}  // namespace

#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX512VNNI)
#define CMF_PICK(fn, ...)                                                                                              \
    (has_avx512vnni() ? avx512vnni::fn(__VA_ARGS__) : has_avx2() ? avx2::fn(__VA_ARGS__) : portable::fn(__VA_ARGS__))
#elif defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX2)
#define CMF_PICK(fn, ...) (has_avx2() ? avx2::fn(__VA_ARGS__) : portable::fn(__VA_ARGS__))
#else
#define CMF_PICK(fn, ...) portable::fn(__VA_ARGS__)
#endif

long prefetch_ahead_light() { return cmf::prefetch_ahead_bytes(cmf::PrefetchStream::light); }
long prefetch_ahead_q4() { return cmf::prefetch_ahead_bytes(cmf::PrefetchStream::q4); }
bool prefetch_weights_nta() { return cmf::prefetch_weights_nta(); }
namespace {
std::atomic<bool> avx512_extensions_on{true};  // set_avx512_extensions
// Whether the VNNI build's forms for an AVX-512 extension run: the build
// runs, CMF_CODECS_ISA does not cap them, they are not turned off, and the
// CPU has the extension (cpu_has).
#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX512VNNI)
bool avx512_extension(bool cpu_has) {
    return isa_cap() >= 3 && avx512_extensions_on.load(std::memory_order_relaxed) && has_avx512vnni() && cpu_has;
}
#endif
}  // namespace
void set_avx512_extensions(bool on) { avx512_extensions_on.store(on, std::memory_order_relaxed); }
#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX512VNNI)
bool has_avx512_vbmi() { return avx512_extension(cmf::cpu_has_avx512_vbmi()); }
bool has_avx512_bitalg() { return avx512_extension(cmf::cpu_has_avx512_bitalg()); }
bool has_gfni() { return avx512_extension(cmf::cpu_has_gfni()); }
#else
bool has_avx512_vbmi() { return false; }
bool has_avx512_bitalg() { return false; }
bool has_gfni() { return false; }
#endif

void *thread_room(RoomSlot slot, uint64_t bytes) {
    thread_local std::vector<unsigned char> rooms[static_cast<int>(RoomSlot::count)];
    std::vector<unsigned char> &room = rooms[static_cast<int>(slot)];
    if (room.size() < bytes + 64) room.resize(bytes + 64);
    const uintptr_t at = reinterpret_cast<uintptr_t>(room.data());
    return room.data() + ((64 - at % 64) % 64);
}
const char *active_isa() { return has_avx512vnni() ? "avx512vnni" : has_avx2() ? "avx2" : "portable"; }
float dot_f32(const float *a, const float *x, uint64_t n) { return CMF_PICK(dot_f32, a, x, n); }
float dot_f16(const uint16_t *h, const float *x, uint64_t n) { return CMF_PICK(dot_f16, h, x, n); }
float dot_bf16(const uint16_t *h, const float *x, uint64_t n) { return CMF_PICK(dot_bf16, h, x, n); }
void quantize_x(const float *x, uint64_t n, XOrder order, int8_t *q, float *d) {
    if (order != XOrder::q4_pair_blocks) return CMF_PICK(quantize_x, x, n, order, q, d);
    // q4_pairs, then per pair of blocks swap the middle two 16-byte quarters:
    // [A lo | A hi | B lo | B hi] -> [A lo | B lo | A hi | B hi] (kernels.hpp).
    CMF_PICK(quantize_x, x, n, XOrder::q4_pairs, q, d);
    for (uint64_t k = 0; k < x_blocks(n) / 2; ++k) {
        int8_t a_hi[16];
        std::memcpy(a_hi, q + 64 * k + 16, 16);
        std::memcpy(q + 64 * k + 16, q + 64 * k + 32, 16);
        std::memcpy(q + 64 * k + 32, a_hi, 16);
    }
}
void q4_pair_offset(const int8_t *q, uint64_t blocks, int32_t *offset) {
    CMF_PICK(q4_pair_offset, q, blocks, offset);
}
float dot_i8_xq(const int8_t *w, const int8_t *xq, const float *xd, uint64_t n) {
    return CMF_PICK(dot_i8_xq, w, xq, xd, n);
}
void i8_offset(const int8_t *q, uint64_t blocks, int32_t *offset) { CMF_PICK(i8_offset, q, blocks, offset); }
void rows_i8_xq(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                const float *xd, uint64_t n, uint64_t rows, float *y) {
    CMF_PICK(rows_i8_xq, w, ld, f16_scales, xq, xboff, xd, n, rows, y);
}
void rows_i8_xq_batch(const int8_t *w, uint64_t ld, const uint8_t *f16_scales, const int8_t *xq, const int32_t *xboff,
                      const float *xd, uint64_t n, uint64_t rows, uint64_t k, float *y, uint64_t ldy) {
    CMF_PICK(rows_i8_xq_batch, w, ld, f16_scales, xq, xboff, xd, n, rows, k, y, ldy);
}
void i8_block_offsets(const int8_t *q, uint64_t blocks, int32_t *offset) {
    for (uint64_t b = 0; b < blocks; ++b) {
        int32_t s = 0;
        for (uint64_t i = 0; i < 32; ++i) s += q[32 * b + i];
        offset[b] = -128 * s;
    }
}
float dot_q4_tiled_xq(const uint8_t *t, const int8_t *xq, const int32_t *xb, const float *xd, uint64_t g) {
    return CMF_PICK(dot_q4_tiled_xq, t, xq, xb, xd, g);
}
float dot_q4_split_xq(const uint8_t *n, const uint8_t *s, const int8_t *xq, const int32_t *xb, const float *xd,
                      uint64_t g) {
    return CMF_PICK(dot_q4_split_xq, n, s, xq, xb, xd, g);
}
void rows_q4_tiled_xq(const uint8_t *t, const int8_t *xq, const int32_t *xb, const float *xd, uint64_t g, uint64_t rows,
                      float *y) {
    CMF_PICK(rows_q4_tiled_xq, t, xq, xb, xd, g, rows, y);
}
void rows_q4_split_xq(const uint8_t *n, uint64_t nld, const uint8_t *s, uint64_t sld, const int8_t *xq, const int32_t *xb,
                      const float *xd, uint64_t g, uint64_t rows, float *y) {
    CMF_PICK(rows_q4_split_xq, n, nld, s, sld, xq, xb, xd, g, rows, y);
}
void q4_pair_x_table(const int8_t *xq, const int32_t *xb, uint64_t g, int8_t *xt) {
    CMF_PICK(q4_pair_x_table, xq, xb, g, xt);
}
void vbit4_x(const int8_t *natural, uint64_t blocks, int8_t *q, int32_t *offset) {
    for (uint64_t b = 0; b < blocks; ++b) {
        const int8_t *e = natural + 32 * b;
        int8_t *odd = (b | 1) < blocks ? q + 64 * (b / 2) + 16 * (b % 2) : q + 32 * b;
        int8_t *even = odd + ((b | 1) < blocks ? 32 : 16);
        for (int k = 0; k < 16; ++k) odd[k] = e[2 * k + 1], even[k] = e[2 * k];
    }
    q4_pair_offset(q, blocks, offset);
    for (uint64_t i = 0; i < 8 * (blocks / 2); ++i) offset[i] = offset[i] / 8 * 7;  // -8 * sum -> -7 * sum, exact
}
float dot_q4_groups_xq(const uint8_t *n, const float *s, const int8_t *xq, const int32_t *xb, const float *xd,
                       uint64_t g) {
    return CMF_PICK(dot_q4_groups_xq, n, s, xq, xb, xd, g);
}
void rows_q4_groups_xq(const uint8_t *n, const float *s, const int8_t *xq, const int32_t *xb, const float *xd, uint64_t g,
                       uint64_t rows, float *y) {
    CMF_PICK(rows_q4_groups_xq, n, s, xq, xb, xd, g, rows, y);
}
void ladder_scales(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes, uint64_t code_stride,
                   uint64_t groups, unsigned rows, float *out) {
    CMF_PICK(ladder_scales, first, ratio, zero_rung, codes, code_stride, groups, rows, out);
}
void ladder_scales_powers(const float *first, const float *ratio, bool zero_rung, const uint8_t *codes,
                          uint64_t code_stride, uint64_t groups, unsigned rows, float *out) {
    CMF_PICK(ladder_scales_powers, first, ratio, zero_rung, codes, code_stride, groups, rows, out);
}
void rows_q4tp_xq(const uint8_t *n, const float *first, const float *ratio, const uint8_t *codes, uint64_t code_stride,
                  const int8_t *xq, const int32_t *xb, const float *xd, uint64_t g, uint64_t rows, float *scratch,
                  float *y) {
    CMF_PICK(rows_q4tp_xq, n, first, ratio, codes, code_stride, xq, xb, xd, g, rows, scratch, y);
}
float dot_q2_groups_xq(const uint8_t *c, const float *s, const int8_t *xq, const int32_t *xoff, const float *xd,
                       uint64_t g) {
    return CMF_PICK(dot_q2_groups_xq, c, s, xq, xoff, xd, g);
}
void rows_q2_groups_xq(const uint8_t *c, const float *s, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t g,
                       uint64_t rows, float *y) {
    CMF_PICK(rows_q2_groups_xq, c, s, xq, xoff, xd, g, rows, y);
}
void rows_q2tp_xq(const uint8_t *c, const float *first, const float *ratio, const uint8_t *codes, uint64_t code_stride,
                  const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t g, uint64_t rows, float *scratch,
                  float *y) {
    CMF_PICK(rows_q2tp_xq, c, first, ratio, codes, code_stride, xq, xoff, xd, g, rows, scratch, y);
}
void q2_offset(const int8_t *q, uint64_t blocks, int32_t *offset) {
    // i8_offset's lane sums (-128 * sum of 4 codes), rescaled: exact.
    i8_offset(q, blocks, offset);
    for (uint64_t i = 0; i < 8 * blocks; ++i) offset[i] = offset[i] / 128 * 3;
}
float dot_vbit_xq(const uint8_t *c, unsigned b, const uint8_t *s, const int8_t *xq, const int32_t *xoff, const float *xd,
                  uint64_t g) {
    return CMF_PICK(dot_vbit_xq, c, b, s, xq, xoff, xd, g);
}
void rows_vbit_xq(const uint8_t *const *c, const uint8_t *widths, const uint8_t *s, const int8_t *xq, const int32_t *xoff,
                  const float *xd, uint64_t g, uint64_t rows, const VbitRowsX &vx, float *y) {
    CMF_PICK(rows_vbit_xq, c, widths, s, xq, xoff, xd, g, rows, vx, y);
}
void vbit_width_offsets(const int32_t *xoff, uint64_t groups, int32_t *table) {
    for (unsigned b = 3; b < kVbitWidthOffsets; ++b) {
        const int32_t L = (1 << (b - 1)) - 1;
        int32_t *t = table + 8 * groups * b;
        for (uint64_t i = 0; i < 8 * groups; ++i) t[i] = L * (xoff[i] / 128);
    }
}
void unpack_vbit_groups(const uint8_t *c, unsigned b, uint64_t g, int8_t *out) { CMF_PICK(unpack_vbit_groups, c, b, g, out); }
void rows_q1_xq(const uint8_t *t, const int8_t *xq, const int32_t *xoff, const float *xd, uint64_t g, uint64_t rows,
                float *y) {
    CMF_PICK(rows_q1_xq, t, xq, xoff, xd, g, rows, y);
}
void unpack_q1_groups(const uint8_t *t, uint64_t g, int8_t *codes, float *scales) {
    CMF_PICK(unpack_q1_groups, t, g, codes, scales);
}
void q1_passes_x(const int8_t *xq, uint64_t groups, uint8_t *xt) { CMF_PICK(q1_passes_x, xq, groups, xt); }
void rows_q1_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                       float *y) {
    CMF_PICK(rows_q1_passes_xq, steps, xt, xd, groups, rows, y);
}
void rows_q1t_passes_xq(const uint8_t *steps, const uint8_t *xt, const float *xd, uint64_t groups, uint64_t rows,
                        float *y) {
    CMF_PICK(rows_q1t_passes_xq, steps, xt, xd, groups, rows, y);
}
void unpack_q1_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    CMF_PICK(unpack_q1_passes, steps, n, codes, scales);
}
void unpack_q1t_passes(const uint8_t *steps, uint64_t n, int8_t *codes, float *scales) {
    CMF_PICK(unpack_q1t_passes, steps, n, codes, scales);
}
bool q1_passes_kernel() { return has_avx512vnni(); }
bool q1s_ascending(const uint8_t *e, uint64_t count) { return CMF_PICK(q1s_ascending, e, count); }
void q1s_slice_sums(const uint8_t *steps, uint64_t n_steps, uint64_t cols, const float *xf, float *sums) {
    CMF_PICK(q1s_slice_sums, steps, n_steps, cols, xf, sums);
}
void q1s_overlay_xq(const uint8_t *t, const uint8_t *e, uint64_t count, uint64_t phase, uint64_t begin, uint64_t cols,
                    uint64_t rows, const int8_t *xq, const float *xd, float *y) {
    CMF_PICK(q1s_overlay_xq, t, e, count, phase, begin, cols, rows, xq, xd, y);
}
void dequant_q4_groups(const uint8_t *n, uint64_t stride, const float *s, uint64_t g, float *dst) {
    CMF_PICK(dequant_q4_groups, n, stride, s, g, dst);
}
void dequant_q2_groups(const uint8_t *c, const float *s, uint64_t g, float *dst) { CMF_PICK(dequant_q2_groups, c, s, g, dst); }
void dequant_vbit_groups(const uint8_t *c, unsigned b, const uint8_t *s, uint64_t g, float *dst) {
    CMF_PICK(dequant_vbit_groups, c, b, s, g, dst);
}
void unpack_q4_groups(const uint8_t *n, uint64_t stride, uint64_t g, int8_t *codes) {
    CMF_PICK(unpack_q4_groups, n, stride, g, codes);
}
void rows_q1t_xq(const uint8_t *t, const int8_t *xq, const float *xd, uint64_t g, uint64_t rows, float *y) {
    CMF_PICK(rows_q1t_xq, t, xq, xd, g, rows, y);
}
void unpack_q1t_groups(const uint8_t *t, uint64_t g, int8_t *codes, float *scales) {
    CMF_PICK(unpack_q1t_groups, t, g, codes, scales);
}

std::vector<SimdKernels> simd_kernels() {
    std::vector<SimdKernels> sets;
#define CMF_CODECS_KERNEL_POINTER(name) &isa_ns::name,
#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX512VNNI)
    if (has_avx512vnni()) {
        namespace isa_ns = avx512vnni;
        sets.push_back({"avx512vnni", CMF_CODECS_KERNEL_NAMES(CMF_CODECS_KERNEL_POINTER)});
    }
#endif
#if defined(__x86_64__) && defined(CMF_CODECS_HAVE_AVX2)
    if (has_avx2()) {
        namespace isa_ns = avx2;
        sets.push_back({"avx2", CMF_CODECS_KERNEL_NAMES(CMF_CODECS_KERNEL_POINTER)});
    }
#endif
#undef CMF_CODECS_KERNEL_POINTER
    return sets;
}

}  // namespace cmf::codecs::kernels
