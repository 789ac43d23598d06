// The values a chat template computes with, and the Python semantics the
// interpreter gives them: truthiness, str()/repr(), ==, <, iteration and
// json.dumps. Internal to the Jinja interpreter (core/text/jinja.hpp is the
// public face).
#pragma once

#include "common/error.hpp"

#include <simdjson.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cmf::text::jinja {

// Every template error: cmf::Error(CMF_ERR_TEMPLATE) naming the line.
[[noreturn]] void fail(int line, const std::string &msg);

struct Value;
using Array = std::vector<Value>;
struct Object;
struct Callable;

struct Value {
    enum Kind : uint8_t { Undefined, None, Bool, Int, Float, Str, List, Dict, Func };
    Kind kind = Undefined;
    bool b = false;
    int64_t i = 0;
    double f = 0;
    std::string s;  // string value; for Undefined, the name (for messages)
    std::shared_ptr<Array> list;
    std::shared_ptr<Object> dict;
    std::shared_ptr<Callable> func;

    static Value undefined(std::string name = {}) {
        Value v;
        v.s = std::move(name);
        return v;
    }
    static Value none() {
        Value v;
        v.kind = None;
        return v;
    }
    static Value boolean(bool x) {
        Value v;
        v.kind = Bool;
        v.b = x;
        return v;
    }
    static Value integer(int64_t x) {
        Value v;
        v.kind = Int;
        v.i = x;
        return v;
    }
    static Value number(double x) {
        Value v;
        v.kind = Float;
        v.f = x;
        return v;
    }
    static Value str(std::string x) {
        Value v;
        v.kind = Str;
        v.s = std::move(x);
        return v;
    }
    static Value array(Array a = {}) {
        Value v;
        v.kind = List;
        v.list = std::make_shared<Array>(std::move(a));
        return v;
    }
    static Value object();
    bool is_undef() const { return kind == Undefined; }
    bool is_num() const { return kind == Int || kind == Float || kind == Bool; }
    double as_double() const { return kind == Float ? f : kind == Int ? double(i) : double(b); }
};

// A dict keeps insertion order (Python's), as json.dumps and items() show it.
struct Object {
    std::vector<std::pair<std::string, Value>> items;
    bool is_namespace = false;
    Value *find(std::string_view k) {
        for (auto &kv : items)
            if (kv.first == k) return &kv.second;
        return nullptr;
    }
    void set(const std::string &k, Value v) {
        if (Value *p = find(k)) *p = std::move(v);
        else items.emplace_back(k, std::move(v));
    }
};
inline Value Value::object() {
    Value v;
    v.kind = Dict;
    v.dict = std::make_shared<Object>();
    return v;
}

struct CallArgs {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value *get(size_t idx, std::string_view name) const {
        for (auto &kv : kw)
            if (kv.first == name) return &kv.second;
        return idx < pos.size() ? &pos[idx] : nullptr;
    }
};
struct Callable {
    std::function<Value(CallArgs &, int line)> fn;
};

bool truthy(const Value &v);
// Python's type name, for error messages.
const char *type_name(const Value &v);
// Python's repr of a float (shortest round-trip, always with '.' or 'e').
std::string float_repr(double d);
std::string py_str_repr(const std::string &s);
// Python's str(): what {{ x }} prints.
std::string to_str(const Value &v);
std::string repr(const Value &v);
// json.dumps(x, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
void to_json(const Value &v, std::string &out, int indent, int depth, const std::string &item_sep,
             const std::string &key_sep, bool sort_keys, int line);
Value from_json(simdjson::dom::element e);
// Code points of a UTF-8 string, for Python's per-character indexing.
std::vector<std::string> chars_of(const std::string &s);
bool values_equal(const Value &a, const Value &b);
// -1, 0, 1 as Python's <; other types than numbers, strings, lists fail.
int compare(const Value &a, const Value &b, int line);
// Items a for-loop or filter iterates: list items, dict keys, string chars.
Array iterate(const Value &v, int line);

}  // namespace cmf::text::jinja
