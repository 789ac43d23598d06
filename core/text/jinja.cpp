#include "text/jinja.hpp"

#include "common/error.hpp"
#include "common/json.hpp"
#include "text/unicode.hpp"

#include <cmf/json_writer.hpp>

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

namespace cmf::text {

const char *const kChatmlTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

[[noreturn]] void fail(int line, const std::string &msg) {
    throw Error(CMF_ERR_TEMPLATE, "chat template line " + std::to_string(line) + ": " + msg);
}

// ---------------------------------------------------------------- values --
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
Value Value::object() {
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

std::string repr(const Value &v);
// Python's str(): what {{ x }} prints.
std::string to_str(const Value &v) {
    switch (v.kind) {
    case Value::Undefined: return "";
    case Value::None: return "None";
    case Value::Bool: return v.b ? "True" : "False";
    case Value::Int: return std::to_string(v.i);
    case Value::Float: return float_repr(v.f);
    case Value::Str: return v.s;
    default: return repr(v);
    }
}
std::string repr(const Value &v) {
    switch (v.kind) {
    case Value::Str: return py_str_repr(v.s);
    case Value::List: {
        std::string o = "[";
        for (size_t k = 0; k < v.list->size(); ++k) o += (k ? ", " : "") + repr((*v.list)[k]);
        return o + "]";
    }
    case Value::Dict: {
        if (v.dict->is_namespace) return "<Namespace>";
        std::string o = "{";
        bool first = true;
        for (auto &kv : v.dict->items) {
            o += (first ? "" : ", ") + py_str_repr(kv.first) + ": " + repr(kv.second);
            first = false;
        }
        return o + "}";
    }
    case Value::Func: return "<function>";
    default: return to_str(v);
    }
}

// json.dumps(x, ensure_ascii=False, indent=indent, separators=..., sort_keys=...)
void to_json(const Value &v, std::string &out, int indent, int depth, const std::string &item_sep,
             const std::string &key_sep, bool sort_keys, int line) {
    auto newline = [&](int d) {
        if (indent < 0) return;
        out += '\n';
        out.append(size_t(indent * d), ' ');
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

Value from_json(simdjson::dom::element e) {
    using simdjson::dom::element_type;
    switch (e.type()) {
    case element_type::ARRAY: {
        Value v = Value::array();
        simdjson::dom::array arr;
        if (e.get(arr)) return v;
        for (simdjson::dom::element x : arr) v.list->push_back(from_json(x));
        return v;
    }
    case element_type::OBJECT: {
        Value v = Value::object();
        simdjson::dom::object obj;
        if (e.get(obj)) return v;
        for (auto kv : obj) v.dict->set(std::string(kv.key), from_json(kv.value));
        return v;
    }
    case element_type::INT64: return Value::integer(e.get_int64().value_unsafe());
    case element_type::UINT64: return Value::number(double(e.get_uint64().value_unsafe()));
    case element_type::DOUBLE: return Value::number(e.get_double().value_unsafe());
    case element_type::STRING: {
        // NaN and the infinities of Python-written JSON arrive as the shared
        // reader's sentinel strings; a template sees them as the floats they are.
        double d;
        if (json::sentinel_number(e.get_string().value_unsafe(), d)) return Value::number(d);
        return Value::str(std::string(e.get_string().value_unsafe()));
    }
    case element_type::BOOL: return Value::boolean(e.get_bool().value_unsafe());
    case element_type::NULL_VALUE: return Value::none();
    }
    return Value::none();
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

bool values_equal(const Value &a, const Value &b) {
    if (a.is_num() && b.is_num()) {
        if (a.kind != Value::Float && b.kind != Value::Float) return (a.kind == Value::Int ? a.i : a.b) == (b.kind == Value::Int ? b.i : b.b);
        return a.as_double() == b.as_double();
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case Value::Undefined:
    case Value::None: return true;
    case Value::Str: return a.s == b.s;
    case Value::List:
        if (a.list->size() != b.list->size()) return false;
        for (size_t k = 0; k < a.list->size(); ++k)
            if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
        return true;
    case Value::Dict: {
        if (a.dict->items.size() != b.dict->items.size()) return false;
        for (auto &kv : a.dict->items) {
            Value *o = b.dict->find(kv.first);
            if (!o || !values_equal(kv.second, *o)) return false;
        }
        return true;
    }
    case Value::Func: return a.func == b.func;
    default: return false;
    }
}

int compare(const Value &a, const Value &b, int line) {
    if (a.is_num() && b.is_num()) {
        double x = a.as_double(), y = b.as_double();
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.kind == Value::Str && b.kind == Value::Str) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
    if (a.kind == Value::List && b.kind == Value::List) {
        for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
            int c = compare((*a.list)[k], (*b.list)[k], line);
            if (c) return c;
        }
        return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
    }
    fail(line, std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'");
}

// Items a for-loop or filter iterates: list items, dict keys, string chars.
Array iterate(const Value &v, int line) {
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

// ---------------------------------------------------------------- lexer --
enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
struct Token {
    Tok type;
    std::string text;
    int line;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::vector<Token> lex(std::string_view src) {
    std::vector<Token> toks;
    size_t pos = 0;
    int line = 1;
    bool strip_next = false;  // a '-' closed the last tag: strip leading whitespace of the next text
    bool trim_next = false;   // trim_blocks: drop one newline after a block/comment tag
    bool line_start = true;   // the text about to be pushed begins a line (for lstrip_blocks)
    auto count_lines = [&](std::string_view s) {
        for (char c : s)
            if (c == '\n') ++line;
    };
    auto push_text = [&](std::string text, bool next_is_block, bool next_minus, bool next_plus) {
        if (strip_next) {
            size_t k = 0;
            while (k < text.size() && is_space(text[k])) ++k;
            line_start = k > 0 && text[k - 1] == '\n';
            text.erase(0, k);
        } else if (trim_next) {
            line_start = false;
            if (text.rfind("\r\n", 0) == 0) {
                text.erase(0, 2);
                line_start = true;
            } else if (!text.empty() && text[0] == '\n') {
                text.erase(0, 1);
                line_start = true;
            }
        } else if (!toks.empty()) {
            line_start = false;
        }
        if (next_minus) {
            while (!text.empty() && is_space(text.back())) text.pop_back();
        } else if (next_is_block && !next_plus) {
            // lstrip_blocks: spaces/tabs between a line start and a block tag.
            size_t k = text.size();
            while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
            if ((k > 0 && text[k - 1] == '\n') || (k == 0 && line_start)) text.erase(k);
        }
        if (!text.empty()) toks.push_back({Tok::Text, std::move(text), line});
    };
    while (pos < src.size()) {
        size_t open = src.find('{', pos);
        while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
               src[open + 1] != '#')
            open = src.find('{', open + 1);
        if (open == std::string_view::npos || open + 1 >= src.size()) {
            std::string text(src.substr(pos));
            int l0 = line;
            push_text(text, false, false, false);
            if (!toks.empty() && toks.back().type == Tok::Text) toks.back().line = l0;
            count_lines(src.substr(pos));
            break;
        }
        char kind = src[open + 1];
        bool minus = open + 2 < src.size() && src[open + 2] == '-';
        bool plus = open + 2 < src.size() && src[open + 2] == '+';
        std::string text(src.substr(pos, open - pos));
        int text_line = line;
        size_t before = toks.size();
        push_text(text, kind != '{', minus, plus);
        if (toks.size() > before) toks.back().line = text_line;
        count_lines(src.substr(pos, open - pos));
        strip_next = trim_next = false;
        size_t p = open + 2 + ((minus || plus) ? 1 : 0);
        int tag_line = line;
        if (kind == '#') {
            size_t close = src.find("#}", p);
            if (close == std::string_view::npos) fail(tag_line, "unclosed comment");
            count_lines(src.substr(p, close + 2 - p));
            strip_next = close > p && src[close - 1] == '-';
            trim_next = !strip_next;
            pos = close + 2;
            continue;
        }
        toks.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", tag_line});
        size_t tag_start = toks.size();
        // tokens inside the tag
        const char *close2 = kind == '{' ? "}}" : "%}";
        bool closed = false;
        while (p < src.size()) {
            char c = src[p];
            if (is_space(c)) {
                if (c == '\n') ++line;
                ++p;
                continue;
            }
            if (c == '-' && src.substr(p + 1, 2) == close2) {
                strip_next = true;
                p += 3;
                closed = true;
                break;
            }
            if (src.substr(p, 2) == close2) {
                p += 2;
                closed = true;
                trim_next = kind == '%';
                break;
            }
            if (c == '\'' || c == '"') {
                std::string s;
                size_t k = p + 1;
                while (k < src.size() && src[k] != c) {
                    if (src[k] == '\\' && k + 1 < src.size()) {
                        char e = src[++k];
                        switch (e) {
                        case 'n': s += '\n'; break;
                        case 't': s += '\t'; break;
                        case 'r': s += '\r'; break;
                        case '\\': s += '\\'; break;
                        case '\'': s += '\''; break;
                        case '"': s += '"'; break;
                        case '0': s += '\0'; break;
                        case 'u':
                        case 'x': {
                            size_t n = e == 'u' ? 4 : 2;
                            uint32_t cp = 0;
                            for (size_t q = 0; q < n && k + 1 < src.size(); ++q) {
                                char h = src[++k];
                                cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
                            }
                            s += utf8_encode(cp);
                            break;
                        }
                        default: s += '\\'; s += e;
                        }
                        ++k;
                        continue;
                    }
                    if (src[k] == '\n') ++line;
                    s += src[k++];
                }
                if (k >= src.size()) fail(tag_line, "unterminated string");
                toks.push_back({Tok::String, std::move(s), line});
                p = k + 1;
                continue;
            }
            if (std::isdigit(static_cast<unsigned char>(c))) {
                size_t k = p;
                while (k < src.size() && (std::isdigit(static_cast<unsigned char>(src[k])) || src[k] == '_')) ++k;
                bool is_float = false;
                if (k + 1 < src.size() && src[k] == '.' && std::isdigit(static_cast<unsigned char>(src[k + 1]))) {
                    is_float = true;
                    ++k;
                    while (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) ++k;
                }
                if (k < src.size() && (src[k] == 'e' || src[k] == 'E')) {
                    size_t q = k + 1;
                    if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
                    if (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) {
                        is_float = true;
                        k = q;
                        while (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) ++k;
                    }
                }
                std::string num(src.substr(p, k - p));
                num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
                toks.push_back({is_float ? Tok::Float : Tok::Int, num, line});
                p = k;
                continue;
            }
            if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
                size_t k = p;
                while (k < src.size() && (std::isalnum(static_cast<unsigned char>(src[k])) || src[k] == '_')) ++k;
                toks.push_back({Tok::Name, std::string(src.substr(p, k - p)), line});
                p = k;
                continue;
            }
            static const char *ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                        "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "=", "!"};
            bool matched = false;
            for (const char *op : ops) {
                size_t n = std::strlen(op);
                if (src.substr(p, n) == op) {
                    toks.push_back({Tok::Op, op, line});
                    p += n;
                    matched = true;
                    break;
                }
            }
            if (!matched) fail(line, std::string("unexpected character '") + c + "'");
        }
        if (!closed) fail(tag_line, std::string("tag not closed with '") + close2 + "'");
        toks.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", line});
        // {% raw %} ... {% endraw %}: text verbatim
        if (kind == '%' && toks.size() == tag_start + 2 && toks[tag_start].type == Tok::Name && toks[tag_start].text == "raw") {
            toks.resize(tag_start - 1);
            size_t q = p;
            for (;;) {
                size_t o = src.find("{%", q);
                if (o == std::string_view::npos) fail(tag_line, "raw block not closed with endraw");
                size_t k = o + 2;
                bool m = k < src.size() && src[k] == '-';
                if (m || (k < src.size() && src[k] == '+')) ++k;
                while (k < src.size() && is_space(src[k])) ++k;
                if (src.substr(k, 6) == "endraw") {
                    size_t e = src.find("%}", k);
                    if (e == std::string_view::npos) fail(tag_line, "raw block not closed");
                    std::string raw(src.substr(p, o - p));
                    if (strip_next) {
                        size_t z = 0;
                        while (z < raw.size() && is_space(raw[z])) ++z;
                        raw.erase(0, z);
                    } else if (trim_next && !raw.empty() && raw[0] == '\n')
                        raw.erase(0, 1);
                    if (m)
                        while (!raw.empty() && is_space(raw.back())) raw.pop_back();
                    if (!raw.empty()) toks.push_back({Tok::Text, raw, line});
                    count_lines(src.substr(p, e + 2 - p));
                    strip_next = src[e - 1] == '-';
                    trim_next = !strip_next;
                    p = e + 2;
                    break;
                }
                q = o + 2;
            }
        }
        pos = p;
    }
    toks.push_back({Tok::End, "", line});
    return toks;
}

// ---------------------------------------------------------------- AST --
struct Node;
using NodeP = std::unique_ptr<Node>;
enum class NK {
    // expressions
    Literal, Name, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, And, Or, Not, Cond, ListLit, DictLit, Concat,
    // statements
    Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Body
};
struct Node {
    NK kind;
    int line = 0;
    std::string name;               // Name/Attr/Filter/Test/op/macro name
    Value lit;                      // Literal, Text
    std::vector<NodeP> kids;        // operands, arguments, body statements
    std::vector<std::string> kw;    // keyword names for the last kw.size() kids (calls)
    std::vector<std::string> targets;  // For/Set/Macro params
    bool negate = false;            // "is not"
    NodeP a, b, c;                  // sub-expressions / bodies (If: cond, then, else)
};
NodeP mk(NK k, int line) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    return n;
}

class Parser {
public:
    explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}

    NodeP parse_template() {
        auto body = parse_body({});
        if (peek().type != Tok::End) fail(peek().line, "unexpected '" + peek().text + "'");
        return body;
    }

private:
    std::vector<Token> t_;
    size_t i_ = 0;

    const Token &peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
    const Token &next() { return t_[std::min(i_++, t_.size() - 1)]; }
    bool is_op(const char *op, size_t k = 0) const { return peek(k).type == Tok::Op && peek(k).text == op; }
    bool is_name(const char *n, size_t k = 0) const { return peek(k).type == Tok::Name && peek(k).text == n; }
    void expect_op(const char *op) {
        if (!is_op(op)) fail(peek().line, std::string("expected '") + op + "', got '" + describe(peek()) + "'");
        ++i_;
    }
    void expect(Tok t, const char *what) {
        if (peek().type != t) fail(peek().line, std::string("expected ") + what + ", got '" + describe(peek()) + "'");
        ++i_;
    }
    static std::string describe(const Token &t) {
        switch (t.type) {
        case Tok::BlockEnd: return "%}";
        case Tok::VarEnd: return "}}";
        case Tok::End: return "end of template";
        default: return t.text;
        }
    }
    std::string expect_name() {
        if (peek().type != Tok::Name) fail(peek().line, "expected a name, got '" + describe(peek()) + "'");
        return next().text;
    }

    // Statements until one of `stops` (a block tag name) is next; leaves the
    // parser at that tag's name (after BlockBegin).
    NodeP parse_body(const std::vector<std::string> &stops) {
        auto body = mk(NK::Body, peek().line);
        for (;;) {
            const Token &t = peek();
            if (t.type == Tok::End) {
                if (!stops.empty()) fail(t.line, "unexpected end of template: missing '{% " + stops.back() + " %}'");
                return body;
            }
            if (t.type == Tok::Text) {
                auto n = mk(NK::Text, t.line);
                n->lit = Value::str(t.text);
                body->kids.push_back(std::move(n));
                ++i_;
            } else if (t.type == Tok::VarBegin) {
                ++i_;
                auto n = mk(NK::Output, t.line);
                n->a = parse_expr();
                expect(Tok::VarEnd, "'}}'");
                body->kids.push_back(std::move(n));
            } else if (t.type == Tok::BlockBegin) {
                const Token &kw = peek(1);
                if (kw.type != Tok::Name) fail(kw.line, "expected a tag name");
                if (std::find(stops.begin(), stops.end(), kw.text) != stops.end()) {
                    ++i_;
                    return body;
                }
                ++i_;
                if (auto s = parse_statement()) body->kids.push_back(std::move(s));
            } else {
                fail(t.line, "unexpected '" + describe(t) + "'");
            }
        }
    }

    void end_tag() { expect(Tok::BlockEnd, "'%}'"); }

    NodeP parse_statement() {
        DepthGuard g(depth_, peek().line);
        const Token &kw = next();
        int line = kw.line;
        const std::string &k = kw.text;
        if (k == "if") {
            auto n = mk(NK::If, line);
            n->a = parse_expr();
            end_tag();
            n->b = parse_body({"elif", "else", "endif"});
            Node *cur = n.get();
            for (;;) {
                std::string which = next().text;
                if (which == "elif") {
                    auto e = mk(NK::If, peek().line);
                    e->a = parse_expr();
                    end_tag();
                    e->b = parse_body({"elif", "else", "endif"});
                    Node *en = e.get();
                    auto wrap = mk(NK::Body, e->line);
                    wrap->kids.push_back(std::move(e));
                    cur->c = std::move(wrap);
                    cur = en;
                } else if (which == "else") {
                    end_tag();
                    cur->c = parse_body({"endif"});
                    next();
                    end_tag();
                    break;
                } else {
                    end_tag();
                    break;
                }
            }
            return n;
        }
        if (k == "for") {
            auto n = mk(NK::For, line);
            n->targets.push_back(expect_name());
            while (is_op(",")) {
                ++i_;
                n->targets.push_back(expect_name());
            }
            if (!is_name("in")) fail(peek().line, "expected 'in' in for loop");
            ++i_;
            n->a = parse_or();  // not parse_expr: a trailing `if` filters the loop
            if (is_name("if")) {
                ++i_;
                n->c = parse_or();
            }
            if (is_name("recursive")) fail(line, "recursive for loops are not supported");
            end_tag();
            n->b = parse_body({"else", "endfor"});
            if (t_[i_ - 1].type == Tok::BlockBegin && peek().text == "else") {
                next();
                end_tag();
                auto els = parse_body({"endfor"});
                n->kids.push_back(std::move(els));
            }
            next();
            end_tag();
            return n;
        }
        if (k == "set") {
            std::vector<std::string> targets{expect_name()};
            std::string attr;
            if (is_op(".")) {
                ++i_;
                attr = expect_name();
            }
            while (is_op(",")) {
                ++i_;
                targets.push_back(expect_name());
            }
            if (is_op("=")) {
                ++i_;
                auto n = mk(NK::Set, line);
                n->targets = targets;
                n->name = attr;
                n->a = parse_or_tuple(true);
                end_tag();
                return n;
            }
            auto n = mk(NK::SetBlock, line);
            n->targets = targets;
            n->name = attr;
            if (is_op("|")) n->a = parse_filter_chain(nullptr);
            end_tag();
            n->b = parse_body({"endset"});
            next();
            end_tag();
            return n;
        }
        if (k == "macro") {
            auto n = mk(NK::Macro, line);
            n->name = expect_name();
            parse_params(*n);
            end_tag();
            n->b = parse_body({"endmacro"});
            next();
            if (peek().type == Tok::Name) ++i_;
            end_tag();
            return n;
        }
        if (k == "call") {
            auto n = mk(NK::CallBlock, line);
            if (is_op("(")) parse_params(*n);
            n->a = parse_expr();
            if (n->a->kind != NK::Call) fail(line, "call block needs a macro call");
            end_tag();
            n->b = parse_body({"endcall"});
            next();
            end_tag();
            return n;
        }
        if (k == "filter") {
            auto n = mk(NK::FilterBlock, line);
            n->a = parse_filter_chain(nullptr, true);
            end_tag();
            n->b = parse_body({"endfilter"});
            next();
            end_tag();
            return n;
        }
        if (k == "break" || k == "continue") {
            end_tag();
            return mk(k == "break" ? NK::Break : NK::Continue, line);
        }
        if (k == "generation" || k == "endgeneration") {  // HF's assistant-mask markers: no output
            end_tag();
            return nullptr;
        }
        if (k == "include" || k == "extends" || k == "import" || k == "from" || k == "block")
            fail(line, "'" + k + "' is not supported in chat templates");
        fail(line, "unknown tag '" + k + "'");
    }

    // (a, b=1, ...) into targets (names) and kids (defaults, nullptr-free: missing = Undefined literal)
    void parse_params(Node &n) {
        expect_op("(");
        while (!is_op(")")) {
            n.targets.push_back(expect_name());
            if (is_op("=")) {
                ++i_;
                n.kids.push_back(parse_expr());
            } else {
                auto u = mk(NK::Literal, peek().line);
                u->lit = Value::undefined(n.targets.back());
                u->negate = true;  // marks "no default"
                n.kids.push_back(std::move(u));
            }
            if (!is_op(",")) break;
            ++i_;
        }
        expect_op(")");
    }

    NodeP parse_or_tuple(bool allow_tuple) {
        int line = peek().line;
        auto e = parse_expr();
        if (!allow_tuple || !is_op(",")) return e;
        auto t = mk(NK::ListLit, line);
        t->kids.push_back(std::move(e));
        while (is_op(",")) {
            ++i_;
            t->kids.push_back(parse_expr());
        }
        return t;
    }

public:
    // Guards the recursive descent against absurdly nested input.
    struct DepthGuard {
        int &d;
        DepthGuard(int &depth, int line) : d(depth) {
            if (++d > 100) fail(line, "template nested too deeply");  // ~50 levels of brackets: stays far from the stack limit, even under ASan
        }
        ~DepthGuard() { --d; }
    };
    int depth_ = 0;

    NodeP parse_expr() {
        DepthGuard g(depth_, peek().line);
        auto e = parse_or();
        while (is_name("if")) {
            int line = peek().line;
            ++i_;
            auto n = mk(NK::Cond, line);
            n->a = parse_or();  // condition
            n->b = std::move(e);
            if (is_name("else")) {
                ++i_;
                n->c = parse_expr();
            }
            e = std::move(n);
        }
        return e;
    }

private:
    NodeP parse_or() {
        auto e = parse_and();
        while (is_name("or")) {
            auto n = mk(NK::Or, next().line);
            n->a = std::move(e);
            n->b = parse_and();
            e = std::move(n);
        }
        return e;
    }
    NodeP parse_and() {
        auto e = parse_not();
        while (is_name("and")) {
            auto n = mk(NK::And, next().line);
            n->a = std::move(e);
            n->b = parse_not();
            e = std::move(n);
        }
        return e;
    }
    NodeP parse_not() {
        if (is_name("not")) {
            auto n = mk(NK::Not, next().line);
            n->a = parse_not();
            return n;
        }
        return parse_compare();
    }
    NodeP parse_compare() {
        auto e = parse_math1();
        for (;;) {
            std::string op;
            if (peek().type == Tok::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                           peek().text == "<=" || peek().text == ">" || peek().text == ">="))
                op = next().text;
            else if (is_name("in")) {
                ++i_;
                op = "in";
            } else if (is_name("not") && is_name("in", 1)) {
                i_ += 2;
                op = "not in";
            } else
                break;
            auto n = mk(NK::Binary, peek().line);
            n->name = op;
            n->a = std::move(e);
            n->b = parse_math1();
            e = std::move(n);
        }
        return e;
    }
    NodeP binary(NodeP l, const std::string &op, NodeP r, int line) {
        auto n = mk(op == "~" ? NK::Concat : NK::Binary, line);
        n->name = op;
        n->a = std::move(l);
        n->b = std::move(r);
        return n;
    }
    NodeP parse_math1() {
        auto e = parse_concat();
        while (is_op("+") || is_op("-")) {
            const Token &t = next();
            e = binary(std::move(e), t.text, parse_concat(), t.line);
        }
        return e;
    }
    NodeP parse_concat() {
        auto e = parse_math2();
        while (is_op("~")) {
            const Token &t = next();
            e = binary(std::move(e), "~", parse_math2(), t.line);
        }
        return e;
    }
    NodeP parse_math2() {
        auto e = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            const Token &t = next();
            e = binary(std::move(e), t.text, parse_pow(), t.line);
        }
        return e;
    }
    NodeP parse_pow() {
        auto e = parse_unary(true);
        while (is_op("**")) {
            const Token &t = next();
            e = binary(std::move(e), "**", parse_unary(true), t.line);
        }
        return e;
    }
    NodeP parse_unary(bool with_filter) {
        DepthGuard g(depth_, peek().line);
        NodeP e;
        if (is_op("-") || is_op("+")) {
            auto n = mk(NK::Unary, peek().line);
            n->name = next().text;
            n->a = parse_unary(false);
            e = std::move(n);
        } else {
            e = parse_postfix(parse_primary());
        }
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }
    NodeP parse_primary() {
        const Token &t = next();
        if (t.type == Tok::String) {
            auto n = mk(NK::Literal, t.line);
            std::string s = t.text;
            while (peek().type == Tok::String) s += next().text;  // adjacent literals concatenate
            n->lit = Value::str(s);
            return n;
        }
        if (t.type == Tok::Int) {
            auto n = mk(NK::Literal, t.line);
            n->lit = Value::integer(std::stoll(t.text));
            return n;
        }
        if (t.type == Tok::Float) {
            auto n = mk(NK::Literal, t.line);
            n->lit = Value::number(std::stod(t.text));
            return n;
        }
        if (t.type == Tok::Name) {
            auto n = mk(NK::Literal, t.line);
            if (t.text == "true" || t.text == "True") n->lit = Value::boolean(true);
            else if (t.text == "false" || t.text == "False") n->lit = Value::boolean(false);
            else if (t.text == "none" || t.text == "None") n->lit = Value::none();
            else {
                n->kind = NK::Name;
                n->name = t.text;
            }
            return n;
        }
        if (t.type == Tok::Op && t.text == "(") {
            if (is_op(")")) {
                ++i_;
                return mk(NK::ListLit, t.line);
            }
            auto e = parse_expr();
            if (is_op(",")) {
                auto tup = mk(NK::ListLit, t.line);
                tup->kids.push_back(std::move(e));
                while (is_op(",")) {
                    ++i_;
                    if (is_op(")")) break;
                    tup->kids.push_back(parse_expr());
                }
                e = std::move(tup);
            }
            expect_op(")");
            return e;
        }
        if (t.type == Tok::Op && t.text == "[") {
            auto n = mk(NK::ListLit, t.line);
            while (!is_op("]")) {
                n->kids.push_back(parse_expr());
                if (!is_op(",")) break;
                ++i_;
            }
            expect_op("]");
            return n;
        }
        if (t.type == Tok::Op && t.text == "{") {
            auto n = mk(NK::DictLit, t.line);
            while (!is_op("}")) {
                n->kids.push_back(parse_expr());
                expect_op(":");
                n->kids.push_back(parse_expr());
                if (!is_op(",")) break;
                ++i_;
            }
            expect_op("}");
            return n;
        }
        fail(t.line, "unexpected '" + describe(t) + "'");
    }
    void parse_call_args(Node &n) {
        expect_op("(");
        std::vector<NodeP> pos, kwv;
        while (!is_op(")")) {
            if (peek().type == Tok::Name && is_op("=", 1)) {
                n.kw.push_back(next().text);
                ++i_;
                kwv.push_back(parse_expr());
            } else {
                if (!kwv.empty()) fail(peek().line, "positional argument after keyword argument");
                pos.push_back(parse_expr());
            }
            if (!is_op(",")) break;
            ++i_;
        }
        expect_op(")");
        for (auto &p : pos) n.kids.push_back(std::move(p));
        for (auto &k : kwv) n.kids.push_back(std::move(k));
    }
    NodeP parse_postfix(NodeP e) {
        for (;;) {
            if (is_op(".")) {
                int line = next().line;
                auto n = mk(NK::Attr, line);
                if (peek().type == Tok::Int) n->name = next().text;
                else n->name = expect_name();
                n->a = std::move(e);
                e = std::move(n);
            } else if (is_op("[")) {
                int line = next().line;
                NodeP lo, hi, step;
                bool slice = false;
                if (!is_op(":")) lo = parse_expr();
                if (is_op(":")) {
                    slice = true;
                    ++i_;
                    if (!is_op("]") && !is_op(":")) hi = parse_expr();
                    if (is_op(":")) {
                        ++i_;
                        if (!is_op("]")) step = parse_expr();
                    }
                }
                expect_op("]");
                auto n = mk(slice ? NK::Slice : NK::Index, line);
                n->a = std::move(e);
                if (slice) {
                    n->kids.push_back(std::move(lo));
                    n->kids.push_back(std::move(hi));
                    n->kids.push_back(std::move(step));
                } else
                    n->b = std::move(lo);
                e = std::move(n);
            } else if (is_op("(")) {
                auto n = mk(NK::Call, peek().line);
                n->a = std::move(e);
                parse_call_args(*n);
                e = std::move(n);
            } else
                return e;
        }
    }
    // `| name(args)` chain; `first` true when the leading '|' is absent (filter blocks).
    NodeP parse_filter_chain(NodeP e, bool first = false) {
        while (first || is_op("|")) {
            if (!first) ++i_;
            first = false;
            auto n = mk(NK::Filter, peek().line);
            n->name = expect_name();
            while (is_op(".")) {  // dotted filter names do not exist in jinja2 but keep the error clear
                fail(peek().line, "unknown filter '" + n->name + ".'");
            }
            n->a = std::move(e);
            if (is_op("(")) parse_call_args(*n);
            e = std::move(n);
        }
        return e;
    }
    NodeP parse_filter_expr(NodeP e) {
        for (;;) {
            if (is_op("|")) e = parse_filter_chain(std::move(e));
            else if (is_name("is")) {
                auto n = mk(NK::Test, next().line);
                if (is_name("not")) {
                    ++i_;
                    n->negate = true;
                }
                n->name = expect_name();
                n->a = std::move(e);
                if (is_op("(")) parse_call_args(*n);
                else if (peek().type == Tok::String || peek().type == Tok::Int || peek().type == Tok::Float ||
                         (peek().type == Tok::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                          !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not")))
                    n->kids.push_back(parse_postfix(parse_primary()));
                e = std::move(n);
            } else
                return e;
        }
    }
};

// ---------------------------------------------------------------- eval --
struct BreakSignal {};
struct ContinueSignal {};

struct Macro {
    const Node *node;
};

class Renderer {
public:
    Renderer(int64_t now) : now_(now) { scopes_.emplace_back(); }

    std::vector<std::unordered_map<std::string, Value>> scopes_;
    int64_t now_;
    int depth_ = 0;

    Value lookup(const std::string &name) const {
        for (size_t k = scopes_.size(); k-- > 0;) {
            auto it = scopes_[k].find(name);
            if (it != scopes_[k].end()) return it->second;
        }
        return Value::undefined(name);
    }
    void assign(const std::string &name, Value v) { scopes_.back()[name] = std::move(v); }

    void exec(const Node &n, std::string &out) {
        switch (n.kind) {
        case NK::Body:
            for (auto &k : n.kids) exec(*k, out);
            return;
        case NK::Text: out += n.lit.s; return;
        case NK::Output: out += to_str(eval(*n.a)); return;
        case NK::If:
            if (truthy(eval(*n.a))) exec(*n.b, out);
            else if (n.c) exec(*n.c, out);
            return;
        case NK::For: exec_for(n, out); return;
        case NK::Set: {
            Value v = eval(*n.a);
            if (!n.name.empty()) {
                Value ns = lookup(n.targets[0]);
                if (ns.kind != Value::Dict || !ns.dict->is_namespace)
                    fail(n.line, "cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
                ns.dict->set(n.name, v);
                return;
            }
            assign_targets(n.targets, v, n.line);
            return;
        }
        case NK::SetBlock: {
            std::string body;
            exec(*n.b, body);
            Value v = Value::str(body);
            if (n.a) v = apply_filters(*n.a, v);
            if (!n.name.empty()) {
                Value ns = lookup(n.targets[0]);
                if (ns.kind != Value::Dict || !ns.dict->is_namespace)
                    fail(n.line, "cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
                ns.dict->set(n.name, v);
            } else
                assign(n.targets[0], v);
            return;
        }
        case NK::Macro: assign(n.name, make_macro(n, nullptr)); return;
        case NK::CallBlock: {
            // caller() renders the block body with the call's parameters.
            Value caller = make_macro(n, nullptr, true);
            scopes_.emplace_back();
            assign("caller", caller);
            Value r;
            try {
                r = eval(*n.a);
            } catch (...) {
                scopes_.pop_back();
                throw;
            }
            scopes_.pop_back();
            out += to_str(r);
            return;
        }
        case NK::FilterBlock: {
            std::string body;
            exec(*n.b, body);
            out += to_str(apply_filters(*n.a, Value::str(body)));
            return;
        }
        case NK::Break: throw BreakSignal{};
        case NK::Continue: throw ContinueSignal{};
        default: out += to_str(eval(n)); return;
        }
    }

    // The filter chain node `chain` (whose innermost `a` is null) applied to v.
    Value apply_filters(const Node &chain, Value v) {
        std::vector<const Node *> fs;
        for (const Node *p = &chain; p; p = p->a.get()) fs.push_back(p);
        for (size_t k = fs.size(); k-- > 0;) v = call_filter(*fs[k], v);
        return v;
    }

    void assign_targets(const std::vector<std::string> &targets, const Value &v, int line) {
        if (targets.size() == 1) {
            assign(targets[0], v);
            return;
        }
        Array items = iterate(v, line);
        if (items.size() != targets.size())
            fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()));
        for (size_t k = 0; k < targets.size(); ++k) assign(targets[k], items[k]);
    }

    Value make_macro(const Node &n, const Node *, bool is_caller = false) {
        auto c = std::make_shared<Callable>();
        const Node *np = &n;
        c->fn = [this, np, is_caller](CallArgs &args, int line) -> Value {
            if (++depth_ > 200) fail(line, "macro recursion too deep");
            scopes_.emplace_back();
            size_t used_pos = 0;
            for (size_t k = 0; k < np->targets.size(); ++k) {
                const Value *v = args.get(k, np->targets[k]);
                if (v) {
                    assign(np->targets[k], *v);
                    if (k < args.pos.size()) ++used_pos;
                } else {
                    const Node &d = *np->kids[k];
                    assign(np->targets[k], d.kind == NK::Literal && d.negate ? Value::undefined(np->targets[k]) : eval(d));
                }
            }
            Array varargs(args.pos.begin() + long(std::min(used_pos, args.pos.size())), args.pos.end());
            assign("varargs", Value::array(varargs));
            std::string out;
            try {
                exec(*np->b, out);
            } catch (...) {
                scopes_.pop_back();
                --depth_;
                throw;
            }
            scopes_.pop_back();
            --depth_;
            (void)is_caller;
            return Value::str(out);
        };
        Value v;
        v.kind = Value::Func;
        v.func = c;
        return v;
    }

    void exec_for(const Node &n, std::string &out) {
        Value seq = eval(*n.a);
        Array items;
        if (seq.kind == Value::Dict) {
            for (auto &kv : seq.dict->items) items.push_back(Value::str(kv.first));
        } else
            items = iterate(seq, n.line);
        if (n.c) {  // for x in xs if cond
            Array kept;
            for (auto &it : items) {
                scopes_.emplace_back();
                assign_targets(n.targets, it, n.line);
                bool ok = truthy(eval(*n.c));
                scopes_.pop_back();
                if (ok) kept.push_back(it);
            }
            items = std::move(kept);
        }
        if (items.empty()) {
            if (!n.kids.empty()) exec(*n.kids[0], out);
            return;
        }
        size_t len = items.size();
        for (size_t k = 0; k < len; ++k) {
            scopes_.emplace_back();
            Value loop = Value::object();
            auto &L = *loop.dict;
            L.set("index", Value::integer(int64_t(k + 1)));
            L.set("index0", Value::integer(int64_t(k)));
            L.set("revindex", Value::integer(int64_t(len - k)));
            L.set("revindex0", Value::integer(int64_t(len - k - 1)));
            L.set("first", Value::boolean(k == 0));
            L.set("last", Value::boolean(k + 1 == len));
            L.set("length", Value::integer(int64_t(len)));
            L.set("depth", Value::integer(1));
            L.set("depth0", Value::integer(0));
            L.set("previtem", k > 0 ? items[k - 1] : Value::undefined("previtem"));
            L.set("nextitem", k + 1 < len ? items[k + 1] : Value::undefined("nextitem"));
            auto cyc = std::make_shared<Callable>();
            cyc->fn = [k](CallArgs &a, int line) -> Value {
                if (a.pos.empty()) fail(line, "no items for cycling given");
                return a.pos[k % a.pos.size()];
            };
            Value cv;
            cv.kind = Value::Func;
            cv.func = cyc;
            L.set("cycle", cv);
            assign("loop", loop);
            assign_targets(n.targets, items[k], n.line);
            bool brk = false;
            try {
                exec(*n.b, out);
            } catch (const BreakSignal &) {
                brk = true;
            } catch (const ContinueSignal &) {
            } catch (...) {
                scopes_.pop_back();
                throw;
            }
            scopes_.pop_back();
            if (brk) break;
        }
    }

    Value eval(const Node &n) {
        switch (n.kind) {
        case NK::Literal: return n.lit;
        case NK::Name: {
            Value v = lookup(n.name);
            if (v.is_undef()) v = builtin(n.name);
            return v;
        }
        case NK::Attr: return get_attr(eval(*n.a), n.name, n.line);
        case NK::Index: return get_item(eval(*n.a), eval(*n.b), n.line);
        case NK::Slice: return slice(eval(*n.a), n);
        case NK::Call: return call(n);
        case NK::Filter: return call_filter(n, eval(*n.a));
        case NK::Test: {
            bool r = run_test(n, eval(*n.a));
            return Value::boolean(n.negate ? !r : r);
        }
        case NK::Unary: {
            Value v = eval(*n.a);
            if (!v.is_num()) fail(n.line, std::string("bad operand type for unary ") + n.name + ": '" + type_name(v) + "'");
            if (n.name == "+") return v;
            return v.kind == Value::Float ? Value::number(-v.f) : Value::integer(-(v.kind == Value::Int ? v.i : v.b));
        }
        case NK::Not: return Value::boolean(!truthy(eval(*n.a)));
        case NK::And: {
            Value l = eval(*n.a);
            return truthy(l) ? eval(*n.b) : l;
        }
        case NK::Or: {
            Value l = eval(*n.a);
            return truthy(l) ? l : eval(*n.b);
        }
        case NK::Cond:
            if (truthy(eval(*n.a))) return eval(*n.b);
            return n.c ? eval(*n.c) : Value::undefined();
        case NK::Concat: return Value::str(to_str(eval(*n.a)) + to_str(eval(*n.b)));
        case NK::ListLit: {
            Value v = Value::array();
            for (auto &k : n.kids) v.list->push_back(eval(*k));
            return v;
        }
        case NK::DictLit: {
            Value v = Value::object();
            for (size_t k = 0; k + 1 < n.kids.size(); k += 2) {
                Value key = eval(*n.kids[k]);
                if (key.kind != Value::Str) fail(n.line, "dict keys must be strings here");
                v.dict->set(key.s, eval(*n.kids[k + 1]));
            }
            return v;
        }
        case NK::Binary: return binary(n.name, eval(*n.a), eval(*n.b), n.line);
        default: fail(n.line, "not an expression");
        }
    }

    Value binary(const std::string &op, const Value &l, const Value &r, int line) {
        if (op == "==") return Value::boolean(values_equal(l, r));
        if (op == "!=") return Value::boolean(!values_equal(l, r));
        if (op == "<") return Value::boolean(compare(l, r, line) < 0);
        if (op == "<=") return Value::boolean(compare(l, r, line) <= 0);
        if (op == ">") return Value::boolean(compare(l, r, line) > 0);
        if (op == ">=") return Value::boolean(compare(l, r, line) >= 0);
        if (op == "in" || op == "not in") {
            bool in = contains(r, l, line);
            return Value::boolean(op == "in" ? in : !in);
        }
        if (op == "+") {
            if (l.kind == Value::Str && r.kind == Value::Str) return Value::str(l.s + r.s);
            if (l.kind == Value::List && r.kind == Value::List) {
                Array a = *l.list;
                a.insert(a.end(), r.list->begin(), r.list->end());
                return Value::array(std::move(a));
            }
        }
        if (op == "*" && ((l.kind == Value::Str && r.kind == Value::Int) || (l.kind == Value::Int && r.kind == Value::Str))) {
            const Value &s = l.kind == Value::Str ? l : r;
            int64_t n = l.kind == Value::Int ? l.i : r.i;
            std::string o;
            for (int64_t k = 0; k < n; ++k) o += s.s;
            return Value::str(o);
        }
        if (!l.is_num() || !r.is_num())
            fail(line, std::string("unsupported operand type(s) for ") + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
        bool ints = l.kind != Value::Float && r.kind != Value::Float;
        int64_t li = l.kind == Value::Int ? l.i : l.b, ri = r.kind == Value::Int ? r.i : r.b;
        double ld = l.as_double(), rd = r.as_double();
        if (op == "+") return ints ? Value::integer(li + ri) : Value::number(ld + rd);
        if (op == "-") return ints ? Value::integer(li - ri) : Value::number(ld - rd);
        if (op == "*") return ints ? Value::integer(li * ri) : Value::number(ld * rd);
        if (op == "/") {
            if (rd == 0) fail(line, "division by zero");
            return Value::number(ld / rd);
        }
        if (op == "//" || op == "%") {
            if (rd == 0) fail(line, "integer division or modulo by zero");
            if (ints) {
                int64_t q = li / ri, m = li % ri;
                if (m != 0 && ((m < 0) != (ri < 0))) {
                    --q;
                    m += ri;
                }
                return Value::integer(op == "//" ? q : m);
            }
            double q = std::floor(ld / rd);
            return Value::number(op == "//" ? q : ld - q * rd);
        }
        if (op == "**") return ints && ri >= 0 ? Value::integer(int64_t(std::llround(std::pow(ld, rd)))) : Value::number(std::pow(ld, rd));
        fail(line, "unknown operator " + op);
    }

    bool contains(const Value &hay, const Value &needle, int line) {
        switch (hay.kind) {
        case Value::Str:
            if (needle.kind != Value::Str) fail(line, "'in <string>' requires string as left operand");
            return hay.s.find(needle.s) != std::string::npos;
        case Value::List:
            for (auto &x : *hay.list)
                if (values_equal(x, needle)) return true;
            return false;
        case Value::Dict: return needle.kind == Value::Str && hay.dict->find(needle.s) != nullptr;
        case Value::Undefined: return false;
        default: fail(line, std::string("argument of type '") + type_name(hay) + "' is not iterable");
        }
    }

    [[noreturn]] void undefined_error(const Value &v, int line) {
        fail(line, v.s.empty() ? "value is undefined" : "'" + v.s + "' is undefined");
    }

    Value get_attr(const Value &obj, const std::string &name, int line) {
        if (obj.kind == Value::Dict) {
            if (Value *v = obj.dict->find(name)) return *v;
            if (!obj.dict->is_namespace) {
                Value m = method(obj, name, line);
                if (!m.is_undef()) return m;
            }
            return Value::undefined(name);
        }
        if (obj.is_undef()) undefined_error(obj, line);
        if (obj.kind == Value::Str || obj.kind == Value::List) {
            if (!name.empty() && std::isdigit(static_cast<unsigned char>(name[0])))
                return get_item(obj, Value::integer(std::stoll(name)), line);
            return method(obj, name, line);
        }
        return Value::undefined(name);
    }

    Value get_item(const Value &obj, const Value &key, int line) {
        if (obj.is_undef()) undefined_error(obj, line);
        if (obj.kind == Value::Dict) {
            if (key.kind == Value::Str) {
                if (Value *v = obj.dict->find(key.s)) return *v;
                return Value::undefined(key.s);
            }
            return Value::undefined();
        }
        if ((obj.kind == Value::List || obj.kind == Value::Str) && key.kind == Value::Int) {
            if (obj.kind == Value::List) {
                int64_t n = int64_t(obj.list->size()), k = key.i < 0 ? key.i + n : key.i;
                if (k < 0 || k >= n) return Value::undefined("index");
                return (*obj.list)[size_t(k)];
            }
            auto cs = chars_of(obj.s);
            int64_t n = int64_t(cs.size()), k = key.i < 0 ? key.i + n : key.i;
            if (k < 0 || k >= n) return Value::undefined("index");
            return Value::str(cs[size_t(k)]);
        }
        if (key.kind == Value::Str) return get_attr(obj, key.s, line);
        return Value::undefined();
    }

    Value slice(const Value &obj, const Node &n) {
        auto opt = [&](const NodeP &p) -> std::optional<int64_t> {
            if (!p) return std::nullopt;
            Value v = eval(*p);
            if (v.kind == Value::None) return std::nullopt;
            if (v.kind != Value::Int) fail(n.line, "slice indices must be integers");
            return v.i;
        };
        auto lo = opt(n.kids[0]), hi = opt(n.kids[1]), st = opt(n.kids[2]);
        int64_t step = st.value_or(1);
        if (step == 0) fail(n.line, "slice step cannot be zero");
        Array src;
        bool is_str = obj.kind == Value::Str;
        if (is_str)
            for (auto &c : chars_of(obj.s)) src.push_back(Value::str(c));
        else if (obj.kind == Value::List) src = *obj.list;
        else if (obj.is_undef()) undefined_error(obj, n.line);
        else fail(n.line, std::string("'") + type_name(obj) + "' object is not subscriptable");
        int64_t len = int64_t(src.size());
        auto norm = [&](std::optional<int64_t> v, int64_t dflt, bool is_hi) -> int64_t {
            if (!v) return dflt;
            int64_t x = *v < 0 ? *v + len : *v;
            if (step > 0) return std::clamp<int64_t>(x, 0, len);
            (void)is_hi;
            return std::clamp<int64_t>(x, -1, len - 1);
        };
        int64_t b = norm(lo, step > 0 ? 0 : len - 1, false), e = norm(hi, step > 0 ? len : -1, true);
        Array out;
        if (step > 0)
            for (int64_t k = b; k < e; k += step) out.push_back(src[size_t(k)]);
        else
            for (int64_t k = b; k > e; k += step) out.push_back(src[size_t(k)]);
        if (is_str) {
            std::string s;
            for (auto &c : out) s += c.s;
            return Value::str(s);
        }
        return Value::array(std::move(out));
    }

    CallArgs eval_args(const Node &n) {
        CallArgs a;
        size_t npos = n.kids.size() - n.kw.size();
        for (size_t k = 0; k < npos; ++k) a.pos.push_back(eval(*n.kids[k]));
        for (size_t k = 0; k < n.kw.size(); ++k) a.kw.emplace_back(n.kw[k], eval(*n.kids[npos + k]));
        return a;
    }

    Value call(const Node &n) {
        Value f = eval(*n.a);
        CallArgs args = eval_args(n);
        if (f.kind != Value::Func) {
            if (f.is_undef()) fail(n.line, "'" + (f.s.empty() ? std::string("value") : f.s) + "' is undefined (not callable)");
            fail(n.line, std::string("'") + type_name(f) + "' object is not callable");
        }
        return f.func->fn(args, n.line);
    }

    static Value func(std::function<Value(CallArgs &, int)> fn) {
        Value v;
        v.kind = Value::Func;
        v.func = std::make_shared<Callable>();
        v.func->fn = std::move(fn);
        return v;
    }

    Value builtin(const std::string &name) {
        if (name == "raise_exception")
            return func([](CallArgs &a, int line) -> Value {
                std::string msg = a.pos.empty() ? "" : to_str(a.pos[0]);
                throw Error(CMF_ERR_TEMPLATE, "chat template raised (line " + std::to_string(line) + "): " + msg);
            });
        if (name == "strftime_now")
            return func([this](CallArgs &a, int line) -> Value {
                if (a.pos.empty() || a.pos[0].kind != Value::Str) fail(line, "strftime_now needs a format string");
                std::time_t t = now_ >= 0 ? std::time_t(now_) : std::time(nullptr);
                std::tm tm{};
                localtime_r(&t, &tm);
                char buf[256];
                size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
                return Value::str(std::string(buf, n));
            });
        if (name == "range")
            return func([](CallArgs &a, int line) -> Value {
                int64_t b = 0, e = 0, s = 1;
                for (auto &x : a.pos)
                    if (x.kind != Value::Int) fail(line, "range() needs integers");
                if (a.pos.size() == 1) e = a.pos[0].i;
                else if (a.pos.size() >= 2) {
                    b = a.pos[0].i;
                    e = a.pos[1].i;
                    if (a.pos.size() > 2) s = a.pos[2].i;
                } else
                    fail(line, "range() needs arguments");
                if (s == 0) fail(line, "range() step must not be zero");
                Array out;
                for (int64_t k = b; s > 0 ? k < e : k > e; k += s) {
                    out.push_back(Value::integer(k));
                    if (out.size() > 1000000) fail(line, "range() too large");
                }
                return Value::array(std::move(out));
            });
        if (name == "namespace" || name == "dict")
            return func([name](CallArgs &a, int line) -> Value {
                Value v = Value::object();
                v.dict->is_namespace = name == "namespace";
                for (auto &p : a.pos) {
                    if (p.kind != Value::Dict) fail(line, name + "() positional argument must be a mapping");
                    for (auto &kv : p.dict->items) v.dict->set(kv.first, kv.second);
                }
                for (auto &kv : a.kw) v.dict->set(kv.first, kv.second);
                return v;
            });
        return Value::undefined(name);
    }

    // Python methods on str / dict / list the templates call.
    Value method(const Value &obj, const std::string &name, int line) {
        Value self = obj;
        auto arg_str = [line, name](const CallArgs &a, size_t k, const char *kw) -> std::optional<std::string> {
            const Value *v = a.get(k, kw);
            if (!v || v->kind == Value::None) return std::nullopt;
            if (v->kind != Value::Str) fail(line, name + "() argument must be str");
            return v->s;
        };
        if (obj.kind == Value::Str) {
            const std::string &s = obj.s;
            if (name == "startswith" || name == "endswith")
                return func([s, name](CallArgs &a, int ln) -> Value {
                    if (a.pos.empty()) fail(ln, name + "() takes an argument");
                    std::vector<std::string> cands;
                    if (a.pos[0].kind == Value::Str) cands.push_back(a.pos[0].s);
                    else if (a.pos[0].kind == Value::List)
                        for (auto &x : *a.pos[0].list) cands.push_back(to_str(x));
                    else fail(ln, name + "() argument must be str or a tuple of str");
                    for (auto &c : cands) {
                        if (name == "startswith" ? s.rfind(c, 0) == 0 : (s.size() >= c.size() && s.compare(s.size() - c.size(), c.size(), c) == 0))
                            return Value::boolean(true);
                    }
                    return Value::boolean(false);
                });
            if (name == "strip" || name == "lstrip" || name == "rstrip")
                return func([s, name, arg_str](CallArgs &a, int) -> Value {
                    auto chars = arg_str(a, 0, "chars");
                    bool left = name != "rstrip", right = name != "lstrip";
                    if (!chars) return Value::str(strip_whitespace(s, left, right));
                    auto cs = chars_of(*chars);
                    auto in = [&](const std::string &c) { return std::find(cs.begin(), cs.end(), c) != cs.end(); };
                    auto v = chars_of(s);
                    size_t b = 0, e = v.size();
                    if (left)
                        while (b < e && in(v[b])) ++b;
                    if (right)
                        while (e > b && in(v[e - 1])) --e;
                    std::string o;
                    for (size_t k = b; k < e; ++k) o += v[k];
                    return Value::str(o);
                });
            if (name == "split" || name == "rsplit")
                return func([s, name, arg_str](CallArgs &a, int ln) -> Value {
                    auto sep = arg_str(a, 0, "sep");
                    const Value *mx = a.get(1, "maxsplit");
                    int64_t maxsplit = mx && mx->kind == Value::Int ? mx->i : -1;
                    Array out;
                    if (!sep) {
                        // whitespace runs, no empty strings
                        std::vector<std::string> words;
                        std::string cur;
                        bool in_word = false;
                        auto cs = chars_of(s);
                        for (auto &c : cs) {
                            uint32_t cp;
                            utf8_decode(c, 0, cp);
                            if (is_unicode_whitespace(cp)) {
                                if (in_word) words.push_back(cur);
                                cur.clear();
                                in_word = false;
                            } else {
                                cur += c;
                                in_word = true;
                            }
                        }
                        if (in_word) words.push_back(cur);
                        if (maxsplit >= 0 && int64_t(words.size()) > maxsplit + 1) {
                            // rare in templates: rejoin the tail with single spaces is not exact Python; refuse
                            fail(ln, name + "() with maxsplit and no separator is not supported");
                        }
                        for (auto &w : words) out.push_back(Value::str(w));
                        return Value::array(std::move(out));
                    }
                    if (sep->empty()) fail(ln, "empty separator");
                    std::vector<std::string> parts;
                    if (name == "split") {
                        size_t p = 0;
                        int64_t n = 0;
                        for (;;) {
                            size_t q = s.find(*sep, p);
                            if (q == std::string::npos || (maxsplit >= 0 && n >= maxsplit)) break;
                            parts.push_back(s.substr(p, q - p));
                            p = q + sep->size();
                            ++n;
                        }
                        parts.push_back(s.substr(p));
                    } else {
                        size_t e = s.size();
                        int64_t n = 0;
                        std::vector<std::string> rev;
                        for (;;) {
                            if (e < sep->size()) break;
                            size_t q = s.rfind(*sep, e - sep->size());
                            if (q == std::string::npos || (maxsplit >= 0 && n >= maxsplit)) break;
                            rev.push_back(s.substr(q + sep->size(), e - q - sep->size()));
                            e = q;
                            ++n;
                        }
                        rev.push_back(s.substr(0, e));
                        parts.assign(rev.rbegin(), rev.rend());
                    }
                    for (auto &p : parts) out.push_back(Value::str(p));
                    return Value::array(std::move(out));
                });
            if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase")
                return func([this, s, name](CallArgs &, int ln) -> Value { return string_case(s, name, ln); });
            if (name == "replace")
                return func([s](CallArgs &a, int ln) -> Value {
                    if (a.pos.size() < 2 || a.pos[0].kind != Value::Str || a.pos[1].kind != Value::Str)
                        fail(ln, "replace() takes two strings");
                    int64_t count = a.pos.size() > 2 && a.pos[2].kind == Value::Int ? a.pos[2].i : -1;
                    return Value::str(replace_str(s, a.pos[0].s, a.pos[1].s, count));
                });
            if (name == "find" || name == "rfind" || name == "count" || name == "index")
                return func([s, name](CallArgs &a, int ln) -> Value {
                    if (a.pos.empty() || a.pos[0].kind != Value::Str) fail(ln, name + "() takes a string");
                    const std::string &sub = a.pos[0].s;
                    if (name == "count") {
                        if (sub.empty()) return Value::integer(int64_t(chars_of(s).size() + 1));
                        int64_t n = 0;
                        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
                        return Value::integer(n);
                    }
                    size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
                    if (p == std::string::npos) {
                        if (name == "index") fail(ln, "substring not found");
                        return Value::integer(-1);
                    }
                    return Value::integer(int64_t(chars_of(s.substr(0, p)).size()));
                });
            if (name == "join")
                return func([s](CallArgs &a, int ln) -> Value {
                    if (a.pos.empty()) fail(ln, "join() takes an iterable");
                    std::string o;
                    bool first = true;
                    for (auto &x : iterate(a.pos[0], ln)) {
                        if (x.kind != Value::Str) fail(ln, "join() expects strings");
                        o += (first ? "" : s) + x.s;
                        first = false;
                    }
                    return Value::str(o);
                });
            if (name == "removeprefix" || name == "removesuffix")
                return func([s, name](CallArgs &a, int ln) -> Value {
                    if (a.pos.empty() || a.pos[0].kind != Value::Str) fail(ln, name + "() takes a string");
                    const std::string &x = a.pos[0].s;
                    if (name == "removeprefix") return Value::str(s.rfind(x, 0) == 0 ? s.substr(x.size()) : s);
                    bool ends = s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
                    return Value::str(ends && !x.empty() ? s.substr(0, s.size() - x.size()) : s);
                });
            if (name == "splitlines")
                return func([s](CallArgs &, int) -> Value {
                    Array out;
                    size_t p = 0;
                    while (p < s.size()) {
                        size_t q = s.find_first_of("\r\n", p);
                        if (q == std::string::npos) {
                            out.push_back(Value::str(s.substr(p)));
                            break;
                        }
                        out.push_back(Value::str(s.substr(p, q - p)));
                        p = q + ((s[q] == '\r' && q + 1 < s.size() && s[q + 1] == '\n') ? 2 : 1);
                    }
                    return Value::array(std::move(out));
                });
            if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "islower" || name == "isupper")
                return func([s, name](CallArgs &, int) -> Value {
                    if (s.empty()) return Value::boolean(false);
                    bool any_cased = false;
                    for (auto &c : chars_of(s)) {
                        uint32_t cp;
                        utf8_decode(c, 0, cp);
                        bool ok = true;
                        if (name == "isdigit") ok = cp >= '0' && cp <= '9';
                        else if (name == "isspace") ok = is_unicode_whitespace(cp);
                        else if (name == "isalpha") ok = is_alnum_cp(cp) && !(cp >= '0' && cp <= '9');
                        else if (name == "isalnum") ok = is_alnum_cp(cp);
                        else {
                            std::string lo = lowercase(c);
                            bool is_lower = lo == c;
                            bool cased = lowercase(c) != c || utf8_encode(cp) != c || true;
                            (void)cased;
                            if (name == "islower" && !is_lower) return Value::boolean(false);
                            if (name == "isupper" && is_lower && is_alnum_cp(cp) && !(cp >= '0' && cp <= '9'))
                                return Value::boolean(false);
                            if (is_alnum_cp(cp) && !(cp >= '0' && cp <= '9')) any_cased = true;
                        }
                        if (!ok) return Value::boolean(false);
                    }
                    if (name == "islower" || name == "isupper") return Value::boolean(any_cased);
                    return Value::boolean(true);
                });
            if (name == "format") fail(line, "str.format is not supported in chat templates");
        }
        if (obj.kind == Value::Dict) {
            if (name == "items")
                return func([self](CallArgs &, int) -> Value {
                    Array out;
                    for (auto &kv : self.dict->items) out.push_back(Value::array({Value::str(kv.first), kv.second}));
                    return Value::array(std::move(out));
                });
            if (name == "keys")
                return func([self](CallArgs &, int) -> Value {
                    Array out;
                    for (auto &kv : self.dict->items) out.push_back(Value::str(kv.first));
                    return Value::array(std::move(out));
                });
            if (name == "values")
                return func([self](CallArgs &, int) -> Value {
                    Array out;
                    for (auto &kv : self.dict->items) out.push_back(kv.second);
                    return Value::array(std::move(out));
                });
            if (name == "get")
                return func([self](CallArgs &a, int ln) -> Value {
                    if (a.pos.empty()) fail(ln, "get() takes a key");
                    if (a.pos[0].kind == Value::Str)
                        if (Value *v = self.dict->find(a.pos[0].s)) return *v;
                    return a.pos.size() > 1 ? a.pos[1] : Value::none();
                });
            return Value::undefined(name);
        }
        if (obj.kind == Value::List) {
            if (name == "append" || name == "pop" || name == "extend" || name == "insert" || name == "remove" || name == "clear" ||
                name == "sort" || name == "reverse")
                fail(line, "access to attribute '" + name + "' of 'list' object is unsafe (the sandbox is immutable)");
            if (name == "index" || name == "count")
                return func([self, name](CallArgs &a, int ln) -> Value {
                    if (a.pos.empty()) fail(ln, name + "() takes an argument");
                    int64_t n = 0;
                    for (size_t k = 0; k < self.list->size(); ++k)
                        if (values_equal((*self.list)[k], a.pos[0])) {
                            if (name == "index") return Value::integer(int64_t(k));
                            ++n;
                        }
                    if (name == "index") fail(ln, "value is not in list");
                    return Value::integer(n);
                });
        }
        return Value::undefined(name);
    }

    static std::string replace_str(const std::string &s, const std::string &from, const std::string &to, int64_t count) {
        if (from.empty()) {
            std::string o;
            int64_t n = 0;
            for (auto &c : chars_of(s)) {
                if (count < 0 || n < count) {
                    o += to;
                    ++n;
                }
                o += c;
            }
            if (count < 0 || n < count) o += to;
            return o;
        }
        std::string o;
        size_t p = 0;
        int64_t n = 0;
        for (;;) {
            size_t q = s.find(from, p);
            if (q == std::string::npos || (count >= 0 && n >= count)) break;
            o += s.substr(p, q - p) + to;
            p = q + from.size();
            ++n;
        }
        return o + s.substr(p);
    }

    Value string_case(const std::string &s, const std::string &name, int) {
        if (name == "lower") return Value::str(lowercase(s));
        std::string out;
        bool prev_cased = false;
        bool first = true;
        for (auto &c : chars_of(s)) {
            uint32_t cp;
            utf8_decode(c, 0, cp);
            std::string up = upper_cp(cp), lo = lowercase(c);
            if (name == "upper") out += up;
            else if (name == "swapcase") out += lo == c ? up : lo;
            else if (name == "capitalize") out += first ? up : lo;
            else {  // title: upper after a non-letter, lower after a letter
                out += prev_cased ? lo : up;
            }
            prev_cased = is_alnum_cp(cp) && !(cp >= '0' && cp <= '9');
            first = false;
        }
        return Value::str(out);
    }
    static std::string upper_cp(uint32_t cp);

    // ---- filters ----
    Value call_filter(const Node &n, const Value &v) {
        CallArgs a = eval_args(n);
        const std::string &f = n.name;
        int line = n.line;
        auto need_str = [&](const Value &x) -> const std::string & {
            if (x.kind != Value::Str) fail(line, "filter '" + f + "' needs a string, got " + type_name(x));
            return x.s;
        };
        if (f == "tojson") {
            const Value *ind = a.get(0, "indent");
            int indent = ind && ind->kind == Value::Int ? int(ind->i) : -1;
            const Value *sk = a.get(99, "sort_keys");
            const Value *seps = a.get(99, "separators");
            std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
            if (seps && seps->kind == Value::List && seps->list->size() == 2) {
                item_sep = to_str((*seps->list)[0]);
                key_sep = to_str((*seps->list)[1]);
            }
            std::string out;
            to_json(v, out, indent, 0, item_sep, key_sep, sk && truthy(*sk), line);
            return Value::str(out);
        }
        if (f == "safe" || f == "string") return f == "safe" ? v : Value::str(to_str(v));
        if (f == "trim") {
            auto chars = a.get(0, "chars");
            if (chars && chars->kind == Value::Str) {
                CallArgs ca;
                ca.pos.push_back(*chars);
                return method(Value::str(to_str(v)), "strip", line).func->fn(ca, line);
            }
            return Value::str(strip_whitespace(to_str(v), true, true));
        }
        if (f == "length" || f == "count") {
            switch (v.kind) {
            case Value::Str: return Value::integer(int64_t(chars_of(v.s).size()));
            case Value::List: return Value::integer(int64_t(v.list->size()));
            case Value::Dict: return Value::integer(int64_t(v.dict->items.size()));
            case Value::Undefined: return Value::integer(0);
            default: fail(line, std::string("object of type '") + type_name(v) + "' has no len()");
            }
        }
        if (f == "default" || f == "d") {
            const Value *dflt = a.get(0, "default_value");
            const Value *boolean = a.get(1, "boolean");
            bool use = v.is_undef() || (boolean && truthy(*boolean) && !truthy(v));
            return use ? (dflt ? *dflt : Value::str("")) : v;
        }
        if (f == "upper" || f == "lower" || f == "capitalize" || f == "title") return string_case(to_str(v), f, line);
        if (f == "replace") {
            if (a.pos.size() < 2) fail(line, "replace needs two arguments");
            int64_t count = a.pos.size() > 2 && a.pos[2].kind == Value::Int ? a.pos[2].i : -1;
            return Value::str(replace_str(to_str(v), to_str(a.pos[0]), to_str(a.pos[1]), count));
        }
        if (f == "join") {
            const Value *sep = a.get(0, "d");
            const Value *attr = a.get(1, "attribute");
            std::string o;
            bool first = true;
            for (auto &x : iterate(v, line)) {
                Value item = attr ? get_attr_path(x, to_str(*attr), line) : x;
                o += (first ? "" : (sep ? to_str(*sep) : "")) + to_str(item);
                first = false;
            }
            return Value::str(o);
        }
        if (f == "first" || f == "last") {
            Array items = iterate(v, line);
            if (items.empty()) return Value::undefined(f);
            return f == "first" ? items.front() : items.back();
        }
        if (f == "list") return Value::array(iterate(v, line));
        if (f == "reverse") {
            if (v.kind == Value::Str) {
                auto cs = chars_of(v.s);
                std::string o;
                for (size_t k = cs.size(); k-- > 0;) o += cs[k];
                return Value::str(o);
            }
            Array items = iterate(v, line);
            std::reverse(items.begin(), items.end());
            return Value::array(std::move(items));
        }
        if (f == "items") {
            if (v.is_undef()) return Value::array();
            if (v.kind != Value::Dict) fail(line, "items filter needs a mapping");
            return method(v, "items", line).func->fn(a, line);
        }
        if (f == "dictsort") {
            if (v.kind != Value::Dict) fail(line, "dictsort filter needs a mapping");
            Array out;
            for (auto &kv : v.dict->items) out.push_back(Value::array({Value::str(kv.first), kv.second}));
            std::stable_sort(out.begin(), out.end(), [&](const Value &x, const Value &y) {
                return lowercase((*x.list)[0].s) < lowercase((*y.list)[0].s);
            });
            return Value::array(std::move(out));
        }
        if (f == "map") {
            Array items = iterate(v, line);
            Array out;
            const Value *attr = a.get(99, "attribute");
            if (attr) {
                const Value *dflt = a.get(99, "default");
                for (auto &x : items) {
                    Value r = get_attr_path(x, to_str(*attr), line);
                    out.push_back(r.is_undef() && dflt ? *dflt : r);
                }
                return Value::array(std::move(out));
            }
            if (a.pos.empty()) fail(line, "map needs a filter name or attribute=");
            Node fn;
            fn.kind = NK::Filter;
            fn.line = line;
            fn.name = to_str(a.pos[0]);
            for (size_t k = 1; k < a.pos.size(); ++k) {
                auto lit = mk(NK::Literal, line);
                lit->lit = a.pos[k];
                fn.kids.push_back(std::move(lit));
            }
            for (auto &x : items) out.push_back(call_filter(fn, x));
            return Value::array(std::move(out));
        }
        if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
            bool by_attr = f == "selectattr" || f == "rejectattr";
            bool want = f == "selectattr" || f == "select";
            size_t k0 = by_attr ? 1 : 0;
            if (by_attr && a.pos.empty()) fail(line, f + " needs an attribute name");
            Array out;
            for (auto &x : iterate(v, line)) {
                Value subject = by_attr ? get_attr_path(x, to_str(a.pos[0]), line) : x;
                bool ok;
                if (a.pos.size() <= k0) ok = truthy(subject);
                else {
                    Node t;
                    t.kind = NK::Test;
                    t.line = line;
                    t.name = to_str(a.pos[k0]);
                    for (size_t k = k0 + 1; k < a.pos.size(); ++k) {
                        auto lit = mk(NK::Literal, line);
                        lit->lit = a.pos[k];
                        t.kids.push_back(std::move(lit));
                    }
                    ok = run_test(t, subject);
                }
                if (ok == want) out.push_back(x);
            }
            return Value::array(std::move(out));
        }
        if (f == "unique") {
            Array out;
            for (auto &x : iterate(v, line)) {
                bool seen = false;
                for (auto &y : out) seen = seen || values_equal(x, y);
                if (!seen) out.push_back(x);
            }
            return Value::array(std::move(out));
        }
        if (f == "sort") {
            Array items = iterate(v, line);
            const Value *rev = a.get(0, "reverse");
            const Value *attr = a.get(2, "attribute");
            std::stable_sort(items.begin(), items.end(), [&](const Value &x, const Value &y) {
                Value kx = attr ? get_attr_path(x, to_str(*attr), line) : x, ky = attr ? get_attr_path(y, to_str(*attr), line) : y;
                if (kx.kind == Value::Str && ky.kind == Value::Str) return lowercase(kx.s) < lowercase(ky.s);
                return compare(kx, ky, line) < 0;
            });
            if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
            return Value::array(std::move(items));
        }
        if (f == "int") {
            if (v.kind == Value::Int) return v;
            if (v.kind == Value::Float) return Value::integer(int64_t(v.f));
            if (v.kind == Value::Bool) return Value::integer(v.b);
            if (v.kind == Value::Str) {
                try {
                    size_t used;
                    int64_t x = std::stoll(strip_whitespace(v.s, true, true), &used);
                    return Value::integer(x);
                } catch (...) {
                }
            }
            return a.pos.empty() ? Value::integer(0) : a.pos[0];
        }
        if (f == "float") {
            if (v.is_num()) return Value::number(v.as_double());
            if (v.kind == Value::Str) {
                try {
                    return Value::number(std::stod(v.s));
                } catch (...) {
                }
            }
            return a.pos.empty() ? Value::number(0) : a.pos[0];
        }
        if (f == "abs") {
            if (v.kind == Value::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
            if (v.kind == Value::Float) return Value::number(std::fabs(v.f));
            fail(line, "abs needs a number");
        }
        if (f == "round") {
            const Value *prec = a.get(0, "precision");
            int p = prec && prec->kind == Value::Int ? int(prec->i) : 0;
            double m = std::pow(10.0, p);
            return Value::number(std::round(v.as_double() * m) / m);
        }
        if (f == "indent") {
            const Value *w = a.get(0, "width");
            const Value *first = a.get(1, "first");
            const Value *blank = a.get(2, "blank");
            std::string pad = w ? (w->kind == Value::Int ? std::string(size_t(w->i), ' ') : to_str(*w)) : "    ";
            std::string s = to_str(v), out;
            size_t p = 0;
            bool first_line = true;
            while (p <= s.size()) {
                size_t q = s.find('\n', p);
                std::string ln = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
                bool add = (!first_line || (first && truthy(*first))) && (!ln.empty() || (blank && truthy(*blank)));
                out += (add ? pad : "") + ln;
                if (q == std::string::npos) break;
                out += '\n';
                p = q + 1;
                first_line = false;
            }
            return Value::str(out);
        }
        if (f == "escape" || f == "e") {
            std::string o;
            for (char c : to_str(v)) {
                switch (c) {
                case '&': o += "&amp;"; break;
                case '<': o += "&lt;"; break;
                case '>': o += "&gt;"; break;
                case '"': o += "&#34;"; break;
                case '\'': o += "&#39;"; break;
                default: o += c;
                }
            }
            return Value::str(o);
        }
        if (f == "wordcount") return Value::integer(int64_t(iterate(method(Value::str(to_str(v)), "split", line).func->fn(a, line), line).size()));
        if (f == "sum") {
            Value acc = Value::integer(0);
            for (auto &x : iterate(v, line)) acc = binary("+", acc, x, line);
            return acc;
        }
        if (f == "center") (void)need_str(v);
        fail(line, "unknown filter '" + f + "'");
    }

    Value get_attr_path(const Value &x, const std::string &path, int line) {
        Value cur = x;
        size_t p = 0;
        while (p <= path.size()) {
            size_t q = path.find('.', p);
            std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
            if (cur.is_undef()) return cur;
            if (cur.kind == Value::Dict) {
                Value *v = cur.dict->find(part);
                cur = v ? *v : Value::undefined(part);
            } else
                cur = get_attr(cur, part, line);
            if (q == std::string::npos) break;
            p = q + 1;
        }
        return cur;
    }

    bool run_test(const Node &n, const Value &v) {
        CallArgs a = eval_args(n);
        const std::string &t = n.name;
        auto arg = [&](size_t k) -> const Value & {
            if (k >= a.pos.size()) fail(n.line, "test '" + t + "' needs an argument");
            return a.pos[k];
        };
        if (t == "defined") return !v.is_undef();
        if (t == "undefined") return v.is_undef();
        if (t == "none") return v.kind == Value::None;
        if (t == "boolean") return v.kind == Value::Bool;
        if (t == "true") return v.kind == Value::Bool && v.b;
        if (t == "false") return v.kind == Value::Bool && !v.b;
        if (t == "integer") return v.kind == Value::Int;
        if (t == "float") return v.kind == Value::Float;
        if (t == "number") return v.kind == Value::Int || v.kind == Value::Float || v.kind == Value::Bool;
        if (t == "string") return v.kind == Value::Str;
        if (t == "mapping") return v.kind == Value::Dict;
        if (t == "iterable") return v.kind == Value::List || v.kind == Value::Dict || v.kind == Value::Str;
        if (t == "sequence") return v.kind == Value::List || v.kind == Value::Dict || v.kind == Value::Str;
        if (t == "callable") return v.kind == Value::Func;
        if (t == "odd" || t == "even") {
            if (v.kind != Value::Int) fail(n.line, "test '" + t + "' needs an integer");
            return (v.i % 2 != 0) == (t == "odd");
        }
        if (t == "divisibleby") {
            const Value &d = arg(0);
            if (v.kind != Value::Int || d.kind != Value::Int || d.i == 0) fail(n.line, "divisibleby needs non-zero integers");
            return v.i % d.i == 0;
        }
        if (t == "eq" || t == "equalto" || t == "==") return values_equal(v, arg(0));
        if (t == "ne" || t == "!=") return !values_equal(v, arg(0));
        if (t == "lt" || t == "lessthan" || t == "<") return compare(v, arg(0), n.line) < 0;
        if (t == "le" || t == "<=") return compare(v, arg(0), n.line) <= 0;
        if (t == "gt" || t == "greaterthan" || t == ">") return compare(v, arg(0), n.line) > 0;
        if (t == "ge" || t == ">=") return compare(v, arg(0), n.line) >= 0;
        if (t == "in") return contains(arg(0), v, n.line);
        if (t == "sameas") {
            const Value &o = arg(0);
            if (v.kind != o.kind) return false;
            if (v.kind == Value::List) return v.list == o.list;
            if (v.kind == Value::Dict) return v.dict == o.dict;
            return values_equal(v, o);
        }
        if (t == "lower" || t == "upper") {
            if (v.kind != Value::Str) return false;
            std::string conv = t == "lower" ? lowercase(v.s) : string_case(v.s, "upper", n.line).s;
            return conv == v.s;
        }
        fail(n.line, "unknown test '" + t + "'");
    }
};

std::string Renderer::upper_cp(uint32_t cp) { return uppercase_cp(cp); }

}  // namespace

struct JinjaTemplate {
    NodeP root;
};

ChatTemplate::ChatTemplate(std::string_view source) : t_(std::make_unique<JinjaTemplate>()) {
    Parser p(lex(source));
    t_->root = p.parse_template();
}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(std::string_view context_json, int64_t now_unix) const {
    simdjson::dom::parser parser;
    simdjson::dom::element doc = parse_json(parser, context_json, "chat context");
    if (!doc.is_object()) throw Error(CMF_ERR_PARSE, "chat context: expected a JSON object (messages, tools, ...)");
    Renderer r(now_unix);
    Value ctx = from_json(doc);
    for (auto &kv : ctx.dict->items) r.scopes_[0][kv.first] = kv.second;
    r.scopes_.emplace_back();  // template-level assignments
    std::string out;
    try {
        r.exec(*t_->root, out);
    } catch (const BreakSignal &) {
        throw Error(CMF_ERR_TEMPLATE, "chat template: 'break' outside a loop");
    } catch (const ContinueSignal &) {
        throw Error(CMF_ERR_TEMPLATE, "chat template: 'continue' outside a loop");
    }
    return out;
}

}  // namespace cmf::text
