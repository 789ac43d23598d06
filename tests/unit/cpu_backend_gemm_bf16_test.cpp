// The bf16 prefill GEMM (plugins/backends/cpu/gemm_bf16.hpp):
//  - pack_x / pack_w write the documented layouts (x rounded as
//    codecs::f32_to_bf16, which tests/unit/half_test.cpp holds to its rules; odd column counts,
//    tokens and rows past the end);
//  - the AVX-512 BF16 kernel (where the CPU has it) matches a double
//    reference over the bf16 operands for partial panels and token blocks;
//  - through the backend's matmul, bf16 prefill equals that reference where
//    the kernel runs, and the f32 GEMM's result (activations unrounded)
//    where it does not.
#include <doctest/doctest.h>
#include "support/encoded_weight.hpp"
#include "support/random_vec.hpp"
#include "support/test_runtime.hpp"

#include "gemm_bf16.hpp"
#include "half.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace b16 = cmf::cpu::bf16;

using cmf::codecs::bf16_to_f32;
using cmf::codecs::f32_to_bf16;

// A bf16 matrix of random normal-range values (no subnormals: the
// instruction reads those as 0).
std::vector<uint16_t> random_bf16(size_t n, unsigned seed) {
    auto v = random_vec(n, seed);
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(v[i]);
    return h;
}

// y = sum_k w*bf16(x) in double, and sum |terms|.
void ref_gemm(const std::vector<uint16_t> &w, size_t rows, size_t cols, const std::vector<float> &x, size_t n_batch,
              std::vector<double> &y, std::vector<double> &mag) {
    y.assign(n_batch * rows, 0.0);
    mag.assign(n_batch * rows, 0.0);
    for (size_t t = 0; t < n_batch; ++t)
        for (size_t r = 0; r < rows; ++r)
            for (size_t k = 0; k < cols; ++k) {
                const double term = double(bf16_to_f32(w[r * cols + k])) * double(bf16_to_f32(f32_to_bf16(x[t * cols + k])));
                y[t * rows + r] += term;
                mag[t * rows + r] += std::fabs(term);
            }
}

// Each column pair adds two exact products (8-bit significands) to the f32
// accumulator, at most two roundings of u = 2^-24 each on the partial sum:
// |y - ref| <= (cols + 1) u sum |terms|, doubled for slack.
double tolerance(size_t cols, double mag) { return 2.0 * double(cols + 1) * std::ldexp(1.0, -24) * mag + 1e-30; }

}  // namespace

TEST_CASE("cpu backend bf16: packed operands have the documented layout") {
    for (auto [rows, cols, n_batch] : {std::tuple<size_t, size_t, size_t>{21, 70, 7}, {3, 5, 1}, {32, 64, 12}}) {
        CAPTURE(rows);
        CAPTURE(cols);
        const size_t kp = b16::pairs(cols);
        auto x = random_vec(n_batch * cols, 3);
        std::vector<uint32_t> xp(b16::packed_x_words(n_batch, cols), 0xDEADBEEFu);
        b16::pack_x(x.data(), cols, n_batch, cols, 0, b16::x_blocks(n_batch), xp.data());
        for (size_t b = 0; b < b16::x_blocks(n_batch); ++b)
            for (size_t j = 0; j < kp; ++j)
                for (size_t t = 0; t < b16::kTokens; ++t) {
                    const size_t tok = b * b16::kTokens + t;
                    uint32_t want = 0;
                    if (tok < n_batch) {
                        want = f32_to_bf16(x[tok * cols + 2 * j]);
                        if (2 * j + 1 < cols) want |= uint32_t(f32_to_bf16(x[tok * cols + 2 * j + 1])) << 16;
                    }
                    REQUIRE(xp[(b * kp + j) * b16::kTokens + t] == want);
                }
        auto w = random_bf16(rows * cols, 5);
        std::vector<uint32_t> wp(b16::packed_w_words(rows, cols), 0u);
        // Two calls, the second at a row offset, as a row subset's runs pack.
        const size_t first = rows / 2;
        b16::pack_w(w.data(), cols, first, cols, 0, wp.data());
        b16::pack_w(w.data() + first * cols, cols, rows - first, cols, first, wp.data());
        const size_t prow = (rows + 2 * b16::kRows - 1) / (2 * b16::kRows) * 2 * b16::kRows;
        REQUIRE(wp.size() == prow * kp);
        for (size_t r = 0; r < prow; ++r)
            for (size_t j = 0; j < kp; ++j) {
                uint32_t want = 0;
                if (r < rows) {
                    want = w[r * cols + 2 * j];
                    if (2 * j + 1 < cols) want |= uint32_t(w[r * cols + 2 * j + 1]) << 16;
                }
                REQUIRE(wp[((r / b16::kRows) * kp + j) * b16::kRows + r % b16::kRows] == want);
            }
    }
}

TEST_CASE("cpu backend bf16: the AVX-512 BF16 kernel matches a double reference") {
    const b16::GemmFn gemm = b16::gemm_native();
    if (gemm == nullptr) {
        MESSAGE("this CPU has no AVX-512 BF16: kernel not tested here");
        return;
    }
    for (auto [rows, cols, n_batch] : {std::tuple<size_t, size_t, size_t>{32, 64, 12}, {21, 70, 7}, {3, 5, 1},
                                       {17, 1024, 13}, {32, 1, 6}}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(n_batch);
        auto w = random_bf16(rows * cols, 7);
        auto x = random_vec(n_batch * cols, 9);
        std::vector<uint32_t> wp(b16::packed_w_words(rows, cols), 0u), xp(b16::packed_x_words(n_batch, cols));
        b16::pack_w(w.data(), cols, rows, cols, 0, wp.data());
        b16::pack_x(x.data(), cols, n_batch, cols, 0, b16::x_blocks(n_batch), xp.data());
        const size_t ldy = rows + 3;  // the gap between rows must stay untouched
        std::vector<float> y(n_batch * ldy, 12345.0f);
        gemm(wp.data(), rows, cols, xp.data(), n_batch, y.data(), ldy);
        std::vector<double> ref, mag;
        ref_gemm(w, rows, cols, x, n_batch, ref, mag);
        for (size_t t = 0; t < n_batch; ++t) {
            for (size_t r = 0; r < rows; ++r)
                REQUIRE(std::fabs(double(y[t * ldy + r]) - ref[t * rows + r]) <= tolerance(cols, mag[t * rows + r]));
            for (size_t r = rows; r < ldy; ++r) REQUIRE(y[t * ldy + r] == 12345.0f);
        }
    }
}

TEST_CASE("cpu backend bf16: matmul of a bf16 weight over a batch takes the bf16 GEMM where the CPU has it") {
    TestRuntime t;
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    void *ctx = nullptr;
    const cmf_codec_vt *codec = find_test_codec(t.rt, CMF_DTYPE_BF16, &ctx);
    REQUIRE(codec != nullptr);
    const size_t rows = 45, cols = 130, batch = 19;
    auto wf = random_vec(rows * cols, 51);
    Encoded e = encode(codec, ctx, CMF_DTYPE_BF16, rows, cols, wf.data());
    std::vector<uint16_t> w(rows * cols);
    std::memcpy(w.data(), e.bytes.data(), w.size() * 2);
    auto x = random_vec(batch * cols, 53);
    cmf_backend_weight *bw = nullptr;
    REQUIRE(be->vt.weight_bind(be->ctx, &e.v, &bw) == nullptr);
    std::vector<float> y(batch * rows, -1.0f);
    REQUIRE(be->vt.matmul(be->ctx, bw, x.data(), batch, y.data()) == nullptr);
    be->vt.weight_free(be->ctx, bw);
    std::vector<double> ref, mag;
    ref_gemm(w, rows, cols, x, batch, ref, mag);
    const bool rounded = b16::gemm() != nullptr;
    MESSAGE(std::string(rounded ? "bf16 GEMM (activations rounded to bf16)" : "f32 GEMM (no AVX-512 BF16 here, or turned off)"));
    for (size_t tok = 0; tok < batch; ++tok)
        for (size_t r = 0; r < rows; ++r) {
            const double v = y[tok * rows + r];
            if (rounded) {
                REQUIRE(std::fabs(v - ref[tok * rows + r]) <= tolerance(cols, mag[tok * rows + r]));
            } else {
                double exact = 0, m = 0;
                for (size_t k = 0; k < cols; ++k) {
                    exact += double(bf16_to_f32(w[r * cols + k])) * x[tok * cols + k];
                    m += std::fabs(double(bf16_to_f32(w[r * cols + k])) * x[tok * cols + k]);
                }
                REQUIRE(std::fabs(v - exact) <= 1e-5 * m);
            }
        }
}
