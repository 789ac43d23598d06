// The original's worked examples (docs/dtypes.md, "Worked examples"): for
// each dtype, the bytes the original's encoder writes for the small inputs
// A-D below, checked byte for byte (encode) and value for value where
// decoded numbers are known (decode); plus the f16 primitives.
#include "codec_test_util.hpp"

#include "dtypes/common.hpp"

#include <cmath>
#include <sstream>

namespace {

using namespace codec_test;

std::vector<uint8_t> unhex(const std::string &s) {
    std::vector<uint8_t> v;
    std::istringstream in(s);
    std::string tok;
    while (in >> tok)
        if (tok != "|") v.push_back(static_cast<uint8_t>(std::stoul(tok, nullptr, 16)));
    return v;
}

// The example inputs A-D (every value exact in f32).
std::vector<float> input_a() {
    std::vector<float> v;
    for (int i = 0; i < 32; ++i) v.push_back(static_cast<float>((i * i) % 37 - 18) / 16.0f);
    return v;
}
std::vector<float> input_b() {
    std::vector<float> v = input_a();
    for (int i = 0; i < 32; ++i) v.push_back(static_cast<float>((5 * i + 3) % 11 - 5) / 64.0f);
    return v;
}
std::vector<float> input_c() {
    std::vector<float> v;
    for (int r = 0; r < 4; ++r)
        for (int i = 0; i < 32; ++i)
            v.push_back(static_cast<float>((i * i + 7 * r * i + 3 * r) % 37 - 18) / 16.0f * std::ldexp(1.0f, 2 * (r - 1)));
    return v;
}
std::vector<float> input_d() {
    std::vector<float> v;
    for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 64; ++c)
            v.push_back(static_cast<float>((c * c + 11 * r * c + 5) % 41 - 20) / 32.0f * (c < 32 ? 1.0f : 3.0f) *
                        (r == 0 ? 1.0f : 0.5f));
    return v;
}

void check_encode(int32_t id, const std::vector<uint64_t> &shape, const std::vector<float> &src,
                  const std::string &expected_hex, const std::string &options = "") {
    std::vector<uint8_t> got = encode(id, shape, src.data(), options);
    CHECK(hex(got) == hex(unhex(expected_hex)));
}

}  // namespace

TEST_CASE("examples: test inputs are exact") {
    CHECK(input_a()[0] == -1.125f);
    CHECK(input_b()[32] == -2.0f / 64.0f);
    CHECK(input_c()[3 * 32 + 0] == static_cast<float>(9 % 37 - 18) / 16.0f * 16.0f);
}

TEST_CASE("examples: f32, bf16, f16") {
    check_encode(CMF_DTYPE_F32, {2}, {1.0f, -2.5f}, "00 00 80 3f 00 00 20 c0");
    check_encode(CMF_DTYPE_BF16, {2}, {1.0f, -2.5f}, "80 3f 20 c0");
    std::vector<uint8_t> f16 = encode(CMF_DTYPE_F16, {32}, input_a().data());
    CHECK(hex(std::vector<uint8_t>(f16.begin(), f16.begin() + 16)) == "80 bc 40 bc 00 bb 80 b8 00 b0 00 37 80 3c 00 b6");
}

TEST_CASE("examples: q8_row B") {
    std::string want =
        "81 88 9d c0 f2 31 7f d6 40 b2 38 c8 6a 15 cf 96 71 55 47 47 55 71 96 cf 15 6a c8 38 b2 40 d6 7f "
        "cd 4c b4 33 9a 19 81 00 7f e7 66 cd 4c b4 33 9a 19 81 00 7f e7 66 cd 4c b4 33 9a 19 81 00 7f e7 "
        "89 20 0a 11";
    check_encode(CMF_DTYPE_Q8_ROW, {2, 32}, input_b(), want);
    std::vector<float> d = decode(CMF_DTYPE_Q8_ROW, {2, 32}, unhex(want));
    CHECK(d[0] == -127.0f * cmf::codecs::f16_to_f32(0x2089));
}

TEST_CASE("examples: q4_block") {
    std::vector<float> src = input_a();
    for (int i = 0; i < 8; ++i) src.push_back(static_cast<float>(i - 4) / 8.0f);
    std::string want =
        "11 53 b7 6f 4b 5b 9e 25 de cc ed 52 e9 b5 b4 f6 | 31 64 a8 dc 88 88 88 88 88 88 88 88 88 88 88 88 | 25 31 | 92 2c";
    check_encode(CMF_DTYPE_Q4_BLOCK, {1, 40}, src, want);
    check_encode(CMF_DTYPE_Q4_BLOCK, {1, 32}, input_a(),
                 "11 53 b7 6f 4b 5b 9e 25 de cc ed 52 e9 b5 b4 f6 25 31");
    std::vector<float> d = decode(CMF_DTYPE_Q4_BLOCK, {1, 40}, unhex(want));
    REQUIRE(d.size() == 40);
    // element 32 = (i-4)/8 at i=0 = -0.5: nibble 1 -> (1-8) * 0.071411
    CHECK(d[32] == -7.0f * cmf::codecs::f16_to_f32(0x2c92));
}

TEST_CASE("examples: q4_tiled A and D") {
    check_encode(CMF_DTYPE_Q4_TILED, {1, 32}, input_a(), "25 31 11 53 b7 6f 4b 5b 9e 25 de cc ed 52 e9 b5 b4 f6");
    check_encode(CMF_DTYPE_Q4_TILED, {2, 64}, input_d(),
                 "b7 2d 33 64 b8 61 2b 29 5a ae 36 e1 ee 1e 63 ea a5 92 | 49 34 b2 16 8c 46 33 43 86 1c b6 92 a2 e4 6a 13 ee ee | "
                 "6e 29 72 3c 29 4a 8d 14 ce ab cb 1e 84 4d 2a 39 7c e2 | 12 30 9b 77 77 b9 2e c7 93 a2 d4 48 e1 bc ba ec 41 d8");
}

TEST_CASE("examples: q8_2f B") {
    std::string want =
        "81 81 81 81 8e 7f 7f 81 7e 81 7e 81 7f 7b 81 81 7f 7e 7f 7e 7f 7f 81 82 7b 7f 82 7f 82 7f 84 7f "
        "f8 0d f1 10 81 0a ec 00 27 fa 23 ee 0e bb 14 ed 04 e3 00 23 fa 12 f7 1e bb 09 dd 09 e0 00 3a fc "
        "b4 21 1a 1d "
        "5e 3a 04 3a f5 38 60 36 53 2e f4 34 61 3a 3e 34 6d 36 c8 37 b3 35 ab 35 4f 39 60 30 f6 34 51 39 a8 39 44 38 "
        "12 37 20 37 3e 38 ab 39 4e 39 fa 34 60 30 4e 39 b3 35 a9 35 d4 37 5d 36 55 34 5d 3a";
    check_encode(CMF_DTYPE_Q8_2F, {2, 32}, input_b(), want);
    std::vector<float> d = decode(CMF_DTYPE_Q8_2F, {2, 32}, unhex(want));
    CHECK(d[0] == doctest::Approx(-1.12591).epsilon(1e-5));
    CHECK(d[0] == -127.0f * cmf::codecs::f16_to_f32(0x21b4) * cmf::codecs::f16_to_f32(0x3a5e));
}

namespace {
const char *kVbitC =
    "03 03 05 08 | 00 2e | 00 36 | 89 34 | 49 30 | "
    "00 97 32 a6 2a d1 d6 db 8a 75 43 56 | 29 d5 0d 5a 32 40 04 b9 95 31 56 8e | "
    "24 81 11 dd 84 ee 29 39 d3 1d 23 2e 38 82 44 d4 10 2f 6f 5b | "
    "3c e0 7f 2d fe ca a4 8e 86 8e a4 ca fe 2d 7f e0 3c bb 34 d1 69 0f d9 9d 70 52 43 43 52 70 9d d9";
const char *kVbitRoC =
    "03 03 05 08 | 00 2e | 00 36 | 89 34 | 49 30 | 00 00 00 00 0c 00 00 00 18 00 00 00 2c 00 00 00 4c 00 00 00 | "
    "00 97 32 a6 2a d1 d6 db 8a 75 43 56 | 29 d5 0d 5a 32 40 04 b9 95 31 56 8e | "
    "24 81 11 dd 84 ee 29 39 d3 1d 23 2e 38 82 44 d4 10 2f 6f 5b | "
    "3c e0 7f 2d fe ca a4 8e 86 8e a4 ca fe 2d 7f e0 3c bb 34 d1 69 0f d9 9d 70 52 43 43 52 70 9d d9";
}  // namespace

TEST_CASE("examples: vbit and vbit_ro C") {
    check_encode(CMF_DTYPE_VBIT, {4, 32}, input_c(), kVbitC);
    check_encode(CMF_DTYPE_VBIT_RO, {4, 32}, input_c(), kVbitRoC);
    // mean_bits is stored as truncated thousandths: 4.2509 behaves like 4.25.
    check_encode(CMF_DTYPE_VBIT, {4, 32}, input_c(), kVbitC, "mean_bits=4.2509");
    for (auto [id, text] : {std::pair{CMF_DTYPE_VBIT, kVbitC}, std::pair{CMF_DTYPE_VBIT_RO, kVbitRoC}}) {
        std::vector<float> d = decode(id, {4, 32}, unhex(text));
        CHECK(d[0] == -0.28125f);
        CHECK(d[1] == -0.28125f);
        CHECK(d[2] == -0.1875f);
        CHECK(d[3] == -0.1875f);
    }
    CHECK(decode(CMF_DTYPE_VBIT, {4, 32}, unhex(kVbitC)) == decode(CMF_DTYPE_VBIT_RO, {4, 32}, unhex(kVbitRoC)));
}

TEST_CASE("examples: q1 and q1p B") {
    std::string q1 = "5c 39 60 35 3f ab | 60 29 aa 55 ad 6a";
    check_encode(CMF_DTYPE_Q1, {2, 32}, input_b(), q1);
    check_encode(CMF_DTYPE_Q1, {2, 32}, input_b(), "5c 39 60 35 3f ab | 60 29 8a 5d b8 62", "error_diffusion=1");
    std::vector<float> d = decode(CMF_DTYPE_Q1, {2, 32}, unhex(q1));
    CHECK(d[0] == -cmf::codecs::f16_to_f32(0x395c));
    CHECK(d[5] == cmf::codecs::f16_to_f32(0x395c));
}

TEST_CASE("examples: q1s B keep 0.05") {
    std::string want =
        "fc 38 60 35 3f ab | 60 29 8a 5d b8 62 | 03 00 00 00 | 00 00 00 00 80 bc | 06 00 00 00 80 3c | 1f 00 00 00 80 3c";
    check_encode(CMF_DTYPE_Q1S, {2, 32}, input_b(), want, "keep=0.05");
    std::vector<float> d = decode(CMF_DTYPE_Q1S, {2, 32}, unhex(want));
    CHECK(d[0] == -1.125f);
    CHECK(d[6] == 1.125f);
    CHECK(d[31] == 1.125f);
    CHECK(d[1] == -cmf::codecs::f16_to_f32(0x38fc));
}

TEST_CASE("examples: q1t B") {
    check_encode(CMF_DTYPE_Q1T, {2, 32}, input_b(),
                 "c7 39 50 d3 b2 7a 4c 97 05 | f5 2a d4 21 97 65 d2 3d 01 | 00 00 00 00 00 00 00 00 00 00 00 00");
    std::string ovl =
        "67 39 4e d0 b2 7a 4c 97 02 | f5 2a d4 21 97 65 d2 3d 01 | 00 00 00 00 03 00 00 00 03 00 00 00 | "
        "00 00 80 bc | 06 00 80 3c | 1f 00 80 3c";
    check_encode(CMF_DTYPE_Q1T, {2, 32}, input_b(), ovl, "keep=0.05");
    std::vector<float> d = decode(CMF_DTYPE_Q1T, {2, 32}, unhex(ovl));
    const float want[8] = {-1.125f, -0.675293f, -0.675293f, -0.675293f, 0.0f, 0.675293f, 1.125f, -0.675293f};
    for (int i = 0; i < 8; ++i) CHECK(d[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

TEST_CASE("examples: q4tp D and degenerate A") {
    std::string nib =
        "33 64 b8 61 2b 29 5a ae 36 e1 ee 1e 63 ea a5 92 | b2 05 8c 46 23 43 86 0c b5 92 a2 e4 6a 13 ef fe | "
        "73 3c 29 4a 8d 14 cd aa ca 1d 84 4d 2a 39 7c e3 | 9b 67 76 b9 2e c7 a2 a1 e3 48 e0 bc ba ec 40 e8 | ";
    check_encode(CMF_DTYPE_Q4TP, {2, 64}, input_d(), nib + "f8 c2 8b 2a | 8f c4 8b 2a | a0 03 | a1 03");
    std::vector<uint8_t> nosearch = encode(CMF_DTYPE_Q4TP, {2, 64}, input_d().data(), "search=0");
    CHECK(hex(std::vector<uint8_t>(nosearch.begin() + 64, nosearch.end())) == "f8 c2 8b 2a 8f c4 8b 2a e0 03 e0 03");
    check_encode(CMF_DTYPE_Q4TP, {1, 32}, input_a(),
                 "11 53 b7 6f 4b 5b 9e 25 de cc ed 52 e9 b5 b4 f6 | 46 c1 01 00 | 00");
    // Row 0 scales: rung 0 = 0.0893508, rung 29 = 0.249657.
    std::vector<float> d = decode(CMF_DTYPE_Q4TP, {2, 64}, unhex(nib + "f8 c2 8b 2a | 8f c4 8b 2a | a0 03 | a1 03"));
    CHECK(std::fabs(d[0]) / 5.0f == doctest::Approx(0.0893508).epsilon(1e-5));  // nibble 3 -> -5
}

TEST_CASE("examples: q2tp D") {
    check_encode(CMF_DTYPE_Q2TP, {2, 64}, input_d(),
                 "50 4a 22 b6 c5 3f e5 89 | 18 5a 40 29 89 d8 06 ff | 24 62 1b ab 3a 79 22 c6 | 5a a5 d3 88 2c bc fa e0 | "
                 "0d bd 16 2a | ad c0 bd 28 | a1 03 | e1 03");
}

TEST_CASE("examples: glibc exp2f/log2f at f16 arguments") {
    using cmf::codecs::exp2f_f16;
    using cmf::codecs::log2f_f16;
    CHECK(bits(exp2f_f16(0xc4ea)) == 0x3d07db36u);
    CHECK(bits(log2f_f16(0x3a5e)) == 0xbea89fbfu);
    // This machine's libm is glibc (the reference): the recipe must agree on every f16.
    int exp_diff = 0, log_diff = 0;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        float x = cmf::codecs::f16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(x)) continue;
        if (bits(exp2f_f16(static_cast<uint16_t>(h))) != bits(::exp2f(x))) ++exp_diff;
        if (x > 0 && bits(log2f_f16(static_cast<uint16_t>(h))) != bits(::log2f(x))) ++log_diff;
    }
    CHECK(exp_diff == 0);
    CHECK(log_diff == 0);
}

TEST_CASE("examples: f16 scale floor and non-finite inputs") {
    using namespace cmf::codecs;
    CHECK(f16_scale(0.0f) == 6.103515625e-05f);
    CHECK(f16_scale(std::nanf("")) == 6.103515625e-05f);
    // A NaN weight does not change amax and gets code 0 at the cast: q8_row byte 0, q4 nibble 8.
    std::vector<float> w(32, 0.5f);
    w[3] = std::nanf("");
    std::vector<uint8_t> q8 = encode(CMF_DTYPE_Q8_ROW, {1, 32}, w.data());
    CHECK(q8[3] == 0);
    CHECK(q8[0] == 127);
    std::vector<uint8_t> q4 = encode(CMF_DTYPE_Q4_BLOCK, {1, 32}, w.data());
    CHECK((q4[1] >> 4) == 8);
    // An infinite amax gives an infinite scale and all-zero codes.
    w[3] = INFINITY;
    q8 = encode(CMF_DTYPE_Q8_ROW, {1, 32}, w.data());
    CHECK(q8[32] == 0x00);
    CHECK(q8[33] == 0x7c);
    CHECK(q8[0] == 0);
    // q1s/q1t refuse to select outliers among NaNs (the original panics).
    w[3] = std::nanf("");
    CHECK_THROWS_WITH(encode(CMF_DTYPE_Q1S, {1, 32}, w.data(), "keep=0.1"), doctest::Contains("NaN"));
    CHECK_THROWS_WITH(encode(CMF_DTYPE_Q1T, {1, 32}, w.data(), "keep=0.1"), doctest::Contains("NaN"));
}
