#include "text/jinja/renderer.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <optional>

namespace cmf::text::jinja {

Value Renderer::lookup(const std::string &name) const {
    for (size_t k = scopes_.size(); k-- > 0;) {
        auto it = scopes_[k].find(name);
        if (it != scopes_[k].end()) return it->second;
    }
    return Value::undefined(name);
}

void Renderer::exec(const Node &n, std::string &out) {
    Budget::Nest nest(budget_, n.line);
    budget_.charge(1, n.line);
    exec_node(n, out);
    check_bytes(out.size(), n.line);
}

void Renderer::exec_node(const Node &n, std::string &out) {
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
Value Renderer::apply_filters(const Node &chain, Value v) {
    std::vector<const Node *> fs;
    for (const Node *p = &chain; p; p = p->a.get()) fs.push_back(p);
    for (size_t k = fs.size(); k-- > 0;) v = call_filter(*fs[k], v);
    return v;
}

void Renderer::assign_targets(const std::vector<std::string> &targets, const Value &v, int line) {
    if (targets.size() == 1) {
        assign(targets[0], v);
        return;
    }
    Array items = iterate(v, line);
    if (items.size() != targets.size())
        fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()));
    for (size_t k = 0; k < targets.size(); ++k) assign(targets[k], items[k]);
}

Value Renderer::make_macro(const Node &n, const Node *, bool is_caller) {
    auto c = std::make_shared<Callable>();
    const Node *np = &n;
    c->fn = [this, np, is_caller](CallArgs &args, int line) -> Value {
        Budget::Nest nest(budget_, line);
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

void Renderer::exec_for(const Node &n, std::string &out) {
    Value seq = eval(*n.a);
    Array items;
    if (seq.kind == Value::Dict) {
        budget_.charge(seq.dict->items.size(), n.line);
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

Value Renderer::eval(const Node &n) {
    Budget::Nest nest(budget_, n.line);
    budget_.charge(1, n.line);
    Value v = eval_node(n);
    switch (n.kind) {
    case NK::Binary:
    case NK::Concat:
    case NK::Filter:
    case NK::Call:
    case NK::Slice:
    case NK::ListLit:
    case NK::DictLit:
        // A new value: building it cost about its size (lookups, indexing
        // and literals are free: they share what exists).
        budget_.charge(size_units(v), n.line);
        if (v.kind == Value::Str) check_bytes(v.s.size(), n.line);
        break;
    default:
        // Lists and dicts are shared, strings are copied.
        if (v.kind == Value::Str) budget_.charge(v.s.size() / 64, n.line);
        break;
    }
    return v;
}

Value Renderer::eval_node(const Node &n) {
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
        if (v.kind == Value::Float) return Value::number(-v.f);
        const int64_t x = v.kind == Value::Int ? v.i : v.b;
        if (x == INT64_MIN) fail(n.line, "integer overflow in -" + std::to_string(x) + " (Python's integers are unbounded, ours 64-bit)");
        return Value::integer(-x);
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

Value Renderer::binary(const std::string &op, const Value &l, const Value &r, int line) {
    budget_.charge(size_units(l) + size_units(r), line);
    if (op == "==") return Value::boolean(values_equal(l, r, line));
    if (op == "!=") return Value::boolean(!values_equal(l, r, line));
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
        if (n <= 0 || s.s.empty()) return Value::str("");
        if (uint64_t(n) > UINT64_MAX / s.s.size()) check_bytes(UINT64_MAX, line);
        const uint64_t total = uint64_t(n) * s.s.size();
        check_bytes(total, line);
        budget_.charge(total / 64, line);
        // By doubling: log2(n) copies, not n appends.
        std::string o;
        o.reserve(size_t(total));
        o = s.s;
        while (o.size() * 2 <= total) o.append(o);
        o.append(o, 0, size_t(total - o.size()));
        return Value::str(std::move(o));
    }
    if (!l.is_num() || !r.is_num())
        fail(line, std::string("unsupported operand type(s) for ") + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
    bool ints = l.kind != Value::Float && r.kind != Value::Float;
    int64_t li = l.kind == Value::Int ? l.i : l.b, ri = r.kind == Value::Int ? r.i : r.b;
    double ld = l.as_double(), rd = r.as_double();
    // Python's integers are unbounded; ours are 64-bit and say so instead of wrapping.
    auto overflow = [&]() -> Value {
        fail(line, "integer overflow in " + std::to_string(li) + " " + op + " " + std::to_string(ri) +
                       " (Python's integers are unbounded, ours 64-bit)");
    };
    int64_t res;
    if (op == "+") return !ints ? Value::number(ld + rd) : __builtin_add_overflow(li, ri, &res) ? overflow() : Value::integer(res);
    if (op == "-") return !ints ? Value::number(ld - rd) : __builtin_sub_overflow(li, ri, &res) ? overflow() : Value::integer(res);
    if (op == "*") return !ints ? Value::number(ld * rd) : __builtin_mul_overflow(li, ri, &res) ? overflow() : Value::integer(res);
    if (op == "/") {
        if (rd == 0) fail(line, "division by zero");
        return Value::number(ld / rd);
    }
    if (op == "//" || op == "%") {
        if (rd == 0) fail(line, "integer division or modulo by zero");
        if (ints) {
            if (li == INT64_MIN && ri == -1) overflow();
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
    if (op == "**") {
        if (!ints || ri < 0) return Value::number(std::pow(ld, rd));
        // Exact by repeated squaring (pow in doubles loses digits past 2^53).
        int64_t acc = 1, base = li;
        for (int64_t e = ri; e > 0; e >>= 1) {
            if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) overflow();
            if (e > 1 && __builtin_mul_overflow(base, base, &base)) overflow();
        }
        return Value::integer(acc);
    }
    fail(line, "unknown operator " + op);
}

bool Renderer::contains(const Value &hay, const Value &needle, int line) {
    switch (hay.kind) {
    case Value::Str:
        if (needle.kind != Value::Str) fail(line, "'in <string>' requires string as left operand");
        return hay.s.find(needle.s) != std::string::npos;
    case Value::List:
        for (auto &x : *hay.list)
            if (values_equal(x, needle, line)) return true;
        return false;
    case Value::Dict: return needle.kind == Value::Str && hay.dict->find(needle.s) != nullptr;
    case Value::Undefined: return false;
    default: fail(line, std::string("argument of type '") + type_name(hay) + "' is not iterable");
    }
}

void Renderer::undefined_error(const Value &v, int line) {
    fail(line, v.s.empty() ? "value is undefined" : "'" + v.s + "' is undefined");
}

Value Renderer::get_attr(const Value &obj, const std::string &name, int line) {
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
        if (!name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) {
            int64_t k = 0;
            auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), k);
            if (ec != std::errc() || end != name.data() + name.size()) return Value::undefined(name);
            return get_item(obj, Value::integer(k), line);
        }
        return method(obj, name, line);
    }
    return Value::undefined(name);
}

Value Renderer::get_item(const Value &obj, const Value &key, int line) {
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

Value Renderer::slice(const Value &obj, const Node &n) {
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

CallArgs Renderer::eval_args(const Node &n) {
    CallArgs a;
    size_t npos = n.kids.size() - n.kw.size();
    for (size_t k = 0; k < npos; ++k) a.pos.push_back(eval(*n.kids[k]));
    for (size_t k = 0; k < n.kw.size(); ++k) a.kw.emplace_back(n.kw[k], eval(*n.kids[npos + k]));
    return a;
}

Value Renderer::call(const Node &n) {
    Value f = eval(*n.a);
    CallArgs args = eval_args(n);
    if (f.kind != Value::Func) {
        if (f.is_undef()) fail(n.line, "'" + (f.s.empty() ? std::string("value") : f.s) + "' is undefined (not callable)");
        fail(n.line, std::string("'") + type_name(f) + "' object is not callable");
    }
    return f.func->fn(args, n.line);
}

Value Renderer::func(std::function<Value(CallArgs &, int)> fn) {
    Value v;
    v.kind = Value::Func;
    v.func = std::make_shared<Callable>();
    v.func->fn = std::move(fn);
    return v;
}

Value Renderer::builtin(const std::string &name) {
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
        return func([this](CallArgs &a, int line) -> Value {
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
            for (int64_t k = b; s > 0 ? k < e : k > e;) {
                out.push_back(Value::integer(k));
                if (out.size() > 1000000) fail(line, "range() too large");
                budget_.charge(1, line);
                if (__builtin_add_overflow(k, s, &k)) break;  // past INT64_MAX/MIN: beyond e too
            }
            return Value::array(std::move(out));
        });
    if (name == "namespace" || name == "dict")
        return func([this, name](CallArgs &a, int line) -> Value {
            Value v = Value::object();
            v.dict->is_namespace = name == "namespace";
            made_.push_back(v.dict);
            for (auto &p : a.pos) {
                if (p.kind != Value::Dict) fail(line, name + "() positional argument must be a mapping");
                for (auto &kv : p.dict->items) v.dict->set(kv.first, kv.second);
            }
            for (auto &kv : a.kw) v.dict->set(kv.first, kv.second);
            return v;
        });
    return Value::undefined(name);
}

}  // namespace cmf::text::jinja
