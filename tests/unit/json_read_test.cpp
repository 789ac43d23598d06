// The shared JSON reader (sdk/cmf/json_text.hpp, json_read.hpp): what
// Python's json module writes and strict parsers refuse, read as Python
// reads it; errors that name the file, the key and the value.
#include <doctest/doctest.h>

#include <cmf/json_read.hpp>

#include <cmath>
#include <string>

using cmf::json::normalise;

namespace {

std::string rewritten(const std::string &in) {
    auto n = normalise(in);
    REQUIRE(n.error.empty());
    return n.changed ? n.text : in;
}

cmf::json::Object object_of(simdjson::dom::parser &p, const std::string &text) {
    return cmf::json::parse_object(p, text, "tokenizer_config.json");
}

}  // namespace

TEST_CASE("json text: integers past 64 bits become doubles, the rest is kept byte for byte") {
    CHECK(rewritten(R"({"model_max_length": 1000000000000000019884624838656})") ==
          R"({"model_max_length": 1000000000000000019884624838656.0})");
    CHECK(rewritten("[18446744073709551615, -9223372036854775808, 12, -0, 0.5, 1e5]") ==
          "[18446744073709551615, -9223372036854775808, 12, -0, 0.5, 1e5]");
    CHECK(rewritten("[18446744073709551616, -9223372036854775809]") == "[18446744073709551616.0, -9223372036854775809.0]");
    // More digits than a double holds: infinity, as Python's float() gives.
    CHECK(rewritten("[" + std::string(400, '9') + "]") == R"(["\u0000Infinity"])");
    // Inside strings nothing changes, escaped quotes included.
    CHECK(normalise(R"({"a": "NaN 1e400 \" Infinity 99999999999999999999999"})").changed == false);
}

TEST_CASE("json text: NaN, Infinity, -Infinity and overflowing floats become the sentinels; underflow and BOM") {
    CHECK(rewritten(R"({"a": NaN, "b": Infinity, "c": -Infinity})") ==
          R"({"a": "\u0000NaN", "b": "\u0000Infinity", "c": "\u0000-Infinity"})");
    CHECK(rewritten("[1e400, -1.5E+999, 1e-400, 0.0000e500]") == R"(["\u0000Infinity", "\u0000-Infinity", 1e-400, 0.0000e500])");
    auto bom = normalise("\xEF\xBB\xBF{}");
    CHECK(bom.changed);
    CHECK(bom.text == "{}");
}

TEST_CASE("json text: nesting is bounded") {
    std::string ok(cmf::json::kMaxDepth, '['), deep(cmf::json::kMaxDepth + 1, '[');
    ok += std::string(cmf::json::kMaxDepth, ']');
    deep += std::string(cmf::json::kMaxDepth + 1, ']');
    CHECK(normalise(ok).error.empty());
    CHECK(normalise(deep).error.find("nested deeper than 1024 levels") != std::string::npos);
    simdjson::dom::parser p;
    CHECK_NOTHROW(cmf::json::parse(p, ok, "deep.json"));
    CHECK_THROWS_WITH_AS(cmf::json::parse(p, deep, "deep.json"), doctest::Contains("deep.json: not valid JSON: arrays and objects nested deeper"),
                         cmf::sdk::Error);
}

TEST_CASE("json read: Python-written values read as Python reads them") {
    simdjson::dom::parser p;
    const std::string text = "\xEF\xBB\xBF" R"({"model_max_length": 1000000000000000019884624838656, "a": NaN, "b": Infinity,
        "c": -Infinity, "d": 1E+2, "e": 0.1e1, "f": -0.0, "g": 123456789012345678901234567890.5, "h": 64.0, "i": 1e400,
        "j": 7, "s": "x", "n": null})";
    auto o = object_of(p, text);
    CHECK(o.limit("model_max_length") == UINT64_MAX);
    CHECK(o.limit("b") == UINT64_MAX);
    CHECK(o.limit("j") == 7u);
    CHECK(std::isnan(*o.number("a")));
    CHECK(*o.number("b") == HUGE_VAL);
    CHECK(*o.number("c") == -HUGE_VAL);
    CHECK(*o.number("i") == HUGE_VAL);
    CHECK(*o.number("d") == 100.0);
    CHECK(*o.number("e") == 1.0);
    CHECK(std::signbit(*o.number("f")));
    CHECK(*o.number("g") == doctest::Approx(1.2345678901234568e29));
    CHECK(*o.number("model_max_length") == 1e30);
    CHECK(o.u64("h") == 64u);
    CHECK_FALSE(o.number("n"));  // null reads as absent
    CHECK_FALSE(o.number("missing"));
    // Unusable values: the error names the file, the key and the value.
    CHECK_THROWS_WITH_AS(o.u64("model_max_length"),
                         doctest::Contains("tokenizer_config.json: model_max_length = 1e+30: must be a non-negative integer that fits 64 bits"),
                         cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(o.finite("a"), "tokenizer_config.json: a = NaN: must be a finite number", cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(o.limit("c"), doctest::Contains("c = -Infinity"), cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(o.number("s"), R"(tokenizer_config.json: s = "x": must be a number)", cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(o.str("a"), doctest::Contains("a = NaN: must be a string"), cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(o.missing("missing"), "tokenizer_config.json: missing required key missing", cmf::sdk::Error);
}

TEST_CASE("json read: strict files take the fast path, broken ones keep the parser's reason, long strings") {
    simdjson::dom::parser p;
    CHECK_THROWS_WITH_AS(cmf::json::parse(p, R"({"a": 1,})", "config.json"), doctest::Contains("config.json: not valid JSON: "),
                         cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(cmf::json::parse(p, R"({"a": NaN,})", "config.json"), doctest::Contains("config.json: not valid JSON: "),
                         cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(cmf::json::parse(p, "\xEF\xBB\xBF{\"a\": ", "config.json"), doctest::Contains("config.json: not valid JSON: "),
                         cmf::sdk::Error);
    CHECK_THROWS_WITH_AS(cmf::json::parse_object(p, "[1]", "config.json"), "config.json: not a JSON object", cmf::sdk::Error);
    const std::string big(8 << 20, 'q');
    auto o = object_of(p, "{\"chat_template\": \"" + big + "\", \"x\": NaN}");
    CHECK(o.str("chat_template")->size() == big.size());
}

TEST_CASE("json read: a sentinel survives minify and a second parse (arch blocks are re-serialised)") {
    simdjson::dom::parser p, q;
    auto o = object_of(p, R"({"a": NaN, "b": [-Infinity, 1e999]})");
    const std::string m = simdjson::minify(o.raw());
    auto o2 = object_of(q, m);
    CHECK(std::isnan(*o2.number("a")));
    auto arr = *o2.array("b");
    CHECK(*cmf::json::number_of(arr.at(0)) == -HUGE_VAL);
    CHECK(*cmf::json::number_of(arr.at(1)) == HUGE_VAL);
}
