// The CPU backend's image and diffusion operations through the plugin ABI
// (cmf_backend_vt.modulate .. upsample2x), each against a plain double
// reference written here from the operation's contract in cmf_plugin.h.
#include <doctest/doctest.h>
#include "support/random_vec.hpp"
#include "support/test_runtime.hpp"

#include "common/byte_views.hpp"

#include <cmf/cmf.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

void ok_or_fail(cmf_error *e) {
    if (e != nullptr) {
        const std::string msg = cmf_error_message(e);
        cmf_error_free(e);
        FAIL(msg);
    }
}

struct Be {
    TestRuntime t;
    const cmf::BackendEntry *e = nullptr;
    std::vector<cmf_backend_weight *> bound;
    Be() {
        e = t.rt->backend("cpu");
        REQUIRE(e != nullptr);
    }
    ~Be() {
        for (auto *w : bound) e->vt.weight_free(e->ctx, w);
    }
    const cmf_backend_vt &vt() const { return e->vt; }
    void *ctx() const { return e->ctx; }
    // Binds f32 data (kept alive by the caller) as a 1-D or 2-D weight.
    cmf_backend_weight *bind(const std::vector<float> &v, std::vector<uint64_t> shape, int32_t dtype = CMF_DTYPE_F32,
                             const void *data = nullptr, uint64_t nbytes = 0) {
        cmf_tensor_view tv{};
        tv.struct_size = sizeof tv;
        tv.dtype = dtype;
        tv.ndim = uint32_t(shape.size());
        for (size_t i = 0; i < shape.size(); ++i) tv.shape[i] = shape[i];
        tv.data = data ? data : v.data();
        tv.nbytes = data ? nbytes : v.size() * sizeof(float);
        cmf_backend_weight *w = nullptr;
        ok_or_fail(vt().weight_bind(ctx(), &tv, &w));
        bound.push_back(w);
        return w;
    }
};

// Max |got - want| / max(1, max |want|).
double rel_err(const std::vector<float> &got, const std::vector<double> &want) {
    REQUIRE(got.size() == want.size());
    double m = 1, d = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        m = std::max(m, std::fabs(want[i]));
        d = std::max(d, std::fabs(double(got[i]) - want[i]));
    }
    return d / m;
}

void ok(cmf_error *e) { ok_or_fail(e); }

std::string error_text(cmf_error *e) {
    REQUIRE(e != nullptr);
    std::string msg = cmf_error_message(e);
    cmf_error_free(e);
    return msg;
}

}  // namespace

TEST_CASE("cpu backend image ops: modulate, add_gated and activation") {
    Be be;
    const uint64_t rows = 37, dim = 70;
    auto x = random_vec(rows * dim, 1), scale = random_vec(dim, 2), shift = random_vec(dim, 3);
    std::vector<float> y(rows * dim);
    ok(be.vt().modulate(be.ctx(), x.data(), scale.data(), shift.data(), rows, dim, y.data()));
    for (uint64_t i = 0; i < rows * dim; ++i) CHECK(y[i] == x[i] * (1.0f + scale[i % dim]) + shift[i % dim]);
    ok(be.vt().modulate(be.ctx(), x.data(), scale.data(), nullptr, rows, dim, y.data()));
    for (uint64_t i = 0; i < rows * dim; ++i) CHECK(y[i] == x[i] * (1.0f + scale[i % dim]));

    auto acc = random_vec(rows * dim, 4), gate = random_vec(dim, 5);
    std::vector<float> a = acc;
    ok(be.vt().add_gated(be.ctx(), a.data(), x.data(), gate.data(), rows, dim, CMF_ACT_TANH));
    for (uint64_t i = 0; i < rows * dim; ++i) CHECK(a[i] == acc[i] + std::tanh(gate[i % dim]) * x[i]);
    a = acc;
    ok(be.vt().add_gated(be.ctx(), a.data(), x.data(), gate.data(), rows, dim, CMF_ACT_IDENTITY));
    for (uint64_t i = 0; i < rows * dim; ++i) CHECK(a[i] == acc[i] + gate[i % dim] * x[i]);
    CHECK(error_text(be.vt().add_gated(be.ctx(), a.data(), x.data(), gate.data(), rows, dim, CMF_ACT_SILU))
              .find("CMF_ACT_TANH") != std::string::npos);

    // Long enough for the SIMD body and a tail, with large magnitudes.
    auto v = random_vec(40003, 6);
    for (auto &f : v) f *= 8;
    for (int32_t act : {CMF_ACT_SILU, CMF_ACT_GELU_TANH, CMF_ACT_TANH, CMF_ACT_IDENTITY}) {
        CAPTURE(act);
        std::vector<float> out(v.size());
        ok(be.vt().activation(be.ctx(), v.data(), v.size(), act, out.data()));
        std::vector<double> want(v.size());
        for (size_t i = 0; i < v.size(); ++i) {
            const double t = v[i];
            want[i] = act == CMF_ACT_SILU        ? t / (1 + std::exp(-t))
                      : act == CMF_ACT_GELU_TANH ? 0.5 * t * (1 + std::tanh(0.7978845608028654 * (t + 0.044715 * t * t * t)))
                      : act == CMF_ACT_TANH      ? std::tanh(t)
                                                 : t;
        }
        CHECK(rel_err(out, want) < 1e-6);
        // In place too.
        std::vector<float> in_place = v;
        ok(be.vt().activation(be.ctx(), in_place.data(), in_place.size(), act, in_place.data()));
        CHECK(in_place == out);
    }
    CHECK(error_text(be.vt().activation(be.ctx(), v.data(), v.size(), 99, v.data())).find("unknown activation") !=
          std::string::npos);
}

TEST_CASE("cpu backend image ops: layer_norm with and without affine") {
    Be be;
    const uint64_t rows = 19, dim = 96;
    auto x = random_vec(rows * dim, 7), w = random_vec(dim, 8), b = random_vec(dim, 9);
    for (uint64_t i = 0; i < rows * dim; ++i) x[i] = x[i] * 3 + 5;  // a mean far from 0
    cmf_backend_weight *wb = be.bind(w, {dim}), *bb = be.bind(b, {dim});
    for (bool affine : {false, true}) {
        CAPTURE(affine);
        std::vector<float> y(rows * dim);
        ok(be.vt().layer_norm(be.ctx(), x.data(), affine ? wb : nullptr, affine ? bb : nullptr, rows, dim, 1e-6f, y.data()));
        std::vector<double> want(rows * dim);
        for (uint64_t r = 0; r < rows; ++r) {
            double m = 0, v = 0;
            for (uint64_t j = 0; j < dim; ++j) m += x[r * dim + j];
            m /= dim;
            for (uint64_t j = 0; j < dim; ++j) v += (x[r * dim + j] - m) * (x[r * dim + j] - m);
            v /= dim;
            for (uint64_t j = 0; j < dim; ++j) {
                double o = (x[r * dim + j] - m) / std::sqrt(v + 1e-6);
                want[r * dim + j] = affine ? o * w[j] + b[j] : o;
            }
        }
        CHECK(rel_err(y, want) < 1e-5);
    }
}

TEST_CASE("cpu backend image ops: rope_table rotates interleaved and half-split pairs") {
    Be be;
    const uint64_t n = 11, nh = 3, hd = 12, ld = nh * hd + 5;  // rows longer than the heads
    auto x = random_vec(n * ld, 10), ang = random_vec(n * hd / 2, 11);
    std::vector<float> cs(n * hd);
    for (uint64_t i = 0; i < n * hd / 2; ++i) cs[2 * i] = std::cos(ang[i]), cs[2 * i + 1] = std::sin(ang[i]);
    for (int32_t layout : {CMF_ROPE_INTERLEAVED, CMF_ROPE_HALF}) {
        CAPTURE(layout);
        std::vector<float> y = x;
        ok(be.vt().rope_table(be.ctx(), y.data(), n, ld, nh, hd, cs.data(), layout));
        std::vector<double> want(x.begin(), x.end());
        for (uint64_t t = 0; t < n; ++t)
            for (uint64_t h = 0; h < nh; ++h)
                for (uint64_t m = 0; m < hd / 2; ++m) {
                    const uint64_t i0 = t * ld + h * hd + (layout == CMF_ROPE_INTERLEAVED ? 2 * m : m);
                    const uint64_t i1 = i0 + (layout == CMF_ROPE_INTERLEAVED ? 1 : hd / 2);
                    const double c = std::cos(double(ang[t * hd / 2 + m])), s = std::sin(double(ang[t * hd / 2 + m]));
                    want[i0] = x[i0] * c - x[i1] * s;
                    want[i1] = x[i1] * c + x[i0] * s;
                }
        CHECK(rel_err(y, want) < 1e-6);
    }
}

TEST_CASE("cpu backend image ops: attention_full against a double reference (GQA, key bias, masked rows)") {
    Be be;
    for (auto [nq, nkv, nh, nkvh, hd] : {std::array<uint64_t, 5>{37, 53, 4, 2, 24}, {1, 5, 2, 2, 8},
                                        {70, 40, 3, 1, 16}, {25, 300, 1, 1, 100}}) {
        CAPTURE(nq);
        CAPTURE(nkv);
        auto q = random_vec(nq * nh * hd, 12), k = random_vec(nkv * nkvh * hd, 13), v = random_vec(nkv * nkvh * hd, 14);
        const float scale = float(1.0 / std::sqrt(double(hd)));
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            std::vector<float> bias = random_vec(nkv, 15);
            for (uint64_t j = 0; j < nkv; j += 3) bias[j] = -INFINITY;
            std::vector<float> out(nq * nh * hd);
            ok(be.vt().attention_full(be.ctx(), q.data(), k.data(), v.data(), out.data(), nq, nkv, uint32_t(nh),
                                      uint32_t(nkvh), uint32_t(hd), scale, with_bias ? bias.data() : nullptr));
            std::vector<double> want(out.size(), 0.0);
            for (uint64_t t = 0; t < nq; ++t)
                for (uint64_t h = 0; h < nh; ++h) {
                    const uint64_t kh = h / (nh / nkvh);
                    std::vector<double> s(nkv);
                    double mx = -INFINITY;
                    for (uint64_t j = 0; j < nkv; ++j) {
                        double d = 0;
                        for (uint64_t i = 0; i < hd; ++i) d += double(q[(t * nh + h) * hd + i]) * k[(j * nkvh + kh) * hd + i];
                        s[j] = d * scale + (with_bias ? bias[j] : 0.0);
                        mx = std::max(mx, s[j]);
                    }
                    double z = 0;
                    for (auto &e : s) z += (e = std::exp(e - mx));
                    for (uint64_t j = 0; j < nkv; ++j)
                        for (uint64_t i = 0; i < hd; ++i) want[(t * nh + h) * hd + i] += s[j] / z * v[(j * nkvh + kh) * hd + i];
                }
            CHECK(rel_err(out, want) < 1e-5);
        }
    }
    // Every key masked: zeros, not NaN.
    auto q = random_vec(8 * 16, 16), k = random_vec(3 * 16, 17), v = random_vec(3 * 16, 18);
    std::vector<float> bias(3, -INFINITY), out(8 * 16, 7.0f);
    ok(be.vt().attention_full(be.ctx(), q.data(), k.data(), v.data(), out.data(), 8, 3, 1, 1, 16, 0.25f, bias.data()));
    for (float f : out) CHECK(f == 0.0f);
    CHECK(error_text(be.vt().attention_full(be.ctx(), q.data(), k.data(), v.data(), out.data(), 8, 3, 3, 2, 16, 0.25f,
                                            nullptr))
              .find("multiple of n_kv_heads") != std::string::npos);
}

namespace {

// Direct convolution in double: x [H*W][cin], w [cout][cin][kh][kw].
std::vector<double> conv_ref(const std::vector<float> &x, uint64_t H, uint64_t W, uint64_t cin, const std::vector<float> &w,
                             uint64_t cout, uint64_t kh, uint64_t kw, uint64_t pad, const std::vector<float> *bias) {
    const uint64_t ho = H + 2 * pad - kh + 1, wo = W + 2 * pad - kw + 1;
    std::vector<double> y(ho * wo * cout, 0.0);
    for (uint64_t oy = 0; oy < ho; ++oy)
        for (uint64_t ox = 0; ox < wo; ++ox)
            for (uint64_t o = 0; o < cout; ++o) {
                double s = bias ? (*bias)[o] : 0.0;
                for (uint64_t c = 0; c < cin; ++c)
                    for (uint64_t ky = 0; ky < kh; ++ky)
                        for (uint64_t kx = 0; kx < kw; ++kx) {
                            const int64_t iy = int64_t(oy + ky) - int64_t(pad), ix = int64_t(ox + kx) - int64_t(pad);
                            if (iy < 0 || ix < 0 || iy >= int64_t(H) || ix >= int64_t(W)) continue;
                            s += double(x[(uint64_t(iy) * W + uint64_t(ix)) * cin + c]) *
                                 w[((o * cin + c) * kh + ky) * kw + kx];
                        }
                y[(oy * wo + ox) * cout + o] = s;
            }
    return y;
}

std::vector<uint16_t> to_f16(const std::vector<float> &v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const _Float16 h = static_cast<_Float16>(v[i]);
        std::memcpy(&out[i], &h, 2);
    }
    return out;
}

}  // namespace

TEST_CASE("cpu backend image ops: conv2d as im2col + GEMM matches a direct convolution") {
    Be be;
    struct Case {
        uint64_t H, W, cin, cout, k, pad;
    };
    // 3x3 pad 1 (the VAE's), 1x1, a kernel without padding, a non-square
    // image, and 512 input channels over 1024 positions: two chunks.
    for (Case c : {Case{9, 7, 5, 6, 3, 1}, Case{6, 5, 8, 3, 1, 0}, Case{8, 8, 4, 5, 3, 0}, Case{5, 13, 3, 17, 3, 1},
                   Case{32, 32, 512, 16, 3, 1}}) {
        CAPTURE(c.H);
        CAPTURE(c.cin);
        CAPTURE(c.k);
        auto x = random_vec(c.H * c.W * c.cin, 20), w = random_vec(c.cout * c.cin * c.k * c.k, 21),
             bias = random_vec(c.cout, 22);
        for (auto &f : w) f *= 0.1f;
        const uint64_t ho = c.H + 2 * c.pad - c.k + 1, wo = c.W + 2 * c.pad - c.k + 1;
        cmf_backend_weight *bb = be.bind(bias, {c.cout});
        // f32, and the f16 a packed VAE stores its kernels in.
        const std::vector<uint16_t> w16 = to_f16(w);
        std::vector<float> w16_as_f32(w.size());
        for (size_t i = 0; i < w.size(); ++i) {
            _Float16 h;
            std::memcpy(&h, &w16[i], 2);
            w16_as_f32[i] = float(h);
        }
        for (int32_t dtype : {CMF_DTYPE_F32, CMF_DTYPE_F16}) {
            CAPTURE(dtype);
            cmf_backend_weight *wb =
                dtype == CMF_DTYPE_F32
                    ? be.bind(w, {c.cout, c.cin * c.k * c.k})
                    : be.bind(w, {c.cout, c.cin * c.k * c.k}, CMF_DTYPE_F16, w16.data(), w16.size() * 2);
            for (int with_bias = 0; with_bias < 2; ++with_bias) {
                std::vector<float> y(ho * wo * c.cout);
                ok(be.vt().conv2d(be.ctx(), wb, with_bias ? bb : nullptr, x.data(), c.H, c.W, c.cin, uint32_t(c.k),
                                  uint32_t(c.k), uint32_t(c.pad), y.data()));
                const auto want = conv_ref(x, c.H, c.W, c.cin, dtype == CMF_DTYPE_F32 ? w : w16_as_f32, c.cout, c.k, c.k,
                                           c.pad, with_bias ? &bias : nullptr);
                CHECK(rel_err(y, want) < 1e-5);
            }
        }
    }
    auto w = random_vec(4 * 9 * 2, 23), x = random_vec(16 * 2, 24);
    Be be2;
    cmf_backend_weight *wb = be2.bind(w, {4, 18});
    std::vector<float> y(16 * 4);
    CHECK(error_text(be2.vt().conv2d(be2.ctx(), wb, nullptr, x.data(), 4, 4, 3, 3, 3, 1, y.data()))
              .find("expected c_in * kh * kw = 27") != std::string::npos);
}

TEST_CASE("cpu backend image ops: group_norm over HWC images") {
    Be be;
    for (auto [npos, ch, groups] : {std::array<uint64_t, 3>{97, 32, 4}, {5, 6, 3}, {300, 64, 32}}) {
        CAPTURE(npos);
        CAPTURE(ch);
        auto x = random_vec(npos * ch, 25), w = random_vec(ch, 26), b = random_vec(ch, 27);
        for (uint64_t i = 0; i < x.size(); ++i) x[i] = x[i] * 2 + float(i % ch) * 0.5f;  // group means differ
        cmf_backend_weight *wb = be.bind(w, {ch}), *bb = be.bind(b, {ch});
        for (bool affine : {false, true}) {
            std::vector<float> y(x.size());
            ok(be.vt().group_norm(be.ctx(), x.data(), affine ? wb : nullptr, affine ? bb : nullptr, npos, ch,
                                  uint32_t(groups), 1e-6f, y.data()));
            std::vector<double> want(x.size());
            const uint64_t cg = ch / groups;
            for (uint64_t g = 0; g < groups; ++g) {
                double m = 0, v = 0;
                for (uint64_t p = 0; p < npos; ++p)
                    for (uint64_t c = g * cg; c < (g + 1) * cg; ++c) m += x[p * ch + c];
                m /= double(npos * cg);
                for (uint64_t p = 0; p < npos; ++p)
                    for (uint64_t c = g * cg; c < (g + 1) * cg; ++c) v += (x[p * ch + c] - m) * (x[p * ch + c] - m);
                v /= double(npos * cg);
                for (uint64_t p = 0; p < npos; ++p)
                    for (uint64_t c = g * cg; c < (g + 1) * cg; ++c) {
                        const double o = (x[p * ch + c] - m) / std::sqrt(v + 1e-6);
                        want[p * ch + c] = affine ? o * w[c] + b[c] : o;
                    }
            }
            CHECK(rel_err(y, want) < 1e-5);
        }
    }
    std::vector<float> x(12);
    CHECK(error_text(be.vt().group_norm(be.ctx(), x.data(), nullptr, nullptr, 2, 6, 4, 1e-6f, x.data()))
              .find("do not split into 4 groups") != std::string::npos);
}

TEST_CASE("cpu backend image ops: upsample2x repeats each position 2x2") {
    Be be;
    const uint64_t H = 3, W = 5, C = 7;
    auto x = random_vec(H * W * C, 28);
    std::vector<float> y(4 * H * W * C);
    ok(be.vt().upsample2x(be.ctx(), x.data(), H, W, C, y.data()));
    for (uint64_t oy = 0; oy < 2 * H; ++oy)
        for (uint64_t ox = 0; ox < 2 * W; ++ox)
            for (uint64_t c = 0; c < C; ++c) CHECK(y[(oy * 2 * W + ox) * C + c] == x[((oy / 2) * W + ox / 2) * C + c]);
}
