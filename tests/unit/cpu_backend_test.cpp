// The CPU backend's matmul through the plugin ABI, exactly as an arch calls
// it: bind a weight, run a batched matmul, compare with a double reference.
// Covers the native f32 kernel (every ISA this CPU has), and the
// dequantize-tiles path for a dtype whose codec has no kernel (f16).
#include <doctest/doctest.h>

#include "kernels.hpp"
#include "plugins/runtime.hpp"

#include <cmf/cmf.h>

#include <cmath>
#include <random>
#include <vector>

namespace {

struct TestRuntime {
    cmf_runtime *rt = nullptr;
    TestRuntime() {
        cmf_runtime_options o;
        cmf_runtime_options_init(&o);
        o.n_threads = 2;
        REQUIRE(cmf_runtime_create(&o, &rt) == nullptr);
    }
    ~TestRuntime() { cmf_runtime_free(rt); }
};

std::vector<float> random_vec(size_t n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v) x = d(gen);
    return v;
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
    cmf_tensor_view v{};
    v.struct_size = sizeof v;
    v.dtype = dtype;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.data = data;
    v.nbytes = nbytes;
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
    for (auto [rows, cols, batch] : {std::tuple<size_t, size_t, size_t>{1, 1, 1}, {7, 9, 3}, {33, 130, 1},
                                     {257, 64, 5}, {1024, 96, 2}}) {
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

TEST_CASE("cpu backend: f16 weights go through the codec's dequantizer") {
    TestRuntime t;
    const size_t rows = 45, cols = 70, batch = 2;
    auto w = random_vec(rows * cols, 5);
    // Quantize through the f16 codec, then compare with the f16-rounded weights.
    void *codec_ctx = nullptr;
    const cmf_codec_vt *codec = t.rt->host_api()->find_codec(t.rt->host_api()->host_ctx, CMF_DTYPE_F16, &codec_ctx);
    REQUIRE(codec != nullptr);
    REQUIRE(bool(codec->quantize));
    std::vector<uint8_t> bytes;
    cmf_byte_sink sink{sizeof(cmf_byte_sink), 0, &bytes, [](void *u, const void *d, size_t n) -> cmf_error * {
                           auto *v = static_cast<std::vector<uint8_t> *>(u);
                           v->insert(v->end(), static_cast<const uint8_t *>(d), static_cast<const uint8_t *>(d) + n);
                           return nullptr;
                       }};
    uint64_t shape[2] = {rows, cols};
    REQUIRE(codec->quantize(codec_ctx, 2, shape, w.data(), nullptr, &sink) == nullptr);
    REQUIRE(bytes.size() == rows * cols * 2);
    std::vector<float> w16(rows * cols);
    cmf_tensor_view v{};
    v.struct_size = sizeof v;
    v.dtype = CMF_DTYPE_F16;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.data = bytes.data();
    v.nbytes = bytes.size();
    REQUIRE(codec->dequantize_rows(codec_ctx, &v, 0, rows, w16.data()) == nullptr);
    auto x = random_vec(batch * cols, 6);
    std::vector<double> ref;
    reference(w16, rows, cols, x, batch, ref);
    std::vector<float> y;
    run_matmul(t.rt, CMF_DTYPE_F16, bytes.data(), bytes.size(), rows, cols, x, batch, y);
    for (size_t i = 0; i < y.size(); ++i) REQUIRE(std::fabs(y[i] - ref[i]) <= 1e-3 * (1.0 + std::fabs(ref[i])));
}

TEST_CASE("cpu backend: a dtype without a codec is refused at bind with a clear error") {
    TestRuntime t;
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    float dummy[4] = {};
    cmf_tensor_view v{};
    v.struct_size = sizeof v;
    v.dtype = 250;
    v.ndim = 2;
    v.shape[0] = 2;
    v.shape[1] = 2;
    v.data = dummy;
    v.nbytes = sizeof dummy;
    cmf_backend_weight *w = nullptr;
    cmf_error *e = be->vt.weight_bind(be->ctx, &v, &w);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_UNKNOWN_DTYPE);
    CHECK(std::string(cmf_error_message(e)).find("250") != std::string::npos);
    cmf_error_free(e);
}
