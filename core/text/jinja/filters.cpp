#include "text/jinja/renderer.hpp"

#include "text/unicode.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace cmf::text::jinja {

Value Renderer::call_filter(const Node &n, const Value &v) {
    budget_.charge(1 + size_units(v), n.line);
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
        return Value::str(replace_str(to_str(v), to_str(a.pos[0]), to_str(a.pos[1]), count, line));
    }
    if (f == "join") {
        const Value *sep = a.get(0, "d");
        const Value *attr = a.get(1, "attribute");
        std::string o;
        bool first = true;
        for (auto &x : iterate(v, line)) {
            Value item = attr ? get_attr_path(x, to_str(*attr), line) : x;
            o += (first ? "" : (sep ? to_str(*sep) : "")) + to_str(item, line);
            first = false;
            check_bytes(o.size(), line);
            budget_.charge(o.size() / 4096, line);
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
            budget_.charge(1 + ((*x.list)[0].s.size() + (*y.list)[0].s.size()) / 64, line);
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
            for (auto &y : out) seen = seen || values_equal(x, y, line);
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
            if (kx.kind == Value::Str && ky.kind == Value::Str) {
                budget_.charge((kx.s.size() + ky.s.size()) / 64, line);
                return lowercase(kx.s) < lowercase(ky.s);
            }
            return compare(kx, ky, line) < 0;
        });
        if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
        return Value::array(std::move(items));
    }
    if (f == "int") {
        if (v.kind == Value::Int) return v;
        if (v.kind == Value::Float) {
            if (std::isnan(v.f)) return a.pos.empty() ? Value::integer(0) : a.pos[0];  // jinja2: ValueError -> the default
            if (!(v.f >= -9223372036854775808.0 && v.f < 9223372036854775808.0))
                fail(line, "int of " + float_repr(v.f) + " does not fit in 64 bits");
            return Value::integer(int64_t(v.f));
        }
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
        if (v.kind == Value::Int) {
            if (v.i == INT64_MIN) fail(line, "abs of " + std::to_string(v.i) + " does not fit in 64 bits");
            return Value::integer(v.i < 0 ? -v.i : v.i);
        }
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
        if (w && w->kind == Value::Int) check_bytes(uint64_t(std::max<int64_t>(w->i, 0)), line);
        std::string pad = w ? (w->kind == Value::Int ? std::string(size_t(std::max<int64_t>(w->i, 0)), ' ') : to_str(*w)) : "    ";
        std::string s = to_str(v), out;
        size_t p = 0;
        bool first_line = true;
        while (p <= s.size()) {
            size_t q = s.find('\n', p);
            std::string ln = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
            bool add = (!first_line || (first && truthy(*first))) && (!ln.empty() || (blank && truthy(*blank)));
            out += (add ? pad : "") + ln;
            check_bytes(out.size(), line);
            budget_.charge(1 + (pad.size() + ln.size()) / 64, line);
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

Value Renderer::get_attr_path(const Value &x, const std::string &path, int line) {
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

bool Renderer::run_test(const Node &n, const Value &v) {
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
    if (t == "eq" || t == "equalto" || t == "==") return values_equal(v, arg(0), n.line);
    if (t == "ne" || t == "!=") return !values_equal(v, arg(0), n.line);
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
        return values_equal(v, o, n.line);
    }
    if (t == "lower" || t == "upper") {
        if (v.kind != Value::Str) return false;
        std::string conv = t == "lower" ? lowercase(v.s) : string_case(v.s, "upper", n.line).s;
        return conv == v.s;
    }
    fail(n.line, "unknown test '" + t + "'");
}

}  // namespace cmf::text::jinja
