// Runs a parsed template: statements (exec), expressions (eval), Python's
// str/dict/list methods (method) and jinja2's filters and tests
// (call_filter, run_test). Internal to the Jinja interpreter; its parts
// live in eval.cpp, methods.cpp and filters.cpp.
#pragma once

#include "text/jinja/parser.hpp"
#include "text/jinja/value.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace cmf::text::jinja {

// How {% break %} and {% continue %} leave the loop body they are in.
struct BreakSignal {};
struct ContinueSignal {};

class Renderer {
public:
    // `now`: the time strftime_now formats (unix seconds); < 0: the clock's.
    // The render's budget is this thread's while the renderer lives.
    Renderer(int64_t now, const RenderLimits &limits) : now_(now), budget_(limits) { scopes_.emplace_back(); }
    // A template can make a namespace (or dict) hold itself ({% set ns.a =
    // [ns] %}): shared ownership alone would never free it, so what the
    // render made is emptied when it ends.
    ~Renderer() {
        for (auto &w : made_)
            if (auto o = w.lock()) o->items.clear();
    }
    Renderer(const Renderer &) = delete;
    Renderer &operator=(const Renderer &) = delete;
    std::vector<std::weak_ptr<Object>> made_;  // namespaces and dicts from namespace() / dict()

    std::vector<std::unordered_map<std::string, Value>> scopes_;
    int64_t now_;
    int depth_ = 0;  // macro calls in progress
    Budget budget_;

    Value lookup(const std::string &name) const;
    void assign(const std::string &name, Value v) { scopes_.back()[name] = std::move(v); }

    // eval.cpp: statements and expressions. exec and eval charge the
    // budget and guard the nesting, then run exec_node / eval_node.
    void exec(const Node &n, std::string &out);
    void exec_node(const Node &n, std::string &out);
    // The filter chain node `chain` (whose innermost `a` is null) applied to v.
    Value apply_filters(const Node &chain, Value v);
    void assign_targets(const std::vector<std::string> &targets, const Value &v, int line);
    Value make_macro(const Node &n, const Node *, bool is_caller = false);
    void exec_for(const Node &n, std::string &out);
    Value eval(const Node &n);
    Value eval_node(const Node &n);
    Value binary(const std::string &op, const Value &l, const Value &r, int line);
    bool contains(const Value &hay, const Value &needle, int line);
    [[noreturn]] void undefined_error(const Value &v, int line);
    Value get_attr(const Value &obj, const std::string &name, int line);
    Value get_item(const Value &obj, const Value &key, int line);
    Value slice(const Value &obj, const Node &n);
    CallArgs eval_args(const Node &n);
    Value call(const Node &n);
    static Value func(std::function<Value(CallArgs &, int)> fn);
    // Global functions: raise_exception, strftime_now, range, namespace, dict.
    Value builtin(const std::string &name);

    // methods.cpp: Python methods on str / dict / list the templates call.
    Value method(const Value &obj, const std::string &name, int line);

    // filters.cpp: jinja2's filters and tests.
    Value call_filter(const Node &n, const Value &v);
    // Dotted attribute path ("a.b") as jinja2's attribute= arguments read it.
    Value get_attr_path(const Value &x, const std::string &path, int line);
    bool run_test(const Node &n, const Value &v);
};

// methods.cpp, shared with the filters of the same names.
// str.replace(from, to, count) (count < 0: all).
std::string replace_str(const std::string &s, const std::string &from, const std::string &to, int64_t count, int line);
// str.upper/lower/title/capitalize/swapcase by code point.
Value string_case(const std::string &s, const std::string &name, int line);

}  // namespace cmf::text::jinja
