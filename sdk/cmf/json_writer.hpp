// cmf/json_writer.hpp — a small streaming JSON writer with the original's
// spelling (serde_json's, as its W1 writer emits headers): compact, keys in the order written, UTF-8 kept
// as is, and floats in serde_json's shortest round-trip form, with f32 and
// f64 spelled differently ("1e-6", "10000.0", "9.797959").
//
// Why not Boost.JSON: its serializer spells doubles its own way ("1E-6",
// "1E4") and has no notion of an f32 value, so headers would not match the
// original byte for byte. Parsing stays with simdjson.
//
// Header-only; used by the converter in libcmf and by arch plugins.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace cmf::json {

// serde_json spelling of a finite float: `digits` are the shortest
// round-trip significant digits, `exp10` the decimal exponent of the first.
// Plain when exp10 is in [lo, hi], else d[.ddd]e±X.
inline std::string spell_float(double v, bool is_f32) {
    if (!std::isfinite(v)) return "null";
    char buf[64];
    std::to_chars_result r = is_f32 ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(v), std::chars_format::scientific)
                                    : std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    std::string s(buf, r.ptr);
    std::string out;
    if (!s.empty() && s[0] == '-') {
        out += '-';
        s.erase(0, 1);
    }
    size_t epos = s.find('e');
    std::string mant = s.substr(0, epos);
    int exp10 = std::atoi(s.c_str() + epos + 1);
    std::string digits;
    for (char c : mant)
        if (c != '.') digits += c;
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    const int lo = is_f32 ? -6 : -5, hi = is_f32 ? 12 : 15;
    if (digits == "0") return out + "0.0";
    if (exp10 >= lo && exp10 <= hi) {
        if (exp10 >= 0) {
            std::string ip = digits.substr(0, std::min<size_t>(digits.size(), static_cast<size_t>(exp10) + 1));
            while (ip.size() < static_cast<size_t>(exp10) + 1) ip += '0';
            std::string fp = digits.size() > ip.size() ? digits.substr(ip.size()) : std::string();
            out += ip + "." + (fp.empty() ? "0" : fp);
        } else {
            out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
        }
        return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += "e";
    out += exp10 < 0 ? "-" : "+";
    out += std::to_string(exp10 < 0 ? -exp10 : exp10);
    return out;
}

inline void append_string(std::string &out, std::string_view s) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                char b[8];
                std::snprintf(b, sizeof b, "\\u%04x", c);
                out += b;
            } else {
                out += static_cast<char>(c);
            }
        }
    }
    out += '"';
}

// Builds one JSON text. Commas are inserted automatically; keys must be
// given inside objects (key() then a value).
class Writer {
public:
    Writer &begin_object() { return open('{'); }
    Writer &end_object() { return close('}'); }
    Writer &begin_array() { return open('['); }
    Writer &end_array() { return close(']'); }
    Writer &key(std::string_view k) {
        comma();
        append_string(out_, k);
        out_ += ':';
        after_key_ = true;
        return *this;
    }
    Writer &string(std::string_view s) { value(); append_string(out_, s); return *this; }
    Writer &u64(uint64_t v) { value(); out_ += std::to_string(v); return *this; }
    Writer &i64(int64_t v) { value(); out_ += std::to_string(v); return *this; }
    Writer &f64(double v) { value(); out_ += spell_float(v, false); return *this; }
    Writer &f32(float v) { value(); out_ += spell_float(v, true); return *this; }
    Writer &boolean(bool b) { value(); out_ += b ? "true" : "false"; return *this; }
    Writer &null() { value(); out_ += "null"; return *this; }
    // Splice an already serialized JSON value.
    Writer &raw(std::string_view json) { value(); out_ += json; return *this; }

    const std::string &str() const { return out_; }
    std::string take() { return std::move(out_); }

private:
    void comma() {
        if (!first_.empty() && !first_.back()) out_ += ',';
        if (!first_.empty()) first_.back() = false;
    }
    void value() {
        if (after_key_) after_key_ = false;
        else comma();
    }
    Writer &open(char c) {
        value();
        out_ += c;
        first_.push_back(true);
        return *this;
    }
    Writer &close(char c) {
        out_ += c;
        if (!first_.empty()) first_.pop_back();
        return *this;
    }
    std::string out_;
    std::vector<bool> first_;
    bool after_key_ = false;
};

}  // namespace cmf::json
