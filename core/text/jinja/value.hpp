// The values a chat template computes with, and the Python semantics the
// interpreter gives them: truthiness, str()/repr(), ==, <, iteration and
// json.dumps. Internal to the Jinja interpreter (core/text/jinja.hpp is the
// public face).
#pragma once

#include "common/error.hpp"
#include "text/jinja.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cmf::text::jinja {

// Every template error: cmf::Error(CMF_ERR_TEMPLATE) naming the line (0:
// the line the current render is running).
[[noreturn]] void fail(int line, const std::string &msg);

// The work budget of the render running on this thread (RenderLimits). The
// renderer charges statements and expressions as it runs them, and the
// value functions below charge what they walk, so every loop and recursion
// a template can drive ends, at the latest, at a limit with a clear error.
// A render is single-threaded, so "this thread's render" is the one whose
// Budget was constructed last on the thread and not yet destroyed.
class Budget {
public:
    explicit Budget(const RenderLimits &limits);
    ~Budget();
    Budget(const Budget &) = delete;
    Budget &operator=(const Budget &) = delete;
    static Budget *current();  // nullptr outside a render
    const RenderLimits &limits() const { return l_; }
    void charge(uint64_t units, int line);
    // The template line being run, for errors raised where no line is known.
    int line() const { return line_; }
    // One level of run-time nesting: a statement, expression or macro call.
    class Nest {
    public:
        Nest(Budget &b, int line);
        ~Nest() {
            --b_.depth_;
            b_.line_ = outer_line_;
        }
        Nest(const Nest &) = delete;
        Nest &operator=(const Nest &) = delete;

    private:
        Budget &b_;
        int outer_line_;
    };

private:
    RenderLimits l_;
    uint64_t used_ = 0;
    int depth_ = 0;
    int line_ = 0;
    Budget *prev_;
};
// Charges the current render's budget (nothing outside a render).
void charge(uint64_t units, int line);
// Fails when a string of `n` bytes would be longer than the current
// render's limit.
void check_bytes(uint64_t n, int line);

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

// What walking a value costs: a string's length in 64-byte units, the
// items of a list or dict.
uint64_t size_units(const Value &v);
bool truthy(const Value &v);
// Python's type name, for error messages.
const char *type_name(const Value &v);
// Python's repr of a float (shortest round-trip, always with '.' or 'e').
std::string float_repr(double d);
std::string py_str_repr(const std::string &s);
// Python's str(): what {{ x }} prints. `line` is for errors of nested
// containers (too deep, too long).
std::string to_str(const Value &v, int line = 0);
std::string repr(const Value &v, int line = 0);
// json.dumps(x, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
void to_json(const Value &v, std::string &out, int indent, int depth, const std::string &item_sep,
             const std::string &key_sep, bool sort_keys, int line);
// Code points of a UTF-8 string, for Python's per-character indexing.
std::vector<std::string> chars_of(const std::string &s);
bool values_equal(const Value &a, const Value &b, int line = 0);
// -1, 0, 1 as Python's <; other types than numbers, strings, lists fail.
int compare(const Value &a, const Value &b, int line);
// Items a for-loop or filter iterates: list items, dict keys, string chars.
Array iterate(const Value &v, int line);

}  // namespace cmf::text::jinja
