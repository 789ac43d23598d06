// Every tensor of the original's fixture dumps: encoding *.orig.f32 with the
// manifest's encoder options must give a payload with the manifest's size and
// hash64, and decoding that payload must give *.deq.f32 bit-for-bit.
#include "codec_test_util.hpp"

#include "common/hash64.hpp"

#include <simdjson.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace {

using namespace codec_test;
namespace fs = std::filesystem;

std::vector<float> read_f32(const fs::path &p) {
    std::ifstream in(p, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open " << p);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(bytes.size() % 4 == 0);
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
}

fs::path fixture_dir(const char *name) {
    // Always the repository's copy: a missing directory fails loudly here
    // rather than being looked for anywhere outside the checkout.
    fs::path dir = fs::path(CMF_FIXTURE_DIR) / name;
    REQUIRE_MESSAGE(fs::is_directory(dir), "fixture directory missing from the repository: " << dir);
    return dir;
}

void check_fixture_dir(const char *name) {
    fs::path dir = fixture_dir(name);
    simdjson::dom::parser parser;
    simdjson::dom::element manifest = parser.load((dir / "manifest.json").string());
    int checked = 0;
    for (simdjson::dom::element t : manifest["tensors"].get_array()) {
        std::string tname{std::string_view(t["name"])};
        int32_t id = static_cast<int32_t>(int64_t(t["dtype_id"]));
        std::string kind{std::string_view(t["encoder_kind"])};
        std::vector<uint64_t> shape;
        for (simdjson::dom::element s : t["shape"].get_array()) shape.push_back(uint64_t(s));
        CAPTURE(tname);
        std::vector<float> orig = read_f32(dir / std::string_view(t["orig"]));
        std::vector<float> deq = read_f32(dir / std::string_view(t["deq"]));

        std::string options;
        std::vector<float> act;
        simdjson::dom::element opts = t["encoder_opts"];
        double keep;
        if (opts["keep"].get(keep) == simdjson::SUCCESS) options = "keep=" + std::to_string(keep);
        std::string_view act_file;
        if (opts["act_rms"].get(act_file) == simdjson::SUCCESS) act = read_f32(dir / act_file);
        if (kind == "q1_ef") options = "error_diffusion=1";

        std::vector<uint8_t> payload =
            encode(id, shape, orig.data(), options, act.empty() ? nullptr : act.data(), act.size());
        CHECK(payload.size() == uint64_t(t["nbytes"]));
        char hash[17];
        std::snprintf(hash, sizeof hash, "%016" PRIx64, cmf::hash64(payload.data(), payload.size()));
        CHECK(std::string(hash) == std::string(std::string_view(t["hash"])));

        std::vector<float> got = decode(id, shape, payload);
        REQUIRE(got.size() == deq.size());
        size_t mismatches = 0, first = 0;
        for (size_t i = 0; i < got.size(); ++i)
            if (bits(got[i]) != bits(deq[i]) && !mismatches++) first = i;
        CHECK_MESSAGE(mismatches == 0, mismatches << " decoded values differ, first at " << first);
        ++checked;
    }
    CHECK(checked >= 30);
}

}  // namespace

TEST_CASE("fixtures: sample.f32dir encodes and decodes like the original") { check_fixture_dir("sample.f32dir"); }
TEST_CASE("fixtures: sample-loops.f32dir encodes and decodes like the original") {
    check_fixture_dir("sample-loops.f32dir");
}
