// The int8 prefill GEMM (plugins/backends/cpu/gemm_i8.hpp) and the codec
// hook that feeds it (cmf_codec_vt.int8_rows):
//  - the hook's codes x scales equal dequantize_rows exactly (q8_row,
//    q4_block, q4_tiled, q4tp, q2tp), dtypes/shapes without a view say so;
//  - the kernels' packing and activation quantization have the documented
//    layout and quantize like the codecs' quantize_x;
//  - every ISA's GEMM matches a double reference over the same quantized
//    operands (partial row groups, token tiles and column blocks, zero and
//    non-finite blocks), and the AVX2 and portable results are identical;
//  - through the backend's matmul: q8_row/q4/q4tp/q2tp prefill takes the int8 path,
//    q8_2f and q4 with cols % 32 != 0 keep the f32 path.
#include <doctest/doctest.h>
#include "support/encoded_weight.hpp"
#include "support/random_vec.hpp"
#include "support/test_runtime.hpp"

#include "gemm_i8.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

namespace i8 = cmf::cpu::i8;

struct I8Runtime : TestRuntime {
    const cmf_codec_vt *codec(int32_t dtype, void **ctx) const { return find_test_codec(rt, dtype, ctx); }
};


// The activation quantizer the codecs' decode kernels document
// (plugins/codecs/kernels/kernels.hpp), written out again as the spec.
float ref_quantize_block(const float *x, size_t n, int8_t *q) {
    float amax = 0.0f;
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) finite = false;
        amax = std::max(amax, std::fabs(x[i]));
    }
    std::fill(q, q + 32, int8_t{0});
    if (!finite) return std::numeric_limits<float>::quiet_NaN();
    const float d = amax / 127.0f;
    float inv = d > 0.0f ? 1.0f / d : 0.0f;
    if (std::isinf(inv)) inv = 0.0f;
    for (size_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
    return d;
}

// Quantized activations in plain [token][block] form.
struct RefX {
    std::vector<int8_t> q;  // [t][nb*32]
    std::vector<float> d;   // [t][nb]
};

RefX ref_quantize_x(const std::vector<float> &x, size_t n_batch, size_t cols) {
    const size_t nb = i8::blocks(cols);
    RefX r{std::vector<int8_t>(n_batch * nb * 32), std::vector<float>(n_batch * nb)};
    for (size_t t = 0; t < n_batch; ++t)
        for (size_t b = 0; b < nb; ++b)
            r.d[t * nb + b] = ref_quantize_block(x.data() + t * cols + b * 32, std::min<size_t>(32, cols - b * 32),
                                                 r.q.data() + (t * nb + b) * 32);
    return r;
}

// y = sum_b sw*sx*isum in double, and the sum of |terms| the f32 error is bounded by.
void ref_gemm(const std::vector<int8_t> &codes, const std::vector<float> &scales, size_t rows, size_t cols,
              const RefX &x, size_t n_batch, std::vector<double> &y, std::vector<double> &mag) {
    const size_t nb = i8::blocks(cols);
    y.assign(n_batch * rows, 0.0);
    mag.assign(n_batch * rows, 0.0);
    for (size_t t = 0; t < n_batch; ++t)
        for (size_t r = 0; r < rows; ++r)
            for (size_t b = 0; b < nb; ++b) {
                int64_t s = 0;
                for (size_t k = 0; k < 32; ++k)
                    s += int64_t{codes[(r * nb + b) * 32 + k]} * x.q[(t * nb + b) * 32 + k];
                const double term = double(scales[r * nb + b]) * double(x.d[t * nb + b]) * double(s);
                y[t * rows + r] += term;
                mag[t * rows + r] += std::fabs(term);
            }
}

// The f32 evaluation: per block sc = fl(sw*sx) (relative error <= u) and one
// rounded fma into the running sum (<= u relative on the partial sum); over
// nb blocks |y - ref| <= ((nb + 1) u + O(u^2)) * sum |terms| with u = 2^-24.
// Doubled for the O(u^2) slack.
double tolerance(size_t nb, double mag) { return 2.0 * double(nb + 1) * std::ldexp(1.0, -24) * mag; }

}  // namespace

TEST_CASE("cpu backend int8: the codecs' int8_rows view equals dequantize_rows") {
    I8Runtime t;
    struct Case {
        int32_t dtype;
        size_t rows, cols;
        bool has_view;
    };
    for (Case c : {Case{CMF_DTYPE_Q8_ROW, 13, 70, true}, Case{CMF_DTYPE_Q8_ROW, 5, 64, true},
                   Case{CMF_DTYPE_Q4_BLOCK, 9, 96, true}, Case{CMF_DTYPE_Q4_TILED, 9, 96, true},
                   Case{CMF_DTYPE_Q4_BLOCK, 9, 40, false}, Case{CMF_DTYPE_Q4_TILED, 3, 40, false},
                   Case{CMF_DTYPE_Q4TP, 9, 96, true}, Case{CMF_DTYPE_Q2TP, 9, 96, true},
                   Case{CMF_DTYPE_Q8_2F, 6, 64, false}, Case{CMF_DTYPE_Q1, 9, 96, true},
                   Case{CMF_DTYPE_VBIT_RO, 9, 96, true}, Case{CMF_DTYPE_VBIT_RO, 9, 96, false},
                   Case{CMF_DTYPE_Q1T, 9, 96, true}}) {
        CAPTURE(c.dtype);
        CAPTURE(c.cols);
        void *ctx = nullptr;
        const cmf_codec_vt *codec = t.codec(c.dtype, &ctx);
        REQUIRE(codec != nullptr);
        REQUIRE(codec->struct_size >= offsetof(cmf_codec_vt, int8_rows) + sizeof(void *));
        auto w = random_vec(c.rows * c.cols, 11);
        // An outlier: q8 codes reach +-127, q4 group scales differ; vbit_ro
        // gives its row 8 bits, which has no int8 view (without it rows
        // stay at 3-6 bits and it has one).
        if (c.dtype != CMF_DTYPE_VBIT_RO || !c.has_view) w[3] = 40.0f;
        Encoded e = encode(codec, ctx, c.dtype, c.rows, c.cols, w.data());
        if (codec->int8_rows == nullptr) {
            CHECK_FALSE(c.has_view);
            continue;
        }
        cmf_error *err = codec->int8_rows(ctx, &e.v, 0, 0, nullptr, nullptr);
        if (!c.has_view) {
            REQUIRE(err != nullptr);
            CHECK(cmf_error_code(err) == CMF_ERR_UNSUPPORTED);
            cmf_error_free(err);
            continue;
        }
        REQUIRE(err == nullptr);
        const size_t nb = i8::blocks(c.cols);
        std::vector<float> deq(c.rows * c.cols);
        REQUIRE(codec->dequantize_rows(ctx, &e.v, 0, c.rows, deq.data()) == nullptr);
        // Rows 1.. (not from 0) so the row offset is exercised; poison first.
        std::vector<int8_t> codes((c.rows - 1) * nb * 32, int8_t{99});
        std::vector<float> scales((c.rows - 1) * nb, -1.0f);
        REQUIRE(codec->int8_rows(ctx, &e.v, 1, c.rows, codes.data(), scales.data()) == nullptr);
        int lo = 0, hi = 0;
        for (size_t r = 1; r < c.rows; ++r)
            for (size_t col = 0; col < nb * 32; ++col) {
                const int8_t q = codes[((r - 1) * nb) * 32 + col];
                if (col >= c.cols) {
                    REQUIRE(q == 0);
                    continue;
                }
                lo = std::min<int>(lo, q);
                hi = std::max<int>(hi, q);
                const float v = float(q) * scales[(r - 1) * nb + col / 32];
                REQUIRE(v == deq[r * c.cols + col]);
            }
        if (c.dtype == CMF_DTYPE_Q8_ROW) CHECK(hi == 127);
        else if (c.dtype == CMF_DTYPE_Q2TP) CHECK((lo == -3 && hi == 3));  // codes 2c - 3, odd
        else if (c.dtype == CMF_DTYPE_Q1 || c.dtype == CMF_DTYPE_Q1T) CHECK((lo == -1 && hi == 1));
        else if (c.dtype == CMF_DTYPE_VBIT_RO) CHECK((lo >= -31 && hi <= 32 && lo < 0 && hi > 0));
        else CHECK((lo >= -8 && hi <= 7 && lo < 0));
        if (c.dtype == CMF_DTYPE_Q2TP)
            for (int8_t q : codes) CHECK((q == -3 || q == -1 || q == 1 || q == 3));
        if (c.dtype == CMF_DTYPE_Q1)
            for (int8_t q : codes) CHECK((q == -1 || q == 1));
        if (c.dtype == CMF_DTYPE_Q1T)
            for (int8_t q : codes) CHECK((q == -1 || q == 0 || q == 1));
        // Out-of-range rows are refused.
        err = codec->int8_rows(ctx, &e.v, 0, c.rows + 1, codes.data(), scales.data());
        CHECK(err != nullptr);
        cmf_error_free(err);
    }
}

TEST_CASE("cpu backend int8: packed operands have the documented layout, x quantizes like quantize_x") {
    const size_t rows = 11, cols = 70, n_batch = 6, nb = i8::blocks(cols);
    auto x = random_vec(n_batch * cols, 21);
    for (size_t c = 32; c < 64; ++c) x[1 * cols + c] = 0.0f;  // an all-zero block: d = 0
    x[2 * cols + 5] = std::numeric_limits<float>::infinity();  // non-finite block: d = NaN, codes 0
    x[3 * cols + 3] = 1e-42f;  // a block of one subnormal: 1/d overflows, codes 0
    for (size_t c = 0; c < 32; ++c)
        if (c != 3) x[3 * cols + c] = 0.0f;
    const RefX ref = ref_quantize_x(x, n_batch, cols);
    std::mt19937 gen(5);
    std::vector<int8_t> codes(rows * nb * 32);
    std::vector<float> scales(rows * nb);
    for (auto &q : codes) q = static_cast<int8_t>(int(gen() % 256) - 128);
    for (auto &s : scales) s = float(gen() % 1000) / 997.0f;
    for (const char *isa : {"portable", "avx2", "avx512vnni"}) {
        const i8::Kernels *k = i8::kernels_for(isa);
        if (k == nullptr) continue;
        const std::string isa_name = isa;
        CAPTURE(isa_name);
        std::vector<int16_t> xq(i8::packed_xq_count(n_batch, cols), int16_t{777});
        std::vector<float> xd(i8::packed_xd_floats(n_batch, cols), -5.0f);
        k->quantize_x(x.data(), cols, n_batch, cols, 0, i8::x_tiles(n_batch), xq.data(), xd.data());
        const bool vnni = isa_name == "avx512vnni";  // its own layout (gemm_i8.cpp): bytes, 4-code words
        const auto *xb = reinterpret_cast<const uint8_t *>(xq.data());
        for (size_t tile = 0; tile < i8::x_tiles(n_batch); ++tile)
            for (size_t j = 0; j < i8::kTokens; ++j)
                for (size_t b = 0; b < nb; ++b) {
                    const size_t tok = tile * i8::kTokens + j;
                    const float d = xd[(tile * nb + b) * i8::kTokens + j];
                    if (tok >= n_batch) REQUIRE(d == 0.0f);
                    else if (std::isnan(ref.d[tok * nb + b])) REQUIRE(std::isnan(d));
                    else REQUIRE(d == ref.d[tok * nb + b]);
                    if (vnni) {
                        const uint8_t *blk = xb + (tile * nb + b) * (32 * i8::kTokens + 4 * i8::kTokens);
                        int32_t sum = 0;
                        for (size_t s = 0; s < 8; ++s)
                            for (size_t kk = 0; kk < 4; ++kk) {
                                const int8_t q = static_cast<int8_t>(blk[(s * i8::kTokens + j) * 4 + kk]);
                                REQUIRE(q == (tok < n_batch ? ref.q[(tok * nb + b) * 32 + 4 * s + kk] : int8_t{0}));
                                sum += q;
                            }
                        int32_t corr;
                        std::memcpy(&corr, blk + 32 * i8::kTokens + 4 * j, 4);
                        REQUIRE(corr == 128 * sum);
                        continue;
                    }
                    for (size_t s = 0; s < i8::kSteps; ++s)
                        for (size_t kk = 0; kk < 2; ++kk) {
                            const int16_t q = xq[(((tile * nb + b) * i8::kSteps + s) * i8::kTokens + j) * 2 + kk];
                            REQUIRE(q == (tok < n_batch ? ref.q[(tok * nb + b) * 32 + 2 * s + kk] : int8_t{0}));
                        }
                }
        std::vector<int16_t> wp(i8::packed_w_count(rows, cols), int16_t{999});
        std::vector<float> wd(i8::packed_wd_floats(rows, cols), -5.0f);
        k->pack_w(codes.data(), scales.data(), rows, cols, wp.data(), wd.data());
        if (vnni) {
            const auto *wb = reinterpret_cast<const uint8_t *>(wp.data());
            for (size_t g = 0; g < (rows + 15) / 16; ++g)
                for (size_t b = 0; b < nb; ++b)
                    for (size_t i = 0; i < 16; ++i) {
                        const size_t r = g * 16 + i;
                        REQUIRE(wd[(g * nb + b) * 16 + i] == (r < rows ? scales[r * nb + b] : 0.0f));
                        for (size_t s = 0; s < 8; ++s)
                            for (size_t kk = 0; kk < 4; ++kk) {
                                const int c = r < rows ? codes[(r * nb + b) * 32 + 4 * s + kk] : 0;
                                REQUIRE(int(wb[(g * nb + b) * 512 + (s * 16 + i) * 4 + kk]) == c + 128);
                            }
                    }
            continue;
        }
        for (size_t g = 0; g < i8::w_groups(rows); ++g)
            for (size_t b = 0; b < nb; ++b)
                for (size_t i = 0; i < i8::kRows; ++i) {
                    const size_t r = g * i8::kRows + i;
                    REQUIRE(wd[(g * nb + b) * i8::kRows + i] == (r < rows ? scales[r * nb + b] : 0.0f));
                    for (size_t s = 0; s < i8::kSteps; ++s)
                        for (size_t kk = 0; kk < 2; ++kk) {
                            const int c = r < rows ? codes[(r * nb + b) * 32 + 2 * s + kk] : 0;
                            REQUIRE(int(wp[((g * nb + b) * i8::kSteps + s) * 16 + i * 2 + kk]) == c);
                        }
                }
    }
}

TEST_CASE("cpu backend int8: every ISA's GEMM matches a double reference and equals portable bit for bit") {
    std::mt19937 gen(9);
    for (auto [rows, cols, n_batch] : {std::tuple<size_t, size_t, size_t>{21, 70, 7}, {8, 32, 4}, {16, 1024, 9},
                                       {3, 5, 1}, {40, 96, 13}}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(n_batch);
        const size_t nb = i8::blocks(cols);
        std::vector<int8_t> codes(rows * nb * 32);
        std::vector<float> scales(rows * nb);
        for (size_t r = 0; r < rows; ++r)
            for (size_t c = 0; c < nb * 32; ++c)
                codes[r * nb * 32 + c] = c < cols ? static_cast<int8_t>(int(gen() % 256) - 128) : int8_t{0};
        for (auto &s : scales) s = std::ldexp(float(gen() % 4096 + 1), -int(gen() % 8) - 12);
        codes[0] = -128;  // the extreme codes: -128 * -127 twice is the largest pair sum
        codes[1] = -128;
        auto x = random_vec(n_batch * cols, 31);
        if (n_batch > 2) x[2 * cols] = std::numeric_limits<float>::quiet_NaN();  // token 2, block 0: NaN outputs
        const RefX rx = ref_quantize_x(x, n_batch, cols);
        std::vector<double> ref, mag;
        ref_gemm(codes, scales, rows, cols, rx, n_batch, ref, mag);
        std::vector<float> first;
        for (const char *isa : {"portable", "avx2", "avx512vnni"}) {
            const i8::Kernels *k = i8::kernels_for(isa);
            if (k == nullptr) continue;
            const std::string isa_name = isa;
            CAPTURE(isa_name);
            std::vector<int16_t> xq(i8::packed_xq_count(n_batch, cols));
            std::vector<float> xd(i8::packed_xd_floats(n_batch, cols));
            k->quantize_x(x.data(), cols, n_batch, cols, 0, i8::x_tiles(n_batch), xq.data(), xd.data());
            std::vector<int16_t> wp(i8::packed_w_count(rows, cols));
            std::vector<float> wd(i8::packed_wd_floats(rows, cols));
            k->pack_w(codes.data(), scales.data(), rows, cols, wp.data(), wd.data());
            // y has a row stride (ldy) wider than rows: the gap must stay untouched.
            const size_t ldy = rows + 3;
            std::vector<float> y(n_batch * ldy, 12345.0f);
            k->gemm(wp.data(), wd.data(), rows, cols, xq.data(), xd.data(), n_batch, y.data(), ldy);
            for (size_t tok = 0; tok < n_batch; ++tok) {
                for (size_t r = 0; r < rows; ++r) {
                    const float v = y[tok * ldy + r];
                    if (tok == 2 && n_batch > 2) {
                        REQUIRE(std::isnan(v));
                        continue;
                    }
                    REQUIRE(std::fabs(double(v) - ref[tok * rows + r]) <= tolerance(nb, mag[tok * rows + r]));
                }
                for (size_t r = rows; r < ldy; ++r) REQUIRE(y[tok * ldy + r] == 12345.0f);
            }
            if (first.empty()) {
                first = y;
            } else {
                for (size_t i = 0; i < y.size(); ++i)
                    REQUIRE((std::memcmp(&y[i], &first[i], sizeof(float)) == 0 || (std::isnan(y[i]) && std::isnan(first[i]))));
            }
        }
    }
}

TEST_CASE("cpu backend int8: matmul takes the int8 path for q8_row/q4 prefill and the f32 path where there is no view") {
    I8Runtime t;
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    struct Case {
        int32_t dtype;
        size_t rows, cols;
        bool int8;
    };
    // >= 16: the prefill path for codec dtypes; q8_row/q8_2f with the
    // codec's AVX-512 VNNI kernels take it from 64.
    const size_t batch = 67;
    for (Case c : {Case{CMF_DTYPE_Q8_ROW, 37, 100, true}, Case{CMF_DTYPE_Q4_TILED, 21, 64, true},
                   Case{CMF_DTYPE_Q4_BLOCK, 21, 64, true}, Case{CMF_DTYPE_Q4_BLOCK, 21, 40, false},
                   Case{CMF_DTYPE_Q4TP, 21, 64, true}, Case{CMF_DTYPE_Q2TP, 21, 96, true},
                   Case{CMF_DTYPE_Q8_2F, 17, 64, false}}) {
        CAPTURE(c.dtype);
        CAPTURE(c.cols);
        void *ctx = nullptr;
        const cmf_codec_vt *codec = t.codec(c.dtype, &ctx);
        REQUIRE(codec != nullptr);
        auto w = random_vec(c.rows * c.cols, 41);
        Encoded e = encode(codec, ctx, c.dtype, c.rows, c.cols, w.data());
        std::vector<float> deq(c.rows * c.cols);
        REQUIRE(codec->dequantize_rows(ctx, &e.v, 0, c.rows, deq.data()) == nullptr);
        auto x = random_vec(batch * c.cols, 43);
        cmf_backend_weight *bw = nullptr;
        REQUIRE(be->vt.weight_bind(be->ctx, &e.v, &bw) == nullptr);
        std::vector<float> y(batch * c.rows, -1.0f);
        REQUIRE(be->vt.matmul(be->ctx, bw, x.data(), batch, y.data()) == nullptr);
        std::vector<int8_t> vcodes;
        std::vector<float> vscales;
        if (c.int8) {
            vcodes.resize(c.rows * i8::blocks(c.cols) * 32);
            vscales.resize(c.rows * i8::blocks(c.cols));
            REQUIRE(codec->int8_rows(ctx, &e.v, 0, c.rows, vcodes.data(), vscales.data()) == nullptr);
        }
        be->vt.weight_free(be->ctx, bw);
        // The int8 path is exact over the quantized activations up to f32
        // rounding; the f32 path over the original ones. Each reference
        // misses the other path by the activation rounding (~1e-2 here),
        // far outside these tolerances, so this also tells the paths apart.
        for (size_t tok = 0; tok < batch; ++tok)
            for (size_t r = 0; r < c.rows; ++r) {
                double ref = 0, mag = 0;
                if (c.int8) {
                    const size_t nb = i8::blocks(c.cols);
                    for (size_t b = 0; b < nb; ++b) {
                        int8_t q[32];
                        const size_t n = std::min<size_t>(32, c.cols - b * 32);
                        const float d = ref_quantize_block(x.data() + tok * c.cols + b * 32, n, q);
                        // The weights as the view gives them, code * scale in double: the
                        // decoded f32 values round that product where the scale has more
                        // significant bits than an f16 (q4tp's rungs).
                        double s = 0;
                        for (size_t k = 0; k < n; ++k)
                            s += double(vcodes[(r * nb + b) * 32 + k]) * double(vscales[r * nb + b]) * q[k];
                        ref += double(d) * s;
                        mag += std::fabs(double(d) * s);
                    }
                    REQUIRE(std::fabs(y[tok * c.rows + r] - ref) <= tolerance(nb, mag) + 1e-30);
                } else {
                    for (size_t k = 0; k < c.cols; ++k) {
                        ref += double(deq[r * c.cols + k]) * x[tok * c.cols + k];
                        mag += std::fabs(double(deq[r * c.cols + k]) * x[tok * c.cols + k]);
                    }
                    REQUIRE(std::fabs(y[tok * c.rows + r] - ref) <= 1e-5 * mag);
                }
            }
    }
}
