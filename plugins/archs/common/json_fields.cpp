#include "json_fields.hpp"

#include <cmf/plugin.hpp>

namespace cmf::archs {

using cmf::sdk::Error;
using simdjson::dom::element;

void JsonFields::bad(const std::string &key, const std::string &what) const {
    throw Error(CMF_ERR_PARSE, where_ + key + ": " + what);
}

element JsonFields::get(const char *key) const {
    element e;
    if (obj_[key].get(e) != simdjson::SUCCESS) return element();
    return e;
}

bool JsonFields::has(const char *key) const {
    element e;
    return obj_[key].get(e) == simdjson::SUCCESS && !e.is_null();
}

uint64_t JsonFields::uint(const char *key) const {
    if (!has(key)) bad(key, "required key is missing");
    uint64_t v;
    if (get(key).get_uint64().get(v) != simdjson::SUCCESS) bad(key, "must be a non-negative integer");
    return v;
}

uint64_t JsonFields::uint(const char *key, uint64_t fallback) const { return has(key) ? uint(key) : fallback; }

double JsonFields::number(const char *key, double fallback, bool required) const {
    if (!has(key)) {
        if (required) bad(key, "required key is missing");
        return fallback;
    }
    const element e = get(key);
    double v;
    if (e.get_double().get(v) == simdjson::SUCCESS) return v;
    int64_t i;
    if (e.get_int64().get(i) == simdjson::SUCCESS) return double(i);
    uint64_t u;
    if (e.get_uint64().get(u) == simdjson::SUCCESS) return double(u);
    bad(key, "must be a number");
}

std::string JsonFields::string(const char *key, const char *fallback, bool required) const {
    if (!has(key)) {
        if (required) bad(key, "required key is missing");
        return fallback;
    }
    std::string_view s;
    if (get(key).get_string().get(s) != simdjson::SUCCESS) bad(key, "must be a string");
    return std::string(s);
}

bool JsonFields::boolean(const char *key, bool fallback) const {
    if (!has(key)) return fallback;
    bool b;
    if (get(key).get_bool().get(b) != simdjson::SUCCESS) bad(key, "must be true or false");
    return b;
}

std::vector<uint64_t> JsonFields::uints(const char *key) const {
    if (!has(key)) bad(key, "required key is missing");
    simdjson::dom::array arr;
    if (get(key).get_array().get(arr) != simdjson::SUCCESS) bad(key, "must be an array of non-negative integers");
    std::vector<uint64_t> out;
    for (element e : arr) {
        uint64_t v;
        if (e.get_uint64().get(v) != simdjson::SUCCESS) bad(key, "must be an array of non-negative integers");
        out.push_back(v);
    }
    return out;
}

std::vector<std::string> JsonFields::strings(const char *key) const {
    if (!has(key)) bad(key, "required key is missing");
    simdjson::dom::array arr;
    if (get(key).get_array().get(arr) != simdjson::SUCCESS) bad(key, "must be an array of strings");
    std::vector<std::string> out;
    for (element e : arr) {
        std::string_view s;
        if (e.get_string().get(s) != simdjson::SUCCESS) bad(key, "must be an array of strings");
        out.emplace_back(s);
    }
    return out;
}

}  // namespace cmf::archs
