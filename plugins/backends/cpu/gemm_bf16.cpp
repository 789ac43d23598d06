#include "gemm_bf16.hpp"
#include "kernels.hpp"

#include "../../codecs/half.hpp"

#include <cmf/cpu_features.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(CMF_NATIVE_KERNELS) && defined(__x86_64__)
#include <immintrin.h>
#define CMF_X86 1
#endif

namespace cmf::cpu::bf16 {

using codecs::f32_to_bf16;

// Packing is scalar: per matmul it touches each activation once and each
// weight once per panel, against pairs * 12 multiply-adds per packed word
// in the GEMM.
void pack_x(const float *x, uint64_t ldx, uint64_t n_batch, uint64_t cols, uint64_t b0, uint64_t b1, uint32_t *xp) {
    const uint64_t kp = pairs(cols);
    for (uint64_t b = b0; b < b1; ++b) {
        uint32_t *dst = xp + b * kp * kTokens;
        for (uint64_t t = 0; t < kTokens; ++t) {
            const uint64_t tok = b * kTokens + t;
            if (tok >= n_batch) {
                for (uint64_t j = 0; j < kp; ++j) dst[j * kTokens + t] = 0;
                continue;
            }
            const float *row = x + tok * ldx;
            for (uint64_t j = 0; j < cols / 2; ++j)
                dst[j * kTokens + t] = uint32_t(f32_to_bf16(row[2 * j])) | uint32_t(f32_to_bf16(row[2 * j + 1])) << 16;
            if (cols % 2) dst[(kp - 1) * kTokens + t] = f32_to_bf16(row[cols - 1]);
        }
    }
}

void pack_w(const uint16_t *w, uint64_t ldw, uint64_t n, uint64_t cols, uint64_t row0, uint32_t *wp) {
    const uint64_t kp = pairs(cols);
    for (uint64_t r = 0; r < n; ++r) {
        const uint64_t pr = row0 + r;
        uint32_t *dst = wp + (pr / kRows) * kp * kRows + pr % kRows;
        const uint16_t *src = w + r * ldw;
        for (uint64_t j = 0; j < cols / 2; ++j) {
            uint32_t v;
            std::memcpy(&v, src + 2 * j, 4);  // little-endian: column 2j in the low half
            dst[j * kRows] = v;
        }
        if (cols % 2) dst[(kp - 1) * kRows] = src[cols - 1];
    }
}

namespace {

#ifdef CMF_X86
#define BF16 __attribute__((target("avx512f,avx512bf16")))
// Two panels (32 rows) x kTokens tokens: per column pair 2 loads, 6
// broadcasts and 12 vdpbf16ps into 12 independent accumulators.
BF16 void micro_32x6(const uint32_t *wp0, const uint32_t *wp1, const uint32_t *xb, uint64_t kp, float *y,
                     uint64_t ldy, uint64_t nr, uint64_t nt) {
    __m512 acc[6][2];
#pragma GCC unroll 6
    for (int t = 0; t < 6; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (uint64_t j = 0; j < kp; ++j) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp0 + j * kRows);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp1 + j * kRows);
#pragma GCC unroll 6
        for (int t = 0; t < 6; ++t) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xb[j * kTokens + t]));
            acc[t][0] = _mm512_dpbf16_ps(acc[t][0], w0, xv);
            acc[t][1] = _mm512_dpbf16_ps(acc[t][1], w1, xv);
        }
    }
    if (nr == 2 * kRows && nt == kTokens) {
#pragma GCC unroll 6
        for (int t = 0; t < 6; ++t) {
            _mm512_storeu_ps(y + t * ldy, acc[t][0]);
            _mm512_storeu_ps(y + t * ldy + kRows, acc[t][1]);
        }
        return;
    }
    alignas(64) float out[6][2 * kRows];
#pragma GCC unroll 6
    for (int t = 0; t < 6; ++t) {
        _mm512_store_ps(out[t], acc[t][0]);
        _mm512_store_ps(out[t] + kRows, acc[t][1]);
    }
    for (uint64_t t = 0; t < nt; ++t) std::memcpy(y + t * ldy, out[t], nr * sizeof(float));
}

void gemm_avx512bf16(const uint32_t *wp, uint64_t n_rows, uint64_t cols, const uint32_t *xp, uint64_t n_batch,
                     float *y, uint64_t ldy) {
    const uint64_t kp = pairs(cols), blocks = x_blocks(n_batch);
    for (uint64_t r0 = 0; r0 < n_rows; r0 += 2 * kRows) {
        const uint64_t nr = std::min(2 * kRows, n_rows - r0);
        const uint32_t *panel = wp + r0 * kp;
        for (uint64_t b = 0; b < blocks; ++b) {
            const uint64_t t0 = b * kTokens;
            micro_32x6(panel, panel + kRows * kp, xp + b * kp * kTokens, kp, y + t0 * ldy + r0, ldy, nr,
                       std::min(kTokens, n_batch - t0));
        }
    }
}
#undef BF16
#endif

}  // namespace

GemmFn gemm_native() {
#ifdef CMF_X86
    if (cpu_has_avx512_bf16()) return gemm_avx512bf16;
#endif
    return nullptr;
}

// By default on AMD only. Zen 4 and 5 retire vdpbf16ps at the rate of an
// f32 FMA with twice its multiply-adds (pp512 on the 0.6B bf16 file: 551
// against f16's 279 tok/s on the Zen 5 VM); on the Intel Xeon VM (Sapphire
// Rapids' instruction set) this GEMM ran pp512 at 164.6-167.0 tok/s and the
// f32 GEMM over widened panels at 274.5-278.0, so Intel keeps the f32 GEMM.
// CMF_CPU_BF16_GEMM=0 rules it out anywhere, =1 takes it wherever the CPU
// has the instruction.
GemmFn gemm() {
    static const GemmFn fn = []() -> GemmFn {
        const char *env = std::getenv("CMF_CPU_BF16_GEMM");
        if (env != nullptr && std::strcmp(env, "0") == 0) return nullptr;
        const bool forced = env != nullptr && std::strcmp(env, "1") == 0;
        return isa_allowed("avx512") && (forced || cpu_is_amd()) ? gemm_native() : nullptr;
    }();
    return fn;
}

}  // namespace cmf::cpu::bf16
