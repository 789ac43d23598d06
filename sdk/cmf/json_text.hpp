// cmf/json_text.hpp — JSON text as real files spell it, rewritten into text
// every strict parser reads (simdjson in libcmf and the plugins, Boost.JSON
// in cmfhost). No parser here: json_read.hpp parses the result.
//
// Files written by Python's json module (config.json, tokenizer_config.json,
// generation_config.json of Hugging Face checkpoints) may hold what strict
// JSON parsers refuse:
//  - integers beyond 64 bits: `"model_max_length": 1000000000000000019884624838656`
//    (int(1e30), the tokenizers' "no limit") — rewritten as a double
//    (the same digits + ".0"), which is what Python's readers make of it
//    where a float is expected;
//  - NaN, Infinity, -Infinity (json.dumps writes them unless allow_nan=False),
//    and numbers too large for a double (1e400, which Python reads as inf) —
//    rewritten as the sentinel strings below, which the typed reads of
//    json_read.hpp (and the chat templates' JSON import) turn back into
//    NaN / ±infinity and nothing else mistakes for a number;
//  - a UTF-8 byte order mark, dropped.
// Nesting deeper than kMaxDepth is refused with that reason.
//
// Why a text pass and not the parser: simdjson 3.0.1 (Debian 12) has no
// big-integer mode in either API (its DOM and on-demand parsers both stop
// with "Problem while parsing a number") and no NaN/Infinity extension;
// Boost.JSON 1.81 has neither either. The pass runs only after a strict
// parse failed (json_read.hpp), so well-formed files cost nothing extra.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace cmf::json {

// The deepest nesting of arrays and objects accepted (simdjson's default).
inline constexpr size_t kMaxDepth = 1024;

// NaN and the infinities as they appear in rewritten text (JSON strings
// whose first character is U+0000, which no real value starts with) ...
inline constexpr std::string_view kNaNToken = "\"\\u0000NaN\"";
inline constexpr std::string_view kInfToken = "\"\\u0000Infinity\"";
inline constexpr std::string_view kNegInfToken = "\"\\u0000-Infinity\"";
// ... and as the parsed string values.
inline constexpr std::string_view kNaNValue{"\0NaN", 4};
inline constexpr std::string_view kInfValue{"\0Infinity", 9};
inline constexpr std::string_view kNegInfValue{"\0-Infinity", 10};

// The number a sentinel string stands for; false for any other string.
inline bool sentinel_number(std::string_view s, double &out) {
    if (s.empty() || s[0] != '\0') return false;
    if (s == kNaNValue) out = std::nan("");
    else if (s == kInfValue) out = HUGE_VAL;
    else if (s == kNegInfValue) out = -HUGE_VAL;
    else return false;
    return true;
}

namespace detail {

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

// One number token starting at text[i] ('-' or a digit): its rewrite, or
// empty when it is kept as written. `end` is set past the token.
inline std::string rewrite_number(std::string_view text, size_t i, size_t &end) {
    size_t j = i;
    const bool neg = text[j] == '-';
    if (neg) ++j;
    const size_t int_begin = j;
    while (j < text.size() && is_digit(text[j])) ++j;
    const size_t int_end = j;
    bool is_float = false;
    size_t frac_begin = j, frac_end = j;
    if (j < text.size() && text[j] == '.') {
        is_float = true;
        frac_begin = ++j;
        while (j < text.size() && is_digit(text[j])) ++j;
        frac_end = j;
    }
    long long exp10 = 0;
    if (j < text.size() && (text[j] == 'e' || text[j] == 'E')) {
        is_float = true;
        ++j;
        bool eneg = false;
        if (j < text.size() && (text[j] == '+' || text[j] == '-')) eneg = text[j++] == '-';
        while (j < text.size() && is_digit(text[j])) {
            if (exp10 < 100000) exp10 = exp10 * 10 + (text[j] - '0');
            ++j;
        }
        if (eneg) exp10 = -exp10;
    }
    end = j;
    const std::string_view token = text.substr(i, j - i);
    if (int_end == int_begin) return {};  // not a number ("-" alone, "-Infinity" is handled by the caller)
    if (!is_float) {
        uint64_t u = 0;
        auto r = std::from_chars(text.data() + int_begin, text.data() + int_end, u);
        const bool fits = r.ec == std::errc() && (!neg || u <= uint64_t(INT64_MAX) + 1);
        if (fits) return {};
    } else {
        double d = 0;
        auto r = std::from_chars(token.data(), token.data() + token.size(), d);
        if (r.ec != std::errc::result_out_of_range) return {};
        // Out of range: an underflow (1e-400) reads as 0 everywhere; only an
        // overflow needs the infinity. Its decimal magnitude decides.
        size_t lead = int_begin;
        while (lead < int_end && text[lead] == '0') ++lead;
        long long magnitude = exp10;
        if (lead < int_end) {
            magnitude += static_cast<long long>(int_end - lead);
        } else {
            size_t f = frac_begin;
            while (f < frac_end && text[f] == '0') ++f;
            magnitude -= static_cast<long long>(f - frac_begin);
        }
        if (magnitude <= 0) return {};
        return std::string(neg ? kNegInfToken : kInfToken);
    }
    // An integer beyond 64 bits: a double when it fits one, else infinity.
    double d = 0;
    auto r = std::from_chars(token.data(), token.data() + token.size(), d);
    if (r.ec == std::errc::result_out_of_range) return std::string(neg ? kNegInfToken : kInfToken);
    return std::string(token) + ".0";
}

}  // namespace detail

// Outcome of normalise(): `changed` when `text` holds a rewrite to parse
// instead of the input; `error` non-empty when the input cannot be read for
// a reason the pass itself found (nesting too deep).
struct Normalised {
    bool changed = false;
    std::string text;
    std::string error;
};

// Rewrites the non-standard spellings listed at the top, outside strings;
// everything else is copied as is (a strict parser reports what is wrong with it).
inline Normalised normalise(std::string_view in) {
    Normalised out;
    if (in.size() >= 3 && in.substr(0, 3) == "\xEF\xBB\xBF") {
        in.remove_prefix(3);
        out.changed = true;
    }
    std::string &o = out.text;
    o.reserve(in.size() + 16);
    size_t depth = 0, copied = 0;  // in[copied..i) is still to be copied
    auto flush = [&](size_t upto) {
        o.append(in.data() + copied, upto - copied);
        copied = upto;
    };
    for (size_t i = 0; i < in.size();) {
        const char c = in[i];
        if (c == '"') {  // skip the string, escapes included
            ++i;
            while (i < in.size() && in[i] != '"') i += in[i] == '\\' ? 2 : 1;
            ++i;
            continue;
        }
        if (c == '[' || c == '{') {
            if (++depth > kMaxDepth) {
                out.error = "arrays and objects nested deeper than " + std::to_string(kMaxDepth) + " levels";
                return out;
            }
        } else if (c == ']' || c == '}') {
            if (depth) --depth;
        } else if (c == 'N' || c == 'I' || c == '-') {
            static constexpr std::string_view words[][2] = {
                {"NaN", kNaNToken}, {"Infinity", kInfToken}, {"-Infinity", kNegInfToken}};
            bool matched = false;
            for (const auto &w : words)
                if (in.substr(i, w[0].size()) == w[0]) {
                    flush(i);
                    o += w[1];
                    i += w[0].size();
                    copied = i;
                    out.changed = matched = true;
                    break;
                }
            if (matched) continue;
        }
        if (c == '-' || detail::is_digit(c)) {
            size_t end = i;
            std::string rw = detail::rewrite_number(in, i, end);
            if (!rw.empty()) {
                flush(i);
                o += rw;
                copied = end;
                out.changed = true;
            }
            i = std::max(end, i + 1);
            continue;
        }
        ++i;
    }
    flush(in.size());
    return out;
}

}  // namespace cmf::json
