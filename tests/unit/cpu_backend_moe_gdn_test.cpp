// The CPU backend's mixture-of-experts and gated delta net operations
// through the plugin ABI, against plain references:
//  - matmul_grouped equals one matmul per group, bit for bit (small groups in
//    one row loop, large ones through the GEMMs; mixed dtypes and widths);
//  - gather_rows / scatter_rows / copy_rows move and sum rows exactly;
//  - causal_conv1d_silu against a double reference, token by token equal to
//    a whole call, and its two states (after every token, one token back);
//  - the gated delta rule: the recurrence against a double-precision
//    restatement, the chunked (WY) form against the recurrence, the op's
//    states, and the sigmoid gate of gated_act.
#include <doctest/doctest.h>
#include "support/encoded_weight.hpp"
#include "support/random_vec.hpp"
#include "support/test_runtime.hpp"

#include "common/byte_views.hpp"
#include "delta_net.hpp"
#include "plugin_host/runtime.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

const cmf::BackendEntry &cpu(TestRuntime &t) {
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    REQUIRE(be->vt.struct_size >= offsetof(cmf_backend_vt, gated_delta_net) + sizeof(void *));
    return *be;
}

cmf_backend_weight *bind_vec(const cmf::BackendEntry &be, const std::vector<float> &v) {
    cmf_tensor_view t = cmf::tensor_view(CMF_DTYPE_F32, std::vector<uint64_t>{v.size()}, v.data(), v.size() * 4);
    cmf_backend_weight *w = nullptr;
    REQUIRE(be.vt.weight_bind(be.ctx, &t, &w) == nullptr);
    return w;
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace

TEST_CASE("cpu backend: matmul_grouped equals one matmul per group, bit for bit") {
    TestRuntime t;
    const auto &be = cpu(t);
    // Experts of two widths and several dtypes; gate-like [w, 64] and
    // down-like [64, w] weights.
    struct Spec {
        int32_t dtype;
        uint64_t rows, cols;
    };
    const std::vector<Spec> specs = {{CMF_DTYPE_Q4_BLOCK, 48, 64}, {CMF_DTYPE_F16, 40, 64}, {CMF_DTYPE_Q8_ROW, 64, 48},
                                     {CMF_DTYPE_F32, 64, 40},      {CMF_DTYPE_Q8_ROW, 48, 64}, {CMF_DTYPE_BF16, 33, 64}};
    std::vector<Encoded> enc;
    std::vector<cmf_backend_weight *> ws;
    for (size_t i = 0; i < specs.size(); ++i) {
        void *cctx = nullptr;
        const cmf_codec_vt *codec = find_test_codec(t.rt, specs[i].dtype, &cctx);
        REQUIRE(codec != nullptr);
        const auto w = random_vec(specs[i].rows * specs[i].cols, 300 + unsigned(i));
        enc.push_back(encode(codec, cctx, specs[i].dtype, specs[i].rows, specs[i].cols, w.data()));
        cmf_backend_weight *b = nullptr;
        REQUIRE(be.vt.weight_bind(be.ctx, &enc.back().v, &b) == nullptr);
        ws.push_back(b);
    }
    // Row counts: decode (1-3, a shared x), empty groups, and GEMM-sized ones.
    for (const std::vector<uint64_t> &rows : {std::vector<uint64_t>{1, 1, 1, 1, 1, 1}, {2, 0, 3, 1, 0, 2},
                                              std::vector<uint64_t>{17, 1, 40, 0, 5, 20}}) {
        const bool shared_x = rows[0] == 1 && rows[1] == 1;
        std::vector<std::vector<float>> xs(ws.size()), want(ws.size()), got(ws.size());
        std::vector<const float *> xp;
        std::vector<float *> yp;
        const auto x64 = random_vec(64, 9);
        for (size_t g = 0; g < ws.size(); ++g) {
            xs[g] = shared_x && specs[g].cols == 64 ? x64 : random_vec(rows[g] * specs[g].cols, 50 + unsigned(g));
            want[g].assign(rows[g] * specs[g].rows, -1.0f);
            if (rows[g]) REQUIRE(be.vt.matmul(be.ctx, ws[g], xs[g].data(), rows[g], want[g].data()) == nullptr);
            got[g].assign(rows[g] * specs[g].rows, -2.0f);
            xp.push_back(xs[g].data());
            yp.push_back(got[g].data());
        }
        REQUIRE(be.vt.matmul_grouped(be.ctx, uint32_t(ws.size()), ws.data(), xp.data(), rows.data(), yp.data()) == nullptr);
        for (size_t g = 0; g < ws.size(); ++g) {
            CAPTURE(g);
            CHECK(same_bits(got[g], want[g]));
        }
    }
    for (auto *w : ws) be.vt.weight_free(be.ctx, w);
}

TEST_CASE("cpu backend: gather_rows, scatter_rows and copy_rows") {
    TestRuntime t;
    const auto &be = cpu(t);
    const uint64_t dim = 37;
    const auto src = random_vec(10 * dim, 1);
    const std::vector<int32_t> rows = {3, 0, 9, 3, 7};
    std::vector<float> g(rows.size() * dim);
    REQUIRE(be.vt.gather_rows(be.ctx, src.data(), dim, rows.data(), rows.size(), g.data()) == nullptr);
    for (size_t i = 0; i < rows.size(); ++i)
        CHECK(std::memcmp(&g[i * dim], &src[size_t(rows[i]) * dim], dim * 4) == 0);
    // scatter: out[r] = sum of weights[i] * x[i] over rows[i] == r, in i order.
    const std::vector<int32_t> to = {2, 0, 2, 2, 1, 0};
    const auto x = random_vec(to.size() * dim, 2), wt = random_vec(to.size(), 3);
    std::vector<float> out(4 * dim, 5.0f), want(4 * dim, 0.0f);
    REQUIRE(be.vt.scatter_rows(be.ctx, x.data(), to.size(), dim, to.data(), wt.data(), out.data(), 4) == nullptr);
    for (size_t i = 0; i < to.size(); ++i)
        for (uint64_t j = 0; j < dim; ++j) want[size_t(to[i]) * dim + j] += wt[i] * x[i * dim + j];
    CHECK(same_bits(out, want));  // row 3: no source, zeros
    std::vector<int32_t> bad = {4};
    cmf_error *e = be.vt.scatter_rows(be.ctx, x.data(), 1, dim, bad.data(), wt.data(), out.data(), 4);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_BOUNDS);
    cmf_error_free(e);
    // copy_rows: every other row of 2*dim, the second half.
    std::vector<float> dst(3 * dim);
    REQUIRE(be.vt.copy_rows(be.ctx, dst.data(), dim, src.data() + dim, 2 * dim, 3, dim) == nullptr);
    for (int r = 0; r < 3; ++r) CHECK(std::memcmp(&dst[r * dim], &src[(2 * r + 1) * dim], dim * 4) == 0);
}

TEST_CASE("cpu backend: causal_conv1d_silu, whole calls and token by token, and its two states") {
    TestRuntime t;
    const auto &be = cpu(t);
    const uint64_t C = 300, n = 9;  // channels past one 256-channel block
    const uint32_t K = 4;
    const auto w = random_vec(C * K, 11), x = random_vec(n * C, 12), init = random_vec((K - 1) * C, 13);
    cmf_backend_weight *wb = bind_vec(be, w);
    // Whole call.
    std::vector<float> st = init, st_out((K - 1) * C), out(n * C);
    REQUIRE(be.vt.causal_conv1d_silu(be.ctx, x.data(), n, C, wb, K, st.data(), st_out.data(), out.data()) == nullptr);
    for (uint64_t tk = 0; tk < n; ++tk)
        for (uint64_t c = 0; c < C; ++c) {
            double acc = 0;
            for (uint32_t j = 0; j < K; ++j) {
                const int64_t s = int64_t(tk) + j - (K - 1);  // input stream index
                const double u = s < 0 ? init[size_t(int64_t(K - 1) + s) * C + c] : x[size_t(s) * C + c];
                acc += w[c * K + j] * u;
            }
            CHECK(out[tk * C + c] == doctest::Approx(silu(acc)).epsilon(1e-5));
        }
    // state_out = the last K-1 inputs; state = the K-1 before the last token.
    for (uint32_t r = 0; r < K - 1; ++r) {
        CHECK(std::memcmp(&st_out[r * C], &x[(n - (K - 1) + r) * C], C * 4) == 0);
        CHECK(std::memcmp(&st[r * C], &x[(n - K + r) * C], C * 4) == 0);
    }
    // Token by token through the states: the same outputs, bit for bit.
    std::vector<float> a = init, b((K - 1) * C), one(C), step_out(n * C);
    for (uint64_t tk = 0; tk < n; ++tk) {
        REQUIRE(be.vt.causal_conv1d_silu(be.ctx, x.data() + tk * C, 1, C, wb, K, a.data(), b.data(), one.data()) == nullptr);
        std::copy(one.begin(), one.end(), step_out.begin() + std::ptrdiff_t(tk * C));
        std::swap(a, b);
    }
    CHECK(same_bits(step_out, out));
    CHECK(same_bits(a, st_out));
    // Two tokens from the start: state holds the initial state shifted by one.
    std::vector<float> s2 = init, s2o((K - 1) * C), o2(2 * C);
    REQUIRE(be.vt.causal_conv1d_silu(be.ctx, x.data(), 2, C, wb, K, s2.data(), s2o.data(), o2.data()) == nullptr);
    CHECK(std::memcmp(s2.data(), init.data() + C, (K - 2) * C * 4) == 0);
    CHECK(std::memcmp(s2.data() + (K - 2) * C, x.data(), C * 4) == 0);
    be.vt.weight_free(be.ctx, wb);
}

namespace {

// The gated delta rule in double precision, straight from its definition.
struct DeltaRef {
    uint32_t nk, nv, dk, dv;
    std::vector<double> S;  // [nv][dk][dv]
    void run(const std::vector<float> &qkv, uint64_t n, const std::vector<float> &a, const std::vector<float> &b,
             const std::vector<float> &alog, const std::vector<float> &dtb, std::vector<double> &out) {
        const uint64_t ld = 2ull * nk * dk + uint64_t(nv) * dv, rep = nv / nk;
        out.assign(n * nv * dv, 0.0);
        for (uint64_t t = 0; t < n; ++t)
            for (uint32_t h = 0; h < nv; ++h) {
                const uint32_t g = uint32_t(h / rep);
                const float *row = qkv.data() + t * ld;
                std::vector<double> q(dk), k(dk);
                double sq = 0, sk = 0;
                for (uint32_t i = 0; i < dk; ++i) {
                    sq += double(row[g * dk + i]) * row[g * dk + i];
                    sk += double(row[nk * dk + g * dk + i]) * row[nk * dk + g * dk + i];
                }
                for (uint32_t i = 0; i < dk; ++i) {
                    q[i] = row[g * dk + i] / std::sqrt(sq + 1e-6) / std::sqrt(double(dk));
                    k[i] = row[nk * dk + g * dk + i] / std::sqrt(sk + 1e-6);
                }
                const double beta = 1 / (1 + std::exp(-double(b[t * nv + h])));
                const double x = a[t * nv + h] + double(dtb[h]);
                const double decay = std::exp(-std::exp(double(alog[h])) * (x > 20 ? x : std::log1p(std::exp(x))));
                double *s = S.data() + uint64_t(h) * dk * dv;
                const float *v = row + 2 * nk * dk + uint64_t(h) * dv;
                for (uint64_t i = 0; i < uint64_t(dk) * dv; ++i) s[i] *= decay;
                std::vector<double> r(dv, 0.0);
                for (uint32_t i = 0; i < dk; ++i)
                    for (uint32_t j = 0; j < dv; ++j) r[j] += s[i * dv + j] * k[i];
                for (uint32_t i = 0; i < dk; ++i)
                    for (uint32_t j = 0; j < dv; ++j) s[i * dv + j] += k[i] * beta * (v[j] - r[j]);
                for (uint32_t i = 0; i < dk; ++i)
                    for (uint32_t j = 0; j < dv; ++j) out[(t * nv + h) * dv + j] += s[i * dv + j] * q[i];
            }
    }
};

double max_rel(const std::vector<float> &got, const std::vector<double> &want) {
    double d = 0, m = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        d = std::max(d, std::fabs(got[i] - want[i]));
        m = std::max(m, std::fabs(want[i]));
    }
    return d / std::max(m, 1e-30);
}

}  // namespace

TEST_CASE("cpu backend: gated_delta_net, the recurrence and the chunked form against a double reference") {
    TestRuntime t;
    const auto &be = cpu(t);
    const uint32_t nk = 2, nv = 6, dk = 16, dv = 8;  // 3 value heads per key head, dv != dk
    const uint64_t n = 150;                         // three chunks of 64, the last partial
    const uint64_t ld = 2ull * nk * dk + uint64_t(nv) * dv;
    const auto qkv = random_vec(n * ld, 21), a = random_vec(n * nv, 22), b = random_vec(n * nv, 23);
    std::vector<float> alog(nv), dtb = random_vec(nv, 24);
    for (uint32_t h = 0; h < nv; ++h) alog[h] = std::log(0.05f + 0.15f * float(h));  // slow and fast decays
    cmf_backend_weight *wa = bind_vec(be, alog), *wd = bind_vec(be, dtb);
    const auto init = random_vec(uint64_t(nv) * dk * dv, 25);

    DeltaRef ref{nk, nv, dk, dv, std::vector<double>(init.begin(), init.end())};
    std::vector<double> want;
    ref.run(qkv, n, a, b, alog, dtb, want);

    // The op over all n tokens (chunked for the first n-1, the last by the recurrence).
    std::vector<float> S = init, S_out(init.size()), out(n * nv * dv);
    REQUIRE(be.vt.gated_delta_net(be.ctx, qkv.data(), n, nk, nv, dk, dv, a.data(), b.data(), wa, wd, S.data(),
                                  S_out.data(), out.data()) == nullptr);
    const double e_op = max_rel(out, want);
    MESSAGE("gated_delta_net (chunked) vs double reference: " << e_op);
    CHECK(e_op < 1e-5);
    CHECK(max_rel(S_out, ref.S) < 1e-5);

    // The kernels directly: chunked against recurrent on the same inputs.
    namespace gdn = cmf::cpu::gdn;
    const gdn::Dims d{nk, nv, dk, dv};
    std::vector<float> q(n * nk * dk), k(n * nk * dk), beta(n * nv), g(n * nv);
    gdn::prepare(d, qkv.data(), 0, n, a.data(), b.data(), alog.data(), dtb.data(), q.data(), k.data(), beta.data(), g.data());
    std::vector<float> o_rec(n * nv * dv), o_chk(n * nv * dv);
    double worst = 0;
    for (uint32_t h = 0; h < nv; ++h) {
        std::vector<float> s1(init.begin() + std::ptrdiff_t(h) * dk * dv, init.begin() + std::ptrdiff_t(h + 1) * dk * dv),
            s2 = s1;
        gdn::recurrent(d, h, gdn::Head{q.data(), k.data(), qkv.data(), beta.data(), g.data(), o_rec.data(), uint64_t(nv) * dv}, n,
                       s1.data());
        for (uint64_t chunk : {64u, 16u, 7u}) {
            s2.assign(init.begin() + std::ptrdiff_t(h) * dk * dv, init.begin() + std::ptrdiff_t(h + 1) * dk * dv);
            gdn::chunked(d, h, gdn::Head{q.data(), k.data(), qkv.data(), beta.data(), g.data(), o_chk.data(), uint64_t(nv) * dv},
                         n, s2.data(), chunk);
            worst = std::max(worst, max_rel(s2, std::vector<double>(s1.begin(), s1.end())));
        }
    }
    worst = std::max(worst, max_rel(o_chk, std::vector<double>(o_rec.begin(), o_rec.end())));
    MESSAGE("chunked vs recurrent (chunks of 64, 16, 7): " << worst);
    CHECK(worst < 1e-5);
    CHECK(max_rel(o_rec, want) < 1e-5);

    // States: `state` is one token back. Two calls, n-1 then 1 token, give
    // the op's state_out and, after the first, its `state`.
    std::vector<float> P = init, P_out(init.size()), o1(n * nv * dv);
    REQUIRE(be.vt.gated_delta_net(be.ctx, qkv.data(), n - 1, nk, nv, dk, dv, a.data(), b.data(), wa, wd, P.data(),
                                  P_out.data(), o1.data()) == nullptr);
    CHECK(max_rel(S, std::vector<double>(P_out.begin(), P_out.end())) < 1e-5);
    // One token: `state` unchanged, the step bit-identical however it runs.
    std::vector<float> u = P_out, u_out(init.size()), o_last(nv * dv);
    REQUIRE(be.vt.gated_delta_net(be.ctx, qkv.data() + (n - 1) * ld, 1, nk, nv, dk, dv, a.data() + (n - 1) * nv,
                                  b.data() + (n - 1) * nv, wa, wd, u.data(), u_out.data(), o_last.data()) == nullptr);
    CHECK(same_bits(u, P_out));
    CHECK(max_rel(u_out, ref.S) < 1e-5);
    be.vt.weight_free(be.ctx, wa);
    be.vt.weight_free(be.ctx, wd);
}

TEST_CASE("cpu backend: gated_act with CMF_ACT_SIGMOID is the output gate u * sigmoid(g)") {
    TestRuntime t;
    const auto &be = cpu(t);
    const auto g = random_vec(100, 31), u = random_vec(100, 32);
    std::vector<float> out(100);
    REQUIRE(be.vt.gated_act(be.ctx, g.data(), u.data(), 100, CMF_ACT_SIGMOID, out.data()) == nullptr);
    for (int i = 0; i < 100; ++i) CHECK(out[i] == doctest::Approx(u[i] / (1 + std::exp(-double(g[i])))).epsilon(1e-6));
}
