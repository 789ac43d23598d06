#include "text/jinja/value.hpp"

#include "text/unicode.hpp"

#include <cmf/json_writer.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace cmf::text::jinja {

namespace {
thread_local Budget *current_budget = nullptr;
}  // namespace

void fail(int line, const std::string &msg) {
    if (line == 0 && current_budget) line = current_budget->line();
    throw Error(CMF_ERR_TEMPLATE, "chat template line " + std::to_string(line) + ": " + msg);
}

namespace {

// Outside a render (tests of the value functions) the default limits hold.
int depth_limit() { return current_budget ? current_budget->limits().depth : RenderLimits{}.depth; }

void check_value_depth(int depth, int line) {
    if (depth > depth_limit())
        fail(line, "a value nested deeper than " + std::to_string(depth_limit()) + " levels (does a namespace contain itself?)");
}

}  // namespace

Budget::Budget(const RenderLimits &limits) : l_(limits), prev_(current_budget) { current_budget = this; }
Budget::~Budget() { current_budget = prev_; }
Budget *Budget::current() { return current_budget; }

void Budget::charge(uint64_t units, int line) {
    used_ += units;
    if (used_ > l_.steps)
        fail(line, "the template did more than " + std::to_string(l_.steps) + " steps of work (an endless or runaway loop?)");
}

Budget::Nest::Nest(Budget &b, int line) : b_(b), outer_line_(b.line_) {
    b_.line_ = line;
    if (++b_.depth_ > b_.l_.depth) {
        --b_.depth_;
        b_.line_ = outer_line_;
        fail(line, "statements, expressions and macro calls nested deeper than " + std::to_string(b_.l_.depth) +
                       " levels (runaway recursion?)");
    }
}

void charge(uint64_t units, int line) {
    if (current_budget) current_budget->charge(units, line);
}

void check_bytes(uint64_t n, int line) {
    const uint64_t limit = current_budget ? current_budget->limits().bytes : RenderLimits{}.bytes;
    if (n > limit) fail(line, "a string of " + std::to_string(n) + " bytes, over the limit of " + std::to_string(limit));
}

uint64_t size_units(const Value &v) {
    switch (v.kind) {
    case Value::Str: return v.s.size() / 64;
    case Value::List: return v.list->size();
    case Value::Dict: return v.dict->items.size();
    default: return 0;
    }
}

bool truthy(const Value &v) {
    switch (v.kind) {
    case Value::Undefined:
    case Value::None: return false;
    case Value::Bool: return v.b;
    case Value::Int: return v.i != 0;
    case Value::Float: return v.f != 0;
    case Value::Str: return !v.s.empty();
    case Value::List: return !v.list->empty();
    case Value::Dict: return !v.dict->items.empty();
    case Value::Func: return true;
    }
    return false;
}

const char *type_name(const Value &v) {
    switch (v.kind) {
    case Value::Undefined: return "Undefined";
    case Value::None: return "NoneType";
    case Value::Bool: return "bool";
    case Value::Int: return "int";
    case Value::Float: return "float";
    case Value::Str: return "str";
    case Value::List: return "list";
    case Value::Dict: return "dict";
    case Value::Func: return "function";
    }
    return "?";
}

// Python's repr of a float (shortest round-trip, always with '.' or 'e').
std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[64];
    double a = std::fabs(d);
    std::to_chars_result r;
    if (a != 0 && (a >= 1e16 || a < 1e-4)) r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    else r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
    std::string s(buf, r.ptr);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    // Python writes exponents with at least two digits: 1e-05, 1e+16.
    size_t e = s.find('e');
    if (e != std::string::npos) {
        std::string mant = s.substr(0, e), ex = s.substr(e + 1);
        char sign = '+';
        if (!ex.empty() && (ex[0] == '-' || ex[0] == '+')) {
            sign = ex[0];
            ex = ex.substr(1);
        }
        if (ex.size() < 2) ex = "0" + ex;
        s = mant + "e" + sign + ex;
    }
    return s;
}

std::string py_str_repr(const std::string &s) {
    bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
    char q = has_sq && !has_dq ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c == q) out += std::string("\\") + char(c);
        else if (c < 0x20 || c == 0x7f) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        } else
            out += char(c);
    }
    return out + q;
}

namespace {

void repr_into(const Value &v, std::string &out, int depth, int line);

void str_into(const Value &v, std::string &out, int depth, int line) {
    switch (v.kind) {
    case Value::Undefined: return;
    case Value::None: out += "None"; return;
    case Value::Bool: out += v.b ? "True" : "False"; return;
    case Value::Int: out += std::to_string(v.i); return;
    case Value::Float: out += float_repr(v.f); return;
    case Value::Str: out += v.s; return;
    default: repr_into(v, out, depth, line); return;
    }
}

// Appends as it walks, so a list holding the same big list many times fails
// at the byte limit instead of being built first.
void repr_into(const Value &v, std::string &out, int depth, int line) {
    check_value_depth(depth, line);
    charge(1, line);
    switch (v.kind) {
    case Value::Str: out += py_str_repr(v.s); break;
    case Value::List:
        out += '[';
        for (size_t k = 0; k < v.list->size(); ++k) {
            if (k) out += ", ";
            repr_into((*v.list)[k], out, depth + 1, line);
        }
        out += ']';
        break;
    case Value::Dict: {
        if (v.dict->is_namespace) {
            out += "<Namespace>";
            break;
        }
        out += '{';
        bool first = true;
        for (auto &kv : v.dict->items) {
            out += (first ? "" : ", ") + py_str_repr(kv.first) + ": ";
            repr_into(kv.second, out, depth + 1, line);
            first = false;
        }
        out += '}';
        break;
    }
    case Value::Func: out += "<function>"; break;
    default: str_into(v, out, depth, line); break;
    }
    check_bytes(out.size(), line);
}

}  // namespace

std::string to_str(const Value &v, int line) {
    if (v.kind == Value::Str) return v.s;
    std::string out;
    str_into(v, out, 0, line);
    return out;
}

std::string repr(const Value &v, int line) {
    std::string out;
    repr_into(v, out, 0, line);
    return out;
}

// json.dumps(x, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
void to_json(const Value &v, std::string &out, int indent, int depth, const std::string &item_sep,
             const std::string &key_sep, bool sort_keys, int line) {
    check_value_depth(depth, line);
    charge(1, line);
    check_bytes(out.size(), line);
    auto newline = [&](int d) {
        if (indent < 0) return;
        check_bytes(out.size() + uint64_t(indent) * uint64_t(d), line);
        out += '\n';
        out.append(size_t(indent) * size_t(d), ' ');
    };
    switch (v.kind) {
    case Value::Undefined: fail(line, "Object of type Undefined is not JSON serializable");
    case Value::None: out += "null"; return;
    case Value::Bool: out += v.b ? "true" : "false"; return;
    case Value::Int: out += std::to_string(v.i); return;
    case Value::Float:
        if (std::isnan(v.f)) out += "NaN";
        else if (std::isinf(v.f)) out += v.f < 0 ? "-Infinity" : "Infinity";
        else out += float_repr(v.f);
        return;
    case Value::Str:
        // Python's json.dumps(ensure_ascii=False) escapes exactly as serde_json does.
        cmf::json::append_string(out, v.s);
        return;
    case Value::List:
        if (v.list->empty()) {
            out += "[]";
            return;
        }
        out += '[';
        for (size_t k = 0; k < v.list->size(); ++k) {
            if (k) out += item_sep;
            newline(depth + 1);
            to_json((*v.list)[k], out, indent, depth + 1, item_sep, key_sep, sort_keys, line);
        }
        newline(depth);
        out += ']';
        return;
    case Value::Dict: {
        if (v.dict->items.empty()) {
            out += "{}";
            return;
        }
        std::vector<const std::pair<std::string, Value> *> items;
        for (auto &kv : v.dict->items) items.push_back(&kv);
        if (sort_keys) std::sort(items.begin(), items.end(), [](auto *a, auto *b) { return a->first < b->first; });
        out += '{';
        for (size_t k = 0; k < items.size(); ++k) {
            if (k) out += item_sep;
            newline(depth + 1);
            to_json(Value::str(items[k]->first), out, indent, depth + 1, item_sep, key_sep, sort_keys, line);
            out += key_sep;
            to_json(items[k]->second, out, indent, depth + 1, item_sep, key_sep, sort_keys, line);
        }
        newline(depth);
        out += '}';
        return;
    }
    case Value::Func: fail(line, "Object of type function is not JSON serializable");
    }
}

// Code points of a UTF-8 string, for Python's per-character indexing.
std::vector<std::string> chars_of(const std::string &s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        uint32_t cp;
        size_t n = utf8_decode(s, i, cp);
        out.push_back(s.substr(i, n));
        i += n;
    }
    return out;
}

namespace {

bool equal_at(const Value &a, const Value &b, int depth, int line) {
    check_value_depth(depth, line);
    charge(1, line);
    if (a.is_num() && b.is_num()) {
        if (a.kind != Value::Float && b.kind != Value::Float) return (a.kind == Value::Int ? a.i : a.b) == (b.kind == Value::Int ? b.i : b.b);
        return a.as_double() == b.as_double();
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case Value::Undefined:
    case Value::None: return true;
    case Value::Str: charge(a.s.size() / 64, line); return a.s == b.s;
    case Value::List:
        if (a.list->size() != b.list->size()) return false;
        for (size_t k = 0; k < a.list->size(); ++k)
            if (!equal_at((*a.list)[k], (*b.list)[k], depth + 1, line)) return false;
        return true;
    case Value::Dict: {
        if (a.dict->items.size() != b.dict->items.size()) return false;
        for (auto &kv : a.dict->items) {
            charge(b.dict->items.size(), line);  // find() is a linear scan
            Value *o = b.dict->find(kv.first);
            if (!o || !equal_at(kv.second, *o, depth + 1, line)) return false;
        }
        return true;
    }
    case Value::Func: return a.func == b.func;
    default: return false;
    }
}

int compare_at(const Value &a, const Value &b, int depth, int line) {
    check_value_depth(depth, line);
    charge(1, line);
    if (a.is_num() && b.is_num()) {
        double x = a.as_double(), y = b.as_double();
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.kind == Value::Str && b.kind == Value::Str) {
        charge(std::min(a.s.size(), b.s.size()) / 64, line);
        return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
    }
    if (a.kind == Value::List && b.kind == Value::List) {
        for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
            int c = compare_at((*a.list)[k], (*b.list)[k], depth + 1, line);
            if (c) return c;
        }
        return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
    }
    fail(line, std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'");
}

}  // namespace

bool values_equal(const Value &a, const Value &b, int line) { return equal_at(a, b, 0, line); }

int compare(const Value &a, const Value &b, int line) { return compare_at(a, b, 0, line); }

// Items a for-loop or filter iterates: list items, dict keys, string chars.
Array iterate(const Value &v, int line) {
    charge(v.kind == Value::Str ? v.s.size() : size_units(v), line);  // a string: one item per character
    switch (v.kind) {
    case Value::Undefined: return {};
    case Value::List: return *v.list;
    case Value::Dict: {
        Array a;
        for (auto &kv : v.dict->items) a.push_back(Value::str(kv.first));
        return a;
    }
    case Value::Str: {
        Array a;
        for (auto &c : chars_of(v.s)) a.push_back(Value::str(c));
        return a;
    }
    default: fail(line, std::string("'") + type_name(v) + "' object is not iterable");
    }
}

}  // namespace cmf::text::jinja
