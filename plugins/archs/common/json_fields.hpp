// Typed reads of a JSON object's keys with errors that name them: the arch
// block of a header ("arch.hidden_size: required key is missing") and the
// component configs of a pipeline ("dit.config_json: patch_size: ...").
// A key holding JSON null counts as absent. Errors are cmf::sdk::Error
// with CMF_ERR_PARSE.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cmf::archs {

class JsonFields {
public:
    // `where` prefixes every message: "arch." gives "arch.KEY: ...".
    JsonFields(simdjson::dom::element obj, std::string where) : obj_(obj), where_(std::move(where)) {}

    [[noreturn]] void bad(const std::string &key, const std::string &what) const;
    bool has(const char *key) const;
    uint64_t uint(const char *key) const;                         // required
    uint64_t uint(const char *key, uint64_t fallback) const;      // optional
    double number(const char *key, double fallback, bool required = false) const;
    std::string string(const char *key, const char *fallback, bool required = false) const;
    bool boolean(const char *key, bool fallback) const;
    std::vector<uint64_t> uints(const char *key) const;           // required array of non-negative integers
    std::vector<std::string> strings(const char *key) const;      // required array of strings

private:
    simdjson::dom::element get(const char *key) const;  // null element when absent
    simdjson::dom::element obj_;
    std::string where_;
};

}  // namespace cmf::archs
