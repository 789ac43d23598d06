#include "text/jinja/parser.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace cmf::text::jinja {

namespace {

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
            int64_t v = 0;
            auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
            if (ec != std::errc() || end != t.text.data() + t.text.size())
                fail(t.line, "integer literal " + t.text + " does not fit in 64 bits");
            n->lit = Value::integer(v);
            return n;
        }
        if (t.type == Tok::Float) {
            auto n = mk(NK::Literal, t.line);
            n->lit = Value::number(std::strtod(t.text.c_str(), nullptr));  // 1e999 is inf, as in Python
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

}  // namespace

NodeP parse(std::vector<Token> tokens) {
    Parser p(std::move(tokens));
    return p.parse_template();
}

}  // namespace cmf::text::jinja
