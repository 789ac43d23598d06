// Chat templates through the C API: errors name the line, raise_exception
// carries its message, the ChatML fallback, and the tokenizer C API.
#include <doctest/doctest.h>

#include <cmf/cmf.h>

#include <string>
#include <vector>

namespace {

struct Rendered {
    int32_t code = 0;
    std::string text;  // output, or the error message
};

Rendered render(const std::string &tmpl, const std::string &ctx, int64_t now = -1) {
    cmf_chat_options o;
    cmf_chat_options_init(&o);
    o.now_unix = now;
    char *out = nullptr;
    size_t n = 0;
    cmf_error *e = cmf_chat_render(tmpl.data(), tmpl.size(), ctx.data(), ctx.size(), &o, &out, &n);
    Rendered r;
    if (e) {
        r.code = cmf_error_code(e);
        r.text = cmf_error_message(e);
        cmf_error_free(e);
        return r;
    }
    r.text.assign(out, n);
    cmf_string_free(out);
    return r;
}

}  // namespace

TEST_CASE("chat: ChatML fallback when no template is given") {
    auto r = render("", R"({"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true})");
    REQUIRE(r.code == 0);
    CHECK(r.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("chat: whitespace control follows trim_blocks and lstrip_blocks") {
    std::string t = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}\n  {{- 'end' -}}  \n";
    auto r = render(t, R"({"messages":[{"role":"user","content":"a"},{"role":"bot","content":"b"}]})");
    REQUIRE(r.code == 0);
    CHECK(r.text == "[a]\nend");
}

TEST_CASE("chat: errors name the template line; raise_exception carries its message") {
    auto syntax = render("line one\n{% if x %}\n{{ x + }}\n{% endif %}", R"({"x":1})");
    CHECK(syntax.code == CMF_ERR_TEMPLATE);
    CHECK(syntax.text.find("line 3") != std::string::npos);
    auto raised = render("a\nb {{ raise_exception('roles must alternate') }}", R"({})");
    CHECK(raised.code == CMF_ERR_TEMPLATE);
    CHECK(raised.text.find("roles must alternate") != std::string::npos);
    CHECK(raised.text.find("line 2") != std::string::npos);
    auto filter = render("{{ x | no_such_filter }}", R"({"x":1})");
    CHECK(filter.code == CMF_ERR_TEMPLATE);
    CHECK(filter.text.find("unknown filter 'no_such_filter'") != std::string::npos);
    auto include = render("{% include 'other' %}", R"({})");
    CHECK(include.code == CMF_ERR_TEMPLATE);
    CHECK(include.text.find("'include' is not supported") != std::string::npos);
    auto undefined_attr = render("{{ missing.attr }}", R"({})");
    CHECK(undefined_attr.code == CMF_ERR_TEMPLATE);
    CHECK(undefined_attr.text.find("'missing' is undefined") != std::string::npos);
    auto immutable = render("{% set l = [1] %}{{ l.append(2) }}", R"({})");
    CHECK(immutable.code == CMF_ERR_TEMPLATE);
    auto bad_ctx = render("x", "[1, 2]");
    CHECK(bad_ctx.code == CMF_ERR_PARSE);
    auto deep = render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "{}");
    CHECK(deep.code == CMF_ERR_TEMPLATE);
    CHECK(deep.text.find("nested too deeply") != std::string::npos);
    auto unclosed = render("{% for x in y %}never closed", R"({"y":[]})");
    CHECK(unclosed.code == CMF_ERR_TEMPLATE);
    CHECK(unclosed.text.find("endfor") != std::string::npos);
}

TEST_CASE("chat: undefined values, namespaces, strftime_now with a fixed time") {
    auto r = render("[{{ nope }}]{% for x in nope %}x{% endfor %}{{ nope is defined }}{{ d.missing is defined }}", R"({"d":{}})");
    REQUIRE(r.code == 0);
    CHECK(r.text == "[]FalseFalse");
    auto ns = render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", "{}");
    CHECK(ns.text == "6");
    auto t = render("{{ strftime_now('%Y-%m-%d') }}", "{}", 86400 * 365);
    CHECK(t.text.size() == 10);
    CHECK(t.text.rfind("1971-01-0", 0) == 0);  // local time: 1 or 2 January
}

TEST_CASE("tokenizer C API: create, encode, decode, lookups, streaming, errors") {
    std::string json = R"({"added_tokens":[{"id":3,"content":"<eos>","special":true}],"normalizer":null,
      "pre_tokenizer":null,"post_processor":null,"decoder":{"type":"Fuse"},
      "model":{"type":"BPE","vocab":{"h":0,"i":1,"hi":2},"merges":["h i"]}})";
    cmf_tokenizer *t = nullptr;
    REQUIRE(cmf_tokenizer_create(json.data(), json.size(), &t) == nullptr);
    int32_t *ids = nullptr;
    size_t n = 0;
    REQUIRE(cmf_tokenizer_encode(t, "hih<eos>", 8, 0, &ids, &n) == nullptr);
    CHECK(std::vector<int32_t>(ids, ids + n) == std::vector<int32_t>{2, 0, 3});
    char *s = nullptr;
    size_t len = 0;
    REQUIRE(cmf_tokenizer_decode(t, ids, n, CMF_DECODE_SKIP_SPECIAL, &s, &len) == nullptr);
    CHECK(std::string(s, len) == "hih");
    cmf_string_free(s);
    cmf_ids_free(ids);
    CHECK(cmf_tokenizer_vocab_size(t) == 4);
    int32_t id = -1;
    REQUIRE(cmf_tokenizer_token_to_id(t, "<eos>", 5, &id) == nullptr);
    CHECK(id == 3);
    CHECK(cmf_tokenizer_is_special(t, 3) == 1);
    CHECK(cmf_tokenizer_is_special(t, 2) == 0);
    cmf_error *e = cmf_tokenizer_token_to_id(t, "zz", 2, &id);
    CHECK(cmf_error_code(e) == CMF_ERR_NOT_FOUND);
    cmf_error_free(e);
    e = cmf_tokenizer_id_to_token(t, 42, &s, &len);
    CHECK(cmf_error_code(e) == CMF_ERR_BOUNDS);
    cmf_error_free(e);
    cmf_detokenizer *d = nullptr;
    REQUIRE(cmf_detokenizer_create(t, 0, &d) == nullptr);
    std::string streamed;
    for (int32_t x : {2, 0, 1}) {
        REQUIRE(cmf_detokenizer_push(d, x, &s, &len) == nullptr);
        streamed += std::string(s, len);
        cmf_string_free(s);
    }
    e = cmf_detokenizer_push(d, 99, &s, &len);  // not in the vocabulary: an error, the stream goes on
    CHECK(cmf_error_code(e) == CMF_ERR_BOUNDS);
    cmf_error_free(e);
    REQUIRE(cmf_detokenizer_push(d, 1, &s, &len) == nullptr);
    streamed += std::string(s, len);
    cmf_string_free(s);
    REQUIRE(cmf_detokenizer_finish(d, &s, &len) == nullptr);
    streamed += s;
    cmf_string_free(s);
    CHECK(streamed == "hihii");
    cmf_detokenizer_free(d);
    cmf_tokenizer_free(t);
    cmf_tokenizer *bad = nullptr;
    e = cmf_tokenizer_create("{}", 2, &bad);
    CHECK(cmf_error_code(e) == CMF_ERR_PARSE);
    CHECK(bad == nullptr);
    cmf_error_free(e);
}

TEST_CASE("chat: a render is bounded: runaway loops, recursion, nesting and sizes end in errors") {
    const std::string ctx = R"({"messages":[]})";
    struct Case {
        const char *tmpl, *message;
    };
    const Case cases[] = {
        // 10^6 scans of a 1 MB string: the limit stops it after about 640 (each costs 15 625 steps), fast
        {"{% set s = 'x' * 1000000 %}{% for i in range(1000000) %}{{ s.count('y') }}{% endfor %}",
         "chat template line 1: the template did more than 10000000 steps of work (an endless or runaway loop?)"},
        {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
         "chat template line 1: statements, expressions and macro calls nested deeper than 500 levels (runaway recursion?)"},
        {"{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns.a | tojson }}",
         "chat template line 1: a value nested deeper than 500 levels (does a namespace contain itself?)"},
        {"{% set ns = namespace(a=1) %}{% set ns.a = [ns] %}{{ ns == ns.a[0] }}",
         "chat template line 1: a value nested deeper than 500 levels (does a namespace contain itself?)"},
        {"{{ 'x' * 1000000000000 }}", "chat template line 1: a string of 1000000000000 bytes, over the limit of 67108864"},
        // repr of a list holding one 8 MiB string 16 times: refused while it is written, not after
        {"{% set s = 'x' * 8388608 %}{{ [s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s] }}",
         "chat template line 1: a string of 67108895 bytes, over the limit of 67108864"},
        {"{{ 9223372036854775807 + 1 }}",
         "chat template line 1: integer overflow in 9223372036854775807 + 1 (Python's integers are unbounded, ours 64-bit)"},
        {"{{ 3 ** 40 }}", "chat template line 1: integer overflow in 3 ** 40 (Python's integers are unbounded, ours 64-bit)"},
        {"{{ 99999999999999999999 }}", "chat template line 1: integer literal 99999999999999999999 does not fit in 64 bits"},
        {"{{ 1e300 | int }}", "chat template line 1: int of 1e+300 does not fit in 64 bits"},
    };
    for (const Case &c : cases) {
        INFO(c.tmpl);
        auto r = render(c.tmpl, ctx);
        CHECK(r.code == CMF_ERR_TEMPLATE);
        CHECK(r.text == c.message);
    }
    // Legitimate work under the limits is untouched.
    auto fine = render("{% for i in range(1000) %}{{ i % 10 }}{% endfor %}{{ 3 ** 39 }}", ctx);
    REQUIRE(fine.code == 0);
    CHECK(fine.text.size() == 1000 + 19);
}

TEST_CASE("chat: a context object with a repeated key keeps the last value at the first place, as json.loads") {
    auto r = render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d":{"a":1,"b":2,"a":3}})");
    REQUIRE(r.code == 0);
    CHECK(r.text == "a=3;b=2;");
}
