// The safetensors reader: every malformed input is refused with an error
// naming the file (and tensor), valid files read back exactly; plus the
// header float spelling of cmf/json_writer.hpp.
#include <doctest/doctest.h>

#include "common/error.hpp"
#include "convert/safetensors.hpp"

#include <cmf/json_writer.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace cmf::convert;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() / ("cmf_st_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    static int &counter() {
        static int c = 0;
        return c;
    }
};

std::string u64le(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
    return s;
}

// A file from a header JSON and a data region.
std::string write(const fs::path &dir, const std::string &name, const std::string &header, const std::string &data) {
    fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << u64le(header.size()) << header << data;
    return p.string();
}
std::string write_raw(const fs::path &dir, const std::string &name, const std::string &bytes) {
    fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
}

// Expect open() to fail with `code` and a message holding every `parts`.
void expect_error(const std::string &path, int32_t code, std::vector<std::string> parts) {
    try {
        SafetensorsFile f(path);
        FAIL("opened a bad file: " << path);
    } catch (const cmf::Error &e) {
        INFO(e.message());
        CHECK(e.code() == code);
        CHECK(e.message().find(path) != std::string::npos);
        for (const auto &p : parts) CHECK(e.message().find(p) != std::string::npos);
    }
}

std::string floats(std::initializer_list<float> v) {
    std::string s(v.size() * 4, '\0');
    std::memcpy(s.data(), std::data(v), s.size());
    return s;
}

}  // namespace

TEST_CASE("safetensors: a valid file reads back with names sorted, metadata and all three dtypes") {
    TempDir d;
    std::string data = floats({1.5f, -2.0f, 3.25f, 0.0f});
    data += std::string("\x00\x3c\x00\xc0", 4);  // f16 1.0, -2.0
    data += std::string("\x80\x3f\x40\x40", 4);  // bf16 1.0, 3.0
    std::string h = R"({"b":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                    R"("a":{"dtype":"F16","shape":[2],"data_offsets":[16,20]},)"
                    R"("c":{"dtype":"BF16","shape":[2],"data_offsets":[20,24]},"__metadata__":{"format":"pt"}})";
    SafetensorsFile f(write(d.path, "ok.safetensors", h, data));
    REQUIRE(f.tensors().size() == 3);
    CHECK(f.tensors()[0].name == "a");
    CHECK(f.tensors()[1].name == "b");
    CHECK(f.metadata().at("format") == "pt");
    const SourceTensor *b = f.find("b");
    REQUIRE(b);
    CHECK(b->shape == std::vector<uint64_t>{2, 2});
    float out[4];
    read_f32(*b, 0, 4, out);
    CHECK(out[0] == 1.5f);
    CHECK(out[1] == -2.0f);
    CHECK(out[2] == 3.25f);
    read_f32(*b, 2, 1, out);
    CHECK(out[0] == 3.25f);
    read_f32(*f.find("a"), 0, 2, out);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == -2.0f);
    read_f32(*f.find("c"), 0, 2, out);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 3.0f);
    CHECK(f.find("zz") == nullptr);
}

TEST_CASE("safetensors: malformed files are refused with specific errors") {
    TempDir d;
    const std::string t4 = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
    const std::string data16(16, '\0');
    SUBCASE("shorter than the length field") { expect_error(write_raw(d.path, "short", "abc"), CMF_ERR_PARSE, {"truncated"}); }
    SUBCASE("header length over the cap") {
        expect_error(write_raw(d.path, "cap", u64le(kMaxSafetensorsHeader + 1) + "{}"), CMF_ERR_PARSE, {"exceeds"});
    }
    SUBCASE("header longer than the file") {
        expect_error(write_raw(d.path, "hlen", u64le(100) + "{}"), CMF_ERR_PARSE, {"truncated: header length 100"});
    }
    SUBCASE("header not JSON") { expect_error(write(d.path, "json", "{\"w\":", ""), CMF_ERR_PARSE, {"not valid JSON"}); }
    SUBCASE("header not an object") { expect_error(write(d.path, "arr", "[1,2]", ""), CMF_ERR_PARSE, {"not a JSON object"}); }
    SUBCASE("unsupported dtype names the tensor") {
        expect_error(write(d.path, "i64", R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", data16),
                     CMF_ERR_UNKNOWN_DTYPE, {"\"ids\"", "I64", "F32, F16 and BF16"});
    }
    SUBCASE("unknown dtype") {
        expect_error(write(d.path, "xyz", R"({"w":{"dtype":"XYZ","shape":[2],"data_offsets":[0,8]}})", data16), CMF_ERR_PARSE,
                     {"unknown dtype \"XYZ\""});
    }
    SUBCASE("negative dimension") {
        expect_error(write(d.path, "neg", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", data16), CMF_ERR_PARSE,
                     {"\"w\"", "shape"});
    }
    SUBCASE("missing data_offsets") {
        expect_error(write(d.path, "nooff", R"({"w":{"dtype":"F32","shape":[1]}})", data16), CMF_ERR_PARSE, {"data_offsets"});
    }
    SUBCASE("begin after end") {
        expect_error(write(d.path, "rev", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", data16), CMF_ERR_BOUNDS,
                     {"begin 8 > end 4"});
    }
    SUBCASE("data past the end of the file (truncated)") {
        expect_error(write(d.path, "trunc", t4, std::string(12, '\0')), CMF_ERR_BOUNDS, {"\"w\"", "truncated"});
    }
    SUBCASE("size disagrees with shape x dtype") {
        expect_error(write(d.path, "size", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data16), CMF_ERR_BOUNDS,
                     {"\"w\"", "holds 16 bytes", "needs 12"});
    }
    SUBCASE("overlapping tensors") {
        expect_error(write(d.path, "ovl",
                           R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                           data16),
                     CMF_ERR_BOUNDS, {"\"a\"", "\"b\"", "overlap"});
    }
    SUBCASE("duplicate names") {
        expect_error(write(d.path, "dup",
                           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           data16),
                     CMF_ERR_PARSE, {"duplicate key \"a\""});
    }
    SUBCASE("metadata must map strings to strings") {
        expect_error(write(d.path, "meta", R"({"__metadata__":{"x":1}})", ""), CMF_ERR_PARSE, {"__metadata__"});
    }
    SUBCASE("missing file") { expect_error((d.path / "absent.safetensors").string(), CMF_ERR_FILE_NOT_FOUND, {"cannot open"}); }
}

TEST_CASE("safetensors: checkpoint directories, single file and index") {
    TempDir d;
    const std::string one = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    SUBCASE("not a directory") {
        CHECK_THROWS_WITH_AS(Checkpoint((d.path / "nope").string()), doctest::Contains("not a directory"), cmf::Error);
    }
    SUBCASE("no weights") {
        CHECK_THROWS_WITH_AS(Checkpoint(d.path.string()), doctest::Contains("neither model.safetensors"), cmf::Error);
    }
    SUBCASE("sharded, in the index's file order") {
        write(d.path, "model-00002.safetensors", one, floats({2.0f}));
        write(d.path, "model-00001.safetensors", R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", floats({1.0f}));
        std::ofstream(d.path / "model.safetensors.index.json")
            << R"({"metadata":{},"weight_map":{"x":"model-00002.safetensors","y":"model-00001.safetensors"}})";
        Checkpoint c(d.path.string());
        REQUIRE(c.tensors().size() == 2);
        CHECK(c.tensors()[0]->name == "y");
        CHECK(c.tensors()[1]->name == "x");
        CHECK(c.file_of(*c.find("x")).path().find("model-00002") != std::string::npos);
    }
    SUBCASE("index naming a tensor its shard lacks") {
        write(d.path, "a.safetensors", one, floats({2.0f}));
        std::ofstream(d.path / "model.safetensors.index.json") << R"({"weight_map":{"x":"a.safetensors","q":"a.safetensors"}})";
        CHECK_THROWS_WITH_AS(Checkpoint(d.path.string()), doctest::Contains("\"q\" is listed in weight_map but absent"), cmf::Error);
    }
    SUBCASE("index naming a missing shard") {
        std::ofstream(d.path / "model.safetensors.index.json") << R"({"weight_map":{"x":"gone.safetensors"}})";
        CHECK_THROWS_WITH_AS(Checkpoint(d.path.string()), doctest::Contains("gone.safetensors"), cmf::Error);
    }
    SUBCASE("index escaping the directory") {
        std::ofstream(d.path / "model.safetensors.index.json") << R"({"weight_map":{"x":"../x.safetensors"}})";
        CHECK_THROWS_WITH_AS(Checkpoint(d.path.string()), doctest::Contains("not a plain file name"), cmf::Error);
    }
    SUBCASE("same tensor in two shards") {
        write(d.path, "a.safetensors", one, floats({2.0f}));
        write(d.path, "b.safetensors", one, floats({3.0f}));
        std::ofstream(d.path / "model.safetensors.index.json") << R"({"weight_map":{"x":"a.safetensors","z":"b.safetensors"}})";
        CHECK_THROWS_WITH_AS(Checkpoint(d.path.string()), doctest::Contains("also appears in"), cmf::Error);
    }
}

TEST_CASE("json_writer: floats are spelled as serde_json does") {
    using cmf::json::spell_float;
    CHECK(spell_float(1e-6, false) == "1e-6");
    CHECK(spell_float(1e-5, false) == "0.00001");
    CHECK(spell_float(10000.0, false) == "10000.0");
    CHECK(spell_float(1.0, false) == "1.0");
    CHECK(spell_float(0.0, false) == "0.0");
    CHECK(spell_float(1.05, false) == "1.05");
    CHECK(spell_float(1e16, false) == "1e+16");
    CHECK(spell_float(1e15, false) == "1000000000000000.0");
    CHECK(spell_float(-2.5e-7, false) == "-2.5e-7");
    CHECK(spell_float(0.25, true) == "0.25");
    CHECK(spell_float(8.0, true) == "8.0");
    CHECK(spell_float(1e-6, true) == "0.000001");
    CHECK(spell_float(1e13, true) == "1e+13");
    CHECK(spell_float(static_cast<double>(std::sqrt(96.0f)), true) == "9.797959");
    cmf::json::Writer w;
    w.begin_object().key("a").begin_array().u64(1).string("x\"\n").end_array().key("b").null().key("c").boolean(true).end_object();
    CHECK(w.str() == R"({"a":[1,"x\"\n"],"b":null,"c":true})");
}
