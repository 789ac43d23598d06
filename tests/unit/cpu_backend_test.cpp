// The CPU backend's matmul through the plugin ABI, exactly as an arch calls
// it: bind a weight, run a batched matmul, compare with a double reference.
// Covers the native f32 kernel (every ISA this CPU has), and the
// dequantize-tiles path for a dtype whose codec has no kernel (f16).
#include <doctest/doctest.h>
#include "support/encoded_weight.hpp"
#include "support/random_vec.hpp"
#include "support/test_runtime.hpp"

#include "common/byte_views.hpp"
#include "half.hpp"
#include "backend.hpp"
#include "kernels.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/cmf.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <cstdio>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

namespace {

// f32 values as f16 bits, rounded by GCC's _Float16 (the reference the
// kernels' f16 rounding is tested against).
std::vector<uint16_t> f16_bits(const std::vector<float> &v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const _Float16 h = static_cast<_Float16>(v[i]);
        std::memcpy(&out[i], &h, 2);
    }
    return out;
}

// Runs f(kernels) for every kernel set this CPU and build have (portable,
// AVX2, AVX-512), the set's name in the failure context.
template <class F>
void for_each_isa(F &&f) {
    for (const char *isa : {"portable", "avx2", "avx512"}) {
        const cmf::cpu::Kernels *k = cmf::cpu::kernels_for(isa);
        if (!k) continue;
        CAPTURE(isa);
        f(k);
    }
}

void reference(const std::vector<float> &w, size_t rows, size_t cols, const std::vector<float> &x, size_t batch,
               std::vector<double> &y) {
    y.assign(batch * rows, 0.0);
    for (size_t b = 0; b < batch; ++b)
        for (size_t r = 0; r < rows; ++r) {
            double s = 0;
            for (size_t c = 0; c < cols; ++c) s += double(w[r * cols + c]) * x[b * cols + c];
            y[b * rows + r] = s;
        }
}

void run_matmul(cmf_runtime *rt, int32_t dtype, const void *data, uint64_t nbytes, size_t rows, size_t cols,
                const std::vector<float> &x, size_t batch, std::vector<float> &y) {
    const cmf::BackendEntry *be = rt->backend("cpu");
    REQUIRE(be != nullptr);
    cmf_tensor_view v = cmf::tensor_view(dtype, std::array<uint64_t, 2>{rows, cols}, data, nbytes);
    cmf_backend_weight *w = nullptr;
    REQUIRE(be->vt.weight_bind(be->ctx, &v, &w) == nullptr);
    y.assign(batch * rows, -1.0f);
    cmf_error *e = be->vt.matmul(be->ctx, w, x.data(), batch, y.data());
    CHECK(e == nullptr);
    be->vt.weight_free(be->ctx, w);
}

}  // namespace

TEST_CASE("cpu backend: f32 matmul matches a double reference on odd shapes") {
    TestRuntime t;
    // Batches >= 4 take the prefill GEMM: partial panels (rows % 16), token
    // blocks (batch % 6) and k tails (cols % 8) included.
    for (auto [rows, cols, batch] : {std::tuple<size_t, size_t, size_t>{1, 1, 1}, {7, 9, 3}, {33, 130, 1},
                                     {257, 64, 5}, {1024, 96, 2}, {37, 203, 13}, {16, 8, 6}, {5, 3, 4}}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(batch);
        auto w = random_vec(rows * cols, 1);
        auto x = random_vec(batch * cols, 2);
        std::vector<double> ref;
        reference(w, rows, cols, x, batch, ref);
        std::vector<float> y;
        run_matmul(t.rt, CMF_DTYPE_F32, w.data(), w.size() * 4, rows, cols, x, batch, y);
        for (size_t i = 0; i < y.size(); ++i) REQUIRE(std::fabs(y[i] - ref[i]) <= 1e-4 * (1.0 + std::fabs(ref[i])) * std::sqrt(double(cols)));
    }
}

TEST_CASE("cpu backend: every available ISA kernel agrees with the portable one") {
    const size_t rows = 19, cols = 203, batch = 3;
    auto w = random_vec(rows * cols, 3);
    auto x = random_vec(batch * cols, 4);
    std::vector<float> y0(batch * rows), y1(batch * rows);
    cmf::cpu::kernels_for("portable")->matmul_f32(w.data(), cols, x.data(), cols, batch, 0, rows, y0.data(), rows);
    int tested = 0;
    for (const char *isa : {"avx2", "avx512"}) {
        const cmf::cpu::Kernels *k = cmf::cpu::kernels_for(isa);
        if (!k) continue;
        ++tested;
        k->matmul_f32(w.data(), cols, x.data(), cols, batch, 0, rows, y1.data(), rows);
        for (size_t i = 0; i < y0.size(); ++i) REQUIRE(std::fabs(y0[i] - y1[i]) <= 1e-4f * (1.0f + std::fabs(y0[i])));
    }
    MESSAGE("ISA kernels compared: " << tested << ", best: " << std::string(cmf::cpu::kernels().isa));
}

TEST_CASE("cpu backend: f16 weights (F16C row kernel for decode, panel GEMM for prefill) match the dequantized reference") {
    TestRuntime t;
    const size_t rows = 45, cols = 70;
    for (size_t batch : {size_t(2), size_t(7)}) {
    CAPTURE(batch);
    auto w = random_vec(rows * cols, 5);
    // Quantize through the f16 codec, then compare with the f16-rounded weights.
    void *codec_ctx = nullptr;
    const cmf_codec_vt *codec = t.rt->host_api()->find_codec(t.rt->host_api()->host_ctx, CMF_DTYPE_F16, &codec_ctx);
    REQUIRE(codec != nullptr);
    REQUIRE(bool(codec->quantize));
    std::vector<uint8_t> bytes;
    cmf_byte_sink sink = cmf::vector_sink(bytes);
    uint64_t shape[2] = {rows, cols};
    REQUIRE(codec->quantize(codec_ctx, 2, shape, w.data(), nullptr, &sink) == nullptr);
    REQUIRE(bytes.size() == rows * cols * 2);
    std::vector<float> w16(rows * cols);
    cmf_tensor_view v = cmf::tensor_view(CMF_DTYPE_F16, {uint64_t(rows), uint64_t(cols)}, bytes);
    REQUIRE(codec->dequantize_rows(codec_ctx, &v, 0, rows, w16.data()) == nullptr);
    auto x = random_vec(batch * cols, 6);
    std::vector<double> ref;
    reference(w16, rows, cols, x, batch, ref);
    std::vector<float> y;
    run_matmul(t.rt, CMF_DTYPE_F16, bytes.data(), bytes.size(), rows, cols, x, batch, y);
    for (size_t i = 0; i < y.size(); ++i) REQUIRE(std::fabs(y[i] - ref[i]) <= 1e-3 * (1.0 + std::fabs(ref[i])));
    }
}

TEST_CASE("cpu backend: 16-bit row kernels, conversions and the panel GEMM agree across ISAs") {
    const size_t rows = 21, cols = 203, batch = 8;
    auto wf = random_vec(rows * cols, 7);
    auto x = random_vec(batch * cols, 8);
    std::vector<uint16_t> wh(rows * cols), wb(rows * cols);
    for (size_t i = 0; i < wf.size(); ++i) {
        wh[i] = cmf::codecs::f32_to_f16(wf[i]);
        wb[i] = cmf::codecs::f32_to_bf16(wf[i]);
    }
    const cmf::cpu::Kernels *p = cmf::cpu::kernels_for("portable");
    auto close = [](const std::vector<float> &a, const std::vector<float> &b) {
        for (size_t i = 0; i < a.size(); ++i)
            if (std::fabs(a[i] - b[i]) > 1e-4f * (1.0f + std::fabs(a[i]))) return false;
        return true;
    };
    for_each_isa([&](const cmf::cpu::Kernels *k) {
        std::vector<float> y0(batch * rows), y1(batch * rows);
        p->matmul_f32(wf.data(), cols, x.data(), cols, batch, 0, rows, y0.data(), rows);
        k->gemm_panel(wf.data(), rows, cols, x.data(), cols, batch, y1.data(), rows);
        CHECK(close(y0, y1));
        for (bool bf : {false, true}) {
            const auto &bits = bf ? wb : wh;
            std::vector<float> wide(rows * cols), wide_p(rows * cols);
            (bf ? k->convert_bf16 : k->convert_f16)(bits.data(), bits.size(), wide.data());
            (bf ? p->convert_bf16 : p->convert_f16)(bits.data(), bits.size(), wide_p.data());
            CHECK(wide == wide_p);
            p->matmul_f32(wide.data(), cols, x.data(), cols, batch, 0, rows, y0.data(), rows);
            (bf ? k->matmul_bf16 : k->matmul_f16)(bits.data(), cols, x.data(), cols, batch, 0, rows, y1.data(), rows);
            CHECK(close(y0, y1));
        }
    });
}

TEST_CASE("cpu backend: f16 KV cache kernels (narrow, dot, axpy) on every ISA") {
    // narrow_f16 against the compiler's own IEEE binary16 conversion (GCC's
    // _Float16: round to nearest even), over normal values, subnormals,
    // exact ties at both, overflow, inf and NaN.
    std::vector<float> v = random_vec(4096, 21);
    for (size_t i = 0; i < v.size(); i += 4) v[i] *= 1e-5f;  // subnormal f16 range
    for (uint32_t m : {0x33000000u, 0x33000001u, 0x33400000u, 0x387FE000u, 0x387FF000u, 0x38800000u, 0x3F801000u,
                       0x3F803000u, 0x477FEFFFu, 0x477FF000u, 0x7F800000u, 0xFF800000u, 0x80000001u}) {
        float f;
        std::memcpy(&f, &m, 4);
        v.push_back(f);  // ties at subnormal and normal ulps, the largest finite, overflow to inf, inf, a tiny negative
    }
    v.push_back(std::nanf(""));
    const std::vector<uint16_t> want = f16_bits(v);
    const cmf::cpu::Kernels *p = cmf::cpu::kernels_for("portable");
    auto x = random_vec(203, 22), y0 = random_vec(203, 23);
    for_each_isa([&](const cmf::cpu::Kernels *k) {
        std::vector<uint16_t> got(v.size(), 0x1234);
        k->narrow_f16(v.data(), v.size(), got.data());
        for (size_t i = 0; i < v.size(); ++i) {
            CAPTURE(i);
            CAPTURE(v[i]);
            if (std::isnan(v[i])) {  // a NaN, payload aside
                CHECK((got[i] & 0x7C00) == 0x7C00);
                CHECK((got[i] & 0x03FF) != 0);
            } else {
                CHECK(got[i] == want[i]);
            }
        }
        // dot and axpy over f16 bits against the f32 kernels on the widened values.
        std::vector<float> wide(203);
        p->convert_f16(got.data(), 203, wide.data());
        for (uint64_t n : {1u, 7u, 8u, 33u, 203u}) {
            CAPTURE(n);
            const float d16 = k->dot_f16(x.data(), got.data(), n), d32 = p->dot(x.data(), wide.data(), n);
            CHECK(std::fabs(d16 - d32) <= 1e-5f * (1.0f + std::fabs(d32)));
            std::vector<float> a = y0, b = y0;
            k->axpy_f16(0.75f, got.data(), a.data(), n);
            p->axpy(0.75f, wide.data(), b.data(), n);
            for (size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(a[i] - b[i]) <= 1e-6f * (1.0f + std::fabs(b[i])));
        }
    });
}

TEST_CASE("cpu backend: heads_dot and heads_axpy match a double reference per head, f32 and f16 rows") {
    // (n_heads, group, head_dim): GQA, plain MHA, MQA, a head count that is not a multiple of 4, and head
    // dims off the 16-wide fast path.
    for (auto [nh, group, hd] : {std::tuple<uint32_t, uint32_t, uint32_t>{16, 2, 128}, {4, 1, 64}, {8, 8, 32},
                                 {7, 7, 48}, {6, 3, 40}, {5, 1, 9}, {12, 4, 256}}) {
        CAPTURE(nh);
        CAPTURE(group);
        CAPTURE(hd);
        const uint32_t nkv = nh / group;
        auto q = random_vec(size_t(nh) * hd, 31), row = random_vec(size_t(nkv) * hd, 32);
        auto a = random_vec(nh, 33), o0 = random_vec(size_t(nh) * hd, 34);
        const std::vector<uint16_t> row16 = f16_bits(row);
        for (int f16 = 0; f16 < 2; ++f16) {
            CAPTURE(f16);
            std::vector<double> rv(row.size());
            for (size_t i = 0; i < row.size(); ++i) rv[i] = f16 ? double(static_cast<float>(static_cast<_Float16>(row[i]))) : row[i];
            for_each_isa([&](const cmf::cpu::Kernels *k) {
                std::vector<float> out(nh + 1, NAN), o = o0;
                out[nh] = 12345.0f;  // past the heads: untouched
                if (f16) {
                    k->heads_dot_f16(q.data(), row16.data(), 0, 1, nh, group, hd, out.data(), 1);
                    k->heads_axpy_f16(a.data(), 1, row16.data(), 0, 1, nh, group, hd, o.data());
                } else {
                    k->heads_dot(q.data(), row.data(), 0, 1, nh, group, hd, out.data(), 1);
                    k->heads_axpy(a.data(), 1, row.data(), 0, 1, nh, group, hd, o.data());
                }
                CHECK(out[nh] == 12345.0f);
                for (uint32_t h = 0; h < nh; ++h) {
                    CAPTURE(h);
                    double want = 0, mag = 0;
                    for (uint32_t d = 0; d < hd; ++d) {
                        want += double(q[size_t(h) * hd + d]) * rv[size_t(h / group) * hd + d];
                        mag += std::fabs(double(q[size_t(h) * hd + d]) * rv[size_t(h / group) * hd + d]);
                    }
                    CHECK(std::fabs(out[h] - want) <= 1e-6 * mag + 1e-7);
                    for (uint32_t d = 0; d < hd; ++d) {
                        const double w = o0[size_t(h) * hd + d] + double(a[h]) * rv[size_t(h / group) * hd + d];
                        CHECK(std::fabs(o[size_t(h) * hd + d] - w) <= 1e-6 * (1.0 + std::fabs(w)));
                    }
                }
            });
        }
    }
}

TEST_CASE("cpu backend: the q8 KV cache kernels (quantize, widen, heads_dot_q8, heads_axpy_q8) on every ISA") {
    // Rows of q8 blocks written by quant_q8_32 (the same bytes from every
    // ISA), widened back within about half a step of each block's scale, and the
    // fused attention kernels over a run of keys against a double reference
    // on the widened values: GQA, MHA, MQA with 7 heads, head_dim 32-256.
    for (auto [nh, group, hd] : {std::tuple<uint32_t, uint32_t, uint32_t>{16, 2, 128}, {4, 1, 64}, {7, 7, 32},
                                 {12, 4, 256}, {6, 3, 96}}) {
        CAPTURE(nh);
        CAPTURE(group);
        CAPTURE(hd);
        const uint32_t nkv = nh / group, n_keys = 21;
        const uint64_t row_len = uint64_t(nkv) * hd, ld_bytes = row_len / 32 * 34;
        auto x = random_vec(n_keys * row_len, 41), q = random_vec(size_t(nh) * hd, 42);
        auto a = random_vec(size_t(nh) * n_keys, 43), o0 = random_vec(size_t(nh) * hd, 44);
        std::vector<uint8_t> rows(n_keys * ld_bytes);
        std::vector<float> wide(x.size());
        cmf::cpu::kernels_for("portable")->quant_q8_32(x.data(), x.size() / 32, rows.data());
        cmf::cpu::kernels_for("portable")->dequant_q8_32(rows.data(), x.size() / 32, wide.data());
        for (size_t i = 0; i < x.size(); ++i) {
            const float d = cmf::codecs::f16_to_f32(static_cast<uint16_t>(rows[i / 32 * 34] | rows[i / 32 * 34 + 1] << 8));
            // half a step, plus the f16 rounding of the scale the codes were
            // not made with (up to 2^-11 of it, times a code of up to 127)
            REQUIRE(std::fabs(wide[i] - x[i]) <= (0.5f + 127.0f * 0x1p-11f) * d * 1.001f + 1e-7f);
        }
        for_each_isa([&](const cmf::cpu::Kernels *k) {
            std::vector<uint8_t> mine(rows.size());
            k->quant_q8_32(x.data(), x.size() / 32, mine.data());
            CHECK(mine == rows);
            std::vector<float> w2(wide.size());
            k->dequant_q8_32(rows.data(), x.size() / 32, w2.data());
            CHECK(w2 == wide);
            std::vector<float> out(size_t(nh) * n_keys + 1, NAN), o = o0;
            out.back() = 12345.0f;
            k->heads_dot_q8(q.data(), rows.data(), ld_bytes, n_keys, nh, group, hd, out.data(), n_keys);
            k->heads_axpy_q8(a.data(), n_keys, rows.data(), ld_bytes, n_keys, nh, group, hd, o.data());
            CHECK(out.back() == 12345.0f);
            for (uint32_t h = 0; h < nh; ++h) {
                CAPTURE(h);
                for (uint32_t j = 0; j < n_keys; ++j) {
                    double want = 0, mag = 0;
                    for (uint32_t d = 0; d < hd; ++d) {
                        const double t = double(q[size_t(h) * hd + d]) * wide[j * row_len + size_t(h / group) * hd + d];
                        want += t;
                        mag += std::fabs(t);
                    }
                    CHECK(std::fabs(out[size_t(h) * n_keys + j] - want) <= 1e-5 * mag + 1e-7);
                }
                for (uint32_t d = 0; d < hd; ++d) {
                    double w = o0[size_t(h) * hd + d], mag = std::fabs(w);
                    for (uint32_t j = 0; j < n_keys; ++j) {
                        const double t = double(a[size_t(h) * n_keys + j]) * wide[j * row_len + size_t(h / group) * hd + d];
                        w += t;
                        mag += std::fabs(t);
                    }
                    CHECK(std::fabs(o[size_t(h) * hd + d] - w) <= 1e-5 * mag + 1e-7);
                }
            }
        });
    }
}

TEST_CASE("cpu backend: heads_dot over a run of keys equals one-key calls, bit for bit") {
    // Runs of 0-9 keys (whole 4-key blocks and every tail), rows with a
    // stride wider than a row, scores with a stride wider than the run;
    // GQA groups of 2 and 3 (heads paired inside and across KV heads), MHA,
    // an odd head count, a head dim off the 8-wide path; f32 and f16 rows.
    for (auto [nh, group, hd] : {std::tuple<uint32_t, uint32_t, uint32_t>{4, 2, 128}, {3, 3, 72}, {5, 1, 40},
                                 {6, 3, 64}, {2, 1, 12}}) {
        for (uint64_t n_keys : {0u, 1u, 2u, 3u, 4u, 5u, 7u, 9u}) {
            CAPTURE(nh);
            CAPTURE(group);
            CAPTURE(hd);
            CAPTURE(n_keys);
            const uint32_t nkv = nh / group;
            const uint64_t ldrow = uint64_t(nkv) * hd + 5, ldo = n_keys + 2;
            auto rows = random_vec(std::max<uint64_t>(1, n_keys) * ldrow, 51), q = random_vec(size_t(nh) * hd, 52);
            const std::vector<uint16_t> rows16 = f16_bits(rows);
            for_each_isa([&](const cmf::cpu::Kernels *k) {
                for (int f16 = 0; f16 < 2; ++f16) {
                    CAPTURE(f16);
                    std::vector<float> run(nh * ldo, -3.0f), one(nh * ldo, -3.0f);
                    if (f16) k->heads_dot_f16(q.data(), rows16.data(), ldrow, n_keys, nh, group, hd, run.data(), ldo);
                    else k->heads_dot(q.data(), rows.data(), ldrow, n_keys, nh, group, hd, run.data(), ldo);
                    for (uint64_t j = 0; j < n_keys; ++j) {
                        if (f16) k->heads_dot_f16(q.data(), rows16.data() + j * ldrow, 0, 1, nh, group, hd, one.data() + j, ldo);
                        else k->heads_dot(q.data(), rows.data() + j * ldrow, 0, 1, nh, group, hd, one.data() + j, ldo);
                    }
                    CHECK(std::memcmp(run.data(), one.data(), run.size() * sizeof(float)) == 0);  // padding untouched too
                    for (uint32_t h = 0; h < nh; ++h)
                        for (uint64_t j = 0; j < n_keys; ++j) {
                            double want = 0, mag = 0;
                            for (uint32_t d = 0; d < hd; ++d) {
                                const double r = f16 ? double(static_cast<float>(static_cast<_Float16>(rows[j * ldrow + (h / group) * hd + d])))
                                                     : rows[j * ldrow + (h / group) * hd + d];
                                want += double(q[size_t(h) * hd + d]) * r;
                                mag += std::fabs(double(q[size_t(h) * hd + d]) * r);
                            }
                            CHECK(std::fabs(run[h * ldo + j] - want) <= 1e-6 * mag + 1e-7);
                        }
                }
            });
        }
    }
}

TEST_CASE("cpu backend: heads_axpy over a run of keys equals one-key calls in key order, bit for bit") {
    // Runs of 0, 1, 5 and 33 keys (rows with a stride wider than a row and
    // weights with a stride wider than the run); head dims with and without
    // 64-column blocks and a tail; f32 and f16 rows.
    for (auto [nh, group, hd] : {std::tuple<uint32_t, uint32_t, uint32_t>{4, 2, 128}, {3, 3, 72}, {2, 1, 40}, {6, 2, 64}}) {
        for (uint64_t n_keys : {0u, 1u, 5u, 33u}) {
            CAPTURE(nh);
            CAPTURE(hd);
            CAPTURE(n_keys);
            const uint32_t nkv = nh / group;
            const uint64_t ldrow = uint64_t(nkv) * hd + 7, lda = n_keys + 3;
            auto rows = random_vec(std::max<uint64_t>(1, n_keys) * ldrow, 41), a = random_vec(nh * lda, 42);
            auto o0 = random_vec(size_t(nh) * hd, 43);
            const std::vector<uint16_t> rows16 = f16_bits(rows);
            for_each_isa([&](const cmf::cpu::Kernels *k) {
                for (int f16 = 0; f16 < 2; ++f16) {
                    CAPTURE(f16);
                    std::vector<float> run = o0, one = o0, col(nh);
                    if (f16) k->heads_axpy_f16(a.data(), lda, rows16.data(), ldrow, n_keys, nh, group, hd, run.data());
                    else k->heads_axpy(a.data(), lda, rows.data(), ldrow, n_keys, nh, group, hd, run.data());
                    for (uint64_t j = 0; j < n_keys; ++j) {
                        for (uint32_t h = 0; h < nh; ++h) col[h] = a[h * lda + j];
                        if (f16) k->heads_axpy_f16(col.data(), 1, rows16.data() + j * ldrow, 0, 1, nh, group, hd, one.data());
                        else k->heads_axpy(col.data(), 1, rows.data() + j * ldrow, 0, 1, nh, group, hd, one.data());
                    }
                    CHECK(std::memcmp(run.data(), one.data(), run.size() * sizeof(float)) == 0);
                }
            });
        }
    }
}

TEST_CASE("cpu backend: packed GEMM operands have the documented layout and every ISA's GEMM matches a double reference") {
    using cmf::cpu::kGemmRows;
    using cmf::cpu::kGemmTokens;
    const cmf::cpu::Kernels *p = cmf::cpu::kernels_for("portable");
    for (auto [rows, cols, batch] : {std::tuple<size_t, size_t, size_t>{37, 203, 13}, {16, 8, 6}, {1, 1, 1},
                                     {17, 9, 7}, {48, 64, 12}, {3, 130, 5}}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(batch);
        const size_t ldx = cols + 3;  // activations with a row stride of their own
        auto w = random_vec(rows * cols, 11);
        auto x = random_vec(batch * ldx, 12);
        std::vector<float> xd(batch * cols);
        for (size_t b = 0; b < batch; ++b)
            for (size_t c = 0; c < cols; ++c) xd[b * cols + c] = x[b * ldx + c];
        std::vector<double> ref;
        reference(w, rows, cols, xd, batch, ref);
        const size_t blocks = cmf::cpu::gemm_x_blocks(batch);
        REQUIRE(blocks == (batch + 5) / 6);
        for_each_isa([&](const cmf::cpu::Kernels *k) {
            // NaN-filled buffers: every element, padding included, must be written.
            std::vector<float> wp(cmf::cpu::packed_w_floats(rows, cols), NAN);
            std::vector<float> xp(cmf::cpu::packed_x_floats(batch, cols), NAN);
            REQUIRE(wp.size() == (rows + 15) / 16 * 16 * cols);
            REQUIRE(xp.size() == blocks * 6 * cols);
            k->pack_w(w.data(), cols, rows, cols, wp.data());
            // Two ranges of token blocks, as two threads pack them.
            k->pack_x(x.data(), ldx, batch, cols, blocks / 2, blocks, xp.data());
            k->pack_x(x.data(), ldx, batch, cols, 0, blocks / 2, xp.data());
            bool w_ok = true, x_ok = true;
            for (size_t r = 0; r < wp.size() / cols; ++r)
                for (size_t c = 0; c < cols; ++c) {
                    const float want = r < rows ? w[r * cols + c] : 0.0f;
                    w_ok = w_ok && wp[((r / kGemmRows) * cols + c) * kGemmRows + r % kGemmRows] == want;
                }
            for (size_t t = 0; t < blocks * 6; ++t)
                for (size_t c = 0; c < cols; ++c) {
                    const float want = t < batch ? x[t * ldx + c] : 0.0f;
                    x_ok = x_ok && xp[((t / kGemmTokens) * cols + c) * kGemmTokens + t % kGemmTokens] == want;
                }
            CHECK(w_ok);
            CHECK(x_ok);
            // Outputs past n_rows / n_batch (inside ldy) must stay untouched.
            const size_t ldy = rows + 2;
            std::vector<float> y(batch * ldy + 5, -7.0f), y2(batch * ldy + 5, -7.0f);
            k->gemm_packed(wp.data(), rows, cols, xp.data(), batch, y.data(), ldy);
            k->gemm_panel(w.data(), rows, cols, x.data(), ldx, batch, y2.data(), ldy);
            bool close = true, untouched = true;
            for (size_t b = 0; b < batch; ++b)
                for (size_t r = 0; r < ldy; ++r) {
                    const size_t i = b * ldy + r;
                    if (r >= rows) {
                        untouched = untouched && y[i] == -7.0f && y2[i] == -7.0f;
                        continue;
                    }
                    const double want = ref[b * rows + r], tol = 1e-5 * (1.0 + std::fabs(want)) * std::sqrt(double(cols));
                    close = close && std::fabs(y[i] - want) <= tol && std::fabs(y2[i] - want) <= tol;
                }
            for (size_t i = batch * ldy; i < y.size(); ++i) untouched = untouched && y[i] == -7.0f && y2[i] == -7.0f;
            CHECK(close);
            CHECK(untouched);
            // The layout is ISA-independent: a portable packing feeds this ISA's GEMM.
            std::vector<float> wpp(wp.size()), xpp(xp.size()), y3(y.size(), -7.0f);
            p->pack_w(w.data(), cols, rows, cols, wpp.data());
            p->pack_x(x.data(), ldx, batch, cols, 0, blocks, xpp.data());
            CHECK(wpp == wp);
            CHECK(xpp == xp);
        });
    }
}

TEST_CASE("cpu backend: exp_sum and silu_mul match double precision on every ISA") {
    // Softmax inputs: -inf (masked keys) must give exactly 0; values far
    // below the max underflow to 0; 21 elements leave a tail of 5 (8 lanes)
    // or are one whole and one masked block (16 lanes); then the same values
    // and more to 87 elements (two 32-element steps, a 16 and a tail of 7).
    std::vector<float> in = {0.0f, -1.0f, 1.5f, -INFINITY, -20.0f, 3.0f, -100.0f, 2.25f, -0.125f, 0.5f, -3.0f,
                             -INFINITY, 1.0f, -7.5f, 2.9f, -0.75f, 0.1f, -50.0f, 2.0f, -INFINITY, 1.25f};
    const float sub = 3.0f;
    std::vector<float> longer = in;
    for (float v : random_vec(66, 23)) longer.push_back(3.0f * v);
    // Every set evaluates each element by the same polynomial: the same bits.
    std::vector<std::vector<float>> per_isa;
    for_each_isa([&](const cmf::cpu::Kernels *k) {
        std::vector<float> x = longer;
        const float sum = k->exp_sum(x.data(), x.size(), sub);
        double want_sum = 0;
        for (float v : longer) want_sum += v == -INFINITY ? 0.0 : std::exp(double(v) - sub);
        CHECK(std::fabs(sum - want_sum) <= 1e-6 * want_sum);
        if (std::strcmp(k->isa, "portable") != 0) per_isa.push_back(x);
    });
    for (size_t i = 1; i < per_isa.size(); ++i) CHECK(per_isa[i] == per_isa[0]);
    auto g = random_vec(37, 21), u = random_vec(37, 22);
    g[3] = 30.0f;
    g[4] = -30.0f;
    g[36] = -95.0f;  // in the scalar tail: exp(95) overflows to inf, g/inf = -0
    for_each_isa([&](const cmf::cpu::Kernels *k) {
        std::vector<float> x = in;
        const float sum = k->exp_sum(x.data(), x.size(), sub);
        double want_sum = 0;
        for (size_t i = 0; i < in.size(); ++i) {
            const double want = in[i] == -INFINITY ? 0.0 : std::exp(double(in[i]) - sub);
            want_sum += want;
            if (in[i] == -INFINITY) CHECK(x[i] == 0.0f);
            CHECK(std::fabs(x[i] - want) <= 2e-7 * want + 1e-30);
        }
        CHECK(std::fabs(sum - want_sum) <= 1e-6 * want_sum);
        std::vector<float> o(g.size());
        k->silu_mul(g.data(), u.data(), g.size(), o.data());
        for (size_t i = 0; i < g.size(); ++i) {
            const double want = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
            CHECK(std::fabs(o[i] - want) <= 2e-7 * std::fabs(want) + 1e-30);
        }
    });
}

TEST_CASE("cpu backend: scale_max scales in place and finds the max on every ISA") {
    // Lengths around the 8-lane blocks, the max in the vector part, in the
    // scalar tail, at the front; all-negative rows; -inf (a masked key);
    // and n = 0, whose max is -inf.
    for (size_t n : {0, 1, 7, 8, 9, 16, 21, 64, 67}) {
        for (int where : {0, 1, 2}) {
            CAPTURE(n);
            CAPTURE(where);
            std::vector<float> in = random_vec(n, 30 + where);
            if (n > 0) {
                for (float &v : in) v -= 2.0f;  // all negative
                const size_t at = where == 0 ? 0 : where == 1 ? n / 2 : n - 1;
                in[at] = -0.25f;
                if (n > 3) in[(at + 1) % n] = -INFINITY;
            }
            const float scale = 0.0884f;
            float want = -INFINITY;
            for (float v : in) want = std::max(want, v * scale);
            for_each_isa([&](const cmf::cpu::Kernels *k) {
                std::vector<float> x = in;
                CHECK(k->scale_max(x.data(), x.size(), scale) == want);
                for (size_t i = 0; i < n; ++i) CHECK(x[i] == in[i] * scale);
            });
        }
    }
}

TEST_CASE("cpu backend: a dtype without a codec is refused at bind with a clear error") {
    TestRuntime t;
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    float dummy[4] = {};
    cmf_tensor_view v = cmf::tensor_view(250, std::array<uint64_t, 2>{2, 2}, dummy, sizeof dummy);
    cmf_backend_weight *w = nullptr;
    cmf_error *e = be->vt.weight_bind(be->ctx, &v, &w);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_UNKNOWN_DTYPE);
    CHECK(std::string(cmf_error_message(e)).find("250") != std::string::npos);
    cmf_error_free(e);
}

namespace {
// Binds a host f32 vector as a 1-D or 2-D weight.
cmf_backend_weight *bind_f32(const cmf::BackendEntry *be, const std::vector<float> &v, uint64_t rows, uint64_t cols) {
    std::vector<uint64_t> shape{cols};
    if (rows != 0) shape.insert(shape.begin(), rows);
    cmf_tensor_view t = cmf::tensor_view(CMF_DTYPE_F32, shape, v.data(), v.size() * 4);
    cmf_backend_weight *w = nullptr;
    REQUIRE(be->vt.weight_bind(be->ctx, &t, &w) == nullptr);
    return w;
}
}  // namespace

TEST_CASE("cpu backend: matmul_multi equals one matmul per weight, bit for bit, and refuses mismatched weights") {
    TestRuntime t;
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    REQUIRE(be->vt.struct_size >= offsetof(cmf_backend_vt, matmul_multi) + sizeof(void *));
    const bool has_multi = be->vt.matmul_multi != nullptr;
    REQUIRE(has_multi);
    const uint64_t cols = 96;
    // Mixed dtypes in one call: native rows, codec kernels, and codecs
    // without an int8 view; row counts that split chunks mid-weight.
    struct Spec {
        int32_t dtype;
        uint64_t rows;
    };
    const std::vector<Spec> specs = {{CMF_DTYPE_Q4_BLOCK, 37}, {CMF_DTYPE_F16, 64}, {CMF_DTYPE_Q8_ROW, 5},
                                     {CMF_DTYPE_F32, 130},     {CMF_DTYPE_Q8_2F, 9}, {CMF_DTYPE_Q4_TILED, 70},
                                     {CMF_DTYPE_BF16, 3},      {CMF_DTYPE_Q4_BLOCK, 200}, {CMF_DTYPE_Q8_ROW, 33}};
    std::vector<Encoded> enc;
    std::vector<cmf_backend_weight *> ws;
    for (size_t i = 0; i < specs.size(); ++i) {
        void *cctx = nullptr;
        const cmf_codec_vt *codec = find_test_codec(t.rt, specs[i].dtype, &cctx);
        REQUIRE(codec != nullptr);
        const auto w = random_vec(specs[i].rows * cols, 100 + unsigned(i));
        enc.push_back(encode(codec, cctx, specs[i].dtype, specs[i].rows, cols, w.data()));
    }
    for (auto &e : enc) {
        cmf_backend_weight *w = nullptr;
        REQUIRE(be->vt.weight_bind(be->ctx, &e.v, &w) == nullptr);
        ws.push_back(w);
    }
    // Every run of weights (1..9 of them: 9 is past the fused job's 8) over
    // batches on the fused decode path (1-3) and on the per-weight GEMM path.
    for (size_t first = 0; first < ws.size(); ++first)
        for (size_t n = 1; first + n <= ws.size(); n += (first == 0 ? 1 : 3))
            for (uint64_t batch : {1u, 2u, 3u, 5u, 17u}) {
                CAPTURE(first);
                CAPTURE(n);
                CAPTURE(batch);
                const auto x = random_vec(batch * cols, 7 + unsigned(batch));
                std::vector<std::vector<float>> want(n), got(n);
                std::vector<float *> ys(n);
                for (size_t i = 0; i < n; ++i) {
                    const uint64_t rows = specs[first + i].rows;
                    want[i].assign(batch * rows, -1.0f);
                    REQUIRE(be->vt.matmul(be->ctx, ws[first + i], x.data(), batch, want[i].data()) == nullptr);
                    got[i].assign(batch * rows + 8, -7.0f);  // 8 guard floats past the output
                    ys[i] = got[i].data();
                }
                REQUIRE(be->vt.matmul_multi(be->ctx, ws.data() + first, uint32_t(n), x.data(), batch, ys.data()) ==
                        nullptr);
                for (size_t i = 0; i < n; ++i) {
                    CAPTURE(specs[first + i].dtype);
                    const size_t len = want[i].size();
                    CHECK(std::memcmp(got[i].data(), want[i].data(), len * sizeof(float)) == 0);
                    CHECK(std::all_of(got[i].begin() + ptrdiff_t(len), got[i].end(), [](float v) { return v == -7.0f; }));
                }
            }
    // Refusals: weights of different widths, no weights, a NULL output.
    std::vector<float> wide_w(4 * 64, 0.5f), y(16), x(96, 1.0f);
    cmf_backend_weight *wide = bind_f32(be, wide_w, 4, 64);
    const cmf_backend_weight *pair[2] = {ws[0], wide};
    float *outs[2] = {y.data(), y.data()};
    cmf_error *e = be->vt.matmul_multi(be->ctx, pair, 2, x.data(), 1, outs);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    CHECK(std::string(cmf_error_message(e)).find("96 and 64 columns") != std::string::npos);
    cmf_error_free(e);
    e = be->vt.matmul_multi(be->ctx, pair, 0, x.data(), 1, outs);
    REQUIRE(e != nullptr);
    cmf_error_free(e);
    float *null_out[1] = {nullptr};
    e = be->vt.matmul_multi(be->ctx, pair, 1, x.data(), 1, null_out);
    REQUIRE(e != nullptr);
    cmf_error_free(e);
    be->vt.weight_free(be->ctx, wide);
    for (auto *w : ws) be->vt.weight_free(be->ctx, w);
}

TEST_CASE("cpu backend: CMF_CPU_DECODE_COPY binds q4_block and q1 matrices as copies with the same bits") {
    ::setenv("CMF_CPU_DECODE_COPY", "0", 1);
    TestRuntime plain;  // the backend reads the variable when it starts
    ::setenv("CMF_CPU_DECODE_COPY", "1", 1);
    TestRuntime copying;
    ::unsetenv("CMF_CPU_DECODE_COPY");
    const cmf::BackendEntry *bp = plain.rt->backend("cpu"), *bc = copying.rt->backend("cpu");
    REQUIRE(bp != nullptr);
    REQUIRE(bc != nullptr);
    struct Case {
        int32_t dtype;
        uint64_t rows, cols;
    };
    for (const auto &[dtype, rows, cols] : std::vector<Case>{{CMF_DTYPE_Q4_BLOCK, 37, 96},
                                                              {CMF_DTYPE_Q4_BLOCK, 200, 96},
                                                              {CMF_DTYPE_Q8_ROW, 5, 96},
                                                              {CMF_DTYPE_Q4_TILED, 9, 96},
                                                              {CMF_DTYPE_Q1, 37, 1024},
                                                              {CMF_DTYPE_Q1, 6, 96},
                                                              {CMF_DTYPE_Q1T, 21, 512}}) {
        CAPTURE(dtype);
        CAPTURE(rows);
        CAPTURE(cols);
        void *cctx = nullptr;
        const cmf_codec_vt *codec = find_test_codec(plain.rt, dtype, &cctx);
        REQUIRE(codec != nullptr);
        const auto wf = random_vec(rows * cols, 300 + unsigned(rows));
        Encoded e = encode(codec, cctx, dtype, rows, cols, wf.data());
        cmf_backend_weight *wp = nullptr, *wc = nullptr;
        const std::vector<uint8_t> stored = e.bytes;
        REQUIRE(bp->vt.weight_bind(bp->ctx, &e.v, &wp) == nullptr);
        REQUIRE(bc->vt.weight_bind(bc->ctx, &e.v, &wc) == nullptr);
        // The copy's source is told to the host as no longer read
        // (release_pages); memory that is not a mapped file keeps its bytes.
        CHECK(e.bytes == stored);
        // Decode (1-3 tokens), the batched rows and the int8 GEMM (17), and
        // embedding rows: the same bits from the copy.
        const int32_t tokens[3] = {0, int32_t(rows - 1), int32_t(rows / 2)};
        auto run = [&](const cmf::BackendEntry *be, cmf_backend_weight *w) {
            std::vector<float> out;
            for (uint64_t batch : {1u, 2u, 3u, 5u, 17u}) {
                const auto x = random_vec(batch * cols, 9 + unsigned(batch));
                std::vector<float> y(batch * rows, -1.0f);
                REQUIRE(be->vt.matmul(be->ctx, w, x.data(), batch, y.data()) == nullptr);
                out.insert(out.end(), y.begin(), y.end());
            }
            std::vector<float> emb(3 * cols, -1.0f);
            REQUIRE(be->vt.embed(be->ctx, w, tokens, 3, 1.0f, emb.data()) == nullptr);
            out.insert(out.end(), emb.begin(), emb.end());
            return out;
        };
        const std::vector<float> want = run(bp, wp), got = run(bc, wc);
        // The same bits, but for the 1-bit copies' decode rows: the same
        // integer sums of each group, added up in another order than q1t's
        // kernel (and q1's other than its BITALG one) adds them.
        if (dtype == CMF_DTYPE_Q1 || dtype == CMF_DTYPE_Q1T) {
            REQUIRE(got.size() == want.size());
            for (size_t i = 0; i < want.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= 1e-5f * (std::fabs(want[i]) + 1.0f));
        } else {
            CHECK(got == want);
        }
        // A weight whose codec has a decode layout for it (q4_block; q1 and
        // q1t with whole steps of 512 columns where their AVX-512 kernel
        // runs) reads the copy, its own memory: the stored bytes no longer
        // matter to it.
        uint64_t copy_bytes = 0;
        int32_t copy_dtype = -1;
        REQUIRE(codec->decode_copy(cctx, &e.v, nullptr, 0, &copy_bytes, &copy_dtype) == nullptr);
        if (dtype == CMF_DTYPE_Q1 || dtype == CMF_DTYPE_Q1T)
            CHECK((cols % 512 == 0 || copy_dtype < 0));  // with 512 columns: where the CPU runs its kernel
        else
            CHECK((copy_dtype >= 0) == (dtype == CMF_DTYPE_Q4_BLOCK));
        std::fill(e.bytes.begin(), e.bytes.end(), uint8_t(0));
        const std::vector<float> after = run(bc, wc);
        CHECK((after == got) == (copy_dtype >= 0));
        bp->vt.weight_free(bp->ctx, wp);
        bc->vt.weight_free(bc->ctx, wc);
    }
}

TEST_CASE("cpu backend: decode copies by default while they fit the budget, none under CMF_CPU_DECODE_COPY=0") {
    // Whether a bound q4_block weight reads a copy: zeroing the bytes it
    // was bound from changes its matmul or not.
    auto reads_a_copy = [&](const TestRuntime &t, int n_weights, uint64_t rows = 64, uint64_t cols = 256) {
        const cmf::BackendEntry *be = t.rt->backend("cpu");
        REQUIRE(be != nullptr);
        void *cctx = nullptr;
        const cmf_codec_vt *codec = find_test_codec(t.rt, CMF_DTYPE_Q4_BLOCK, &cctx);
        REQUIRE(codec != nullptr);
        std::vector<bool> copied;
        std::vector<Encoded> es;
        std::vector<cmf_backend_weight *> ws;
        for (int i = 0; i < n_weights; ++i) {
            const auto wf = random_vec(rows * cols, 500 + unsigned(i));
            es.push_back(encode(codec, cctx, CMF_DTYPE_Q4_BLOCK, rows, cols, wf.data()));
        }
        for (Encoded &e : es) {
            cmf_backend_weight *w = nullptr;
            REQUIRE(be->vt.weight_bind(be->ctx, &e.v, &w) == nullptr);
            ws.push_back(w);
        }
        const auto x = random_vec(cols, 7);
        for (size_t i = 0; i < ws.size(); ++i) {
            std::vector<float> y0(rows), y1(rows);
            REQUIRE(be->vt.matmul(be->ctx, ws[i], x.data(), 1, y0.data()) == nullptr);
            std::fill(es[i].bytes.begin(), es[i].bytes.end(), uint8_t(0));
            REQUIRE(be->vt.matmul(be->ctx, ws[i], x.data(), 1, y1.data()) == nullptr);
            copied.push_back(y0 == y1);
        }
        for (cmf_backend_weight *w : ws) be->vt.weight_free(be->ctx, w);
        return copied;
    };
    ::unsetenv("CMF_CPU_DECODE_COPY");
    ::unsetenv("CMF_CPU_DECODE_COPY_BUDGET_MIB");
    {
        TestRuntime by_default;  // half the available memory: room for these
        CHECK(reads_a_copy(by_default, 3) == std::vector<bool>{true, true, true});
    }
    ::setenv("CMF_CPU_DECODE_COPY", "0", 1);
    {
        TestRuntime never;
        CHECK(reads_a_copy(never, 2) == std::vector<bool>{false, false});
    }
    ::unsetenv("CMF_CPU_DECODE_COPY");
    ::setenv("CMF_CPU_DECODE_COPY_BUDGET_MIB", "0", 1);
    {
        TestRuntime no_room;  // a budget of 0 MiB: nothing fits
        CHECK(reads_a_copy(no_room, 2) == std::vector<bool>{false, false});
    }
    ::setenv("CMF_CPU_DECODE_COPY_BUDGET_MIB", "1", 1);
    {
        TestRuntime room_for_one;  // 1 MiB: one 1024x1024 q4_block copy (576 KiB), not two
        CHECK(reads_a_copy(room_for_one, 2, 1024, 1024) == std::vector<bool>{true, false});
    }
    ::setenv("CMF_CPU_DECODE_COPY", "1", 1);
    {
        TestRuntime always;  // =1: copies whatever the budget
        CHECK(reads_a_copy(always, 2) == std::vector<bool>{true, true});
    }
    ::unsetenv("CMF_CPU_DECODE_COPY");
    ::unsetenv("CMF_CPU_DECODE_COPY_BUDGET_MIB");
}

TEST_CASE("cpu backend: buffer_write, buffer_read and copy move every byte, small and large (split over threads)") {
    TestRuntime t;
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    // Sizes around the 256 KiB where copies go parallel and its 64 KiB pieces.
    for (size_t n : {size_t(0), size_t(1), size_t(4096), (size_t(256) << 10) - 4, size_t(256) << 10,
                     (size_t(256) << 10) + 4, (size_t(1) << 20) + 12, size_t(2400000)}) {
        CAPTURE(n);
        std::vector<uint8_t> src(n + 1), back(n + 16, 0xEE);  // (+1: memcmp wants a valid pointer at n = 0)
        for (size_t i = 0; i < n; ++i) src[i] = uint8_t(i * 131 + (i >> 11));
        float *a = nullptr, *b = nullptr;
        REQUIRE(be->vt.buffer_alloc(be->ctx, n + 64, &a) == nullptr);
        REQUIRE(be->vt.buffer_alloc(be->ctx, n + 64, &b) == nullptr);
        REQUIRE(be->vt.buffer_write(be->ctx, a, src.data(), n) == nullptr);
        REQUIRE(be->vt.copy(be->ctx, b, a, n / 4) == nullptr);
        REQUIRE(be->vt.buffer_read(be->ctx, back.data(), a, n) == nullptr);
        CHECK(std::memcmp(back.data(), src.data(), n) == 0);
        CHECK(std::all_of(back.begin() + ptrdiff_t(n), back.end(), [](uint8_t v) { return v == 0xEE; }));
        REQUIRE(be->vt.buffer_read(be->ctx, back.data(), b, n / 4 * 4) == nullptr);
        CHECK(std::memcmp(back.data(), src.data(), n / 4 * 4) == 0);
        be->vt.buffer_free(be->ctx, a);
        be->vt.buffer_free(be->ctx, b);
    }
}

// The AnonHugePages of the mapping holding p, in KiB (/proc/self/smaps);
// -1 if no mapping holds it.
long anon_huge_kib(const void *p) {
    std::ifstream smaps("/proc/self/smaps");
    const auto at = reinterpret_cast<uintptr_t>(p);
    bool inside = false;
    for (std::string line; std::getline(smaps, line);) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-'))
            inside = at >= lo && at < hi;
        else if (inside && line.rfind("AnonHugePages:", 0) == 0)
            return std::stol(line.substr(14));
    }
    return -1;
}

TEST_CASE("cpu backend: buffers of 2 MiB and more are 2 MiB pages of their own (a KV cache's), smaller ones the heap's") {
    TestRuntime t;
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    float *big = nullptr, *small = nullptr;
    REQUIRE(be->vt.buffer_alloc(be->ctx, size_t(5) << 20, &big) == nullptr);
    REQUIRE(be->vt.buffer_alloc(be->ctx, size_t(1) << 20, &small) == nullptr);
    // Written through, as a cache fills.
    std::vector<uint8_t> ones(size_t(5) << 20, 1), back(ones.size());
    REQUIRE(be->vt.buffer_write(be->ctx, big, ones.data(), ones.size()) == nullptr);
    REQUIRE(be->vt.buffer_read(be->ctx, back.data(), big, back.size()) == nullptr);
    CHECK(back == ones);
    if (cmf::cpu::kUnderAsan) {
        // Every buffer is the heap's, which keeps freed memory (and whose
        // allocator aborts on the sizes below): only the round trip holds.
        MESSAGE("under AddressSanitizer every buffer is the heap's");
        be->vt.buffer_free(be->ctx, big);
        be->vt.buffer_free(be->ctx, small);
        return;
    }
    CHECK(reinterpret_cast<uintptr_t>(big) % (size_t(2) << 20) == 0);
    std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode;
    std::getline(thp, mode);
    if (mode.find("[never]") == std::string::npos && !mode.empty())
        CHECK(anon_huge_kib(big) >= 4096);  // its two whole 2 MiB pages at least
    else
        MESSAGE("transparent huge pages are off here: " << mode);
    be->vt.buffer_free(be->ctx, big);
    be->vt.buffer_free(be->ctx, small);
    CHECK(anon_huge_kib(big) == -1);  // unmapped
    // A size no machine holds (a context far beyond memory): an error at
    // once, as the heap's allocator gives, not a mapping that fails when
    // touched. Under the kernel's heuristic or strict overcommit only.
    std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
    int overcommit_mode = -1;
    overcommit >> overcommit_mode;
    if (overcommit_mode == 0 || overcommit_mode == 2) {
        for (size_t n : {size_t(1) << 40, SIZE_MAX - 64}) {  // 1 TiB: within the address space
            CAPTURE(n);
            float *none = nullptr;
            cmf_error *e = be->vt.buffer_alloc(be->ctx, n, &none);
            REQUIRE(e != nullptr);
            CHECK(cmf_error_code(e) == CMF_ERR_OUT_OF_MEMORY);
            cmf_error_free(e);
            CHECK(none == nullptr);
        }
    }
}

TEST_CASE("cpu backend ops: gemma norm, partial RoPE, windowed soft-capped GQA attention, gelu_tanh, embed") {
    TestRuntime t;
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    const auto &vt = be->vt;
    void *c = be->ctx;

    // RMSNorm, gemma style x^*(1+w), 3 rows of 10.
    auto x = random_vec(30, 11), w = random_vec(10, 12);
    cmf_backend_weight *wn = bind_f32(be, w, 0, 10);
    std::vector<float> y(30);
    REQUIRE(vt.rms_norm(c, x.data(), wn, 3, 10, 1e-6f, CMF_NORM_GEMMA, y.data()) == nullptr);
    for (int r = 0; r < 3; ++r) {
        double ss = 0;
        for (int j = 0; j < 10; ++j) ss += double(x[r * 10 + j]) * x[r * 10 + j];
        double inv = 1.0 / std::sqrt(ss / 10 + 1e-6);
        for (int j = 0; j < 10; ++j) CHECK(y[r * 10 + j] == doctest::Approx(x[r * 10 + j] * inv * (1 + w[j])).epsilon(1e-5));
    }
    cmf_error *e = vt.rms_norm(c, x.data(), wn, 3, 9, 1e-6f, CMF_NORM_QWEN, y.data());
    REQUIRE(e != nullptr);  // weight length does not match dim
    cmf_error_free(e);
    vt.weight_free(c, wn);

    // Partial RoPE: head_dim 8, rot_dim 4 (dims 4..7 pass through), 2 heads, positions 5, 6.
    auto q = random_vec(2 * 16, 13), q0 = q;
    REQUIRE(vt.rope(c, q.data(), 2, 16, 2, 8, 4, 5, 10000.0f) == nullptr);
    for (int tkn = 0; tkn < 2; ++tkn)
        for (int h = 0; h < 2; ++h) {
            const float *a = &q0[tkn * 16 + h * 8];
            const float *b = &q[tkn * 16 + h * 8];
            for (int i = 0; i < 2; ++i) {
                double ang = (5 + tkn) * std::pow(10000.0, -2.0 * i / 4);
                CHECK(b[i] == doctest::Approx(a[i] * std::cos(ang) - a[i + 2] * std::sin(ang)).epsilon(1e-4));
                CHECK(b[i + 2] == doctest::Approx(a[i + 2] * std::cos(ang) + a[i] * std::sin(ang)).epsilon(1e-4));
            }
            for (int i = 4; i < 8; ++i) CHECK(b[i] == a[i]);
        }

    // rope_freqs: the table rope computes from theta, scale 1, gives rope's
    // result bit for bit; a scaled table with an attention factor rotates
    // by f32(pos) * inv_freq[i] and multiplies cos and sin by the factor,
    // over many tokens (split across threads) and partial rotary dims.
    REQUIRE(vt.struct_size >= offsetof(cmf_backend_vt, rope_freqs) + sizeof(void *));
    REQUIRE((vt.rope_freqs != nullptr));
    {
        auto r1 = random_vec(40 * 3 * 12, 21), r2 = r1;
        std::vector<float> table(4);
        for (int i = 0; i < 4; ++i) table[i] = 1.0f / std::pow(500000.0f, float(2 * i) / 8.0f);
        REQUIRE(vt.rope(c, r1.data(), 40, 36, 3, 12, 8, 1000, 500000.0f) == nullptr);
        REQUIRE(vt.rope_freqs(c, r2.data(), 40, 36, 3, 12, 8, 1000, table.data(), 1.0f) == nullptr);
        CHECK(std::memcmp(r1.data(), r2.data(), r1.size() * 4) == 0);

        const std::vector<float> inv = {0.9f, 0.05f, 1e-3f, 2.5e-5f};
        const float att = 1.1386294f;
        auto r3 = random_vec(40 * 3 * 12, 22), r30 = r3;
        REQUIRE(vt.rope_freqs(c, r3.data(), 40, 36, 3, 12, 8, 7000, inv.data(), att) == nullptr);
        for (int tkn = 0; tkn < 40; ++tkn)
            for (int h = 0; h < 3; ++h) {
                const float *a = &r30[tkn * 36 + h * 12];
                const float *b = &r3[tkn * 36 + h * 12];
                for (int i = 0; i < 4; ++i) {
                    const float ang = float(7000 + tkn) * inv[i];  // in f32, as HF
                    const double cs = std::cos(double(ang)) * att, sn = std::sin(double(ang)) * att;
                    CHECK(b[i] == doctest::Approx(a[i] * cs - a[i + 4] * sn).epsilon(1e-4));
                    CHECK(b[i + 4] == doctest::Approx(a[i + 4] * cs + a[i] * sn).epsilon(1e-4));
                }
                for (int i = 8; i < 12; ++i) CHECK(b[i] == a[i]);
            }
        cmf_error *bad = vt.rope_freqs(c, r3.data(), 1, 36, 3, 12, 7, 0, inv.data(), 1.0f);
        REQUIRE(bad != nullptr);  // odd rot_dim
        cmf_error_free(bad);
        bad = vt.rope_freqs(c, r3.data(), 1, 36, 3, 12, 8, 0, nullptr, 1.0f);
        REQUIRE(bad != nullptr);  // no table
        cmf_error_free(bad);
    }

    // Attention, 4 query heads over 2 KV heads, checked in double precision:
    // 3 new tokens at positions 2..4 over a 5-row cache, head_dim 4, window
    // 2, softcap 1.5 (the per-token decode path); then 37 and 40 tokens
    // (the blocked prefill path: a partial last block, head_dim 20 not a
    // multiple of 8, a window that cuts inside a block, no window/softcap).
    struct AttnCase {
        uint32_t hd, n, pos0, win;
        float cap;
        uint32_t nh = 4, nkv = 2;
    };
    // 61 tokens after 20 cached: K/V panels of 16 keys straddling the cache
    // and the new rows, a window starting mid-panel. The last three are
    // decode steps deep in a cache: one token (a KV group split across
    // work items), two tokens with a window, and MQA (3 query heads on
    // one KV head, split three ways), head_dim 40 and 64. Then two decode
    // steps in a short context, where the work items split the KV heads
    // (4 KV heads in groups of 2; 3 KV heads, an uneven split, with a
    // window and softcap). Last, decode with head pairs that do not share
    // a KV head and an odd last head: MHA with 5 heads (head_dim 32),
    // groups of 3 (head_dim 48), and groups of 3 at head_dim 128 (the
    // widest attention kernels, whose value pass pairs the heads of a group).
    // Then the blocked path deep in a windowed context (its ring wraps), and
    // two blocked cases at head_dim 32 and 64. Last, the blocked path over
    // several key chunks (flash attention's running max and denominator):
    // 150 tokens after 200, 100 after 300 in a window of 200 that starts
    // mid-chunk (and its ring), a group of 8 query heads on one KV head,
    // groups of 3, 400 tokens (three token blocks of a GQA pair) and 20
    // query heads on one KV head (two items of 16 and 4 heads). q8 caches run in every case
    // whose K/V rows are whole blocks (heads at 48 or 40 dims start mid-block).
    for (const AttnCase ac : {AttnCase{4, 3, 2, 2, 1.5f}, AttnCase{20, 37, 5, 9, 1.5f}, AttnCase{8, 40, 0, 0, 0.0f},
                              AttnCase{16, 61, 20, 30, 0.0f}, AttnCase{40, 1, 300, 0, 0.0f},
                              AttnCase{64, 2, 100, 50, 1.5f}, AttnCase{40, 1, 77, 0, 0.0f, 3, 1},
                              AttnCase{16, 1, 5, 0, 0.0f, 8, 4}, AttnCase{8, 1, 40, 10, 1.5f, 6, 3},
                              AttnCase{32, 1, 90, 0, 0.0f, 5, 5}, AttnCase{48, 2, 64, 0, 0.0f, 6, 2},
                              AttnCase{128, 1, 70, 0, 0.0f, 9, 3}, AttnCase{16, 30, 50, 12, 1.5f},
                              AttnCase{32, 40, 10, 0, 0.0f}, AttnCase{64, 45, 30, 20, 1.5f},
                              AttnCase{16, 150, 200, 0, 0.0f}, AttnCase{32, 100, 300, 200, 1.5f},
                              AttnCase{16, 60, 140, 0, 0.0f, 8, 1}, AttnCase{24, 50, 130, 0, 0.0f, 6, 2},
                              AttnCase{8, 400, 30, 0, 0.0f}, AttnCase{8, 30, 10, 0, 0.0f, 20, 1}}) {
        CAPTURE(ac.n);
        CAPTURE(ac.pos0);
        const uint32_t nh = ac.nh, nkv = ac.nkv, hd = ac.hd, n = ac.n, pos0 = ac.pos0, win = ac.win, rows = pos0 + n;
        const float scale = 0.5f, cap = ac.cap;
        auto qa = random_vec(n * nh * hd, 14), kc = random_vec(rows * nkv * hd, 15), vc = random_vec(rows * nkv * hd, 16);
        // attention (f32 cache), then attention_kv over f32 and f16 caches
        // written by kv_write in two calls (the cached rows, then the new
        // ones). The f16 case's reference is computed on the f16 values.
        // With a window, also attention_ring over rings of the fewest rows
        // the call allows and of a few more (f32 and f16), every position
        // written at row p % ring in order, so the ring holds only the last
        // ring_rows positions (the rest were overwritten).
        const uint32_t first = pos0 + 1 > win ? pos0 + 1 - win : 0;
        std::vector<int32_t> dtypes = {CMF_DTYPE_F32, CMF_DTYPE_F16};
        if (nkv * hd % 32 == 0) dtypes.push_back(CMF_KV_DTYPE_Q8_32);  // heads may start mid-block
        std::vector<std::pair<int32_t, uint32_t>> caches = {{-1, 0}};
        for (int32_t d : dtypes) caches.emplace_back(d, 0);
        if (win > 0)
            for (int32_t d : dtypes)
                for (uint32_t extra : {0u, 5u}) caches.emplace_back(d, rows - first + extra);
        for (const auto &[kv, ring] : caches) {
            CAPTURE(kv);
            CAPTURE(ring);
            const size_t row = size_t(nkv) * hd;
            const size_t row_bytes = kv == CMF_KV_DTYPE_Q8_32 ? CMF_KV_Q8_32_ROW_BYTES(row) : row * (kv == CMF_DTYPE_F16 ? 2 : 4);
            std::vector<float> kbuf((rows * row_bytes + 3) / 4, -1.0f), vbuf = kbuf;
            std::vector<float> out(n * nh * hd);
            if (ring > 0) {
                for (uint32_t p = 0; p < rows; ++p) {
                    REQUIRE(vt.kv_write(c, kbuf.data(), kv, row, p % ring, kc.data() + p * row, 1) == nullptr);
                    REQUIRE(vt.kv_write(c, vbuf.data(), kv, row, p % ring, vc.data() + p * row, 1) == nullptr);
                }
                REQUIRE(vt.attention_ring(c, qa.data(), kbuf.data(), vbuf.data(), kv, ring, out.data(), n, pos0, nh, nkv, hd,
                                          scale, win, cap) == nullptr);
                if (ring == rows - first) {  // one row short is refused, not read past
                    std::vector<float> o2(out.size());
                    cmf_error *er = vt.attention_ring(c, qa.data(), kbuf.data(), vbuf.data(), kv, ring - 1, o2.data(), n,
                                                      pos0, nh, nkv, hd, scale, win, cap);
                    REQUIRE(er != nullptr);
                    CHECK(cmf_error_code(er) == CMF_ERR_BOUNDS);
                    cmf_error_free(er);
                }
            } else if (kv < 0) {
                REQUIRE(vt.attention(c, qa.data(), kc.data(), vc.data(), out.data(), n, pos0, nh, nkv, hd, scale, win, cap) == nullptr);
            } else {
                for (auto [r0, r1] : {std::pair<uint32_t, uint32_t>{0, pos0}, std::pair<uint32_t, uint32_t>{pos0, rows}}) {
                    REQUIRE(vt.kv_write(c, kbuf.data(), kv, row, r0, kc.data() + r0 * row, r1 - r0) == nullptr);
                    REQUIRE(vt.kv_write(c, vbuf.data(), kv, row, r0, vc.data() + r0 * row, r1 - r0) == nullptr);
                }
                REQUIRE(vt.attention_kv(c, qa.data(), kbuf.data(), vbuf.data(), kv, out.data(), n, pos0, nh, nkv, hd, scale, win,
                                        cap) == nullptr);
            }
            std::vector<float> kref = kc, vref = vc;  // what the cache holds, as f32
            if (kv == CMF_DTYPE_F16) {
                const auto *kh = reinterpret_cast<const uint16_t *>(kbuf.data()), *vh = reinterpret_cast<const uint16_t *>(vbuf.data());
                for (size_t i = 0; i < kref.size(); ++i) {
                    const size_t p = i / row, at = ring > 0 ? (p % ring) * row + i % row : i;  // where position p is
                    if (ring > 0 && p + ring < rows) continue;                             // overwritten in the ring
                    kref[i] = cmf::codecs::f16_to_f32(kh[at]);
                    vref[i] = cmf::codecs::f16_to_f32(vh[at]);
                    REQUIRE(std::fabs(kref[i] - kc[i]) <= std::fabs(kc[i]) * 0x1p-11f + 0x1p-25f);  // rounded, not garbage
                }
            }
            if (kv == CMF_KV_DTYPE_Q8_32) {
                // The bytes are the layout cmf_plugin.h states, computed here
                // from the f32 values: per 32 elements the f16 of max|x|/127,
                // then round(x * 127/max|x|) half away from zero.
                const auto *kb = reinterpret_cast<const uint8_t *>(kbuf.data()), *vb = reinterpret_cast<const uint8_t *>(vbuf.data());
                for (size_t blk = 0; blk < kref.size() / 32; ++blk) {
                    const size_t p = blk * 32 / row, at = (ring > 0 ? (p % ring) * row + blk * 32 % row : blk * 32) / 32 * 34;
                    if (ring > 0 && p + ring < rows) continue;
                    for (auto [src, bytes, ref] : {std::tuple{&kc, kb, &kref}, std::tuple{&vc, vb, &vref}}) {
                        const float *x = src->data() + blk * 32;
                        float amax = 0;
                        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
                        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                        const uint16_t h = cmf::codecs::f32_to_f16(d);
                        REQUIRE(bytes[at] == (h & 0xFF));
                        REQUIRE(bytes[at + 1] == (h >> 8));
                        for (int i = 0; i < 32; ++i) {
                            const int8_t q = static_cast<int8_t>(bytes[at + 2 + i]);
                            REQUIRE(q == static_cast<int>(std::round(x[i] * id)));
                            (*ref)[blk * 32 + i] = cmf::codecs::f16_to_f32(h) * static_cast<float>(q);
                        }
                    }
                }
            }
            for (uint32_t tk = 0; tk < n; ++tk)
                for (uint32_t h = 0; h < nh; ++h) {
                    uint32_t kvh = h / (nh / nkv), p = pos0 + tk;
                    std::vector<double> s;
                    std::vector<uint32_t> js;
                    for (uint32_t j = 0; j <= p; ++j) {
                        if (win > 0 && j + win <= p) continue;  // outside the window
                        double d = 0;
                        for (uint32_t i = 0; i < hd; ++i) d += double(qa[(tk * nh + h) * hd + i]) * kref[(j * nkv + kvh) * hd + i];
                        d *= scale;
                        s.push_back(cap > 0 ? cap * std::tanh(d / cap) : d);
                        js.push_back(j);
                    }
                    double mx = *std::max_element(s.begin(), s.end()), z = 0;
                    for (double &v : s) z += (v = std::exp(v - mx));
                    for (uint32_t i = 0; i < hd; ++i) {
                        double o = 0;
                        for (size_t m = 0; m < js.size(); ++m) o += s[m] / z * vref[(js[m] * nkv + kvh) * hd + i];
                        REQUIRE(out[(tk * nh + h) * hd + i] == doctest::Approx(o).epsilon(1e-4));
                    }
                }
        }
    }
    // A cache dtype the backend does not have is refused, not guessed.
    {
        std::vector<float> buf(64), src(64);
        cmf_error *ek = vt.kv_write(c, buf.data(), CMF_DTYPE_BF16, 8, 0, src.data(), 2);
        REQUIRE(ek != nullptr);
        CHECK(cmf_error_code(ek) == CMF_ERR_UNSUPPORTED);
        CHECK(std::string(cmf_error_message(ek)).find("KV cache dtype 2") != std::string::npos);
        cmf_error_free(ek);
        std::vector<float> qv(8), ov(8);
        ek = vt.attention_kv(c, qv.data(), buf.data(), buf.data(), CMF_DTYPE_Q8_ROW, ov.data(), 1, 0, 1, 1, 8, 1.0f, 0, 0.0f);
        REQUIRE(ek != nullptr);
        CHECK(cmf_error_code(ek) == CMF_ERR_UNSUPPORTED);
        cmf_error_free(ek);
        // q8 blocks need rows and heads of whole blocks.
        ek = vt.kv_write(c, buf.data(), CMF_KV_DTYPE_Q8_32, 8, 0, src.data(), 2);
        REQUIRE(ek != nullptr);
        CHECK(cmf_error_code(ek) == CMF_ERR_INVALID_ARGUMENT);
        CHECK(std::string(cmf_error_message(ek)).find("multiple of 32 elements, not 8") != std::string::npos);
        cmf_error_free(ek);
        ek = vt.attention_kv(c, qv.data(), buf.data(), buf.data(), CMF_KV_DTYPE_Q8_32, ov.data(), 1, 0, 1, 1, 8, 1.0f, 0, 0.0f);
        REQUIRE(ek != nullptr);
        CHECK(cmf_error_code(ek) == CMF_ERR_INVALID_ARGUMENT);
        CHECK(std::string(cmf_error_message(ek)).find("rows of a multiple of 32 elements, not 8") != std::string::npos);
        cmf_error_free(ek);
        // A block with an infinity stores a NaN scale (never a finite guess);
        // the next block is unaffected.
        std::vector<float> row64(64, 0.25f);
        row64[3] = INFINITY;
        REQUIRE(vt.kv_write(c, buf.data(), CMF_KV_DTYPE_Q8_32, 64, 0, row64.data(), 1) == nullptr);
        const auto *qb = reinterpret_cast<const uint8_t *>(buf.data());
        CHECK(std::isnan(cmf::codecs::f16_to_f32(static_cast<uint16_t>(qb[0] | qb[1] << 8))));
        for (int i = 0; i < 32; ++i) CHECK(qb[2 + i] == 0);
        CHECK(cmf::codecs::f16_to_f32(static_cast<uint16_t>(qb[34] | qb[35] << 8)) == doctest::Approx(0.25f / 127).epsilon(1e-3));
        CHECK(static_cast<int8_t>(qb[36]) == 127);
    }

    // gelu_tanh gated product.
    std::vector<float> g = {-2.0f, -0.5f, 0.0f, 0.7f, 3.0f}, u = {1.0f, 2.0f, 3.0f, -1.0f, 0.5f}, o(5);
    REQUIRE(vt.gated_act(c, g.data(), u.data(), 5, CMF_ACT_GELU_TANH, o.data()) == nullptr);
    for (int i = 0; i < 5; ++i) {
        double gg = g[i];
        double ref = 0.5 * gg * (1 + std::tanh(std::sqrt(2 / M_PI) * (gg + 0.044715 * gg * gg * gg))) * u[i];
        CHECK(o[i] == doctest::Approx(ref).epsilon(1e-5));
    }

    // Embedding rows of an f16 table, scaled; an id outside the table is Bounds.
    std::vector<uint16_t> tab(6 * 3);
    for (size_t i = 0; i < tab.size(); ++i) tab[i] = cmf::codecs::f32_to_f16(float(i) * 0.25f);
    cmf_tensor_view tv = cmf::tensor_view(CMF_DTYPE_F16, std::array<uint64_t, 2>{6, 3}, tab.data(), tab.size() * 2);
    cmf_backend_weight *tw = nullptr;
    REQUIRE(vt.weight_bind(c, &tv, &tw) == nullptr);
    int32_t ids[2] = {4, 1};
    std::vector<float> emb(6);
    REQUIRE(vt.embed(c, tw, ids, 2, 2.0f, emb.data()) == nullptr);
    CHECK(emb == std::vector<float>{6.0f, 6.5f, 7.0f, 1.5f, 2.0f, 2.5f});
    int32_t bad[1] = {6};
    e = vt.embed(c, tw, bad, 1, 1.0f, emb.data());
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_BOUNDS);
    cmf_error_free(e);
    vt.weight_free(c, tw);
}
