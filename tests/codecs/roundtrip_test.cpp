// Round-trip error bounds on Gaussian data with outliers, malformed-payload
// fuzz of every validator/decoder, the matmul kernels against the reference
// decode, reserved ids, shape errors, and row-chunked encoding.
#include "codec_test_util.hpp"

#include "half.hpp"

#include "dtypes/common.hpp"
#include "kernels/kernels.hpp"
#include "kernels/portable.hpp"
#include "container/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include <sys/mman.h>
#include <unistd.h>

namespace {

using namespace codec_test;

std::vector<float> gaussian(uint64_t n, uint32_t seed, float outlier_rate = 0.002f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 0.02f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto &x : v) x = u(rng) < outlier_rate ? g(rng) * 20.0f : g(rng);
    return v;
}

double rel_rms(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(a[i]) * a[i];
    }
    return std::sqrt(num / den);
}

constexpr int32_t kLive[] = {CMF_DTYPE_F32,   CMF_DTYPE_F16,      CMF_DTYPE_BF16, CMF_DTYPE_Q8_ROW,
                             CMF_DTYPE_Q4_BLOCK, CMF_DTYPE_VBIT,  CMF_DTYPE_Q8_2F, CMF_DTYPE_VBIT_RO,
                             CMF_DTYPE_Q4_TILED, CMF_DTYPE_Q1,    CMF_DTYPE_Q1S,  CMF_DTYPE_Q1T,
                             CMF_DTYPE_Q4TP,  CMF_DTYPE_Q2TP};

}  // namespace

TEST_CASE("roundtrip: relative RMS error per dtype on Gaussian data with outliers") {
    const std::vector<uint64_t> shape{48, 256};
    std::vector<float> w = gaussian(48 * 256, 7);
    // Upper bounds with some headroom over what the encoders reach on this data.
    struct Bound {
        int32_t id;
        double max_rel;
    };
    const Bound bounds[] = {{CMF_DTYPE_F32, 0.0},       {CMF_DTYPE_F16, 1e-3},     {CMF_DTYPE_BF16, 5e-3},
                            {CMF_DTYPE_Q8_ROW, 0.05},   {CMF_DTYPE_Q8_2F, 0.05},   {CMF_DTYPE_Q4_BLOCK, 0.15},
                            {CMF_DTYPE_Q4_TILED, 0.15}, {CMF_DTYPE_Q4TP, 0.16},    {CMF_DTYPE_VBIT, 0.15},
                            {CMF_DTYPE_VBIT_RO, 0.15},  {CMF_DTYPE_Q2TP, 0.75},     {CMF_DTYPE_Q1, 0.9},
                            {CMF_DTYPE_Q1S, 0.75},      {CMF_DTYPE_Q1T, 0.75}};
    for (const auto &b : bounds) {
        CAPTURE(b.id);
        std::vector<float> d = decode(b.id, shape, encode(b.id, shape, w.data()));
        double e = rel_rms(w, d);
        MESSAGE("dtype " << b.id << " rel rms " << e);
        CHECK(e <= b.max_rel);
    }
    // q4tp (4.66 bits/weight with its ladder) stays within a few percent of q4_tiled (4.5).
    double tiled = rel_rms(w, decode(CMF_DTYPE_Q4_TILED, shape, encode(CMF_DTYPE_Q4_TILED, shape, w.data())));
    double tp = rel_rms(w, decode(CMF_DTYPE_Q4TP, shape, encode(CMF_DTYPE_Q4TP, shape, w.data())));
    CHECK(tp >= tiled * 0.9);
    CHECK(tp <= tiled * 1.05);
}

TEST_CASE("roundtrip: sizes match expected_size for fixed-size dtypes") {
    for (int32_t id : kLive) {
        CAPTURE(id);
        std::vector<uint64_t> shape{3, 64};
        std::vector<float> w = gaussian(3 * 64, static_cast<uint32_t>(id));
        std::vector<uint8_t> p = encode(id, shape, w.data());
        uint64_t want = dtype(id).expected_size(shape);
        if (want != CMF_SIZE_VARIABLE) CHECK(p.size() == want);
        CHECK_NOTHROW(dtype(id).validate(view(id, shape, p)));
    }
}

TEST_CASE("roundtrip: illegal shapes give clear errors") {
    const std::vector<uint64_t> odd{4, 40}, one_d{64};
    for (int32_t id : {CMF_DTYPE_Q4TP, CMF_DTYPE_Q2TP, CMF_DTYPE_VBIT, CMF_DTYPE_VBIT_RO}) {
        CHECK_THROWS_WITH(dtype(id).expected_size(odd), doctest::Contains("multiple of 32"));
        CHECK_THROWS_WITH(dtype(id).expected_size(one_d), doctest::Contains("2-D"));
    }
    for (int32_t id : {CMF_DTYPE_Q8_ROW, CMF_DTYPE_Q8_2F}) CHECK_THROWS_WITH(dtype(id).expected_size(one_d), doctest::Contains("2-D"));
    std::vector<float> w(160, 0.5f);
    CHECK_THROWS_WITH(encode(CMF_DTYPE_Q1, odd, w.data()), doctest::Contains("multiple of 32"));
    CHECK_THROWS_WITH(encode(CMF_DTYPE_Q8_ROW, {2, 32}, w.data(), "bogus=1"), doctest::Contains("no option 'bogus'"));
    CHECK_THROWS_WITH(encode(CMF_DTYPE_VBIT, {2, 32}, w.data(), "mean_bits=abc"), doctest::Contains("not a finite number"));
    // Option syntax (cmf/options.hpp): items without '=' or without a key are
    // refused by name, empty items are skipped, and the list names what a
    // dtype takes.
    CHECK_THROWS_WITH(encode(CMF_DTYPE_VBIT, {2, 32}, w.data(), "mean_bits"), doctest::Contains("option 'mean_bits' is not key=value"));
    CHECK_THROWS_WITH(encode(CMF_DTYPE_VBIT, {2, 32}, w.data(), ",=4"), doctest::Contains("option '=4' is not key=value"));
    CHECK_THROWS_WITH(encode(CMF_DTYPE_Q8_ROW, {2, 32}, w.data(), "a=1"), doctest::Contains("(it takes none)"));
    CHECK_THROWS_WITH(encode(CMF_DTYPE_VBIT, {2, 32}, w.data(), "keep=1"), doctest::Contains("(known: mean_bits)"));
    CHECK(encode(CMF_DTYPE_Q8_ROW, {2, 32}, w.data(), ",,") == encode(CMF_DTYPE_Q8_ROW, {2, 32}, w.data()));
    // q4_block and q8_row work on any row length, like the original.
    CHECK(encode(CMF_DTYPE_Q4_BLOCK, {7, 9}, w.data()).size() == 36);
}

TEST_CASE("roundtrip: reserved ids open with any size but refuse to decode") {
    for (int32_t id : {CMF_DTYPE_MIX8_4, CMF_DTYPE_U8, CMF_DTYPE_Q4_COL}) {
        const Dtype &d = dtype(id);
        CHECK((d.flags() & CMF_CODEC_RESERVED) != 0);
        CHECK(d.expected_size(std::vector<uint64_t>{5, 7}) == CMF_SIZE_VARIABLE);
        std::vector<uint8_t> bytes(13, 1);
        cmf_tensor_view t = view(id, {13}, bytes);
        CHECK_NOTHROW(d.validate(t));
        float out[13];
        try {
            d.dequantize_rows(t, 0, 1, out);
            FAIL("reserved dtype decoded");
        } catch (const cmf::sdk::Error &e) {
            CHECK(e.code() == CMF_ERR_UNSUPPORTED);
            CHECK(std::string(e.what()).find("reserved dtype") != std::string::npos);
        }
        CHECK_THROWS_WITH(encode(id, {32}, std::vector<float>(32).data()), doctest::Contains("reserved dtype"));
    }
}

TEST_CASE("roundtrip: required features") {
    for (int32_t id : kLive)
        CHECK(dtype(id).required_features() == ((id == CMF_DTYPE_Q8_2F || id == CMF_DTYPE_VBIT) ? CMF_FEATURE_QUANT_2F : 0u));
}

TEST_CASE("roundtrip: malformed payloads never crash and fail clearly") {
    std::mt19937 rng(12345);
    for (int32_t id : kLive) {
        CAPTURE(id);
        for (int iter = 0; iter < 60; ++iter) {
            uint64_t rows = 1 + rng() % 5, cols = 32 * (1 + rng() % 3);
            std::vector<uint64_t> shape{rows, cols};
            std::vector<float> w = gaussian(rows * cols, rng(), 0.05f);
            std::vector<uint8_t> p = encode(id, shape, w.data(), id == CMF_DTYPE_Q1T ? "keep=0.05" : "");
            // Mutations: truncate, extend, flip bytes.
            switch (iter % 3) {
            case 0: p.resize(rng() % (p.size() + 1)); break;
            case 1: p.resize(p.size() + 1 + rng() % 8, 0xff); break;
            default:
                for (int k = 0; k < 4; ++k) p[rng() % p.size()] = static_cast<uint8_t>(rng());
            }
            // Copy into an exactly sized heap buffer so ASan sees any overread.
            auto *buf = new uint8_t[p.size() + 1];
            std::copy(p.begin(), p.end(), buf);
            cmf_tensor_view t = view(id, shape, p);
            t.data = buf;
            std::vector<float> out(rows * cols);
            bool ok = true;
            try {
                dtype(id).validate(t);
                dtype(id).dequantize_rows(t, 0, rows, out.data());
            } catch (const cmf::sdk::Error &e) {
                ok = false;
                CHECK(std::string(e.what()).size() > 10);
                CHECK(e.code() != CMF_ERR_INTERNAL);
            }
            // Size changes of fixed-size dtypes must be rejected.
            uint64_t want = dtype(id).expected_size(shape);
            if (want != CMF_SIZE_VARIABLE && p.size() != want) CHECK_FALSE(ok);
            delete[] buf;
        }
    }
}

// A tensor of zero rows may declare any row length (its payload is empty
// whatever the length), and opening a file accepts it. Decoding its zero
// rows must do nothing: several codecs size per-row scratch by the row
// length before looking at the rows (q4tp: a 10-byte fuzz input of shape
// [0, 4160749568] spent half a gigabyte and seconds on nothing). With 2^44
// columns that scratch cannot be allocated at all, so such code fails here
// instead of being slow.
TEST_CASE("roundtrip: zero rows of any row length decode, matmul and int8 without work") {
    cmf::Runtime &rt = runtime();
    const uint64_t shape[2] = {0, uint64_t(1) << 44};
    const uint8_t byte = 0;
    float out = 0, x = 0, y = 0, scale = 0;
    int8_t code = 0;
    for (int32_t id : kLive) {
        CAPTURE(id);
        const cmf::CodecEntry *codec = rt.codec(id);
        REQUIRE(codec != nullptr);
        cmf_tensor_view v{};
        v.struct_size = sizeof v;
        v.dtype = id;
        v.ndim = 2;
        v.shape[0] = shape[0];
        v.shape[1] = shape[1];
        v.data = &byte;
        v.nbytes = 0;
        auto ok = [](cmf_error *e) {
            if (e) MESSAGE(std::string(cmf_error_message(e)));
            bool none = e == nullptr;
            cmf_error_free(e);
            return none;
        };
        CHECK(ok(codec->vt.dequantize_rows(codec->ctx, &v, 0, 0, &out)));
        if (codec->vt.matmul_rows) CHECK(ok(codec->vt.matmul_rows(codec->ctx, &v, &x, shape[1], 1, 0, 0, &y, 0)));
        if (codec->vt.matmul_rows_x) CHECK(ok(codec->vt.matmul_rows_x(codec->ctx, &v, &x, shape[1], 1, 0, 0, &y, 0, 1)));
        // int8_rows may refuse the tensor (no exact int8 view); when it
        // takes it, zero rows are no work either.
        if (codec->vt.int8_rows) {
            cmf_error *probe = codec->vt.int8_rows(codec->ctx, &v, 0, 0, nullptr, nullptr);
            if (probe == nullptr) CHECK(ok(codec->vt.int8_rows(codec->ctx, &v, 0, 0, &code, &scale)));
            cmf_error_free(probe);
        }
    }
}

namespace {

// The dtypes whose matmul_rows quantizes the activations to int8 blocks.
bool int8_path(int32_t id) {
    return id == CMF_DTYPE_Q8_ROW || id == CMF_DTYPE_Q8_2F || id == CMF_DTYPE_Q4_BLOCK || id == CMF_DTYPE_Q4_TILED ||
           id == CMF_DTYPE_Q4TP || id == CMF_DTYPE_Q2TP || id == CMF_DTYPE_Q1 || id == CMF_DTYPE_Q1S ||
           id == CMF_DTYPE_Q1T || id == CMF_DTYPE_VBIT_RO || id == CMF_DTYPE_VBIT;
}

// q8_2f quantizes col[c] * x[c] (its f16 column field folded in); the others x itself.
std::vector<float> col_field(int32_t id, uint64_t rows, uint64_t cols, const std::vector<uint8_t> &p) {
    std::vector<float> col(cols, 1.0f);
    if (id == CMF_DTYPE_Q8_2F)
        for (uint64_t c = 0; c < cols; ++c) {
            uint16_t h;
            std::memcpy(&h, p.data() + rows * cols + 2 * rows + 2 * c, 2);
            col[c] = cmf::codecs::f16_to_f32(h);
        }
    return col;
}

// x (times the column field) quantized as matmul_rows does, dequantized: q * d per element.
std::vector<double> quantized_x(const float *x, const std::vector<float> &col, std::vector<float> *scale = nullptr) {
    namespace k = cmf::codecs::kernels;
    uint64_t n = col.size();
    std::vector<float> xc(n), d(k::x_blocks(n));
    for (uint64_t c = 0; c < n; ++c) xc[c] = col[c] * x[c];
    std::vector<int8_t> q(32 * d.size());
    k::portable::quantize_x(xc.data(), n, k::XOrder::natural, q.data(), d.data());
    std::vector<double> out(n);
    for (uint64_t c = 0; c < n; ++c) out[c] = double(q[c]) * d[c / 32];
    if (scale) *scale = d;
    return out;
}

}  // namespace

TEST_CASE("roundtrip: matmul kernels match the reference decode") {
    // Float paths: reference decode + dot, to f32 rounding (1e-5 of sum |w*x|).
    // int8 paths: each activation moves by at most d_b/2 (d_b = amax of its
    // 32-block / 127, of col*x for q8_2f), so the result may differ by up to
    // sum_c |w_c / col_c| * d_b(c) / 2 on top of the rounding term.
    std::mt19937 rng(99);
    const int32_t ids[] = {CMF_DTYPE_F16,  CMF_DTYPE_BF16,     CMF_DTYPE_F32,  CMF_DTYPE_Q8_ROW, CMF_DTYPE_Q8_2F,
                           CMF_DTYPE_Q4_BLOCK, CMF_DTYPE_Q4_TILED, CMF_DTYPE_Q4TP, CMF_DTYPE_VBIT_RO, CMF_DTYPE_Q1,
                           CMF_DTYPE_Q1T,  CMF_DTYPE_Q2TP, CMF_DTYPE_Q1S};
    MESSAGE("kernels: " << std::string(cmf::codecs::kernels::active_isa()));
    for (int32_t id : ids) {
        for (int iter = 0; iter < 6; ++iter) {
            uint64_t rows = 1 + 2 * (rng() % 6), cols = 32 * (1 + rng() % 5), batch = 1 + rng() % 6;  // both the per-dot and the decode-once paths
            if (iter == 0) rows = 1, cols = 32, batch = 1;  // smallest legal size
            if (iter == 1 && (id == CMF_DTYPE_Q8_ROW || id == CMF_DTYPE_Q8_2F)) cols = 77;  // partial last x block
            CAPTURE(id);
            CAPTURE(rows);
            CAPTURE(cols);
            std::vector<uint64_t> shape{rows, cols};
            std::vector<float> w = gaussian(rows * cols, rng(), 0.01f);
            std::vector<uint8_t> p =
                encode(id, shape, w.data(), id == CMF_DTYPE_Q1T ? "keep=0.03" : id == CMF_DTYPE_Q1S ? "keep=0.05" : "");
            std::vector<float> ref = decode(id, shape, p);
            std::vector<float> x = gaussian(batch * (cols + 3), rng());
            const uint64_t ldx = cols + 3, ldy = rows + 1;
            std::vector<float> y(batch * ldy, -7.0f);
            REQUIRE(dtype(id).has_matmul());
            cmf_tensor_view t = view(id, shape, p);
            // Odd row split, as a caller parallelising over rows would do.
            uint64_t mid = rows / 2;
            dtype(id).matmul_rows(t, x.data(), ldx, batch, 0, mid, y.data(), ldy);
            dtype(id).matmul_rows(t, x.data(), ldx, batch, mid, rows, y.data(), ldy);
            std::vector<float> col = col_field(id, rows, cols, p);
            for (uint64_t b = 0; b < batch; ++b) {
                std::vector<float> d;
                quantized_x(x.data() + b * ldx, col, &d);
                for (uint64_t r = 0; r < rows; ++r) {
                    double want = 0, mag = 0, xq_bound = 0;
                    for (uint64_t c = 0; c < cols; ++c) {
                        want += double(ref[r * cols + c]) * x[b * ldx + c];
                        mag += std::fabs(double(ref[r * cols + c]) * x[b * ldx + c]);
                        xq_bound += std::fabs(double(ref[r * cols + c]) / col[c]) * 0.5 * d[c / 32];
                    }
                    if (!int8_path(id)) xq_bound = 0;
                    CHECK(std::fabs(y[b * ldy + r] - want) <= 1e-5 * mag + xq_bound * (1 + 1e-5) + 1e-30);
                }
                CHECK(y[b * ldy + rows] == -7.0f);  // padding untouched
            }
        }
    }
}

TEST_CASE("roundtrip: matmul_rows_x reuses x's quantization exactly when the x_id repeats") {
    // The contract (cmf_codec_vt.matmul_rows_x): one nonzero id, one x. Under
    // a repeated id the cached quantization is taken without looking at x,
    // which this test shows by breaking the promise; a new id or id 0
    // compares x in full, so a buffer refilled with new activations is seen.
    std::mt19937 rng(31);
    for (int32_t id : {CMF_DTYPE_Q8_ROW, CMF_DTYPE_Q4_BLOCK}) {
        CAPTURE(id);
        const uint64_t rows = 8, cols = 96;
        std::vector<uint64_t> shape{rows, cols};
        std::vector<float> w = gaussian(rows * cols, rng(), 0.01f);
        std::vector<uint8_t> p = encode(id, shape, w.data(), "");
        cmf_tensor_view t = view(id, shape, p);
        const std::vector<float> x1 = gaussian(cols, rng()), x2 = gaussian(cols, rng());
        auto run = [&](const std::vector<float> &x, uint64_t x_id) {
            std::vector<float> y(rows);
            cmf::codecs::XIdScope scope(x_id, x.data());
            dtype(id).matmul_rows(t, x.data(), cols, 1, 0, rows / 2, y.data(), rows);
            dtype(id).matmul_rows(t, x.data(), cols, 1, rows / 2, rows, y.data(), rows);
            return y;
        };
        const std::vector<float> y1 = run(x1, 0), y2 = run(x2, 0);
        REQUIRE(y1 != y2);
        std::vector<float> buf = x1;
        CHECK(run(buf, 1001) == y1);
        buf = x2;                      // same buffer, new contents...
        CHECK(run(buf, 1001) == y1);   // ...under the same id: the promise says x did not change
        CHECK(run(buf, 1002) == y2);   // a new id compares x
        buf = x1;
        CHECK(run(buf, 0) == y1);      // no id: compared in full
        CHECK(run(buf, 1002) == y1);   // the entry follows x, not the id it was made under
    }
    // One id over weights of several dtypes and one x (a fused matmul_multi):
    // q8_2f quantizes a copy of x with its column field folded in, which the
    // id does not speak for, so every result equals its own run without an id.
    const uint64_t rows = 8, cols = 96;
    std::vector<uint64_t> shape{rows, cols};
    const std::vector<float> x = gaussian(cols, rng());
    std::vector<std::vector<float>> alone, fused;
    for (uint64_t x_id : {uint64_t(0), uint64_t(2001)})
        for (int32_t id : {CMF_DTYPE_Q8_ROW, CMF_DTYPE_Q8_2F, CMF_DTYPE_Q8_ROW, CMF_DTYPE_Q4_BLOCK}) {
            const std::vector<float> w = gaussian(rows * cols, 40 + uint32_t(id), 0.01f);
            const std::vector<uint8_t> p = encode(id, shape, w.data(), "");
            const cmf_tensor_view t = view(id, shape, p);
            std::vector<float> y(rows);
            cmf::codecs::XIdScope scope(x_id, x.data());
            dtype(id).matmul_rows(t, x.data(), cols, 1, 0, rows, y.data(), rows);
            (x_id == 0 ? alone : fused).push_back(y);
        }
    CHECK(fused == alone);
}

TEST_CASE("roundtrip: int8 matmul paths equal the decode against quantized activations") {
    // Against the reference decode times x quantized the same way (in double),
    // the int8 kernels differ only by f32 summation: any error in the packing,
    // the block order or the scales is far above 1e-5 of sum |w*xq|
    // (the x quantization alone moves results by ~1e-3 relative).
    std::mt19937 rng(7);
    const int32_t ids[] = {CMF_DTYPE_Q8_ROW, CMF_DTYPE_Q8_2F, CMF_DTYPE_Q4_BLOCK, CMF_DTYPE_Q4_TILED,
                           CMF_DTYPE_Q4TP,   CMF_DTYPE_Q2TP,  CMF_DTYPE_Q1,       CMF_DTYPE_Q1S,
                           CMF_DTYPE_Q1T,    CMF_DTYPE_VBIT_RO};
    for (int32_t id : ids) {
        for (int iter = 0; iter < 4; ++iter) {
            uint64_t rows = 3 + rng() % 5, cols = 32 * (1 + rng() % 8), batch = 1 + rng() % 3;
            if (iter == 1 && (id == CMF_DTYPE_Q8_ROW || id == CMF_DTYPE_Q8_2F)) cols = 32 * 3 + 13;
            // Rows past two 16-row tiles of the batched row loop, ending in a
            // row outside the row kernels' groups of four.
            if (iter == 3) rows = 37, batch = 2;
            CAPTURE(id);
            CAPTURE(cols);
            std::vector<uint64_t> shape{rows, cols};
            std::vector<float> w = gaussian(rows * cols, rng(), 0.01f);
            // q1t with an overlay: its entries as corrections against the same x.
            std::vector<uint8_t> p = encode(id, shape, w.data(), id == CMF_DTYPE_Q1T ? "keep=0.05" : "");
            std::vector<float> ref = decode(id, shape, p);
            std::vector<float> x = gaussian(batch * cols, rng(), 0.01f);
            if (iter == 2) std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
            std::vector<float> y(batch * rows);
            dtype(id).matmul_rows(view(id, shape, p), x.data(), cols, batch, 0, rows, y.data(), rows);
            std::vector<float> col = col_field(id, rows, cols, p);
            double worst_xq_effect = 0;
            for (uint64_t b = 0; b < batch; ++b) {
                std::vector<double> xq = quantized_x(x.data() + b * cols, col);
                for (uint64_t r = 0; r < rows; ++r) {
                    double want = 0, mag = 0, f32_dot = 0;
                    for (uint64_t c = 0; c < cols; ++c) {
                        double wc = double(ref[r * cols + c]) / col[c];
                        want += wc * xq[c];
                        mag += std::fabs(wc * xq[c]);
                        f32_dot += double(ref[r * cols + c]) * x[b * cols + c];
                    }
                    CHECK(std::fabs(y[b * rows + r] - want) <= 1e-5 * mag + 1e-30);
                    worst_xq_effect = std::max(worst_xq_effect, std::fabs(want - f32_dot) / mag);
                }
            }
            // The check above can tell quantized from unquantized activations.
            CHECK(worst_xq_effect > 3e-5);
        }
    }
    // A non-finite activation makes its outputs NaN, as an f32 dot would.
    std::vector<uint64_t> shape{2, 64};
    std::vector<float> w = gaussian(128, 3, 0.0f), x = gaussian(64, 4, 0.0f);
    x[40] = std::numeric_limits<float>::infinity();
    for (int32_t id : ids) {
        std::vector<uint8_t> p = encode(id, shape, w.data());
        float y[2];
        dtype(id).matmul_rows(view(id, shape, p), x.data(), 64, 1, 0, 2, y, 2);
        CHECK(std::isnan(y[0]));
        CHECK(std::isnan(y[1]));
    }
}

TEST_CASE("roundtrip: SIMD and portable kernels agree") {
    // Every SIMD build this CPU runs (avx512vnni, avx2), not only the one
    // dispatch picks; the avx512vnni build with and without its VBMI and
    // BITALG forms (q1t, q1, q2tp rows) where the CPU has those.
    namespace k = cmf::codecs::kernels;
    const std::vector<k::SimdKernels> simd = k::simd_kernels();
    for (const k::SimdKernels &isa : simd)
    for (bool extensions : {true, false}) {
    k::set_avx512_extensions(extensions);
    CAPTURE(isa.isa);
    CAPTURE(extensions);
    std::mt19937 rng(5);
    std::vector<uint8_t> bytes(32 * 64 * 2);  // enough for every kernel at 64 groups
    for (auto &b : bytes) b = static_cast<uint8_t>(rng() % 243);
    for (size_t i = 0; i < bytes.size(); i += 2) bytes[i + 1] &= 0x3b;  // keep f16 scales finite-ish
    std::vector<float> x = gaussian(64 * 32 + 8, 3, 0.0f), s(64, 0.5f);
    for (int i = 0; i < 32; ++i) x[96 + i] = 0.0f;  // block 3 all zero
    x[200] = 1e-39f;                                  // a subnormal
    x[300] = 5.0f;                                    // an outlier
    auto near = [](float a, float b) { return std::fabs(a - b) <= 1e-4f * (std::fabs(a) + std::fabs(b)) + 1e-6f; };
    // Quantized activations: identical bytes and scales in every order, any length.
    for (uint64_t n : {1u, 31u, 32u, 77u, 2048u}) {
        for (k::XOrder order : {k::XOrder::natural, k::XOrder::q4_pairs, k::XOrder::q2_quads}) {
            CAPTURE(n);
            uint64_t nb = k::x_blocks(n);
            std::vector<int8_t> qa(32 * nb, 99), qp(32 * nb, 99);
            std::vector<float> da(nb), dp(nb);
            isa.quantize_x(x.data(), n, order, qa.data(), da.data());
            k::portable::quantize_x(x.data(), n, order, qp.data(), dp.data());
            CHECK(qa == qp);
            CHECK(std::memcmp(da.data(), dp.data(), nb * sizeof(float)) == 0);
        }
    }
    // The q8 offset terms, every int8 code.
    for (uint64_t nb : {1u, 2u, 5u, 64u}) {
        CAPTURE(nb);
        std::vector<int8_t> codes(32 * nb);
        for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<int8_t>(i % 3 == 0 ? -128 : i % 11 == 0 ? 127 : rng());
        std::vector<int32_t> oa(8 * nb + 1, 12345), op = oa;
        isa.i8_offset(codes.data(), nb, oa.data());
        k::portable::i8_offset(codes.data(), nb, op.data());
        CHECK(oa == op);
        CHECK(op[8 * nb] == 12345);
        CHECK(op[0] == -128 * (codes[0] + codes[1] + codes[2] + codes[3]));
    }
    // The q4 offset terms: every int8 code, odd block counts (the unpaired
    // last block has none), an untouched entry past the last pair.
    for (uint64_t nb : {1u, 2u, 3u, 7u, 64u}) {
        CAPTURE(nb);
        std::vector<int8_t> codes(32 * nb);
        for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<int8_t>(i % 5 == 0 ? -128 : i % 7 == 0 ? 127 : rng());
        std::vector<int32_t> oa(8 * (nb / 2) + 1, 12345), op = oa;
        isa.q4_pair_offset(codes.data(), nb, oa.data());
        k::portable::q4_pair_offset(codes.data(), nb, op.data());
        CHECK(oa == op);
    }
    std::vector<int8_t> xq(64 * 32);
    std::vector<float> xd(64);
    // q1 rows: 5 rows (a pass of four and one alone), groups short of,
    // past and at whole steps of 16; a row's bits do not depend on the
    // row the range starts at.
    for (uint64_t g : {1u, 3u, 21u, 64u}) {
        CAPTURE(g);
        k::portable::quantize_x(x.data(), 32 * g, k::XOrder::natural, xq.data(), xd.data());
        std::vector<int32_t> xo(8 * g);
        k::portable::i8_offset(xq.data(), g, xo.data());
        float ya[6], yp[6], y1 = 0;
        ya[5] = yp[5] = -7.0f;
        isa.rows_q1_xq(bytes.data(), xq.data(), xo.data(), xd.data(), g, 5, ya);
        k::portable::rows_q1_xq(bytes.data(), xq.data(), xo.data(), xd.data(), g, 5, yp);
        for (int r = 0; r < 5; ++r) CHECK(near(ya[r], yp[r]));
        CHECK(ya[5] == -7.0f);
        isa.rows_q1_xq(bytes.data() + 4 * 6 * g, xq.data(), xo.data(), xd.data(), g, 1, &y1);
        CHECK(bits(y1) == bits(ya[4]));
        isa.rows_q1_xq(bytes.data() + 6 * g, xq.data(), xo.data(), xd.data(), g, 4, ya);
        CHECK(bits(ya[3]) == bits(y1));
        // q1_passes (q1's decode copy): the bytes read as steps of pass
        // masks, whole steps only; x's passes and the rows against them.
        if (g % 16 == 0) {
            alignas(64) uint8_t xta[k::kQ1PassesXStepBytes * 4], xtp[k::kQ1PassesXStepBytes * 4];
            isa.q1_passes_x(xq.data(), g, xta);
            k::portable::q1_passes_x(xq.data(), g, xtp);
            CHECK(std::memcmp(xta, xtp, k::kQ1PassesXStepBytes * (g / 16)) == 0);
            float qa[6], qp[6], q1 = 0;
            qa[5] = qp[5] = -7.0f;
            isa.rows_q1_passes_xq(bytes.data(), xta, xd.data(), g, 5, qa);
            k::portable::rows_q1_passes_xq(bytes.data(), xtp, xd.data(), g, 5, qp);
            for (int r = 0; r < 5; ++r) CHECK(near(qa[r], qp[r]));
            CHECK((qa[5] == -7.0f && qp[5] == -7.0f));
            isa.rows_q1_passes_xq(bytes.data() + 4 * 6 * g, xta, xd.data(), g, 1, &q1);
            CHECK(bits(q1) == bits(qa[4]));
            // q1t_passes: the same bytes as steps of two-bit codes w+1 (a 3
            // reads as +2).
            isa.rows_q1t_passes_xq(bytes.data(), xta, xd.data(), g, 5, qa);
            k::portable::rows_q1t_passes_xq(bytes.data(), xtp, xd.data(), g, 5, qp);
            for (int r = 0; r < 5; ++r) CHECK(near(qa[r], qp[r]));
            CHECK((qa[5] == -7.0f && qp[5] == -7.0f));
            isa.rows_q1t_passes_xq(bytes.data() + 4 * 10 * g, xta, xd.data(), g, 1, &q1);
            CHECK(bits(q1) == bits(qa[4]));
            // q1s_passes's overlay sums of a slice: live slots and empty
            // ones (0xFFFF and any column >= cols), corrections of either
            // sign; the same bits on every ISA, and lane 0 by hand.
            {
                const uint64_t cols = 32 * g, n_steps = 3;
                std::vector<float> xf(cols);
                for (uint64_t c = 0; c < cols; ++c) xf[c] = xd[c / 32] * float(xq[c]);
                std::vector<uint8_t> st(96 * n_steps);
                for (uint64_t k2 = 0; k2 < n_steps; ++k2)
                    for (unsigned l = 0; l < 16; ++l) {
                        const uint32_t pick = uint32_t(rng() % 8);
                        const uint16_t col = pick == 0 ? uint16_t(0xFFFF) : pick == 1 ? uint16_t(cols + rng() % (0xFFFF - cols))
                                                                         : uint16_t(rng() % cols);
                        const float d = float(int(rng() % 2000) - 1000) * 0.00137f;
                        std::memcpy(st.data() + 96 * k2 + 2 * l, &col, 2);
                        std::memcpy(st.data() + 96 * k2 + 32 + 4 * l, &d, 4);
                    }
                alignas(64) float sa[16], sp[16];
                isa.q1s_slice_sums(st.data(), n_steps, cols, xf.data(), sa);
                k::portable::q1s_slice_sums(st.data(), n_steps, cols, xf.data(), sp);
                CHECK(std::memcmp(sa, sp, sizeof sa) == 0);
                float want = 0.0f;
                for (uint64_t k2 = 0; k2 < n_steps; ++k2) {
                    uint16_t col;
                    float d;
                    std::memcpy(&col, st.data() + 96 * k2, 2);
                    std::memcpy(&d, st.data() + 96 * k2 + 32, 4);
                    if (col >= cols) continue;
                    const float prod = d * xf[col];
                    want = want + prod;
                }
                CHECK(bits(sa[0]) == bits(want));
            }
            // Their int8 views: the same codes and scales on every ISA.
            std::vector<int8_t> ua(32 * g + 1, 99), up(32 * g + 1, 99);
            std::vector<float> va(g), vp(g);
            for (bool ternary : {false, true}) {
                CAPTURE(ternary);
                (ternary ? isa.unpack_q1t_passes : isa.unpack_q1_passes)(bytes.data(), g / 16, ua.data(), va.data());
                (ternary ? k::portable::unpack_q1t_passes : k::portable::unpack_q1_passes)(bytes.data(), g / 16, up.data(), vp.data());
                CHECK(ua == up);
                CHECK(std::memcmp(va.data(), vp.data(), g * sizeof(float)) == 0);
                CHECK(ua[32 * g] == 99);
            }
        }
        // q1's int8 view: the same bytes and scales on every ISA, +-1 by the bits.
        std::vector<int8_t> ca(32 * g + 1, 99), cp(32 * g + 1, 99);
        std::vector<float> sa(g), sp(g);
        isa.unpack_q1_groups(bytes.data(), g, ca.data(), sa.data());
        k::portable::unpack_q1_groups(bytes.data(), g, cp.data(), sp.data());
        CHECK(ca == cp);
        CHECK(std::memcmp(sa.data(), sp.data(), g * sizeof(float)) == 0);
        CHECK(ca[32 * g] == 99);
        for (uint64_t i = 0; i < 32 * g; ++i) CHECK(int(ca[i]) == (((bytes[6 * (i / 32) + 2 + (i % 32) / 8] >> (i % 8)) & 1) ? 1 : -1));
        // The ascending check on lists of 0..40 entries (both sides of one
        // and two 16-entry steps), with one pair out of order or repeated
        // at each place, and ascending ones that start at index 0.
        for (uint64_t n = 0; n <= 40; ++n) {
            std::vector<uint8_t> list(6 * n + 64, 0xEE);
            auto put = [&](uint64_t e, uint32_t idx) { std::memcpy(list.data() + 6 * e, &idx, 4); };
            for (uint64_t e = 0; e < n; ++e) put(e, uint32_t(3 * e + (g == 1 ? 0 : 7)));
            CHECK(isa.q1s_ascending(list.data(), n));
            CHECK(k::portable::q1s_ascending(list.data(), n));
            for (uint64_t e = 1; e < n; ++e) {
                for (uint32_t bad : {uint32_t(3 * (e - 1) + (g == 1 ? 0 : 7)), uint32_t(0)}) {
                    put(e, bad);
                    CAPTURE(n);
                    CAPTURE(e);
                    CHECK_FALSE(isa.q1s_ascending(list.data(), n));
                    CHECK_FALSE(k::portable::q1s_ascending(list.data(), n));
                }
                put(e, uint32_t(3 * e + (g == 1 ? 0 : 7)));
            }
        }
        // q1s overlay entries of a 4-row range starting at row 1: rows 0 and
        // 2 of the range without any, row 1 with three (one at each end) or
        // 23, row 3 with one (the AVX-512 form takes up to 16 entries of up
        // to four rows a step: an empty row between two); against the
        // portable loop (the AVX-512 form sums a row's entries in another
        // order) and row 1 by hand.
        const uint64_t cols = 32 * g, begin = cols;
        std::vector<uint64_t> at{begin + cols};
        if (g >= 21)  // more entries in the row than one 16-lane step takes
            for (uint64_t j = 0; j < 20; ++j) at.push_back(begin + cols + 3 + 5 * j);
        for (uint64_t i : {begin + cols + cols / 2 + 1, begin + 2 * cols - 1, begin + 3 * cols + 3}) at.push_back(i);
        std::vector<uint8_t> entries;
        for (uint64_t i : at) {
            const uint32_t idx = uint32_t(i);
            const uint16_t val = cmf::codecs::f32_to_f16(0.25f + 0.001f * float(i % 97));
            entries.insert(entries.end(), reinterpret_cast<const uint8_t *>(&idx), reinterpret_cast<const uint8_t *>(&idx) + 4);
            entries.insert(entries.end(), reinterpret_cast<const uint8_t *>(&val), reinterpret_cast<const uint8_t *>(&val) + 2);
        }
        float oa[5] = {1, 2, 3, 4, -7}, op[5] = {1, 2, 3, 4, -7};
        isa.q1s_overlay_xq(bytes.data(), entries.data(), at.size(), 0, begin, cols, 4, xq.data(), xd.data(), oa);
        k::portable::q1s_overlay_xq(bytes.data(), entries.data(), at.size(), 0, begin, cols, 4, xq.data(), xd.data(), op);
        for (int r = 0; r < 5; ++r) CHECK(near(oa[r], op[r]));
        CHECK(oa[0] == 1.0f);
        CHECK(oa[2] == 3.0f);
        CHECK(oa[3] != 4.0f);
        CHECK(oa[4] == -7.0f);
        double want2 = 2.0;  // row 1 of the range by hand
        for (uint64_t i : at) {
            if (i < begin + cols || i >= begin + 2 * cols) continue;
            const uint8_t *tile = bytes.data() + 6 * (i / 32);
            uint32_t b;
            std::memcpy(&b, tile + 2, 4);
            uint16_t h;
            std::memcpy(&h, tile, 2);
            const double s = cmf::codecs::f16_to_f32(h), base = ((b >> (i % 32)) & 1u) ? s : -s;
            const uint64_t c = i - begin - cols;
            const double value = cmf::codecs::f16_to_f32(cmf::codecs::f32_to_f16(0.25f + 0.001f * float(i % 97)));
            want2 += (value - base) * double(xd[c / 32]) * xq[c];
        }
        CHECK(std::fabs(oa[1] - want2) <= 1e-5 * std::fabs(want2) + 1e-6);
        // A list that does not ascend or leaves the range (what a caller
        // that skipped q1s_ascending could pass): entries out of order, one
        // below the range and one past it. The sums are not defined, but
        // nothing outside x, y's 4 rows and the tiles is touched (the
        // sanitizer build checks the reads; y's fifth slot must stay).
        std::vector<uint8_t> bad;
        for (uint64_t i : {begin + cols + 1, begin + 2, begin + 2 * cols + 3, begin - 5, begin + 4 * cols + 2,
                           begin + 2 * cols + 5, begin + cols}) {
            const uint32_t idx = uint32_t(i);
            const uint16_t val = cmf::codecs::f32_to_f16(0.5f);
            bad.insert(bad.end(), reinterpret_cast<const uint8_t *>(&idx), reinterpret_cast<const uint8_t *>(&idx) + 4);
            bad.insert(bad.end(), reinterpret_cast<const uint8_t *>(&val), reinterpret_cast<const uint8_t *>(&val) + 2);
        }
        float ba[5] = {1, 2, 3, 4, -7}, bp[5] = {1, 2, 3, 4, -7};
        isa.q1s_overlay_xq(bytes.data(), bad.data(), bad.size() / 6, 0, begin, cols, 4, xq.data(), xd.data(), ba);
        k::portable::q1s_overlay_xq(bytes.data(), bad.data(), bad.size() / 6, 0, begin, cols, 4, xq.data(), xd.data(), bp);
        CHECK(ba[4] == -7.0f);
        CHECK(bp[4] == -7.0f);
        for (int r = 0; r < 4; ++r) CHECK((std::isfinite(ba[r]) && std::isfinite(bp[r])));
    }
    // q1t rows: 5 rows, groups short of, at and past whole 8-group steps,
    // every byte value (those the decoder rejects read by the same digit
    // rule on every ISA), finite scales; a row's bits do not depend on the
    // rows beside it; the tiles allocated to their last byte (the sanitizer
    // build checks the reads). Row 0 by hand too. The int8 view: the same
    // codes and scales on every ISA.
    for (uint64_t g : {1u, 7u, 8u, 9u, 21u, 64u}) {
        CAPTURE(g);
        std::vector<uint8_t> made(9 * 5 * g);
        for (uint64_t i = 0; i < 5 * g; ++i) {
            const uint16_t h = cmf::codecs::f32_to_f16(0.01f + 0.001f * float(rng() % 100));
            std::memcpy(made.data() + 9 * i, &h, 2);
            for (int j = 0; j < 7; ++j) made[9 * i + 2 + j] = static_cast<uint8_t>(i == 0 && j < 2 ? 255 - j : rng());
        }
        const std::vector<uint8_t> tiles(made.begin(), made.end());
        k::portable::quantize_x(x.data(), 32 * g, k::XOrder::natural, xq.data(), xd.data());
        float ya[6], yp[6], y1 = 0;
        ya[5] = yp[5] = -7.0f;
        isa.rows_q1t_xq(tiles.data(), xq.data(), xd.data(), g, 5, ya);
        k::portable::rows_q1t_xq(tiles.data(), xq.data(), xd.data(), g, 5, yp);
        for (int r = 0; r < 5; ++r) CHECK(near(ya[r], yp[r]));
        CHECK(ya[5] == -7.0f);
        isa.rows_q1t_xq(tiles.data() + 4 * 9 * g, xq.data(), xd.data(), g, 1, &y1);
        CHECK(bits(y1) == bits(ya[4]));
        double want = 0;
        for (uint64_t i = 0; i < 32 * g; ++i) {
            unsigned b = tiles[9 * (i / 32) + 2 + (i % 32) / 5];
            for (uint64_t k5 = 0; k5 < (i % 32) % 5; ++k5) b /= 3;
            uint16_t h;
            std::memcpy(&h, tiles.data() + 9 * (i / 32), 2);
            const double w = b % 3 == 0 ? 0.0 : b % 3 == 1 ? 1.0 : -1.0;
            want += w * cmf::codecs::f16_to_f32(h) * double(xd[i / 32]) * xq[i];
        }
        CHECK(std::fabs(ya[0] - want) <= 1e-4 * std::fabs(want) + 1e-6);
        isa.rows_q1t_xq(tiles.data() + 9 * g, xq.data(), xd.data(), g, 4, ya);
        CHECK(bits(ya[3]) == bits(y1));
        std::vector<int8_t> ca(32 * g + 1, 99), cp(32 * g + 1, 99);
        std::vector<float> sa(g), sp(g);
        isa.unpack_q1t_groups(tiles.data(), g, ca.data(), sa.data());
        k::portable::unpack_q1t_groups(tiles.data(), g, cp.data(), sp.data());
        CHECK(ca == cp);
        CHECK(std::memcmp(sa.data(), sp.data(), g * sizeof(float)) == 0);
        CHECK(ca[32 * g] == 99);
    }
    for (uint64_t g : {1u, 3u, 64u}) {
        uint64_t n = 32 * g - 5;
        CHECK(near(isa.dot_f32(x.data() + 7, x.data(), n), k::portable::dot_f32(x.data() + 7, x.data(), n)));
        const int8_t *w8 = reinterpret_cast<const int8_t *>(bytes.data());
        k::portable::quantize_x(x.data(), n, k::XOrder::natural, xq.data(), xd.data());
        CHECK(near(isa.dot_i8_xq(w8, xq.data(), xd.data(), n), k::portable::dot_i8_xq(w8, xq.data(), xd.data(), n)));
        k::portable::quantize_x(x.data(), 32 * g, k::XOrder::q2_quads, xq.data(), xd.data());
        std::vector<int32_t> xo(8 * g);
        k::q2_offset(xq.data(), g, xo.data());
        for (uint64_t i = 0; i < 8 * g; ++i) {  // -3 * the sum of each 4 consecutive codes
            int32_t sum = 0;
            for (int j = 0; j < 4; ++j) sum += xq[4 * i + j];
            CHECK(xo[i] == -3 * sum);
        }
        // Every SIMD form (VNNI: vpdpbusd from the offsets; AVX2: vpmaddubsw
        // and a subtraction) makes the same int32 lane sums and the same
        // f32 operations: the same bits.
        for (const k::SimdKernels &other : simd)
            CHECK(isa.dot_q2_groups_xq(bytes.data(), s.data(), xq.data(), xo.data(), xd.data(), g) ==
                  other.dot_q2_groups_xq(bytes.data(), s.data(), xq.data(), xo.data(), xd.data(), g));
        CHECK(near(isa.dot_q2_groups_xq(bytes.data(), s.data(), xq.data(), xo.data(), xd.data(), g),
                   k::portable::dot_q2_groups_xq(bytes.data(), s.data(), xq.data(), xo.data(), xd.data(), g)));
    }
    // q2tp rows: 5 rows (a pass of four and one alone) with their own group
    // scales, groups short of, past and at whole steps of 16; a row's bits do
    // not depend on the row its range starts at.
    for (uint64_t g : {1u, 3u, 21u, 64u}) {
        CAPTURE(g);
        k::portable::quantize_x(x.data(), 32 * g, k::XOrder::q2_quads, xq.data(), xd.data());
        std::vector<int32_t> xo(8 * g);
        k::q2_offset(xq.data(), g, xo.data());
        std::vector<float> rs(5 * g);
        for (uint64_t i = 0; i < rs.size(); ++i) rs[i] = 0.01f * static_cast<float>(i % 37 + 1) * (i % 3 ? 1.0f : -1.0f);
        float ya[6], yp[6], y1 = 0;
        ya[5] = yp[5] = -7.0f;
        isa.rows_q2_groups_xq(bytes.data(), rs.data(), xq.data(), xo.data(), xd.data(), g, 5, ya);
        k::portable::rows_q2_groups_xq(bytes.data(), rs.data(), xq.data(), xo.data(), xd.data(), g, 5, yp);
        for (int r = 0; r < 5; ++r) CHECK(near(ya[r], yp[r]));
        CHECK(ya[5] == -7.0f);
        isa.rows_q2_groups_xq(bytes.data() + 4 * 8 * g, rs.data() + 4 * g, xq.data(), xo.data(), xd.data(), g, 1, &y1);
        CHECK(bits(y1) == bits(ya[4]));
        isa.rows_q2_groups_xq(bytes.data() + 8 * g, rs.data() + g, xq.data(), xo.data(), xd.data(), g, 4, ya);
        CHECK(bits(ya[3]) == bits(y1));
    }
    // Decode kernels: bit-identical, every group with its own scale.
    std::vector<float> gs(64);
    for (size_t i = 0; i < gs.size(); ++i) gs[i] = 0.01f * static_cast<float>(i) - 0.2f;
    // q4 dots on a q4_pair_blocks x, odd and even group counts (an odd count
    // ends in the single-group step; 259 runs a second slice of 3 groups
    // from group 256), then with a NaN x block (paired or not) and with a
    // NaN weight scale in the last group: both give NaN.
    for (uint64_t g : {1u, 2u, 3u, 33u, 64u, 259u}) {
        std::vector<uint8_t> split0(18 * g), tiled0(18 * g);
        for (auto &b : split0) b = static_cast<uint8_t>(rng());
        for (auto &b : tiled0) b = static_cast<uint8_t>(rng());
        for (uint64_t i = 0; i < g; ++i) split0[16 * g + 2 * i + 1] &= 0x3b, tiled0[18 * i + 1] &= 0x3b;  // finite f16 scales
        std::vector<float> fs0(g);
        for (uint64_t i = 0; i < g; ++i) fs0[i] = 0.01f * static_cast<float>(i % 64) - 0.2f;
        for (int nan_case = 0; nan_case < 3; ++nan_case) {
            CAPTURE(g);
            CAPTURE(nan_case);
            std::vector<float> xv = gaussian(32 * g, static_cast<uint32_t>(g), 0.01f), fs = fs0;
            std::vector<uint8_t> split = split0, tiled = tiled0;
            if (nan_case == 1) xv[32 * (g / 2) + 3] = std::numeric_limits<float>::quiet_NaN();
            if (nan_case == 2) {
                fs[g - 1] = std::numeric_limits<float>::quiet_NaN();
                split[16 * g + 2 * (g - 1)] = 0x00, split[16 * g + 2 * (g - 1) + 1] = 0x7e;  // f16 NaN
                tiled[18 * (g - 1)] = 0x00, tiled[18 * (g - 1) + 1] = 0x7e;
            }
            std::vector<int8_t> q(32 * g);
            std::vector<float> d(g);
            std::vector<int32_t> xb(8 * (g / 2));
            k::quantize_x(xv.data(), 32 * g, k::XOrder::q4_pair_blocks, q.data(), d.data());
            k::q4_pair_offset(q.data(), g, xb.data());
            const uint8_t *sc = split.data() + 16 * g;
            const float r[3][2] = {
                {isa.dot_q4_tiled_xq(tiled.data(), q.data(), xb.data(), d.data(), g),
                 k::portable::dot_q4_tiled_xq(tiled.data(), q.data(), xb.data(), d.data(), g)},
                {isa.dot_q4_split_xq(split.data(), sc, q.data(), xb.data(), d.data(), g),
                 k::portable::dot_q4_split_xq(split.data(), sc, q.data(), xb.data(), d.data(), g)},
                {isa.dot_q4_groups_xq(split.data(), fs.data(), q.data(), xb.data(), d.data(), g),
                 k::portable::dot_q4_groups_xq(split.data(), fs.data(), q.data(), xb.data(), d.data(), g)}};
            for (const auto &ap : r) {
                if (nan_case == 0) {
                    CHECK(near(ap[0], ap[1]));
                } else {
                    CHECK(std::isnan(ap[0]));
                    CHECK(std::isnan(ap[1]));
                }
            }
        }
    }
    for (uint64_t g : {1u, 3u, 64u}) {
        CAPTURE(g);
        for (uint64_t stride : {16u, 18u}) {
            std::vector<float> a(32 * g, -1.0f), p(32 * g, -2.0f);
            isa.dequant_q4_groups(bytes.data(), stride, gs.data(), g, a.data());
            k::portable::dequant_q4_groups(bytes.data(), stride, gs.data(), g, p.data());
            CHECK(std::memcmp(a.data(), p.data(), a.size() * sizeof(float)) == 0);
        }
        for (uint64_t stride : {16u, 18u}) {
            std::vector<int8_t> a(32 * g, 1), p(32 * g, 2);
            isa.unpack_q4_groups(bytes.data(), stride, g, a.data());
            k::portable::unpack_q4_groups(bytes.data(), stride, g, p.data());
            CHECK(a == p);
        }
        std::vector<float> a(32 * g, -1.0f), p(32 * g, -2.0f);
        isa.dequant_q2_groups(bytes.data(), gs.data(), g, a.data());
        k::portable::dequant_q2_groups(bytes.data(), gs.data(), g, p.data());
        CHECK(std::memcmp(a.data(), p.data(), a.size() * sizeof(float)) == 0);
    }
    }
    k::set_avx512_extensions(true);
}

// A q1s payload of Gaussian weights as the encoder writes it (ascending
// outliers), with where its outlier list starts (after the base tiles and
// the count) and how many entries it holds.
struct Q1sSample {
    std::vector<uint8_t> bytes;
    uint64_t base;
    uint32_t count;
};
Q1sSample q1s_sample(uint64_t rows, uint64_t cols, unsigned seed, const char *options) {
    std::vector<float> w = gaussian(rows * cols, seed, 0.01f);
    Q1sSample q{encode(CMF_DTYPE_Q1S, {rows, cols}, w.data(), options), 6 * rows * cols / 32, 0};
    std::memcpy(&q.count, q.bytes.data() + q.base, 4);
    return q;
}

TEST_CASE("roundtrip: q1s matmul equals its decode, overlays in file order or not") {
    // The kernel applies an ascending overlay as corrections to the q1 dot,
    // both against x quantized to int8 blocks: the decode against that x.
    // An overlay out of order or with a repeated index (the last value
    // wins) goes through the decode: decode + f32 dot.
    const uint64_t rows = 6, cols = 96;
    const std::vector<uint64_t> shape{rows, cols};
    const auto [sorted, base, count] = q1s_sample(rows, cols, 5, "keep=0.05");
    REQUIRE(count >= 4);
    // Reversed entries, then the first entry again with another value.
    std::vector<uint8_t> shuffled(sorted.begin(), sorted.begin() + base + 4);
    for (uint32_t e = count; e-- > 0;)
        shuffled.insert(shuffled.end(), sorted.begin() + base + 4 + 6 * e, sorted.begin() + base + 10 + 6 * e);
    shuffled.insert(shuffled.end(), sorted.begin() + base + 4, sorted.begin() + base + 8);
    const uint16_t repeat = cmf::codecs::f32_to_f16(0.75f);
    shuffled.insert(shuffled.end(), reinterpret_cast<const uint8_t *>(&repeat), reinterpret_cast<const uint8_t *>(&repeat) + 2);
    const uint32_t count2 = count + 1;
    std::memcpy(shuffled.data() + base, &count2, 4);
    uint32_t first;
    std::memcpy(&first, sorted.data() + base + 4, 4);
    // Without a matmul id, and under one id shared by both tensors and all
    // their row ranges (the kernel remembers per matmul whether a list
    // ascends; the tensor is part of what it remembers).
    for (uint64_t id : {uint64_t{0}, uint64_t{42}})
    for (const std::vector<uint8_t> *p : {&sorted, static_cast<const std::vector<uint8_t> *>(&shuffled)}) {
        CAPTURE(id);
        CAPTURE(p == &shuffled);
        std::vector<float> ref = decode(CMF_DTYPE_Q1S, shape, *p);
        if (p == &shuffled) CHECK(ref[first] == 0.75f);
        const uint64_t batch = 3, ldx = cols + 1, ldy = rows + 2;
        std::vector<float> x = gaussian(batch * ldx, 6), y(batch * ldy, -7.0f);
        cmf_tensor_view t = view(CMF_DTYPE_Q1S, shape, *p);
        cmf::codecs::XIdScope scope(id, x.data());
        dtype(CMF_DTYPE_Q1S).matmul_rows(t, x.data(), ldx, batch, 0, 1, y.data(), ldy);
        dtype(CMF_DTYPE_Q1S).matmul_rows(t, x.data(), ldx, batch, 1, 4, y.data(), ldy);
        dtype(CMF_DTYPE_Q1S).matmul_rows(t, x.data(), ldx, batch, 4, rows, y.data(), ldy);
        for (uint64_t b = 0; b < batch; ++b) {
            const std::vector<double> xq = quantized_x(x.data() + b * ldx, std::vector<float>(cols, 1.0f));
            for (uint64_t r = 0; r < rows; ++r) {
                double want = 0, mag = 0;
                for (uint64_t c = 0; c < cols; ++c) {
                    const double xc = p == &sorted ? xq[c] : double(x[b * ldx + c]);
                    want += double(ref[r * cols + c]) * xc;
                    mag += std::fabs(double(ref[r * cols + c]) * xc);
                }
                CHECK(std::fabs(y[b * ldy + r] - want) <= 1e-5 * mag + 1e-30);
            }
            CHECK(y[b * ldy + rows] == -7.0f);
        }
    }
}

TEST_CASE("roundtrip: q1s facts: validate_facts says whether the list ascends, views carrying it compute the same") {
    // Bit 0 of cmf_tensor_view.facts (the host puts validate_facts' answer
    // into every view of a tensor it validated at load): the outlier list
    // ascends strictly, so the kernels skip checking it and the decode finds
    // a range's entries by binary search. With the bit, matmul and decode
    // give the same bits as without; a view that claims it falsely reads
    // nothing outside its payload (the ASan build runs this).
    const uint64_t rows = 7, cols = 64;
    const std::vector<uint64_t> shape{rows, cols};
    const auto [sorted, base, count] = q1s_sample(rows, cols, 11, "keep=0.08");
    REQUIRE(count >= 8);
    std::vector<uint8_t> swapped = sorted;  // entries 2 and 3 exchanged
    std::swap_ranges(swapped.begin() + base + 4 + 12, swapped.begin() + base + 4 + 18, swapped.begin() + base + 4 + 18);
    std::vector<uint8_t> repeated = sorted;  // entry 1's index on entry 2 as well
    std::memcpy(repeated.data() + base + 4 + 12, repeated.data() + base + 4 + 6, 4);
    const Dtype &q1s = dtype(CMF_DTYPE_Q1S);
    CHECK(q1s.validate_facts(view(CMF_DTYPE_Q1S, shape, sorted)) == 1u);
    CHECK(q1s.validate_facts(view(CMF_DTYPE_Q1S, shape, swapped)) == 0u);
    CHECK(q1s.validate_facts(view(CMF_DTYPE_Q1S, shape, repeated)) == 0u);
    std::vector<uint8_t> past = sorted;  // an index past the tensor: refused, facts or not
    const uint32_t beyond = uint32_t(rows * cols);
    std::memcpy(past.data() + base + 4 + 6 * (count - 1), &beyond, 4);
    CHECK_THROWS_WITH(q1s.validate_facts(view(CMF_DTYPE_Q1S, shape, past)), doctest::Contains(">= element count"));
    const uint64_t batch = 2, ldx = cols, ldy = rows + 1;
    std::vector<float> x = gaussian(batch * ldx, 12);
    auto run = [&](const std::vector<uint8_t> &bytes, uint32_t facts, std::vector<float> &y, std::vector<float> &dec) {
        cmf_tensor_view t = view(CMF_DTYPE_Q1S, shape, bytes);
        t.facts = facts;
        y.assign(batch * ldy, -7.0f);
        dec.assign(rows * cols, -9.0f);
        for (uint64_t r0 : {uint64_t{0}, uint64_t{2}, uint64_t{3}}) {
            const uint64_t r1 = r0 == 0 ? 2 : (r0 == 2 ? 3 : rows);
            q1s.matmul_rows(t, x.data(), ldx, batch, r0, r1, y.data(), ldy);
            q1s.dequantize_rows(t, r0, r1, dec.data() + r0 * cols);
        }
    };
    std::vector<float> y0, d0, y1, d1;
    run(sorted, 0, y0, d0);
    run(sorted, 1, y1, d1);
    CHECK(y0 == y1);
    CHECK(d0 == d1);
    CHECK(d0 == decode(CMF_DTYPE_Q1S, shape, sorted));
    // False claims: results may differ from the decode, reads stay inside.
    for (const std::vector<uint8_t> *p : {&swapped, &repeated}) {
        run(*p, 1, y1, d1);
        for (uint64_t b = 0; b < batch; ++b) {
            CHECK(y1[b * ldy + rows] == -7.0f);
            for (uint64_t r = 0; r < rows; ++r) CHECK(std::isfinite(y1[b * ldy + r]));
        }
        for (float v : d1) CHECK(std::isfinite(v));
    }
}

TEST_CASE("roundtrip: q1s gives a row the same bits wherever its row range starts") {
    // The backend cuts a weight's rows one way for a matmul and another for
    // a fused matmul_multi; both must give the same bits (tests/unit's
    // backend tests hold the standard codecs to it). The overlay's steps of
    // 16 entries must not depend on where a range's entries begin.
    const uint64_t rows = 41, cols = 256;
    const std::vector<uint64_t> shape{rows, cols};
    const Q1sSample q = q1s_sample(rows, cols, 17, "keep=0.05");
    REQUIRE(q.count > 16 * 8);
    cmf_tensor_view t = view(CMF_DTYPE_Q1S, shape, q.bytes);
    t.facts = 1;  // ascends: the kernel path
    const uint64_t batch = 2;
    std::vector<float> x = gaussian(batch * cols, 18);
    std::vector<float> whole(batch * rows), cut(batch * rows);
    dtype(CMF_DTYPE_Q1S).matmul_rows(t, x.data(), cols, batch, 0, rows, whole.data(), rows);
    for (uint64_t split : {1u, 3u, 5u, 7u, 13u, 22u}) {
        CAPTURE(split);
        for (uint64_t r0 = 0; r0 < rows; r0 += split)
            dtype(CMF_DTYPE_Q1S).matmul_rows(t, x.data(), cols, batch, r0, std::min(rows, r0 + split), cut.data(), rows);
        for (uint64_t i = 0; i < batch * rows; ++i) CHECK(bits(cut[i]) == bits(whole[i]));
    }
}

// A decode copy read by every member against its original: the same
// decoded values (whole and from row 1), matmuls of the same products
// (bit for bit where same_bits) and the same for every row range, the same
// int8 view from row 1, no column selection.
void check_copy_members(const Dtype &orig, const cmf_tensor_view &tb, const Dtype &copy, const cmf_tensor_view &tc,
                        unsigned seed, bool same_bits, std::initializer_list<uint64_t> batches = {1, 3},
                        bool has_int8_view = true) {
    const uint64_t rows = tb.shape[0], cols = tb.shape[1];
    std::vector<float> db(rows * cols), dc(rows * cols, -1.0f);
    orig.dequantize_rows(tb, 0, rows, db.data());
    copy.dequantize_rows(tc, 0, rows, dc.data());
    CHECK(std::memcmp(db.data(), dc.data(), db.size() * sizeof(float)) == 0);
    copy.dequantize_rows(tc, 1, rows, dc.data());  // a range from row 1
    CHECK(std::memcmp(db.data() + cols, dc.data(), (rows - 1) * cols * sizeof(float)) == 0);
    for (uint64_t batch : batches) {
        CAPTURE(batch);
        std::vector<float> x = gaussian(batch * cols, seed), yb(batch * rows), yc(batch * rows, -7.0f);
        orig.matmul_rows(tb, x.data(), cols, batch, 0, rows, yb.data(), rows);
        copy.matmul_rows(tc, x.data(), cols, batch, 0, rows, yc.data(), rows);
        for (uint64_t i = 0; i < yb.size(); ++i) CHECK(std::fabs(yb[i] - yc[i]) <= 1e-5f * (std::fabs(yb[i]) + 1.0f));
        if (same_bits) CHECK(std::memcmp(yb.data(), yc.data(), yb.size() * sizeof(float)) == 0);
        std::vector<float> ycut(batch * rows, -7.0f);
        for (uint64_t r0 = 0; r0 < rows; r0 += 7)
            copy.matmul_rows(tc, x.data(), cols, batch, r0, std::min(rows, r0 + 7), ycut.data(), rows);
        CHECK(std::memcmp(yc.data(), ycut.data(), yc.size() * sizeof(float)) == 0);
    }
    CHECK(copy.column_block(tc) == 0);
    if (!has_int8_view) {
        CHECK_FALSE(copy.int8_view(tc));
        return;
    }
    REQUIRE(copy.int8_view(tc));
    std::vector<int8_t> qb(rows * cols), qc(rows * cols);
    std::vector<float> sb(rows * cols / 32), sc(rows * cols / 32);
    orig.int8_rows(tb, 1, rows, qb.data(), sb.data());
    copy.int8_rows(tc, 1, rows, qc.data(), sc.data());
    CHECK(qb == qc);
    CHECK(std::memcmp(sb.data(), sc.data(), sb.size() * sizeof(float)) == 0);
}

TEST_CASE("roundtrip: q4_block's decode copy (q4_rows) gives every member the same bits") {
    // The dispatched kernels here; the row kernel on every ISA with the
    // scales after each row's nibbles is in "row-range kernels equal the
    // per-row dots".
    const Dtype &block = dtype(CMF_DTYPE_Q4_BLOCK), &rows_dt = dtype(CMF_DTYPE_MEM_Q4_ROWS);
    CHECK(!rows_dt.can_quantize());
    CHECK_THROWS_WITH(rows_dt.expected_size(std::vector<uint64_t>{64}), doctest::Contains("2-D"));
    CHECK_THROWS_WITH(rows_dt.expected_size(std::vector<uint64_t>{4, 40}), doctest::Contains("multiple of 32"));
    {  // no decode layout: 1-D, or groups that straddle rows
        std::vector<float> w = gaussian(160, 30);
        uint64_t n = 7;
        uint8_t room[64];
        for (const std::vector<uint64_t> &shape : {std::vector<uint64_t>{160}, std::vector<uint64_t>{4, 40}}) {
            std::vector<uint8_t> b = encode(CMF_DTYPE_Q4_BLOCK, shape, w.data());
            CHECK(block.decode_layout(view(CMF_DTYPE_Q4_BLOCK, shape, b), &n) == -1);
            CHECK(n == 0);
            CHECK_THROWS_WITH(block.decode_copy(view(CMF_DTYPE_Q4_BLOCK, shape, b), room),
                              doctest::Contains("no decode layout"));
        }
        std::vector<uint8_t> t = encode(CMF_DTYPE_Q4_TILED, {5, 32}, w.data());
        CHECK(dtype(CMF_DTYPE_Q4_TILED).decode_layout(view(CMF_DTYPE_Q4_TILED, {5, 32}, t), &n) == -1);
    }
    // Through the registry's vtable: the size first, then the copy into the
    // caller's room, which must be that size.
    void *cctx = nullptr;
    const cmf_codec_vt *vt = runtime().host_api()->find_codec(runtime().host_api()->host_ctx, CMF_DTYPE_Q4_BLOCK, &cctx);
    REQUIRE(vt != nullptr);
    REQUIRE((vt->decode_copy != nullptr));
    {
        for (const std::vector<uint64_t> &shape : {std::vector<uint64_t>{3, 32}, std::vector<uint64_t>{17, 64},
                                                   std::vector<uint64_t>{40, 1024}, std::vector<uint64_t>{21, 96}}) {
            CAPTURE(shape[0]);
            CAPTURE(shape[1]);
            const uint64_t rows = shape[0], cols = shape[1];
            std::vector<float> w = gaussian(rows * cols, 31);
            std::vector<uint8_t> b = encode(CMF_DTYPE_Q4_BLOCK, shape, w.data());
            const cmf_tensor_view tb = view(CMF_DTYPE_Q4_BLOCK, shape, b);
            uint64_t n = 0;
            int32_t id = -1;
            REQUIRE(vt->decode_copy(cctx, &tb, nullptr, 0, &n, &id) == nullptr);
            REQUIRE(id == CMF_DTYPE_MEM_Q4_ROWS);
            REQUIRE(n == b.size());
            std::vector<uint8_t> c(n + 1, 0xAB);  // a guard byte past the copy
            uint64_t got = 0;
            cmf_error *short_room = vt->decode_copy(cctx, &tb, c.data(), n - 1, &got, &id);
            REQUIRE(short_room != nullptr);
            CHECK(cmf_error_code(short_room) == CMF_ERR_INVALID_ARGUMENT);
            cmf_error_free(short_room);
            REQUIRE(vt->decode_copy(cctx, &tb, c.data(), n, &got, &id) == nullptr);
            CHECK(id == CMF_DTYPE_MEM_Q4_ROWS);
            CHECK(got == n);
            CHECK(c[n] == 0xAB);
            c.pop_back();
            const cmf_tensor_view tc = view(CMF_DTYPE_MEM_Q4_ROWS, shape, c);
            rows_dt.validate(tc);
            // Row 0's scales follow its nibbles.
            CHECK(std::memcmp(c.data() + 16 * (cols / 32), b.data() + 16 * rows * (cols / 32), 2 * (cols / 32)) == 0);
            check_copy_members(block, tb, rows_dt, tc, 32, true, {1, 3, 20});
        }
    }
}

// The decode copy of tb through the codec's vtable into a room of the n
// bytes it asked for, a guard byte past it left as it was.
std::vector<uint8_t> copy_into_room(const cmf_codec_vt *vt, void *cctx, const cmf_tensor_view &tb, uint64_t n) {
    std::vector<uint8_t> c(n + 1, 0xAB);
    uint64_t got = 0;
    int32_t id = -1;
    REQUIRE(vt->decode_copy(cctx, &tb, c.data(), n, &got, &id) == nullptr);
    CHECK(got == n);
    CHECK(c[n] == 0xAB);
    c.pop_back();
    return c;
}

// A pass-mask copy (q1_passes, q1t_passes, q1s_passes): memory-only, no
// encoder, 2-D matrices of whole 16-group steps a row only.
void check_passes_shapes(const Dtype &passes) {
    CHECK(!passes.can_quantize());
    CHECK_THROWS_WITH(passes.expected_size(std::vector<uint64_t>{1024}), doctest::Contains("2-D"));
    CHECK_THROWS_WITH(passes.expected_size(std::vector<uint64_t>{4, 96}), doctest::Contains("multiple of 512"));
}

TEST_CASE("roundtrip: q1's decode copy (q1_passes) gives every member the same bits") {
    namespace k = cmf::codecs::kernels;
    const Dtype &q1 = dtype(CMF_DTYPE_Q1), &passes = dtype(CMF_DTYPE_MEM_Q1_PASSES);
    check_passes_shapes(passes);
    uint64_t n = 7;
    {  // no decode layout: 1-D, or rows that are not whole steps of 16 groups
        std::vector<float> w = gaussian(4 * 512, 40);
        std::vector<uint8_t> b = encode(CMF_DTYPE_Q1, {4, 512}, w.data());
        for (const std::vector<uint64_t> &shape : {std::vector<uint64_t>{4 * 512}, std::vector<uint64_t>{16, 128}}) {
            CHECK(q1.decode_layout(view(CMF_DTYPE_Q1, shape, b), &n) == -1);
            CHECK(n == 0);
        }
    }
    {  // where the AVX-512 kernel does not run, no copy either
        std::vector<float> w = gaussian(2 * 512, 41);
        std::vector<uint8_t> b = encode(CMF_DTYPE_Q1, {2, 512}, w.data());
        CHECK(q1.decode_layout(view(CMF_DTYPE_Q1, {2, 512}, b), &n) == (k::q1_passes_kernel() ? CMF_DTYPE_MEM_Q1_PASSES : -1));
    }
    // The copy made by hand where the CPU would not make it: the view is
    // still a q1_passes matrix every member reads (the portable kernels).
    void *cctx = nullptr;
    const cmf_codec_vt *vt = runtime().host_api()->find_codec(runtime().host_api()->host_ctx, CMF_DTYPE_Q1, &cctx);
    REQUIRE(vt != nullptr);
    for (const std::vector<uint64_t> &shape : {std::vector<uint64_t>{3, 512}, std::vector<uint64_t>{17, 1024},
                                               std::vector<uint64_t>{40, 3072}}) {
        CAPTURE(shape[0]);
        CAPTURE(shape[1]);
        const uint64_t rows = shape[0], cols = shape[1];
        std::vector<float> w = gaussian(rows * cols, 42);
        std::vector<uint8_t> b = encode(CMF_DTYPE_Q1, shape, w.data());
        const cmf_tensor_view tb = view(CMF_DTYPE_Q1, shape, b);
        std::vector<uint8_t> c(b.size() + 1, 0xAB);  // a guard byte past the copy
        if (k::q1_passes_kernel()) {
            int32_t id = -1;
            REQUIRE(vt->decode_copy(cctx, &tb, nullptr, 0, &n, &id) == nullptr);
            REQUIRE(id == CMF_DTYPE_MEM_Q1_PASSES);
            REQUIRE(n == b.size());
            uint64_t got = 0;
            cmf_error *short_room = vt->decode_copy(cctx, &tb, c.data(), n - 1, &got, &id);
            REQUIRE(short_room != nullptr);
            CHECK(cmf_error_code(short_room) == CMF_ERR_INVALID_ARGUMENT);
            cmf_error_free(short_room);
            REQUIRE(vt->decode_copy(cctx, &tb, c.data(), n, &got, &id) == nullptr);
            CHECK(got == n);
        } else {
            REQUIRE(passes.expected_size(shape) == b.size());
            for (uint64_t s = 0; s < b.size() / 96; ++s) {  // the layout's rule, one bit at a time
                uint8_t lanes[64] = {};
                for (unsigned j = 0; j < 16; ++j)
                    for (unsigned e = 0; e < 32; ++e)
                        if ((b[96 * s + 6 * j + 2 + e / 8] >> (e % 8)) & 1)
                            lanes[4 * j + e % 4] |= uint8_t(1u << (e / 4));
                std::memcpy(c.data() + 96 * s, lanes, 64);
                for (unsigned j = 0; j < 16; ++j) std::memcpy(c.data() + 96 * s + 64 + 2 * j, b.data() + 96 * s + 6 * j, 2);
            }
        }
        CHECK(c[b.size()] == 0xAB);
        c.pop_back();
        const cmf_tensor_view tc = view(CMF_DTYPE_MEM_Q1_PASSES, shape, c);
        passes.validate(tc);
        // Step 0 of row 0: bit t of lane byte 4j+i is bit 4t+i of group j, then the scales.
        for (unsigned j = 0; j < 16; ++j)
            for (unsigned e = 0; e < 32; ++e)
                CHECK(((c[4 * j + e % 4] >> (e / 4)) & 1) == ((b[6 * j + 2 + e / 8] >> (e % 8)) & 1));
        CHECK(std::memcmp(c.data() + 64, b.data(), 2) == 0);
        // The same lanes in the same order as q1's BITALG kernel: the same
        // bits; q1's other forms sum in another order.
        check_copy_members(q1, tb, passes, tc, 43, k::q1_passes_kernel() && k::has_avx512_bitalg());
    }
}

TEST_CASE("roundtrip: q1t's decode copy (q1t_passes) gives every member the values q1t gives") {
    namespace k = cmf::codecs::kernels;
    const Dtype &q1t = dtype(CMF_DTYPE_Q1T), &passes = dtype(CMF_DTYPE_MEM_Q1T_PASSES);
    check_passes_shapes(passes);
    uint64_t n = 7;
    {  // no decode layout: an overlay, or rows that are not whole steps
        std::vector<float> w = gaussian(4 * 512, 50);
        std::vector<uint8_t> with = encode(CMF_DTYPE_Q1T, {4, 512}, w.data(), "keep=0.01");
        CHECK(q1t.decode_layout(view(CMF_DTYPE_Q1T, {4, 512}, with), &n) == -1);
        std::vector<float> w96 = gaussian(4 * 96, 51);
        std::vector<uint8_t> narrow = encode(CMF_DTYPE_Q1T, {4, 96}, w96.data());
        CHECK(q1t.decode_layout(view(CMF_DTYPE_Q1T, {4, 96}, narrow), &n) == -1);
        CHECK(n == 0);
    }
    if (!k::q1_passes_kernel()) {
        std::vector<float> w = gaussian(2 * 512, 52);
        std::vector<uint8_t> b = encode(CMF_DTYPE_Q1T, {2, 512}, w.data());
        CHECK(q1t.decode_layout(view(CMF_DTYPE_Q1T, {2, 512}, b), &n) == -1);
        return;  // the copy is made only where its kernel runs
    }
    void *cctx = nullptr;
    const cmf_codec_vt *vt = runtime().host_api()->find_codec(runtime().host_api()->host_ctx, CMF_DTYPE_Q1T, &cctx);
    REQUIRE(vt != nullptr);
    for (const std::vector<uint64_t> &shape : {std::vector<uint64_t>{3, 512}, std::vector<uint64_t>{17, 1024},
                                               std::vector<uint64_t>{40, 3072}}) {
        CAPTURE(shape[0]);
        CAPTURE(shape[1]);
        const uint64_t rows = shape[0], cols = shape[1];
        std::vector<float> w = gaussian(rows * cols, 53);
        std::vector<uint8_t> b = encode(CMF_DTYPE_Q1T, shape, w.data());
        const cmf_tensor_view tb = view(CMF_DTYPE_Q1T, shape, b);
        int32_t id = -1;
        REQUIRE(vt->decode_copy(cctx, &tb, nullptr, 0, &n, &id) == nullptr);
        REQUIRE(id == CMF_DTYPE_MEM_Q1T_PASSES);
        REQUIRE(n == 10 * rows * cols / 32);
        std::vector<uint8_t> c = copy_into_room(vt, cctx, tb, n);
        uint64_t got = 0;
        const cmf_tensor_view tc = view(CMF_DTYPE_MEM_Q1T_PASSES, shape, c);
        passes.validate(tc);
        std::vector<float> db(cols);
        q1t.dequantize_rows(tb, 0, 1, db.data());
        // Step 0 of row 0 by the layout's rule: w+1 in bits 2(t%4), 2(t%4)+1
        // of lane byte 4j+i of half t/4 (element 4t+i of group j).
        for (unsigned j = 0; j < 16; ++j)
            for (unsigned e = 0; e < 32; ++e) {
                const unsigned lane = 4 * j + e % 4, t = e / 4;
                const unsigned code = (c[64 * (t / 4) + lane] >> (2 * (t % 4))) & 3u;
                const float v = db[32 * j + e];
                CHECK(code == (v > 0.0f ? 2u : v < 0.0f ? 0u : 1u));
            }
        // The same products as q1t's VBMI kernel, summed in another order.
        check_copy_members(q1t, tb, passes, tc, 54, false);
        {  // A two-bit 3, which no copy holds, reads as +2: element 0 of group 0.
            std::vector<uint8_t> c3 = c;
            c3[0] |= 3;
            const cmf_tensor_view t3 = view(CMF_DTYPE_MEM_Q1T_PASSES, shape, c3);
            std::vector<int8_t> codes(cols);
            std::vector<float> scales(cols / 32), d3(cols);
            passes.int8_rows(t3, 0, 1, codes.data(), scales.data());
            passes.dequantize_rows(t3, 0, 1, d3.data());
            CHECK(codes[0] == 2);
            CHECK(bits(d3[0]) == bits(scales[0] + scales[0]));
            CHECK(std::memcmp(d3.data() + 1, db.data() + 1, (cols - 1) * sizeof(float)) == 0);
        }
        // A digit byte the decoder rejects fails the copy with its error.
        b[2] = 250;
        cmf_error *bad = vt->decode_copy(cctx, &tb, c.data(), n, &got, &id);
        REQUIRE(bad != nullptr);
        CHECK(cmf_error_code(bad) == CMF_ERR_PARSE);
        CHECK(std::string(cmf_error_message(bad)).find("not a valid digit group") != std::string::npos);
        cmf_error_free(bad);
    }
}

TEST_CASE("roundtrip: q1s's decode copy (q1s_passes) gives every member the values q1s gives") {
    namespace k = cmf::codecs::kernels;
    const Dtype &q1s = dtype(CMF_DTYPE_Q1S), &passes = dtype(CMF_DTYPE_MEM_Q1S_PASSES);
    check_passes_shapes(passes);
    uint64_t n = 7;
    {  // no decode layout: rows that are not whole steps, a list that does not ascend
        const Q1sSample narrow = q1s_sample(4, 96, 60, "keep=0.05");
        CHECK(q1s.decode_layout(view(CMF_DTYPE_Q1S, {4, 96}, narrow.bytes), &n) == -1);
        CHECK(n == 0);
        Q1sSample q = q1s_sample(4, 512, 61, "keep=0.05");
        REQUIRE(q.count >= 2);
        std::swap_ranges(q.bytes.begin() + q.base + 4, q.bytes.begin() + q.base + 10, q.bytes.begin() + q.base + 10);
        CHECK(q1s.decode_layout(view(CMF_DTYPE_Q1S, {4, 512}, q.bytes), &n) == -1);
        // an outlier the base value plus its f32 correction would not give
        // back (0.000977 in a group whose scale is 65504): no copy
        Q1sSample far = q1s_sample(4, 512, 61, "keep=0.05");
        REQUIRE(q1s.decode_layout(view(CMF_DTYPE_Q1S, {4, 512}, far.bytes), &n) == CMF_DTYPE_MEM_Q1S_PASSES);
        uint32_t idx;
        std::memcpy(&idx, far.bytes.data() + far.base + 4 + 6, 4);
        const uint16_t big = 0x7BFF, small = 0x1400;
        std::memcpy(far.bytes.data() + 6 * (idx / 32), &big, 2);
        std::memcpy(far.bytes.data() + far.base + 4 + 6 + 4, &small, 2);
        CHECK(q1s.decode_layout(view(CMF_DTYPE_Q1S, {4, 512}, far.bytes), &n) == -1);
    }
    if (!k::q1_passes_kernel()) {
        const Q1sSample q = q1s_sample(2, 512, 62, "keep=0.05");
        CHECK(q1s.decode_layout(view(CMF_DTYPE_Q1S, {2, 512}, q.bytes), &n) == -1);
        return;  // the copy is made only where q1_passes's kernel runs
    }
    void *cctx = nullptr;
    const cmf_codec_vt *vt = runtime().host_api()->find_codec(runtime().host_api()->host_ctx, CMF_DTYPE_Q1S, &cctx);
    REQUIRE(vt != nullptr);
    struct Case {
        std::vector<uint64_t> shape;
        const char *options;
    };
    // Rows of 0 to past 16 entries, slices whole and cut (3, 17, 40 rows),
    // no list at all.
    for (const Case &cs : {Case{{3, 512}, "keep=0.01"}, Case{{17, 1024}, "keep=0.05"}, Case{{40, 3072}, "keep=0.01"},
                           Case{{20, 512}, "keep=0"}}) {
        CAPTURE(cs.shape[0]);
        CAPTURE(cs.shape[1]);
        CAPTURE(cs.options);
        const uint64_t rows = cs.shape[0], cols = cs.shape[1];
        const Q1sSample q = q1s_sample(rows, cols, 63, cs.options);
        const cmf_tensor_view tb = view(CMF_DTYPE_Q1S, cs.shape, q.bytes);
        int32_t id = -1;
        REQUIRE(vt->decode_copy(cctx, &tb, nullptr, 0, &n, &id) == nullptr);
        REQUIRE(id == CMF_DTYPE_MEM_Q1S_PASSES);
        // the base, the tables, then whole steps: each window's rows by
        // descending outlier count 16 to a slice, a slice as many steps as
        // its fullest row has outliers
        const uint64_t slices = (rows + 15) / 16;
        const uint64_t steps_at = (6 * rows * cols / 32 + 4 * (slices + 1) + 16 * slices + 63) / 64 * 64;
        std::vector<uint64_t> per_row(rows, 0);
        for (uint32_t e = 0; e < q.count; ++e) {
            uint32_t idx;
            std::memcpy(&idx, q.bytes.data() + q.base + 4 + 6 * e, 4);
            ++per_row[idx / cols];
        }
        uint64_t want_steps = 0;
        for (uint64_t w0 = 0; w0 < rows; w0 += 64) {
            std::vector<uint64_t> win(per_row.begin() + int64_t(w0), per_row.begin() + int64_t(std::min(rows, w0 + 64)));
            std::sort(win.rbegin(), win.rend());
            for (uint64_t q16 = 0; q16 < win.size(); q16 += 16) want_steps += win[q16];
        }
        REQUIRE(n == steps_at + 96 * want_steps);
        std::vector<uint8_t> c = copy_into_room(vt, cctx, tb, n);
        uint64_t got = 0;
        const cmf_tensor_view tc = view(CMF_DTYPE_MEM_Q1S_PASSES, cs.shape, c);
        passes.validate(tc);
        // Its base is q1's copy of the base tiles, byte for byte.
        std::vector<uint8_t> base_q1(q.bytes.begin(), q.bytes.begin() + int64_t(q.base)), base_copy(q.base);
        const cmf_tensor_view tq1 = view(CMF_DTYPE_Q1, cs.shape, base_q1);
        REQUIRE(dtype(CMF_DTYPE_Q1).decode_layout(tq1, &got) == CMF_DTYPE_MEM_Q1_PASSES);
        dtype(CMF_DTYPE_Q1).decode_copy(tq1, base_copy.data());
        CHECK(std::memcmp(base_copy.data(), c.data(), q.base) == 0);
        // The same products as q1s's kernels, summed in another order.
        check_copy_members(q1s, tb, passes, tc, 64, false, {1, 3}, false);
    }
    {  // a malformed copy: a step table that does not reach its steps or
       // decreases, a lane naming a row twice or one past the tensor
        const uint64_t rows = 40;
        const Q1sSample q = q1s_sample(rows, 512, 65, "keep=0.05");
        const cmf_tensor_view tb = view(CMF_DTYPE_Q1S, {rows, 512}, q.bytes);
        REQUIRE(q1s.decode_layout(tb, &n) == CMF_DTYPE_MEM_Q1S_PASSES);
        std::vector<uint8_t> c(n);
        q1s.decode_copy(tb, c.data());
        const uint64_t table = 6 * rows * 512 / 32, lanes = table + 4 * 4;
        passes.validate(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, c));
        std::vector<uint8_t> shorter(c.begin(), c.end() - 96);
        CHECK_THROWS_WITH(passes.validate(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, shorter)), doctest::Contains("step table"));
        std::vector<uint8_t> ragged(c.begin(), c.end() - 1);
        CHECK_THROWS_WITH(passes.validate(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, ragged)), doctest::Contains("whole steps"));
        std::vector<float> x = gaussian(512, 66);
        float y[rows];
        std::vector<uint8_t> twice = c;
        twice[lanes + 1] = twice[lanes];
        CHECK_THROWS_WITH(passes.validate(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, twice)), doctest::Contains("named twice"));
        std::vector<uint8_t> past = c;
        past[lanes + 16 * 2 + 3] = 45;  // rows 40..63 of the window do not exist
        CHECK_THROWS_WITH(passes.validate(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, past)), doctest::Contains("out of range"));
        // The members read them without a fault (the sanitizer build
        // checks): a lane past the rows is left out.
        for (const std::vector<uint8_t> *m : {&twice, &past}) {
            passes.matmul_rows(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, *m), x.data(), 512, 1, 0, rows, y, rows);
            std::vector<float> d(rows * 512);
            passes.dequantize_rows(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, *m), 0, rows, d.data());
        }
        uint32_t first1;
        std::memcpy(&first1, c.data() + table + 4, 4);
        REQUIRE(first1 > 0);
        std::vector<uint8_t> down = c;
        const uint32_t less = first1 - 1;
        std::memcpy(down.data() + table + 8, &less, 4);  // slice 1 ends before it starts
        CHECK_THROWS_WITH(passes.matmul_rows(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, down), x.data(), 512, 1, 0, rows, y, rows),
                          doctest::Contains("decreases at slice 1"));
        const uint32_t beyond = uint32_t((c.size() - table) / 96 + 1000);
        std::memcpy(c.data() + table + 4, &beyond, 4);  // slice 0 ends past every step
        CHECK_THROWS_WITH(passes.dequantize_rows(view(CMF_DTYPE_MEM_Q1S_PASSES, {rows, 512}, c), 0, 1, x.data()),
                          doctest::Contains("slice 0 ends past"));
    }
}

TEST_CASE("roundtrip: q1s facts reach the views of a model opened from a file, and only for a list that ascends") {
    // The host validates each tensor at open through validate_facts and
    // hands the answer out in every view of it.
    const uint64_t rows = 4, cols = 64;
    const std::vector<uint64_t> shape{rows, cols};
    const auto [sorted, base, count] = q1s_sample(rows, cols, 13, "keep=0.05");
    REQUIRE(count >= 2);
    std::vector<uint8_t> swapped = sorted;
    std::swap_ranges(swapped.begin() + base + 4, swapped.begin() + base + 10, swapped.begin() + base + 10);
    const char *header =
        R"({"format":"cmf","version":2,"arch":{"arch_name":"tiny-test","hidden_size":64,"intermediate_size":4,)"
        R"("num_layers":1,"num_attention_heads":1,"num_kv_heads":1,"head_dim":64,"vocab_size":10,)"
        R"("layer_types":["FullAttention"],"rms_norm_eps":1e-6,"norm_style":"qwen","rope_theta":10000.0,)"
        R"("tie_word_embeddings":false,"partial_rotary_factor":1.0,"max_position_embeddings":64,)"
        R"("linear_conv_kernel_dim":null,"linear_num_key_heads":null,"linear_num_value_heads":null},"quant_type":"F16"})";
    char dir[] = "/tmp/cmf-q1s-facts.XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    const std::string path = std::string(dir) + "/facts.cmf";
    cmf_writer_options o;
    cmf_writer_options_init(&o);
    cmf_writer *wr = nullptr;
    cmf_runtime *rt = static_cast<cmf_runtime *>(&runtime());
    if (cmf_error *e = cmf_writer_create(rt, path.c_str(), header, std::strlen(header), &o, &wr)) FAIL(std::string(cmf_error_message(e)));
    CHECK(cmf_writer_add_tensor(wr, "model.layers.0.mlp.up_proj.weight", CMF_DTYPE_Q1S, 2, shape.data(), sorted.data(),
                                sorted.size()) == nullptr);
    CHECK(cmf_writer_add_tensor(wr, "model.layers.0.mlp.gate_proj.weight", CMF_DTYPE_Q1S, 2, shape.data(),
                                swapped.data(), swapped.size()) == nullptr);
    CHECK(cmf_writer_finish(wr) == nullptr);
    cmf_writer_free(wr);
    {
        cmf::container::Model m;
        cmf::container::Model::open(m, runtime(), path, 0);
        const cmf::container::TensorRec *up = m.find("model.layers.0.mlp.up_proj.weight");
        const cmf::container::TensorRec *gate = m.find("model.layers.0.mlp.gate_proj.weight");
        REQUIRE(up != nullptr);
        REQUIRE(gate != nullptr);
        CHECK(up->view().facts == 1u);
        CHECK(gate->view().facts == 0u);
    }
    std::remove(path.c_str());
    rmdir(dir);
}

TEST_CASE("roundtrip: vbit groups decode MSB-first codes of every width, read only their bytes, on every ISA") {
    // Codes end exactly at a page whose successor is unmapped, so a read
    // past a group's 4*b bytes faults. Values against a scalar reading of
    // the MSB-first bit stream; the int8 dot (dot_vbit_xq) against the exact
    // integer sums of (u - L) * q, in double, up to f32 summation.
    namespace k = cmf::codecs::kernels;
    const long page = sysconf(_SC_PAGESIZE);
    void *map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(map != MAP_FAILED);
    REQUIRE(mprotect(static_cast<char *>(map) + page, page, PROT_NONE) == 0);
    struct Isa {
        const char *name;
        decltype(&k::portable::dequant_vbit_groups) dequant;
        decltype(&k::portable::dot_vbit_xq) dot;
    };
    std::vector<Isa> isas{{"portable", &k::portable::dequant_vbit_groups, &k::portable::dot_vbit_xq}};
    for (const k::SimdKernels &set : k::simd_kernels()) isas.push_back({set.isa, set.dequant_vbit_groups, set.dot_vbit_xq});
    std::mt19937 rng(8);
    for (unsigned b : {3u, 4u, 5u, 6u, 8u}) {
        for (uint64_t groups : {1u, 3u, 21u, 32u}) {
            CAPTURE(b);
            CAPTURE(groups);
            const uint64_t n = 4 * b * groups;
            uint8_t *codes = static_cast<uint8_t *>(map) + page - n;
            for (uint64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(rng());
            if (groups > 1) std::memset(codes + 4 * b, 0xFF, 4 * b);  // a group of all-ones codes
            std::vector<uint8_t> scales(2 * groups);
            for (uint64_t g = 0; g < groups; ++g) {
                uint16_t h = cmf::codecs::f32_to_f16(0.001f * static_cast<float>(g + 1) * (g % 2 ? -1.0f : 1.0f));
                std::memcpy(scales.data() + 2 * g, &h, 2);
            }
            std::vector<float> want(32 * groups), x = gaussian(32 * groups, b * 100 + static_cast<uint32_t>(groups), 1.0f);
            const int32_t L = (1 << (b - 1)) - 1;
            for (uint64_t i = 0; i < 32 * groups; ++i) {
                uint32_t u = 0;
                for (unsigned j = 0; j < b; ++j) {
                    const uint64_t bit = i * b + j;
                    u = (u << 1) | ((codes[bit / 8] >> (7 - bit % 8)) & 1u);
                }
                uint16_t h;
                std::memcpy(&h, scales.data() + 2 * (i / 32), 2);
                want[i] = static_cast<float>(static_cast<int32_t>(u) - L) * cmf::codecs::f16_to_f32(h);
            }
            std::vector<int8_t> xq(32 * groups);
            std::vector<float> xd(groups);
            std::vector<int32_t> xo(8 * groups);
            k::portable::quantize_x(x.data(), 32 * groups, k::XOrder::natural, xq.data(), xd.data());
            k::portable::i8_offset(xq.data(), groups, xo.data());
            double want_dot = 0, mag = 0;
            for (uint64_t g = 0; g < groups; ++g) {
                int64_t isum = 0;
                for (uint64_t i = 32 * g; i < 32 * g + 32; ++i) {
                    uint16_t h;
                    std::memcpy(&h, scales.data() + 2 * g, 2);
                    isum += int64_t(std::lround(want[i] / cmf::codecs::f16_to_f32(h))) * xq[i];
                }
                uint16_t h;
                std::memcpy(&h, scales.data() + 2 * g, 2);
                const double term = double(cmf::codecs::f16_to_f32(h)) * xd[g] * double(isum);
                want_dot += term;
                mag += std::fabs(term);
            }
            for (const Isa &isa : isas) {
                CAPTURE(isa.name);
                std::vector<float> got(32 * groups + 1, -7.0f);
                isa.dequant(codes, b, scales.data(), groups, got.data());
                CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
                CHECK(got.back() == -7.0f);
                const float dot = isa.dot(codes, b, scales.data(), xq.data(), xo.data(), xd.data(), groups);
                CHECK(std::fabs(dot - want_dot) <= 1e-5 * mag + 1e-30);
            }
            if (b <= 6) {  // the int8 view: u - L, every ISA the same bytes
                std::vector<int8_t> view(32 * groups + 1, 99);
                k::portable::unpack_vbit_groups(codes, b, groups, view.data());
                for (uint64_t i = 0; i < 32 * groups; ++i) {
                    uint16_t h;
                    std::memcpy(&h, scales.data() + 2 * (i / 32), 2);
                    CHECK(float(view[i]) * cmf::codecs::f16_to_f32(h) == want[i]);
                }
                CHECK(view.back() == 99);
                for (const k::SimdKernels &set : k::simd_kernels()) {
                    std::vector<int8_t> other(32 * groups + 1, 99);
                    set.unpack_vbit_groups(codes, b, groups, other.data());
                    CHECK(other == view);
                }
            }
        }
    }
    munmap(map, 2 * page);
}

// The vbit_ro row kernels of the portable build and of every SIMD build
// this CPU runs, with the per-row dot and the x table they are held to.
struct VbitRowsIsa {
    const char *name;
    decltype(&cmf::codecs::kernels::portable::dot_vbit_xq) dot;
    decltype(&cmf::codecs::kernels::portable::rows_vbit_xq) rows;
    decltype(&cmf::codecs::kernels::portable::q4_pair_x_table) table;
};
std::vector<VbitRowsIsa> vbit_rows_isas() {
    namespace k = cmf::codecs::kernels;
    std::vector<VbitRowsIsa> isas{
        {"portable", &k::portable::dot_vbit_xq, &k::portable::rows_vbit_xq, &k::portable::q4_pair_x_table}};
    for (const k::SimdKernels &set : k::simd_kernels())
        isas.push_back({set.isa, set.dot_vbit_xq, set.rows_vbit_xq, set.q4_pair_x_table});
    return isas;
}

TEST_CASE("roundtrip: rows_vbit_xq gives each row its dot_vbit_xq, whatever its width and the rows beside it") {
    // Rows of mixed widths in runs and alone (the AVX-512 form takes each
    // width's offsets from the table vbit_width_offsets makes), row counts that leave 0-3 rows past
    // the last group of four, one row whose codes end at an unmapped page.
    // Each ISA's rows against its own per-row dots: equal up to the order
    // the 8 partial sums are added in (exactly, portable); a row's bits the
    // same alone as among others; y past the last row untouched.
    namespace k = cmf::codecs::kernels;
    const long page = sysconf(_SC_PAGESIZE);
    void *map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(map != MAP_FAILED);
    REQUIRE(mprotect(static_cast<char *>(map) + page, page, PROT_NONE) == 0);
    std::mt19937 rng(31);
    const unsigned pattern[] = {4, 4, 4, 5, 3, 4, 4, 6, 8, 8, 4, 3, 3, 4, 5, 4, 4, 4, 4, 6};
    for (uint64_t groups : {1u, 5u, 16u, 21u, 32u})
        for (uint64_t rows : {1u, 2u, 3u, 4u, 7u, 9u, 20u}) {
            CAPTURE(groups);
            CAPTURE(rows);
            std::vector<uint8_t> widths(rows);
            std::vector<std::vector<uint8_t>> store(rows);
            std::vector<const uint8_t *> codes(rows);
            for (uint64_t r = 0; r < rows; ++r) {
                widths[r] = uint8_t(pattern[(r * 7 + groups) % 20]);
                store[r].resize(4 * widths[r] * groups);
                for (auto &b : store[r]) b = static_cast<uint8_t>(rng());
                codes[r] = store[r].data();
            }
            // The last row's codes end at the unmapped page.
            const uint64_t last = 4 * widths[rows - 1] * groups;
            uint8_t *tail = static_cast<uint8_t *>(map) + page - last;
            std::memcpy(tail, store[rows - 1].data(), last);
            codes[rows - 1] = tail;
            std::vector<uint8_t> scales(2 * groups * rows);
            for (uint64_t i = 0; i < groups * rows; ++i) {
                const uint16_t h = cmf::codecs::f32_to_f16(0.002f * static_cast<float>(i % 13 + 1) * (i % 2 ? -1.0f : 1.0f));
                std::memcpy(scales.data() + 2 * i, &h, 2);
            }
            std::vector<float> x = gaussian(32 * groups, static_cast<uint32_t>(rng()), 1.0f), xd(groups);
            std::vector<int8_t> xq(32 * groups);
            std::vector<int32_t> xo(8 * groups), scratch(k::kVbitWidthOffsets * 8 * groups);
            k::portable::quantize_x(x.data(), 32 * groups, k::XOrder::natural, xq.data(), xd.data());
            k::portable::i8_offset(xq.data(), groups, xo.data());
            k::vbit_width_offsets(xo.data(), groups, scratch.data());
            std::vector<int8_t> x4(32 * groups);
            std::vector<int32_t> off4(8 * (groups / 2) + 1);
            k::vbit4_x(xq.data(), groups, x4.data(), off4.data());
            for (const VbitRowsIsa &isa : vbit_rows_isas()) {
                CAPTURE(isa.name);
                alignas(64) int8_t table[32 * 32];
                isa.table(x4.data(), off4.data(), groups, table);
                const k::VbitRowsX vx{scratch.data(), x4.data(), off4.data(), table};
                std::vector<float> y(rows + 1, -7.0f);
                isa.rows(codes.data(), widths.data(), scales.data(), xq.data(), xo.data(), xd.data(), groups, rows, vx,
                         y.data());
                CHECK(y[rows] == -7.0f);
                for (uint64_t r = 0; r < rows; ++r) {
                    CAPTURE(r);
                    const float one = isa.dot(codes[r], widths[r], scales.data() + 2 * groups * r, xq.data(), xo.data(),
                                              xd.data(), groups);
                    if (std::string(isa.name) == "portable") CHECK(std::memcmp(&one, &y[r], sizeof(float)) == 0);
                    else CHECK(std::fabs(one - y[r]) <= 1e-5f * std::fabs(one) + 1e-6f);
                    float alone = -7.0f;
                    isa.rows(codes.data() + r, widths.data() + r, scales.data() + 2 * groups * r, xq.data(), xo.data(),
                             xd.data(), groups, 1, vx, &alone);
                    CHECK(std::memcmp(&alone, &y[r], sizeof(float)) == 0);
                }
            }
            // The VBMI form of the widths 3, 5 and 6 gives the word decode's
            // bits (the same code bytes, the same sums in the same order).
            for (const k::SimdKernels &set : k::simd_kernels()) {
                CAPTURE(set.isa);
                alignas(64) int8_t table[32 * 32];
                set.q4_pair_x_table(x4.data(), off4.data(), groups, table);
                const k::VbitRowsX vx{scratch.data(), x4.data(), off4.data(), table};
                std::vector<float> with(rows, -7.0f), without(rows, -8.0f);
                k::set_avx512_extensions(false);
                set.rows_vbit_xq(codes.data(), widths.data(), scales.data(), xq.data(), xo.data(), xd.data(), groups, rows,
                                 vx, without.data());
                k::set_avx512_extensions(true);
                set.rows_vbit_xq(codes.data(), widths.data(), scales.data(), xq.data(), xo.data(), xd.data(), groups, rows,
                                 vx, with.data());
                CHECK(std::memcmp(with.data(), without.data(), rows * sizeof(float)) == 0);
            }
        }
    munmap(map, 2 * page);
}

TEST_CASE("roundtrip: width-4 vbit rows through the q4 kernel (rows_vbit_xq) equal dot_vbit_xq, on every ISA") {
    // The q4 kernel meets MSB-first codes through an x whose block halves
    // are swapped (vbit4_x) and offsets for u - 7: a half not swapped, a
    // bias of 8, or the unpaired last block's order wrong changes the sums.
    // Group counts reach the 512-bit steps, the 256-bit pairs and an odd
    // last group; row counts the one- and four-row passes. The portable form
    // gives dot_vbit_xq's bits; the SIMD ones its value up to f32 summation.
    namespace k = cmf::codecs::kernels;
    std::mt19937 rng(41);
    for (uint64_t groups : {1u, 2u, 3u, 5u, 8u, 9u, 16u, 17u, 32u, 33u})
        for (uint64_t rows : {1u, 3u, 4u, 5u, 17u, 20u}) {
            CAPTURE(groups);
            CAPTURE(rows);
            std::vector<uint8_t> codes(16 * groups * rows), scales(2 * groups * rows);
            for (auto &b : codes) b = static_cast<uint8_t>(rng());
            std::memset(codes.data(), 0xFF, 16);  // a group of all-ones codes (u = 15)
            for (uint64_t i = 0; i < groups * rows; ++i) {
                const uint16_t h = cmf::codecs::f32_to_f16(0.003f * static_cast<float>(i % 11 + 1) * (i % 3 ? 1.0f : -1.0f));
                std::memcpy(scales.data() + 2 * i, &h, 2);
            }
            std::vector<float> x = gaussian(32 * groups, static_cast<uint32_t>(rng()), 1.0f), xd(groups);
            std::vector<int8_t> xq(32 * groups), x4(32 * groups);
            std::vector<int32_t> xo(8 * groups), off4(8 * (groups / 2) + 1, 12345);
            k::portable::quantize_x(x.data(), 32 * groups, k::XOrder::natural, xq.data(), xd.data());
            k::portable::i8_offset(xq.data(), groups, xo.data());
            k::vbit4_x(xq.data(), groups, x4.data(), off4.data());
            CHECK(off4.back() == 12345);
            const std::vector<uint8_t> widths(rows, 4);
            std::vector<const uint8_t *> row_codes(rows);
            for (uint64_t r = 0; r < rows; ++r) row_codes[r] = codes.data() + 16 * groups * r;
            for (const VbitRowsIsa &isa : vbit_rows_isas()) {
                CAPTURE(isa.name);
                alignas(64) int8_t table[32 * 33];
                isa.table(x4.data(), off4.data(), groups, table);
                const k::VbitRowsX vx{nullptr, x4.data(), off4.data(), table};
                std::vector<float> y(rows + 1, -7.0f);
                isa.rows(row_codes.data(), widths.data(), scales.data(), xq.data(), xo.data(), xd.data(), groups, rows, vx,
                         y.data());
                CHECK(y[rows] == -7.0f);
                for (uint64_t r = 0; r < rows; ++r) {
                    CAPTURE(r);
                    const float want = k::portable::dot_vbit_xq(codes.data() + 16 * groups * r, 4,
                                                                scales.data() + 2 * groups * r, xq.data(), xo.data(),
                                                                xd.data(), groups);
                    if (std::string(isa.name) == "portable") CHECK(std::memcmp(&want, &y[r], sizeof(float)) == 0);
                    else CHECK(std::fabs(want - y[r]) <= 1e-5f * std::fabs(want) + 1e-6f);
                    float alone = -7.0f;
                    isa.rows(row_codes.data() + r, widths.data() + r, scales.data() + 2 * groups * r, xq.data(), xo.data(),
                             xd.data(), groups, 1, vx, &alone);
                    CHECK(std::memcmp(&alone, &y[r], sizeof(float)) == 0);
                }
            }
        }
}

TEST_CASE("roundtrip: ladder_scales builds each row's ladder and picks rungs by 5-bit codes, on every ISA") {
    // Codes packed LSB-first, 5 bits per group, rows code_stride bytes apart
    // (one spare byte of ones past each row, so a kernel that reads past a
    // row's codes picks a wrong rung); each row its own ladder, with and
    // without q2tp's zero rung; the rungs built here one product at a time.
    namespace k = cmf::codecs::kernels;
    std::mt19937 rng(5);
    float first[k::kLadderMaxRows], ratio[k::kLadderMaxRows];
    for (unsigned j = 0; j < k::kLadderMaxRows; ++j) first[j] = 0.001f * static_cast<float>(j + 1), ratio[j] = 1.1f + 0.01f * static_cast<float>(j);
    for (bool zero_rung : {false, true})
    for (uint64_t groups : {1u, 7u, 8u, 9u, 15u, 16u, 17u, 32u, 45u, 96u}) {
        const uint64_t code_stride = (5 * groups + 7) / 8 + 1;
        for (unsigned rows = 1; rows <= k::kLadderMaxRows; ++rows) {
            CAPTURE(zero_rung);
            CAPTURE(groups);
            CAPTURE(rows);
            std::vector<uint8_t> codes(code_stride * rows, 0);
            std::vector<float> want(groups * rows);
            for (unsigned j = 0; j < rows; ++j) {
                float t[32] = {};
                t[zero_rung ? 1 : 0] = first[j];
                for (int c = zero_rung ? 2 : 1; c < 32; ++c) t[c] = t[c - 1] * ratio[j];
                for (uint64_t g = 0; g < groups; ++g) {
                    const uint32_t c = rng() % 32;
                    want[groups * j + g] = t[c];
                    for (int b = 0; b < 5; ++b)
                        if (c >> b & 1) codes[code_stride * j + (5 * g + b) / 8] |= uint8_t(1u << ((5 * g + b) % 8));
                }
                codes[code_stride * j + code_stride - 1] = 0xff;  // the spare byte
            }
            std::vector<float> yp(groups * rows + 1, -7.0f);
            k::portable::ladder_scales(first, ratio, zero_rung, codes.data(), code_stride, groups, rows, yp.data());
            CHECK(std::memcmp(yp.data(), want.data(), want.size() * sizeof(float)) == 0);
            CHECK(yp[groups * rows] == -7.0f);
            for (const k::SimdKernels &isa : k::simd_kernels()) {
                CAPTURE(isa.isa);
                std::vector<float> ya(groups * rows + 1, -7.0f);
                isa.ladder_scales(first, ratio, zero_rung, codes.data(), code_stride, groups, rows, ya.data());
                CHECK(std::memcmp(ya.data(), yp.data(), yp.size() * sizeof(float)) == 0);
            }
        }
    }
}

TEST_CASE("roundtrip: ladder_scales_powers gives every ISA the same rungs, within a few ulps of the sequential ladder") {
    // Rungs from the ratio's binary powers: lanes that take a power their
    // code does not have, or the powers multiplied in another order, change
    // bits against the portable form; the zero rung and a shift by one lane
    // change the values. Ratios from 2^-4 to 2^4 cover ladders that shrink
    // and grow; against the sequential products each rung is within 2^-17
    // relative (31 roundings either way at most; the worst of these cases
    // is 2^-19.7).
    namespace k = cmf::codecs::kernels;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> lg(-4.0f, 4.0f), lr(-0.2f, 0.2f);
    float first[k::kLadderMaxRows], ratio[k::kLadderMaxRows];
    for (unsigned j = 0; j < k::kLadderMaxRows; ++j) first[j] = std::exp2(lg(rng)), ratio[j] = std::exp2(lr(rng));
    for (bool zero_rung : {false, true})
        for (uint64_t groups : {1u, 15u, 16u, 17u, 32u, 96u}) {
            const uint64_t code_stride = (5 * groups + 7) / 8;
            for (unsigned rows : {1u, 7u, 16u, 33u, k::kLadderMaxRows}) {
                CAPTURE(zero_rung);
                CAPTURE(groups);
                CAPTURE(rows);
                std::vector<uint8_t> codes(code_stride * rows);
                for (auto &b : codes) b = static_cast<uint8_t>(rng());
                std::vector<float> exact(groups * rows), yp(groups * rows);
                k::portable::ladder_scales(first, ratio, zero_rung, codes.data(), code_stride, groups, rows, exact.data());
                k::portable::ladder_scales_powers(first, ratio, zero_rung, codes.data(), code_stride, groups, rows, yp.data());
                float worst = 0.0f;
                for (size_t i = 0; i < yp.size(); ++i) {
                    if (exact[i] == 0.0f) {
                        CHECK(yp[i] == 0.0f);
                        continue;
                    }
                    worst = std::max(worst, std::fabs(yp[i] - exact[i]) / std::fabs(exact[i]));
                }
                CHECK(worst <= 0x1p-17f);
                for (const k::SimdKernels &isa : k::simd_kernels()) {
                    CAPTURE(isa.isa);
                    std::vector<float> ya(groups * rows + 1, -7.0f);
                    isa.ladder_scales_powers(first, ratio, zero_rung, codes.data(), code_stride, groups, rows, ya.data());
                    CHECK(std::memcmp(ya.data(), yp.data(), yp.size() * sizeof(float)) == 0);
                    CHECK(ya[groups * rows] == -7.0f);
                }
            }
        }
}

// rows_q4tp_xq (Two = false) or rows_q2tp_xq against each ISA's two steps,
// ladder_scales_powers then rows_q4_groups_xq / rows_q2_groups_xq, 64 rows
// at a time: the same bits, with the AVX-512 extensions on and off. Group
// counts reach every step of the kernels; a spare byte of ones past each
// row's codes makes a pick that reads past them take a wrong rung; rows past
// 64 cross a ladder block, 5 and 70 leave rows past the last pass of four;
// y past the last row must stay as it was; a row's bits do not depend on
// the rows beside it.
template <bool Two>
void check_tp_rows(uint32_t seed, std::initializer_list<uint64_t> group_counts) {
    namespace k = cmf::codecs::kernels;
    constexpr uint64_t kChunk = Two ? 8 : 16;
    constexpr k::XOrder kOrder = Two ? k::XOrder::q2_quads : k::XOrder::q4_pair_blocks;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> lg(-12.0f, -4.0f), lr(0.05f, 0.3f);
    for (bool extensions : {true, false})
    for (uint64_t g : group_counts)
        for (uint64_t rows : {1u, 5u, 17u, 70u}) {
            k::set_avx512_extensions(extensions);
            CAPTURE(extensions);
            CAPTURE(g);
            CAPTURE(rows);
            const uint64_t code_stride = (5 * g + 7) / 8 + 1;
            std::vector<uint8_t> chunks(kChunk * g * rows), codes(code_stride * rows);
            for (auto &b : chunks) b = static_cast<uint8_t>(rng());
            for (auto &b : codes) b = static_cast<uint8_t>(rng());
            for (uint64_t r = 0; r < rows; ++r) codes[code_stride * r + code_stride - 1] = 0xff;
            std::vector<float> first(rows), ratio(rows);
            for (uint64_t r = 0; r < rows; ++r) first[r] = std::exp2(lg(rng)), ratio[r] = std::exp2(lr(rng));
            std::vector<float> x = gaussian(32 * g, static_cast<uint32_t>(rng()), 0.0f), xd(g);
            std::vector<int8_t> xq(32 * g);
            std::vector<int32_t> xo(Two ? 8 * g : 8 * (g / 2));
            k::quantize_x(x.data(), 32 * g, kOrder, xq.data(), xd.data());
            if constexpr (Two)
                k::q2_offset(xq.data(), g, xo.data());
            else
                k::q4_pair_offset(xq.data(), g, xo.data());
            std::vector<float> scratch(k::kLadderMaxRows * g);
            auto two_steps = [&](auto powers, auto row_kernel, float *y) {
                std::vector<float> scales(k::kLadderMaxRows * g);
                for (uint64_t r0 = 0; r0 < rows; r0 += k::kLadderMaxRows) {
                    const unsigned n = unsigned(std::min<uint64_t>(k::kLadderMaxRows, rows - r0));
                    powers(first.data() + r0, ratio.data() + r0, Two, codes.data() + code_stride * r0, code_stride, g,
                           n, scales.data());
                    row_kernel(chunks.data() + kChunk * g * r0, scales.data(), xq.data(), xo.data(), xd.data(), g, n,
                               y + r0);
                }
            };
            auto fused = [&](auto kernel, uint64_t r, uint64_t n, float *y) {
                kernel(chunks.data() + kChunk * g * r, first.data() + r, ratio.data() + r, codes.data() + code_stride * r,
                       code_stride, xq.data(), xo.data(), xd.data(), g, n, scratch.data(), y);
            };
            std::vector<float> want(rows + 1, -7.0f), got(rows + 1, -7.0f);
            if constexpr (Two) {
                two_steps(k::portable::ladder_scales_powers, k::portable::rows_q2_groups_xq, want.data());
                fused(k::portable::rows_q2tp_xq, 0, rows, got.data());
            } else {
                two_steps(k::portable::ladder_scales_powers, k::portable::rows_q4_groups_xq, want.data());
                fused(k::portable::rows_q4tp_xq, 0, rows, got.data());
            }
            CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
            for (const k::SimdKernels &isa : k::simd_kernels()) {
                CAPTURE(isa.isa);
                const auto kernel = Two ? isa.rows_q2tp_xq : isa.rows_q4tp_xq;
                std::vector<float> ws(rows + 1, -7.0f), gs(rows + 1, -7.0f);
                two_steps(isa.ladder_scales_powers, Two ? isa.rows_q2_groups_xq : isa.rows_q4_groups_xq, ws.data());
                fused(kernel, 0, rows, gs.data());
                CHECK(std::memcmp(gs.data(), ws.data(), gs.size() * sizeof(float)) == 0);
                // Within f32 summation order of the portable form.
                for (uint64_t r = 0; r < rows; ++r) CHECK(std::fabs(gs[r] - want[r]) <= 1e-3f * (std::fabs(want[r]) + 1e-3f));
                for (uint64_t r = 0; r < rows; r += 3) {
                    float alone = -7.0f;
                    fused(kernel, r, 1, &alone);
                    CHECK(std::memcmp(&alone, &gs[r], sizeof(float)) == 0);
                }
            }
        }
    cmf::codecs::kernels::set_avx512_extensions(true);
}

TEST_CASE("roundtrip: rows_q4tp_xq gives the bits of ladder_scales_powers then rows_q4_groups_xq, on every ISA") {
    // The AVX-512 build picks each row's scales inside its pass over x, 16
    // groups a step, then 8, then pairs one by one and an odd last group;
    // the others pick the scales first.
    check_tp_rows<false>(23, {1u, 2u, 7u, 8u, 9u, 15u, 16u, 17u, 24u, 25u, 31u, 32u, 33u, 40u, 48u, 96u, 97u});
}

TEST_CASE("roundtrip: rows_q2tp_xq gives the bits of ladder_scales_powers then rows_q2_groups_xq, on every ISA") {
    // With GFNI the AVX-512 build picks each pass's four rows' scales just
    // before the pass (8 groups a step, a last step short of 8); without it
    // (the "extensions off" switch) and elsewhere the scales come first.
    check_tp_rows<true>(29, {1u, 7u, 8u, 9u, 16u, 17u, 32u, 33u, 96u, 97u});
}

TEST_CASE("roundtrip: row-range kernels equal the per-row dots, row for row") {
    // rows_* sum four rows per horizontal-add tree: a lane mix-up would put a
    // row's sum in its neighbour's y. Every row differs, one row has a NaN
    // scale (its y alone is NaN), and row counts leave 0-3 rows past the last
    // group of four. Each ISA's row kernel against its own per-row dot (up
    // to f32 summation order), and each SIMD one against the portable one.
    namespace k = cmf::codecs::kernels;
    // Equal up to f32 summation order: within 1e-5 of the row's sum of |terms|
    // (a sum can cancel to far below its terms; a row's sum landing in the
    // wrong y misses by about the size of the sum itself).
    auto near = [](float a, float b, double mag) { return std::fabs(double(a) - b) <= 1e-5 * mag; };
    static const std::vector<k::SimdKernels> simd = k::simd_kernels();
    std::vector<const k::SimdKernels *> isas;
    for (const k::SimdKernels &set : simd) isas.push_back(&set);
    if (isas.empty()) isas.push_back(nullptr);  // the portable checks alone
    for (const k::SimdKernels *isa : isas) {
    CAPTURE((isa ? isa->isa : "portable only"));
    std::mt19937 rng(11);
    const bool simd_on = isa != nullptr;
    for (uint64_t rows : {1u, 3u, 4u, 9u, 14u, 17u, 37u}) {
        const uint64_t nan_row = rows / 2;
        // q8: any column count, f16 row scales.
        for (uint64_t n : {31u, 64u, 77u, 1024u}) {
            CAPTURE(rows);
            CAPTURE(n);
            std::vector<int8_t> w(rows * n);
            for (auto &v : w) v = static_cast<int8_t>(rng());
            std::vector<uint8_t> sc(2 * rows);
            for (uint64_t r = 0; r < rows; ++r) {
                uint16_t h = cmf::codecs::f32_to_f16(0.01f * static_cast<float>(r + 1));
                if (r == nan_row) h = 0x7e00;
                std::memcpy(sc.data() + 2 * r, &h, 2);
            }
            std::vector<float> x = gaussian(n, static_cast<uint32_t>(rng()), 0.0f), xd(k::x_blocks(n));
            std::vector<int8_t> xq(32 * xd.size());
            k::quantize_x(x.data(), n, k::XOrder::natural, xq.data(), xd.data());
            std::vector<int32_t> xo(xd.size());
            k::i8_block_offsets(xq.data(), xd.size(), xo.data());
            std::vector<float> yp(rows + 1, -7.0f), ya(rows + 1, -7.0f);
            k::portable::rows_i8_xq(w.data(), n, sc.data(), xq.data(), xo.data(), xd.data(), n, rows, yp.data());
            if (simd_on) isa->rows_i8_xq(w.data(), n, sc.data(), xq.data(), xo.data(), xd.data(), n, rows, ya.data());
            // A row's bits do not depend on where its range starts (the
            // backend cuts ranges differently for fused weights).
            if (simd_on && rows > 1) {
                std::vector<float> ys(rows, -7.0f);
                isa->rows_i8_xq(w.data() + n, n, sc.data() + 2, xq.data(), xo.data(), xd.data(), n, rows - 1, ys.data());
                CHECK(std::memcmp(ys.data(), ya.data() + 1, (rows - 1) * sizeof(float)) == 0);
                CHECK(ys[rows - 1] == -7.0f);
            }
            for (uint64_t r = 0; r < rows; ++r) {
                CAPTURE(r);
                const float s = cmf::codecs::f16_to_f32(static_cast<uint16_t>(sc[2 * r] | sc[2 * r + 1] << 8));
                const float want = s * k::portable::dot_i8_xq(w.data() + r * n, xq.data(), xd.data(), n);
                double mag = 0;
                for (uint64_t c = 0; c < n; ++c) mag += std::fabs(double(s) * w[r * n + c] * xq[c] * xd[c / 32]);
                CHECK((r == nan_row ? std::isnan(yp[r]) : yp[r] == want));
                if (!simd_on) continue;
                const float want_a = s * isa->dot_i8_xq(w.data() + r * n, xq.data(), xd.data(), n);
                CHECK((r == nan_row ? std::isnan(ya[r]) : near(ya[r], want_a, mag) && near(ya[r], want, mag)));
            }
            CHECK(yp[rows] == -7.0f);
            CHECK((!simd_on || ya[rows] == -7.0f));
        }
        // q4 split and tiled: whole groups, one NaN f16 group scale in nan_row.
        for (uint64_t g : {1u, 3u, 13u, 32u}) {
            CAPTURE(rows);
            CAPTURE(g);
            std::vector<uint8_t> split(18 * g * rows), tiled(18 * g * rows);
            for (auto &b : split) b = static_cast<uint8_t>(rng());
            for (auto &b : tiled) b = static_cast<uint8_t>(rng());
            uint8_t *ss = split.data() + 16 * g * rows;
            for (uint64_t i = 0; i < g * rows; ++i) ss[2 * i + 1] &= 0x3b, tiled[18 * i + 1] &= 0x3b;  // finite f16 scales
            ss[2 * (g * nan_row + g - 1)] = 0x00, ss[2 * (g * nan_row + g - 1) + 1] = 0x7e;
            tiled[18 * (g * nan_row)] = 0x00, tiled[18 * (g * nan_row) + 1] = 0x7e;
            std::vector<float> x = gaussian(32 * g, static_cast<uint32_t>(rng()), 0.0f), xd(g);
            std::vector<int8_t> xq(32 * g);
            std::vector<int32_t> xb(8 * (g / 2));
            k::quantize_x(x.data(), 32 * g, k::XOrder::q4_pair_blocks, xq.data(), xd.data());
            k::q4_pair_offset(xq.data(), g, xb.data());
            float xmax = 0;
            for (float v : x) xmax = std::max(xmax, std::fabs(v));
            // The split layout's scales as f32 (q4tp's rows_q4_groups_xq).
            std::vector<float> fs(g * rows);
            for (uint64_t i = 0; i < g * rows; ++i)
                fs[i] = cmf::codecs::f16_to_f32(static_cast<uint16_t>(ss[2 * i] | ss[2 * i + 1] << 8));
            // layout 0: split (q4_block), 1: tiled (q4_tiled), 2: nibbles with f32 scales (q4tp).
            for (int layout = 0; layout < 3; ++layout) {
                const bool tiled_layout = layout == 1;
                CAPTURE(layout);
                auto row_dot = [&](bool use_simd, uint64_t r) {
                    if (layout == 2)
                        return use_simd ? isa->dot_q4_groups_xq(split.data() + 16 * g * r, fs.data() + g * r, xq.data(),
                                                                xb.data(), xd.data(), g)
                                        : k::portable::dot_q4_groups_xq(split.data() + 16 * g * r, fs.data() + g * r,
                                                                        xq.data(), xb.data(), xd.data(), g);
                    if (tiled_layout)
                        return use_simd ? isa->dot_q4_tiled_xq(tiled.data() + 18 * g * r, xq.data(), xb.data(), xd.data(), g)
                                        : k::portable::dot_q4_tiled_xq(tiled.data() + 18 * g * r, xq.data(), xb.data(), xd.data(), g);
                    const uint8_t *nib = split.data() + 16 * g * r, *sc = ss + 2 * g * r;
                    return use_simd ? isa->dot_q4_split_xq(nib, sc, xq.data(), xb.data(), xd.data(), g)
                                    : k::portable::dot_q4_split_xq(nib, sc, xq.data(), xb.data(), xd.data(), g);
                };
                auto row_kernel = [&](bool use_simd, float *y) {
                    if (layout == 2) {
                        if (use_simd) isa->rows_q4_groups_xq(split.data(), fs.data(), xq.data(), xb.data(), xd.data(), g, rows, y);
                        else k::portable::rows_q4_groups_xq(split.data(), fs.data(), xq.data(), xb.data(), xd.data(), g, rows, y);
                    } else if (tiled_layout) {
                        if (use_simd) isa->rows_q4_tiled_xq(tiled.data(), xq.data(), xb.data(), xd.data(), g, rows, y);
                        else k::portable::rows_q4_tiled_xq(tiled.data(), xq.data(), xb.data(), xd.data(), g, rows, y);
                    } else if (use_simd) {
                        isa->rows_q4_split_xq(split.data(), 16 * g, ss, 2 * g, xq.data(), xb.data(), xd.data(), g, rows, y);
                    } else {
                        k::portable::rows_q4_split_xq(split.data(), 16 * g, ss, 2 * g, xq.data(), xb.data(), xd.data(), g,
                                                      rows, y);
                    }
                };
                // sum |w| * max |x| bounds a row's sum of |terms| (up to x's rounding).
                auto row_mag = [&](uint64_t r) {
                    std::vector<float> scales(g), wd(32 * g);
                    for (uint64_t i = 0; i < g; ++i) {
                        const uint8_t *h = tiled_layout ? tiled.data() + 18 * (g * r + i) : ss + 2 * (g * r + i);
                        scales[i] = cmf::codecs::f16_to_f32(static_cast<uint16_t>(h[0] | h[1] << 8));
                    }
                    k::portable::dequant_q4_groups(tiled_layout ? tiled.data() + 18 * g * r + 2 : split.data() + 16 * g * r,
                                                   tiled_layout ? 18 : 16, scales.data(), g, wd.data());
                    double m = 0;
                    for (float v : wd) m += std::fabs(double(v)) * xmax * 1.01;
                    return m;
                };
                std::vector<float> yp(rows + 1, -7.0f), ya(rows + 1, -7.0f);
                row_kernel(false, yp.data());
                if (simd_on) row_kernel(true, ya.data());
                for (uint64_t r = 0; r < rows; ++r) {
                    CAPTURE(r);
                    CHECK((r == nan_row ? std::isnan(yp[r]) : yp[r] == row_dot(false, r)));
                    if (simd_on)
                        CHECK((r == nan_row ? std::isnan(ya[r])
                                            : near(ya[r], row_dot(true, r), row_mag(r)) &&
                                                  near(ya[r], row_dot(false, r), row_mag(r))));
                }
                CHECK(yp[rows] == -7.0f);
                CHECK((!simd_on || ya[rows] == -7.0f));
                // A row's bits do not depend on where its range starts (the
                // SIMD kernels run rows in groups of four, the last 1-3 alone):
                // each row again as a range of its own, and the rows from 1 on.
                if (simd_on) {
                    auto range = [&](uint64_t r0, uint64_t n, float *y) {
                        if (layout == 2)
                            isa->rows_q4_groups_xq(split.data() + 16 * g * r0, fs.data() + g * r0, xq.data(), xb.data(),
                                                   xd.data(), g, n, y);
                        else if (tiled_layout)
                            isa->rows_q4_tiled_xq(tiled.data() + 18 * g * r0, xq.data(), xb.data(), xd.data(), g, n, y);
                        else
                            isa->rows_q4_split_xq(split.data() + 16 * g * r0, 16 * g, ss + 2 * g * r0, 2 * g, xq.data(), xb.data(),
                                                  xd.data(), g, n, y);
                    };
                    std::vector<float> from1(rows, -7.0f);
                    if (rows > 1) range(1, rows - 1, from1.data() + 1);
                    if (layout == 0) {  // q4_rows: each row's scales after its nibbles, the same bits
                        std::vector<uint8_t> il(18 * g * rows);
                        for (uint64_t r = 0; r < rows; ++r) {
                            std::memcpy(il.data() + 18 * g * r, split.data() + 16 * g * r, 16 * g);
                            std::memcpy(il.data() + 18 * g * r + 16 * g, ss + 2 * g * r, 2 * g);
                        }
                        std::vector<float> yi(rows + 1, -7.0f);
                        isa->rows_q4_split_xq(il.data(), 18 * g, il.data() + 16 * g, 18 * g, xq.data(), xb.data(),
                                              xd.data(), g, rows, yi.data());
                        CHECK(std::memcmp(yi.data(), ya.data(), rows * sizeof(float)) == 0);
                        CHECK(yi[rows] == -7.0f);
                    }
                    for (uint64_t r = 0; r < rows; ++r) {
                        CAPTURE(r);
                        float alone = -7.0f;
                        range(r, 1, &alone);
                        CHECK(std::memcmp(&alone, &ya[r], sizeof(float)) == 0);
                        if (r > 0) CHECK(std::memcmp(&from1[r], &ya[r], sizeof(float)) == 0);
                    }
                }
            }
        }
    }
    }
}

TEST_CASE("roundtrip: the k-token q8 row kernel gives each token the bits it has alone, on every ISA") {
    // A batched decode pass must equal each sequence decoded alone: for k in
    // 1..17 (1-2: per token; 3-17: one to three token groups of the VNNI
    // form) and column counts
    // with 0-3 whole blocks past the last group of four and a partial last
    // block, rows_i8_xq_batch's y for token t is the bytes rows_i8_xq writes
    // for token t alone, on each ISA this CPU runs (ISA against itself: the
    // single-token kernel is what a lone decode runs). One row has a NaN
    // scale, one token an inf (its block scale NaN); nothing outside the
    // k x rows outputs is written.
    namespace k = cmf::codecs::kernels;
    static const std::vector<k::SimdKernels> simd = k::simd_kernels();
    struct Isa {
        const char *name;
        decltype(&k::portable::rows_i8_xq) rows;
        decltype(&k::portable::rows_i8_xq_batch) batch;
    };
    std::vector<Isa> isas{{"portable", &k::portable::rows_i8_xq, &k::portable::rows_i8_xq_batch}};
    for (const k::SimdKernels &set : simd) isas.push_back({set.isa, set.rows_i8_xq, set.rows_i8_xq_batch});
    std::mt19937 rng(29);
    for (const Isa &isa : isas) {
        CAPTURE(isa.name);
        for (uint64_t n : {31u, 64u, 96u, 160u, 200u, 1024u}) {
            for (uint64_t rows : {1u, 5u, 21u}) {
                CAPTURE(n);
                CAPTURE(rows);
                const uint64_t nb = k::x_blocks(n), ld = n + 3, ldy = rows + 2;
                std::vector<int8_t> w(rows * ld);
                for (auto &v : w) v = static_cast<int8_t>(rng());
                std::vector<uint8_t> sc(2 * rows);
                for (uint64_t r = 0; r < rows; ++r) {
                    uint16_t h = cmf::codecs::f32_to_f16(0.01f * static_cast<float>(r + 1));
                    if (rows > 1 && r == 3) h = 0x7e00;
                    std::memcpy(sc.data() + 2 * r, &h, 2);
                }
                constexpr uint64_t kMax = 17;
                std::vector<int8_t> xq(kMax * 32 * nb);
                std::vector<float> xd(kMax * nb);
                std::vector<int32_t> xo(kMax * nb);
                for (uint64_t t = 0; t < kMax; ++t) {
                    std::vector<float> x = gaussian(n, static_cast<uint32_t>(rng()), 0.01f);
                    if (t == 6) x[n / 2] = std::numeric_limits<float>::infinity();
                    k::quantize_x(x.data(), n, k::XOrder::natural, xq.data() + t * 32 * nb, xd.data() + t * nb);
                    k::i8_block_offsets(xq.data() + t * 32 * nb, nb, xo.data() + t * nb);
                }
                std::vector<float> alone(kMax * ldy, -7.0f);
                for (uint64_t t = 0; t < kMax; ++t)
                    isa.rows(w.data(), ld, sc.data(), xq.data() + t * 32 * nb, xo.data() + t * nb,
                             xd.data() + t * nb, n, rows, alone.data() + t * ldy);
                for (uint64_t kk = 1; kk <= kMax; ++kk) {
                    CAPTURE(kk);
                    std::vector<float> y((kk + 1) * ldy, -7.0f);
                    isa.batch(w.data(), ld, sc.data(), xq.data(), xo.data(), xd.data(), n, rows, kk, y.data(), ldy);
                    for (uint64_t t = 0; t < kk; ++t) {
                        CAPTURE(t);
                        CHECK(std::memcmp(y.data() + t * ldy, alone.data() + t * ldy, rows * sizeof(float)) == 0);
                        CHECK(y[t * ldy + rows] == -7.0f);
                        CHECK(y[t * ldy + rows + 1] == -7.0f);
                    }
                    for (uint64_t i = kk * ldy; i < y.size(); ++i) CHECK(y[i] == -7.0f);
                }
                // The rows are what they claim: each token's y against the per-row dot.
                for (uint64_t r = 0; r < rows; ++r) {
                    const float s = cmf::codecs::f16_to_f32(static_cast<uint16_t>(sc[2 * r] | sc[2 * r + 1] << 8));
                    const float want = s * k::portable::dot_i8_xq(w.data() + r * ld, xq.data(), xd.data(), n);
                    double mag = 0;  // the sum of |terms|: f32 summation order moves the sum by far less
                    for (uint64_t c = 0; c < n; ++c) mag += std::fabs(double(s) * w[r * ld + c] * xq[c] * xd[c / 32]);
                    CHECK((std::isnan(want) ? std::isnan(alone[r]) : std::fabs(double(alone[r]) - want) <= 1e-5 * mag));
                }
            }
        }
    }
}

TEST_CASE("roundtrip: q4_pair_blocks x order and offsets match a scalar reference") {
    // Built from the natural order: element e of block b at
    // 64*(b/2) + 16*(b%2) + 32*(e%2) + e/2 when b has a partner, else
    // 32*b + 16*(e%2) + e/2; the offset of pair k, entry j: -8 * the sum of
    // the eight elements 8j..8j+7 (j < 4: block 2k; j >= 4: 8(j-4).. of block 2k+1).
    namespace k = cmf::codecs::kernels;
    std::vector<float> x = gaussian(64 * 32, 21, 0.01f);
    for (int i = 0; i < 32; ++i) x[32 + i] = 0.0f;             // block 1 all zero
    x[32 * 4 + 9] = std::numeric_limits<float>::quiet_NaN();  // block 4: NaN scale, zero codes
    for (int i = 0; i < 64; ++i) x[32 * 6 + i] = i < 32 ? 9.0f : -9.0f;  // blocks 6, 7: codes 127, -127
    for (uint64_t n : {32u, 64u, 96u, 77u, 33u * 32u, 2048u}) {
        CAPTURE(n);
        const uint64_t nb = k::x_blocks(n);
        std::vector<int8_t> nat(32 * nb), q(32 * nb, 99);
        std::vector<float> dn(nb), dq(nb);
        k::portable::quantize_x(x.data(), n, k::XOrder::natural, nat.data(), dn.data());
        k::quantize_x(x.data(), n, k::XOrder::q4_pair_blocks, q.data(), dq.data());
        CHECK(std::memcmp(dn.data(), dq.data(), nb * sizeof(float)) == 0);
        std::vector<int8_t> want(32 * nb);
        for (uint64_t b = 0; b < nb; ++b)
            for (uint64_t e = 0; e < 32; ++e)
                want[(b | 1) < nb ? 64 * (b / 2) + 16 * (b % 2) + 32 * (e % 2) + e / 2 : 32 * b + 16 * (e % 2) + e / 2] =
                    nat[32 * b + e];
        CHECK(q == want);
        std::vector<int32_t> off(8 * (nb / 2) + 1, 12345), want_off(8 * (nb / 2) + 1, 12345);
        k::q4_pair_offset(q.data(), nb, off.data());
        for (uint64_t p = 0; p < nb / 2; ++p)
            for (uint64_t j = 0; j < 8; ++j) {
                const int8_t *e = nat.data() + 32 * (2 * p + j / 4) + 8 * (j % 4);
                int32_t sum = 0;
                for (int i = 0; i < 8; ++i) sum += e[i];
                want_off[8 * p + j] = -8 * sum;
            }
        CHECK(off == want_off);  // including the untouched sentinel past the last pair
        if (n == 2048) {  // the extremes: blocks 6 and 7 hold codes 127 and -127
            CHECK(*std::max_element(off.begin(), off.end() - 1) == 8 * 8 * 127);
            CHECK(*std::min_element(off.begin(), off.end() - 1) == -8 * 8 * 127);
        }
    }
}

TEST_CASE("roundtrip: flat-group dtypes decode rows that split groups") {
    // q1, q4_tiled and q4_block groups run over the flattened tensor; a payload
    // written for 2x32 read as 4x16 must give the same values, row by row.
    std::vector<float> w = gaussian(64, 11, 0.1f);
    for (int32_t id : {CMF_DTYPE_Q1, CMF_DTYPE_Q4_TILED, CMF_DTYPE_Q4_BLOCK}) {
        CAPTURE(id);
        std::vector<uint8_t> p = encode(id, {2, 32}, w.data());
        std::vector<float> whole = decode(id, {2, 32}, p);
        cmf_tensor_view t = view(id, {4, 16}, p);
        for (uint64_t r = 0; r < 4; ++r) {
            float row[16];
            dtype(id).dequantize_rows(t, r, r + 1, row);
            for (int c = 0; c < 16; ++c) CHECK(bits(row[c]) == bits(whole[r * 16 + c]));
        }
    }
}

// cmf_codec_vt.quantize_rows through the loaded codecs plugin: for each
// row-separable dtype, encoding ragged row chunks and concatenating the
// sections gives exactly the whole-tensor payload; the other dtypes and
// shapes that straddle groups report 0 sections.
TEST_CASE("roundtrip: row-chunked encoding equals whole-tensor encoding") {
    cmf::Runtime &rt = runtime();
    struct Case {
        int32_t id;
        std::vector<uint64_t> shape;
        uint32_t sections;  // 0: must refuse
    };
    const Case cases[] = {
        {CMF_DTYPE_F32, {37, 20}, 1},       {CMF_DTYPE_F16, {37, 64}, 1},       {CMF_DTYPE_BF16, {5, 3, 7}, 1},
        {CMF_DTYPE_F16, {300}, 1},          {CMF_DTYPE_Q8_ROW, {37, 40}, 2},    {CMF_DTYPE_Q8_ROW, {6, 2, 16}, 2},
        {CMF_DTYPE_Q4_BLOCK, {37, 64}, 2},  {CMF_DTYPE_Q4_TILED, {37, 96}, 1},  {CMF_DTYPE_Q4TP, {37, 64}, 3},
        {CMF_DTYPE_Q2TP, {37, 128}, 3},     {CMF_DTYPE_Q4_BLOCK, {37, 48}, 0},  {CMF_DTYPE_Q4_TILED, {300}, 0},
        {CMF_DTYPE_Q8_2F, {37, 64}, 0},     {CMF_DTYPE_VBIT_RO, {37, 64}, 0},   {CMF_DTYPE_Q1S, {37, 64}, 0},
        {CMF_DTYPE_Q1T, {37, 64}, 0},       {CMF_DTYPE_VBIT, {37, 64}, 0},
    };
    for (const Case &c : cases) {
        CAPTURE(c.id);
        CAPTURE(c.shape[0]);
        const cmf::CodecEntry *codec = rt.codec(c.id);
        REQUIRE(codec != nullptr);
        REQUIRE(static_cast<bool>(codec->vt.quantize_rows));
        const uint32_t ndim = static_cast<uint32_t>(c.shape.size());
        uint32_t n = 99;
        REQUIRE(codec->vt.quantize_rows(codec->ctx, ndim, c.shape.data(), 0, 0, nullptr, nullptr, nullptr, &n) == nullptr);
        CHECK(n == c.sections);
        if (n == 0) continue;
        uint64_t elems = 1;
        for (uint64_t d : c.shape) elems *= d;
        std::vector<float> w = gaussian(elems, 99 + static_cast<uint32_t>(c.id));
        std::vector<uint8_t> whole;
        cmf_byte_sink ws = cmf::vector_sink(whole);
        REQUIRE(codec->vt.quantize(codec->ctx, ndim, c.shape.data(), w.data(), nullptr, &ws) == nullptr);
        std::vector<std::vector<uint8_t>> parts(n);
        std::vector<cmf_byte_sink> sinks;
        for (auto &p : parts) sinks.push_back(cmf::vector_sink(p));
        const uint64_t rows = c.shape[0], row_len = elems / rows;
        const uint64_t steps[] = {1, 7, 13, 2, 9};
        uint64_t r = 0;
        for (size_t k = 0; r < rows; ++k) {
            uint64_t r1 = std::min(rows, r + steps[k % 5]);
            uint32_t got = 0;
            REQUIRE(codec->vt.quantize_rows(codec->ctx, ndim, c.shape.data(), r, r1, w.data() + r * row_len, nullptr,
                                            sinks.data(), &got) == nullptr);
            CHECK(got == n);
            r = r1;
        }
        std::vector<uint8_t> joined;
        for (auto &p : parts) joined.insert(joined.end(), p.begin(), p.end());
        CHECK(joined == whole);
    }
    uint32_t n = 0;
    const uint64_t shape[2] = {4, 32};
    const cmf::CodecEntry *q8 = rt.codec(CMF_DTYPE_Q8_ROW);
    std::vector<float> w(128, 0.5f);
    std::vector<uint8_t> sink_bytes;
    cmf_byte_sink s = cmf::vector_sink(sink_bytes);
    cmf_byte_sink two[2] = {s, s};
    cmf_error *e = q8->vt.quantize_rows(q8->ctx, 2, shape, 3, 5, w.data(), nullptr, two, &n);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    cmf_error_free(e);
}
