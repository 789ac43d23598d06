#include "text/jinja/renderer.hpp"

#include "text/unicode.hpp"

#include <algorithm>
#include <optional>

namespace cmf::text::jinja {

Value Renderer::method(const Value &obj, const std::string &name, int line) {
    // Each call looks its method up anew, so this charges the scan of the
    // receiver every string/list method makes.
    budget_.charge(1 + size_units(obj), line);
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
            return func([s, name](CallArgs &, int ln) -> Value { return string_case(s, name, ln); });
        if (name == "replace")
            return func([s](CallArgs &a, int ln) -> Value {
                if (a.pos.size() < 2 || a.pos[0].kind != Value::Str || a.pos[1].kind != Value::Str)
                    fail(ln, "replace() takes two strings");
                int64_t count = a.pos.size() > 2 && a.pos[2].kind == Value::Int ? a.pos[2].i : -1;
                return Value::str(replace_str(s, a.pos[0].s, a.pos[1].s, count, ln));
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
                    check_bytes(o.size(), ln);
                    charge(o.size() / 4096, ln);
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
                    if (values_equal((*self.list)[k], a.pos[0], ln)) {
                        if (name == "index") return Value::integer(int64_t(k));
                        ++n;
                    }
                if (name == "index") fail(ln, "value is not in list");
                return Value::integer(n);
            });
    }
    return Value::undefined(name);
}

std::string replace_str(const std::string &s, const std::string &from, const std::string &to, int64_t count, int line) {
    if (from.empty()) {
        std::string o;
        int64_t n = 0;
        for (auto &c : chars_of(s)) {
            if (count < 0 || n < count) {
                o += to;
                ++n;
            }
            o += c;
            check_bytes(o.size(), line);
            charge(1 + to.size() / 64, line);
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
        check_bytes(o.size(), line);
        charge(1 + to.size() / 64, line);
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
        std::string up = uppercase_cp(cp), lo = lowercase(c);
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

}  // namespace cmf::text::jinja
