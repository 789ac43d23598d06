// cmf/json_read.hpp — the one way libcmf and the plugins read JSON from
// users' files: parse with simdjson, and when the strict parse fails, once
// more over the rewrite of json_text.hpp (big integers, NaN/Infinity, a
// BOM); then typed reads whose errors name the file, the key and the value.
//
// Header-only: the arch plugins cannot link libcmf. Errors are
// cmf::sdk::Error(CMF_ERR_PARSE); libcmf turns them into its own error type
// at its call sites (core/common/json.hpp).
#pragma once

#include <cmf/json_text.hpp>
#include <cmf/plugin.hpp>

#include <simdjson.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cmf::json {

// Parses `text`, read from `source` (a file name or "header.arch": the
// start of every error message). The element stays valid until `parser`
// parses again or goes away.
inline simdjson::dom::element parse(simdjson::dom::parser &parser, std::string_view text, std::string_view source) {
    simdjson::dom::element doc;
    // simdjson copies its input with memcpy, which must not see a null
    // pointer even for zero bytes (an empty header region has no data()).
    if (text.empty()) throw sdk::Error(CMF_ERR_PARSE, std::string(source) + ": not valid JSON: the text is empty");
    simdjson::error_code err = simdjson::SUCCESS;
    const bool bom = text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF";
    if (!bom) {
        err = parser.parse(text.data(), text.size()).get(doc);
        if (!err) return doc;
    }
    Normalised n = normalise(text);
    if (!n.error.empty()) throw sdk::Error(CMF_ERR_PARSE, std::string(source) + ": not valid JSON: " + n.error);
    if (n.changed) {
        simdjson::error_code err2 = parser.parse(n.text.data(), n.text.size()).get(doc);
        if (!err2) return doc;
        if (bom) err = err2;
    }
    throw sdk::Error(CMF_ERR_PARSE, std::string(source) + ": not valid JSON: " + simdjson::error_message(err));
}

// A number as Python reads it: integers, floats, and NaN/Infinity
// (json_text.hpp's sentinels). nullopt for anything else.
inline std::optional<double> number_of(simdjson::dom::element e) {
    switch (e.type()) {
    case simdjson::dom::element_type::INT64: return double(e.get_int64().value_unsafe());
    case simdjson::dom::element_type::UINT64: return double(e.get_uint64().value_unsafe());
    case simdjson::dom::element_type::DOUBLE: return e.get_double().value_unsafe();
    case simdjson::dom::element_type::STRING: {
        double d;
        if (sentinel_number(e.get_string().value_unsafe(), d)) return d;
        return std::nullopt;
    }
    default: return std::nullopt;
    }
}

// A non-negative integer that fits 64 bits (64.0 counts: Python writes
// some integers as floats); nullopt otherwise.
inline std::optional<uint64_t> u64_of(simdjson::dom::element e) {
    uint64_t u;
    if (!e.get_uint64().get(u)) return u;
    double d;
    if (e.type() == simdjson::dom::element_type::DOUBLE && !e.get_double().get(d) && d >= 0 && d == std::floor(d) &&
        d < 18446744073709551616.0)
        return static_cast<uint64_t>(d);
    return std::nullopt;
}

// The value as a short text for error messages (NaN and the infinities
// spelled as Python writes them).
inline std::string spelling(simdjson::dom::element e) {
    std::string_view s;
    if (!e.get_string().get(s)) {
        if (s == kNaNValue) return "NaN";
        if (s == kInfValue) return "Infinity";
        if (s == kNegInfValue) return "-Infinity";
    }
    std::string m = simdjson::minify(e);
    if (m.size() > 80) m = m.substr(0, 77) + "...";
    return m;
}

// A JSON object read from `source`, found at `path` ("" at the top,
// "text_config." inside): optional typed reads. JSON null reads as absent;
// a present value of the wrong kind is an error naming the file, the key
// and the value.
class Object {
public:
    Object() = default;
    Object(simdjson::dom::object o, std::string source, std::string path = {})
        : o_(o), source_(std::move(source)), path_(std::move(path)) {}

    simdjson::dom::object raw() const { return o_; }
    const std::string &source() const { return source_; }
    const std::string &path() const { return path_; }
    std::string key_path(std::string_view key) const { return path_ + std::string(key); }

    [[noreturn]] void fail(std::string_view key, std::string_view message) const {
        throw sdk::Error(CMF_ERR_PARSE, source_ + ": " + key_path(key) + ": " + std::string(message));
    }
    [[noreturn]] void fail(std::string_view key, simdjson::dom::element value, std::string_view want) const {
        throw sdk::Error(CMF_ERR_PARSE, source_ + ": " + key_path(key) + " = " + spelling(value) + ": " + std::string(want));
    }
    [[noreturn]] void missing(std::string_view key) const {
        throw sdk::Error(CMF_ERR_PARSE, source_ + ": missing required key " + key_path(key));
    }

    bool has(std::string_view key) const { return get(key).has_value(); }
    std::optional<simdjson::dom::element> get(std::string_view key) const {
        simdjson::dom::element e;
        if (o_[key].get(e) || e.is_null()) return std::nullopt;
        return e;
    }
    // Any number, NaN and the infinities included.
    std::optional<double> number(std::string_view key) const {
        auto e = get(key);
        if (!e) return std::nullopt;
        auto d = number_of(*e);
        if (!d) fail(key, *e, "must be a number");
        return d;
    }
    // A finite number.
    std::optional<double> finite(std::string_view key) const {
        auto d = number(key);
        if (d && !std::isfinite(*d)) fail(key, *get(key), "must be a finite number");
        return d;
    }
    std::optional<uint64_t> u64(std::string_view key) const {
        auto e = get(key);
        if (!e) return std::nullopt;
        auto u = u64_of(*e);
        if (!u) fail(key, *e, "must be a non-negative integer that fits 64 bits");
        return u;
    }
    // A limit ("no more than N"): values past 64 bits, and +Infinity, read
    // as the largest uint64 (int(1e30) is how HF tokenizers say "no limit").
    std::optional<uint64_t> limit(std::string_view key) const {
        auto e = get(key);
        if (!e) return std::nullopt;
        if (auto u = u64_of(*e)) return u;
        auto d = number_of(*e);
        if (d && *d >= 18446744073709551616.0) return UINT64_MAX;  // +Infinity too
        fail(key, *e, "must be a non-negative integer (a limit)");
    }
    std::optional<std::string> str(std::string_view key) const {
        auto e = get(key);
        if (!e) return std::nullopt;
        std::string_view s;
        if (e->get_string().get(s) || (!s.empty() && s[0] == '\0' && number_of(*e))) fail(key, *e, "must be a string");
        return std::string(s);
    }
    std::optional<bool> boolean(std::string_view key) const {
        auto e = get(key);
        if (!e) return std::nullopt;
        bool b;
        if (e->get_bool().get(b)) fail(key, *e, "must be true or false");
        return b;
    }
    std::optional<Object> object(std::string_view key) const {
        auto e = get(key);
        if (!e) return std::nullopt;
        simdjson::dom::object o;
        if (e->get_object().get(o)) fail(key, *e, "must be an object");
        return Object(o, source_, key_path(key) + ".");
    }
    std::optional<simdjson::dom::array> array(std::string_view key) const {
        auto e = get(key);
        if (!e) return std::nullopt;
        simdjson::dom::array a;
        if (e->get_array().get(a)) fail(key, *e, "must be an array");
        return a;
    }

private:
    simdjson::dom::object o_;
    std::string source_, path_;
};

// The top-level object of `text` (parse() above).
inline Object parse_object(simdjson::dom::parser &parser, std::string_view text, std::string source) {
    simdjson::dom::element doc = parse(parser, text, source);
    simdjson::dom::object o;
    if (doc.get_object().get(o)) throw sdk::Error(CMF_ERR_PARSE, source + ": not a JSON object");
    return Object(o, std::move(source));
}

}  // namespace cmf::json
