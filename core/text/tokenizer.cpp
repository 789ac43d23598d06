#include "text/tokenizer.hpp"

#include "common/error.hpp"
#include "common/json.hpp"
#include "text/regex.hpp"
#include "text/unicode.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <queue>
#include <unordered_map>

namespace cmf::text {

namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

[[noreturn]] void parse_error(const std::string &what) { throw Error(CMF_ERR_PARSE, "tokenizer.json: " + what); }

// ---- JSON helpers: every missing/mistyped field is a named Parse error ----
std::optional<element> field(const object &o, std::string_view key) {
    element e;
    if (o.at_key(key).get(e)) return std::nullopt;
    if (e.is_null()) return std::nullopt;
    return e;
}
std::string str_field(const object &o, std::string_view key, const std::string &ctx) {
    auto e = field(o, key);
    std::string_view s;
    if (!e || e->get_string().get(s)) parse_error(ctx + ": field '" + std::string(key) + "' must be a string");
    return std::string(s);
}
std::string str_or(const object &o, std::string_view key, std::string dflt, const std::string &ctx) {
    auto e = field(o, key);
    if (!e) return dflt;
    std::string_view s;
    if (e->get_string().get(s)) parse_error(ctx + ": field '" + std::string(key) + "' must be a string");
    return std::string(s);
}
bool bool_or(const object &o, std::string_view key, bool dflt, const std::string &ctx) {
    auto e = field(o, key);
    if (!e) return dflt;
    bool b;
    if (e->get_bool().get(b)) parse_error(ctx + ": field '" + std::string(key) + "' must be a boolean");
    return b;
}
int64_t int_field(const object &o, std::string_view key, const std::string &ctx) {
    auto e = field(o, key);
    int64_t v;
    if (!e || e->get_int64().get(v)) parse_error(ctx + ": field '" + std::string(key) + "' must be an integer");
    return v;
}
object obj_of(element e, const std::string &ctx) {
    object o;
    if (e.get_object().get(o)) parse_error(ctx + " must be an object");
    return o;
}
array arr_field(const object &o, std::string_view key, const std::string &ctx) {
    auto e = field(o, key);
    array a;
    if (!e || e->get_array().get(a)) parse_error(ctx + ": field '" + std::string(key) + "' must be an array");
    return a;
}

// HF patterns: {"String": "..."} or {"Regex": "..."}.
std::unique_ptr<Regex> pattern_field(const object &o, const std::string &ctx) {
    auto p = field(o, "pattern");
    if (!p) parse_error(ctx + ": missing 'pattern'");
    object po = obj_of(*p, ctx + ".pattern");
    if (auto s = field(po, "String")) {
        std::string_view v;
        if (s->get_string().get(v)) parse_error(ctx + ".pattern.String must be a string");
        return std::make_unique<Regex>(v, true, ctx);
    }
    if (auto r = field(po, "Regex")) {
        std::string_view v;
        if (r->get_string().get(v)) parse_error(ctx + ".pattern.Regex must be a string");
        return std::make_unique<Regex>(v, false, ctx);
    }
    parse_error(ctx + ".pattern must hold 'String' or 'Regex'");
}

// ---- GPT-2 byte <-> unicode map (byte-level BPE) ----
struct ByteMap {
    std::string enc[256];                        // byte -> UTF-8 of its stand-in char
    std::unordered_map<uint32_t, uint8_t> dec;   // stand-in code point -> byte
    ByteMap() {
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            uint32_t cp = keep ? uint32_t(b) : uint32_t(256 + n++);
            enc[b] = utf8_encode(cp);
            dec[cp] = uint8_t(b);
        }
    }
};
const ByteMap &byte_map() {
    static const ByteMap m;
    return m;
}

// ---- normalizers ----
struct Normalizer {
    virtual ~Normalizer() = default;
    virtual void apply(std::string &s) const = 0;
};
struct UnicodeNorm : Normalizer {
    NormForm form;
    explicit UnicodeNorm(NormForm f) : form(f) {}
    void apply(std::string &s) const override { s = normalize_unicode(s, form); }
};
struct ReplaceNorm : Normalizer {
    std::unique_ptr<Regex> re;
    std::string content;
    void apply(std::string &s) const override { s = re->replace_all(s, content); }
};
struct PrependNorm : Normalizer {
    std::string prepend;
    void apply(std::string &s) const override {
        if (!s.empty()) s.insert(0, prepend);
    }
};
struct StripNorm : Normalizer {
    bool left, right;
    void apply(std::string &s) const override { s = strip_whitespace(s, left, right); }
};
struct LowercaseNorm : Normalizer {
    void apply(std::string &s) const override { s = lowercase(s); }
};
struct SequenceNorm : Normalizer {
    std::vector<std::unique_ptr<Normalizer>> parts;
    void apply(std::string &s) const override {
        for (auto &p : parts) p->apply(s);
    }
};

std::unique_ptr<Normalizer> make_normalizer(element e, const std::string &ctx) {
    object o = obj_of(e, ctx);
    std::string type = str_field(o, "type", ctx);
    std::string c = ctx + " (" + type + ")";
    if (type == "NFC") return std::make_unique<UnicodeNorm>(NormForm::NFC);
    if (type == "NFD") return std::make_unique<UnicodeNorm>(NormForm::NFD);
    if (type == "NFKC") return std::make_unique<UnicodeNorm>(NormForm::NFKC);
    if (type == "NFKD") return std::make_unique<UnicodeNorm>(NormForm::NFKD);
    if (type == "Lowercase") return std::make_unique<LowercaseNorm>();
    if (type == "Replace") {
        auto n = std::make_unique<ReplaceNorm>();
        n->re = pattern_field(o, c);
        n->content = str_field(o, "content", c);
        return n;
    }
    if (type == "Prepend") {
        auto n = std::make_unique<PrependNorm>();
        n->prepend = str_field(o, "prepend", c);
        return n;
    }
    if (type == "Strip") {
        auto n = std::make_unique<StripNorm>();
        n->left = bool_or(o, "strip_left", true, c);
        n->right = bool_or(o, "strip_right", true, c);
        return n;
    }
    if (type == "Sequence") {
        auto n = std::make_unique<SequenceNorm>();
        size_t i = 0;
        for (element x : arr_field(o, "normalizers", c)) n->parts.push_back(make_normalizer(x, c + "[" + std::to_string(i++) + "]"));
        return n;
    }
    throw Error(CMF_ERR_UNSUPPORTED, "tokenizer.json: unsupported normalizer type '" + type + "' (" + ctx + ")");
}

// ---- pre-tokenizers: transform a list of pieces ----
struct Piece {
    std::string text;
    bool at_start;  // begins at offset 0 of the whole input (Metaspace "first")
};
using Pieces = std::vector<Piece>;

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string &s, const std::string &ctx) {
    if (s == "Removed") return Behavior::Removed;
    if (s == "Isolated") return Behavior::Isolated;
    if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
    if (s == "MergedWithNext") return Behavior::MergedWithNext;
    if (s == "Contiguous") return Behavior::Contiguous;
    parse_error(ctx + ": unknown split behavior '" + s + "'");
}

// HF's split: matches -> (range, is_match) covering the string -> behavior.
void split_piece(const Piece &p, const std::vector<std::pair<size_t, size_t>> &matches, bool invert, Behavior b,
                 Pieces &out) {
    struct Seg {
        size_t b, e;
        bool m;
    };
    std::vector<Seg> segs;
    size_t prev = 0;
    for (auto [s, e] : matches) {
        if (s > prev) segs.push_back({prev, s, invert});
        segs.push_back({s, e, !invert});
        prev = e;
    }
    if (prev < p.text.size()) segs.push_back({prev, p.text.size(), invert});

    std::vector<std::pair<size_t, size_t>> res;
    switch (b) {
    case Behavior::Isolated:
        for (auto &s : segs) res.emplace_back(s.b, s.e);
        break;
    case Behavior::Removed:
        for (auto &s : segs)
            if (!s.m) res.emplace_back(s.b, s.e);
        break;
    case Behavior::MergedWithPrevious: {
        bool prev_match = false;
        for (auto &s : segs) {
            if (s.m && !prev_match && !res.empty()) res.back().second = s.e;
            else res.emplace_back(s.b, s.e);
            prev_match = s.m;
        }
        break;
    }
    case Behavior::MergedWithNext: {
        bool prev_match = false;
        for (size_t i = segs.size(); i-- > 0;) {
            auto &s = segs[i];
            if (s.m && !prev_match && !res.empty()) res.back().first = s.b;
            else res.emplace_back(s.b, s.e);
            prev_match = s.m;
        }
        std::reverse(res.begin(), res.end());
        break;
    }
    case Behavior::Contiguous: {
        bool prev_match = false;
        for (auto &s : segs) {
            if (s.m == prev_match && !res.empty()) res.back().second = s.e;
            else res.emplace_back(s.b, s.e);
            prev_match = s.m;
        }
        break;
    }
    }
    for (auto [s, e] : res)
        if (e > s) out.push_back({p.text.substr(s, e - s), p.at_start && s == 0});
}

struct PreTokenizer {
    virtual ~PreTokenizer() = default;
    virtual void apply(Pieces &pieces) const = 0;
};
struct RegexSplit : PreTokenizer {
    std::unique_ptr<Regex> re;
    Behavior behavior = Behavior::Isolated;
    bool invert = false;
    void apply(Pieces &pieces) const override {
        Pieces out;
        for (auto &p : pieces) split_piece(p, re->find_all(p.text), invert, behavior, out);
        pieces = std::move(out);
    }
};
const char *kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
struct ByteLevelPre : PreTokenizer {
    bool add_prefix_space = false;
    std::unique_ptr<Regex> re;  // null unless use_regex
    void apply(Pieces &pieces) const override {
        Pieces out;
        for (auto &p : pieces) {
            Piece q = p;
            if (add_prefix_space && !q.text.empty() && q.text[0] != ' ') q.text.insert(0, " ");
            if (re) split_piece(q, re->find_all(q.text), false, Behavior::Isolated, out);
            else out.push_back(std::move(q));
        }
        const auto &bm = byte_map();
        for (auto &p : out) {
            std::string m;
            m.reserve(p.text.size() * 2);
            for (unsigned char c : p.text) m += bm.enc[c];
            p.text = std::move(m);
        }
        pieces = std::move(out);
    }
};
struct MetaspacePre : PreTokenizer {
    std::string replacement;
    std::string scheme;  // always | first | never
    bool split = true;
    std::unique_ptr<Regex> rep_re;
    void apply(Pieces &pieces) const override {
        Pieces out;
        for (auto &p : pieces) {
            Piece q{rep_re_space().replace_all(p.text, replacement), p.at_start};
            bool prepend = scheme == "always" || (scheme == "first" && p.at_start);
            if (prepend && q.text.rfind(replacement, 0) != 0) q.text.insert(0, replacement);
            if (split) split_piece(q, rep_re->find_all(q.text), false, Behavior::MergedWithNext, out);
            else out.push_back(std::move(q));
        }
        pieces = std::move(out);
    }
    static const Regex &rep_re_space() {
        static const Regex r(" ", true, "Metaspace");
        return r;
    }
};
struct SequencePre : PreTokenizer {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    void apply(Pieces &pieces) const override {
        for (auto &p : parts) p->apply(pieces);
    }
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(element e, const std::string &ctx) {
    object o = obj_of(e, ctx);
    std::string type = str_field(o, "type", ctx);
    std::string c = ctx + " (" + type + ")";
    if (type == "Split") {
        auto p = std::make_unique<RegexSplit>();
        p->re = pattern_field(o, c);
        p->behavior = parse_behavior(str_field(o, "behavior", c), c);
        p->invert = bool_or(o, "invert", false, c);
        return p;
    }
    if (type == "ByteLevel") {
        auto p = std::make_unique<ByteLevelPre>();
        p->add_prefix_space = bool_or(o, "add_prefix_space", true, c);
        if (bool_or(o, "use_regex", true, c)) p->re = std::make_unique<Regex>(kGpt2Regex, false, c);
        return p;
    }
    if (type == "Metaspace") {
        auto p = std::make_unique<MetaspacePre>();
        p->replacement = str_or(o, "replacement", "\xE2\x96\x81", c);
        p->scheme = str_or(o, "prepend_scheme", bool_or(o, "add_prefix_space", true, c) ? "always" : "never", c);
        if (p->scheme != "always" && p->scheme != "first" && p->scheme != "never")
            parse_error(c + ": unknown prepend_scheme '" + p->scheme + "'");
        p->split = bool_or(o, "split", true, c);
        p->rep_re = std::make_unique<Regex>(p->replacement, true, c);
        return p;
    }
    if (type == "Digits") {
        auto p = std::make_unique<RegexSplit>();
        bool individual = bool_or(o, "individual_digits", false, c);
        p->re = std::make_unique<Regex>(individual ? "\\p{N}" : "\\p{N}+", false, c);
        return p;
    }
    if (type == "Punctuation") {
        auto p = std::make_unique<RegexSplit>();
        // Rust's is_punctuation: ASCII punctuation or Unicode category P*; one match per char.
        p->re = std::make_unique<Regex>("[\\p{P}!-/:-@\\[-`{-~]", false, c);
        p->behavior = parse_behavior(str_or(o, "behavior", "Isolated", c), c);
        return p;
    }
    if (type == "Whitespace") {
        auto p = std::make_unique<RegexSplit>();
        p->re = std::make_unique<Regex>("\\w+|[^\\w\\s]+", false, c);
        p->behavior = Behavior::Removed;
        p->invert = true;
        return p;
    }
    if (type == "WhitespaceSplit") {
        auto p = std::make_unique<RegexSplit>();
        p->re = std::make_unique<Regex>("\\s+", false, c);
        p->behavior = Behavior::Removed;
        return p;
    }
    if (type == "Sequence") {
        auto p = std::make_unique<SequencePre>();
        size_t i = 0;
        for (element x : arr_field(o, "pretokenizers", c))
            p->parts.push_back(make_pre_tokenizer(x, c + "[" + std::to_string(i++) + "]"));
        return p;
    }
    throw Error(CMF_ERR_UNSUPPORTED, "tokenizer.json: unsupported pre_tokenizer type '" + type + "' (" + ctx + ")");
}

// ---- decoders: transform the token strings ----
struct Decoder {
    virtual ~Decoder() = default;
    // `raw`: keep bytes as they are (no validation), for streaming.
    virtual void apply(std::vector<std::string> &toks, bool raw) const = 0;
};
struct ByteLevelDec : Decoder {
    void apply(std::vector<std::string> &toks, bool) const override {
        const auto &bm = byte_map();
        std::string bytes;
        for (auto &t : toks) {
            std::string mapped;
            bool ok = true;
            for (size_t i = 0; i < t.size() && ok;) {
                uint32_t cp;
                size_t n = utf8_decode(t, i, cp);
                auto it = bm.dec.find(cp);
                if (it == bm.dec.end()) ok = false;
                else mapped += char(it->second);
                i += n;
            }
            bytes += ok ? mapped : t;  // a token outside the byte map passes as its raw bytes
        }
        toks.assign(1, std::move(bytes));
    }
};
// "<0xNN>" -> byte value, or -1.
int byte_token(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    auto hex = [](char ch) { return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1; };
    int h = hex(t[3]), l = hex(t[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}
struct ByteFallbackDec : Decoder {
    void apply(std::vector<std::string> &toks, bool raw) const override {
        std::vector<std::string> out;
        std::string pending;
        size_t npending = 0;
        auto flush = [&] {
            if (!npending) return;
            if (raw || valid_utf8(pending)) out.push_back(pending);
            else
                for (size_t i = 0; i < npending; ++i) out.push_back("\xEF\xBF\xBD");
            pending.clear();
            npending = 0;
        };
        for (auto &t : toks) {
            int b = byte_token(t);
            if (b >= 0) {
                pending += char(b);
                ++npending;
            } else {
                flush();
                out.push_back(t);
            }
        }
        flush();
        toks = std::move(out);
    }
};
struct FuseDec : Decoder {
    void apply(std::vector<std::string> &toks, bool) const override {
        std::string all;
        for (auto &t : toks) all += t;
        toks.assign(1, std::move(all));
    }
};
struct StripDec : Decoder {
    std::string content;
    size_t start = 0, stop = 0;
    void apply(std::vector<std::string> &toks, bool) const override {
        if (content.empty()) return;  // nothing to strip (and each loop would never advance)
        for (auto &t : toks) {
            size_t b = 0, e = t.size();
            for (size_t i = 0; i < start && t.compare(b, content.size(), content) == 0 && b + content.size() <= e; ++i)
                b += content.size();
            for (size_t i = 0; i < stop && e >= b + content.size() && t.compare(e - content.size(), content.size(), content) == 0; ++i)
                e -= content.size();
            t = t.substr(b, e - b);
        }
    }
};
struct ReplaceDec : Decoder {
    std::unique_ptr<Regex> re;
    std::string content;
    void apply(std::vector<std::string> &toks, bool) const override {
        for (auto &t : toks)
            if (valid_utf8(t)) t = re->replace_all(t, content);
    }
};
struct MetaspaceDec : Decoder {
    std::string replacement;
    bool prepend = true;
    void apply(std::vector<std::string> &toks, bool) const override {
        for (size_t i = 0; i < toks.size(); ++i) {
            std::string r;
            const std::string &t = toks[i];
            for (size_t k = 0; k < t.size();) {
                if (t.compare(k, replacement.size(), replacement) == 0) {
                    r += ' ';
                    k += replacement.size();
                } else
                    r += t[k++];
            }
            if (i == 0 && prepend && !r.empty() && r[0] == ' ') r.erase(0, 1);
            toks[i] = std::move(r);
        }
    }
};
struct SequenceDec : Decoder {
    std::vector<std::unique_ptr<Decoder>> parts;
    void apply(std::vector<std::string> &toks, bool raw) const override {
        for (auto &p : parts) p->apply(toks, raw);
    }
};

std::unique_ptr<Decoder> make_decoder(element e, const std::string &ctx) {
    object o = obj_of(e, ctx);
    std::string type = str_field(o, "type", ctx);
    std::string c = ctx + " (" + type + ")";
    if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
    if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
    if (type == "Fuse") return std::make_unique<FuseDec>();
    if (type == "Strip") {
        auto d = std::make_unique<StripDec>();
        d->content = str_field(o, "content", c);
        const int64_t start = int_field(o, "start", c), stop = int_field(o, "stop", c);
        if (start < 0 || stop < 0) parse_error(c + ": start and stop must be >= 0");
        d->start = size_t(start);
        d->stop = size_t(stop);
        return d;
    }
    if (type == "Replace") {
        auto d = std::make_unique<ReplaceDec>();
        d->re = pattern_field(o, c);
        d->content = str_field(o, "content", c);
        return d;
    }
    if (type == "Metaspace") {
        auto d = std::make_unique<MetaspaceDec>();
        d->replacement = str_or(o, "replacement", "\xE2\x96\x81", c);
        std::string scheme = str_or(o, "prepend_scheme", bool_or(o, "add_prefix_space", true, c) ? "always" : "never", c);
        d->prepend = scheme != "never";
        return d;
    }
    if (type == "Sequence") {
        auto d = std::make_unique<SequenceDec>();
        size_t i = 0;
        for (element x : arr_field(o, "decoders", c)) d->parts.push_back(make_decoder(x, c + "[" + std::to_string(i++) + "]"));
        return d;
    }
    throw Error(CMF_ERR_UNSUPPORTED, "tokenizer.json: unsupported decoder type '" + type + "' (" + ctx + ")");
}

// ---- post-processors (only run with add_special_tokens) ----
struct PostProcessor {
    virtual ~PostProcessor() = default;
    virtual void apply(std::vector<int32_t> &ids) const = 0;
};
struct TemplatePost : PostProcessor {
    // Each item: the ids of a special token, or empty with is_seq for $A.
    struct Item {
        bool is_seq;
        std::vector<int32_t> ids;
    };
    std::vector<Item> single;
    void apply(std::vector<int32_t> &ids) const override {
        std::vector<int32_t> out;
        for (auto &it : single) {
            if (it.is_seq) out.insert(out.end(), ids.begin(), ids.end());
            else out.insert(out.end(), it.ids.begin(), it.ids.end());
        }
        ids = std::move(out);
    }
};
struct WrapPost : PostProcessor {  // Roberta/Bert: cls A sep
    int32_t cls, sep;
    void apply(std::vector<int32_t> &ids) const override {
        ids.insert(ids.begin(), cls);
        ids.push_back(sep);
    }
};
struct NoopPost : PostProcessor {  // ByteLevel only adjusts offsets
    void apply(std::vector<int32_t> &) const override {}
};
struct SequencePost : PostProcessor {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    void apply(std::vector<int32_t> &ids) const override {
        for (auto &p : parts) p->apply(ids);
    }
};

std::unique_ptr<PostProcessor> make_post_processor(element e, const std::string &ctx) {
    object o = obj_of(e, ctx);
    std::string type = str_field(o, "type", ctx);
    std::string c = ctx + " (" + type + ")";
    if (type == "ByteLevel") return std::make_unique<NoopPost>();
    if (type == "TemplateProcessing") {
        auto p = std::make_unique<TemplatePost>();
        // special_tokens may be absent (Hugging Face defaults it to empty):
        // then a SpecialToken item names a token that is not there.
        const std::optional<element> specials_e = field(o, "special_tokens");
        const std::optional<object> specials =
            specials_e ? std::optional<object>(obj_of(*specials_e, c + ".special_tokens")) : std::nullopt;
        for (element x : arr_field(o, "single", c)) {
            object xo = obj_of(x, c + ".single[]");
            if (auto s = field(xo, "Sequence")) {
                std::string id = str_field(obj_of(*s, c), "id", c + ".single[].Sequence");
                if (id != "A") parse_error(c + ": single template refers to sequence '" + id + "'");
                p->single.push_back({true, {}});
            } else if (auto t = field(xo, "SpecialToken")) {
                std::string id = str_field(obj_of(*t, c), "id", c + ".single[].SpecialToken");
                auto st = specials ? field(*specials, id) : std::nullopt;
                if (!st) parse_error(c + ": special token '" + id + "' is not in special_tokens");
                TemplatePost::Item item{false, {}};
                for (element v : arr_field(obj_of(*st, c), "ids", c + ".special_tokens." + id)) {
                    int64_t n;
                    if (v.get_int64().get(n)) parse_error(c + ".special_tokens." + id + ".ids must be integers");
                    item.ids.push_back(int32_t(n));
                }
                p->single.push_back(std::move(item));
            } else
                parse_error(c + ": template item must be Sequence or SpecialToken");
        }
        return p;
    }
    if (type == "RobertaProcessing" || type == "BertProcessing") {
        auto p = std::make_unique<WrapPost>();
        auto pair_id = [&](std::string_view key) {
            array a = arr_field(o, key, c);
            int64_t n;
            if (a.size() != 2 || a.at(1).get_int64().get(n)) parse_error(c + ": '" + std::string(key) + "' must be [token, id]");
            return int32_t(n);
        };
        p->cls = pair_id("cls");
        p->sep = pair_id("sep");
        return p;
    }
    if (type == "Sequence") {
        auto p = std::make_unique<SequencePost>();
        size_t i = 0;
        for (element x : arr_field(o, "processors", c))
            p->parts.push_back(make_post_processor(x, c + "[" + std::to_string(i++) + "]"));
        return p;
    }
    throw Error(CMF_ERR_UNSUPPORTED, "tokenizer.json: unsupported post_processor type '" + type + "' (" + ctx + ")");
}

struct StrHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using StrMap = std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>>;

// ---- added tokens ----
struct AddedToken {
    std::string content;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
};

// Byte trie over token contents for leftmost-longest matching.
class Trie {
public:
    void add(std::string_view s, int32_t value) {
        size_t n = 0;
        for (unsigned char c : s) {
            auto it = nodes_[n].next.find(c);
            if (it == nodes_[n].next.end()) {
                nodes_.push_back({});
                nodes_[n].next[c] = nodes_.size() - 1;
                n = nodes_.size() - 1;
            } else
                n = it->second;
        }
        nodes_[n].value = value;
    }
    bool empty() const { return nodes_.size() == 1; }
    // Longest token starting at text[pos]: (length, value) or length 0.
    std::pair<size_t, int32_t> longest_at(std::string_view text, size_t pos) const {
        size_t n = 0, best = 0;
        int32_t val = -1;
        for (size_t i = pos; i < text.size(); ++i) {
            auto it = nodes_[n].next.find(static_cast<unsigned char>(text[i]));
            if (it == nodes_[n].next.end()) break;
            n = it->second;
            if (nodes_[n].value >= 0) {
                best = i + 1 - pos;
                val = nodes_[n].value;
            }
        }
        return {best, val};
    }
    bool has_first_byte(unsigned char c) const { return nodes_[0].next.count(c) != 0; }

private:
    struct Node {
        std::map<unsigned char, size_t> next;
        int32_t value = -1;
    };
    std::vector<Node> nodes_{1};
};

bool is_ws_at(std::string_view s, size_t i, size_t &len) {
    uint32_t cp;
    len = utf8_decode(s, i, cp);
    return is_unicode_whitespace(cp);
}

}  // namespace

// ---- the BPE model ----
struct Bpe {
    StrMap vocab;
    std::vector<std::string> id_to_tok;
    std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges;  // (a<<32|b) -> (rank, merged id)
    std::optional<int32_t> unk;
    std::string unk_token, prefix, suffix;
    bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
    int32_t byte_ids[256];
    bool have_byte_ids = false;

    static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

    void word_to_ids(std::string_view w, std::vector<int32_t> &out) const {
        if (ignore_merges) {
            auto it = vocab.find(w);
            if (it != vocab.end()) {
                out.push_back(it->second);
                return;
            }
        }
        std::vector<int32_t> sym;
        sym.reserve(w.size());
        bool last_unk = false;
        for (size_t i = 0; i < w.size();) {
            uint32_t cp;
            size_t n = utf8_decode(w, i, cp);
            std::string piece;
            if (i > 0 && !prefix.empty()) piece = prefix;
            piece.append(w.substr(i, n));
            if (i + n == w.size() && !suffix.empty()) piece += suffix;
            auto it = vocab.find(piece);
            if (it != vocab.end()) {
                sym.push_back(it->second);
                last_unk = false;
            } else if (byte_fallback && have_byte_ids) {
                for (size_t k = 0; k < n; ++k) sym.push_back(byte_ids[static_cast<unsigned char>(w[i + k])]);
                last_unk = false;
            } else if (unk) {
                if (!(fuse_unk && last_unk)) sym.push_back(*unk);
                last_unk = true;
            } else {
                throw Error(CMF_ERR_INVALID_ARGUMENT, "tokenizer: character '" + std::string(w.substr(i, n)) +
                                                          "' is not in the vocabulary and the model has no unk_token "
                                                          "or byte fallback");
            }
            i += n;
        }
        merge(sym);
        out.insert(out.end(), sym.begin(), sym.end());
    }

    // Lowest-rank pair first, leftmost among equal ranks (HF's BinaryHeap order).
    void merge(std::vector<int32_t> &sym) const {
        size_t n = sym.size();
        if (n < 2) return;
        std::vector<int32_t> prev(n), next(n);
        for (size_t i = 0; i < n; ++i) {
            prev[i] = int32_t(i) - 1;
            next[i] = i + 1 < n ? int32_t(i + 1) : -1;
        }
        struct Cand {
            uint32_t rank;
            int32_t pos;
            int32_t a, b;
            bool operator>(const Cand &o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
        };
        std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
        auto push = [&](int32_t i) {
            if (i < 0 || next[i] < 0) return;
            auto it = merges.find(key(sym[i], sym[next[i]]));
            if (it != merges.end()) q.push({it->second.first, i, sym[i], sym[next[i]]});
        };
        for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
        while (!q.empty()) {
            Cand c = q.top();
            q.pop();
            int32_t r = next[c.pos];
            if (sym[c.pos] != c.a || r < 0 || sym[r] != c.b) continue;  // stale
            sym[c.pos] = merges.at(key(c.a, c.b)).second;
            sym[r] = -1;
            next[c.pos] = next[r];
            if (next[r] >= 0) prev[next[r]] = c.pos;
            push(prev[c.pos]);
            push(c.pos);
        }
        size_t k = 0;
        for (size_t i = 0; i < n; ++i)
            if (sym[i] >= 0) sym[k++] = sym[i];
        sym.resize(k);
    }
};

struct Tokenizer::Impl {
    Bpe bpe;
    std::unique_ptr<Normalizer> normalizer;
    std::unique_ptr<PreTokenizer> pre;
    std::unique_ptr<PostProcessor> post;
    std::unique_ptr<Decoder> decoder;
    std::vector<AddedToken> added;
    std::unordered_map<int32_t, size_t> added_by_id;
    StrMap added_by_content;
    Trie raw_trie, norm_trie;  // added tokens matched on raw / normalized text
    size_t size = 0;

    mutable std::mutex cache_mu;
    mutable std::unordered_map<std::string, std::vector<int32_t>, StrHash, std::equal_to<>> cache;
    static constexpr size_t kCacheMax = 200000;
    static constexpr size_t kCacheWordMax = 64;

    // Splits `text` into (segment, added-token id or -1) with HF's rules.
    void split_added(std::string_view text, const Trie &trie, std::vector<std::pair<std::string, int32_t>> &out,
                     bool at_start, std::vector<bool> &starts) const {
        size_t start_off = 0;
        size_t pos = 0;
        while (pos < text.size()) {
            if (!trie.has_first_byte(static_cast<unsigned char>(text[pos]))) {
                ++pos;
                continue;
            }
            auto [len, idx] = trie.longest_at(text, pos);
            if (len == 0) {
                ++pos;
                continue;
            }
            const AddedToken &t = added[size_t(idx)];
            size_t s = pos, e = pos + len;
            if (t.single_word) {
                uint32_t cp;
                bool before_word = s > 0 && is_alnum_cp((utf8_last(text.substr(0, s), cp), cp));
                bool after_word = e < text.size() && is_alnum_cp((utf8_decode(text, e, cp), cp));
                if (before_word || after_word) {
                    pos = e;  // the matcher resumes after the rejected match
                    continue;
                }
            }
            if (t.lstrip) {
                while (s > start_off) {
                    uint32_t cp;
                    size_t n = utf8_last(text.substr(0, s), cp);
                    if (!is_unicode_whitespace(cp)) break;
                    s -= n;
                }
            }
            if (t.rstrip) {
                size_t n;
                while (e < text.size() && is_ws_at(text, e, n)) e += n;
            }
            if (s > start_off) {
                out.emplace_back(std::string(text.substr(start_off, s - start_off)), -1);
                starts.push_back(at_start && start_off == 0);
            }
            out.emplace_back(std::string(), t.id);
            starts.push_back(false);
            start_off = e;
            pos = e;
        }
        if (start_off < text.size()) {
            out.emplace_back(std::string(text.substr(start_off)), -1);
            starts.push_back(at_start && start_off == 0);
        }
    }

    void encode_word(std::string_view w, std::vector<int32_t> &out) const {
        if (w.size() <= kCacheWordMax) {
            {
                std::lock_guard lk(cache_mu);
                auto it = cache.find(w);
                if (it != cache.end()) {
                    out.insert(out.end(), it->second.begin(), it->second.end());
                    return;
                }
            }
            std::vector<int32_t> ids;
            bpe.word_to_ids(w, ids);
            out.insert(out.end(), ids.begin(), ids.end());
            std::lock_guard lk(cache_mu);
            if (cache.size() < kCacheMax) cache.emplace(std::string(w), std::move(ids));
            return;
        }
        bpe.word_to_ids(w, out);
    }

    void encode_segment(std::string s, bool at_start, std::vector<int32_t> &out) const {
        if (normalizer) normalizer->apply(s);
        // Added tokens flagged `normalized` are matched on the normalized text.
        std::vector<std::pair<std::string, int32_t>> parts;
        std::vector<bool> starts;
        if (!norm_trie.empty()) split_added(s, norm_trie, parts, at_start, starts);
        else {
            parts.emplace_back(std::move(s), -1);
            starts.push_back(at_start);
        }
        for (size_t i = 0; i < parts.size(); ++i) {
            if (parts[i].second >= 0) {
                out.push_back(parts[i].second);
                continue;
            }
            Pieces pieces{{std::move(parts[i].first), starts[i]}};
            if (pre) pre->apply(pieces);
            for (auto &p : pieces) encode_word(p.text, out);
        }
    }

    std::vector<std::string> tokens_of(std::span<const int32_t> ids, bool skip_special) const {
        std::vector<std::string> toks;
        toks.reserve(ids.size());
        for (int32_t id : ids) {
            auto a = added_by_id.find(id);
            if (a != added_by_id.end()) {
                if (skip_special && added[a->second].special) continue;
                toks.push_back(added[a->second].content);
            } else if (id >= 0 && size_t(id) < bpe.id_to_tok.size() && !bpe.id_to_tok[size_t(id)].empty()) {
                toks.push_back(bpe.id_to_tok[size_t(id)]);
            } else {
                throw Error(CMF_ERR_BOUNDS, "tokenizer: id " + std::to_string(id) + " is not in the vocabulary (size " +
                                                std::to_string(size) + ")");
            }
        }
        return toks;
    }

    std::string decode(std::span<const int32_t> ids, bool skip_special, bool raw) const {
        std::vector<std::string> toks = tokens_of(ids, skip_special);
        if (!decoder) {
            std::string out;
            for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
            return out;
        }
        // Every token, added ones included, goes through the decoder, as in
        // HF tokenizers (Gemma's whitespace-run added tokens hold "▁").
        decoder->apply(toks, raw);
        std::string out;
        for (auto &t : toks) out += t;
        return out;
    }
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view json) {
    std::unique_ptr<Tokenizer> tok(new Tokenizer());
    Impl &im = *tok->impl_;
    simdjson::dom::parser parser;
    element doc = parse_json(parser, json, "tokenizer.json");
    object root = obj_of(doc, "top level");

    // model
    auto model_el = field(root, "model");
    if (!model_el) parse_error("missing 'model'");
    object model = obj_of(*model_el, "model");
    std::string mtype = str_or(model, "type", "BPE", "model");
    if (mtype != "BPE")
        throw Error(CMF_ERR_UNSUPPORTED, "tokenizer.json: unsupported model type '" + mtype + "' (only BPE is implemented)");
    Bpe &bpe = im.bpe;
    auto vocab_el = field(model, "vocab");
    if (!vocab_el) parse_error("model: missing 'vocab'");
    object vocab = obj_of(*vocab_el, "model.vocab");
    int32_t max_id = -1;
    std::vector<std::pair<int32_t, std::string_view>> order;  // each key's first entry, in the file's order
    for (auto kv : vocab) {
        int64_t id;
        if (kv.value.get_int64().get(id) || id < 0)
            parse_error("model.vocab: id of '" + std::string(kv.key) + "' is not a non-negative integer");
        if (id > kMaxTokenId)
            parse_error("model.vocab: id " + std::to_string(id) + " of '" + std::string(kv.key) + "' is above " +
                        std::to_string(kMaxTokenId) + ", the largest this tokenizer takes");
        if (bpe.vocab.emplace(std::string(kv.key), int32_t(id)).second) order.emplace_back(int32_t(id), kv.key);
        max_id = std::max(max_id, int32_t(id));
    }
    // One token per id: a file that gives an id to two tokens is ambiguous
    // (Hugging Face's reverse map keeps whichever its hash order puts last),
    // and one of the two could be encoded but never decoded. Checked in the
    // file's order, so the message names the first holder.
    bpe.id_to_tok.resize(size_t(max_id + 1));
    std::vector<bool> held(size_t(max_id + 1), false);
    for (const auto &[id, key] : order) {
        if (held[size_t(id)])
            parse_error("model.vocab: id " + std::to_string(id) + " is given to both '" + bpe.id_to_tok[size_t(id)] +
                        "' and '" + std::string(key) + "'");
        held[size_t(id)] = true;
        bpe.id_to_tok[size_t(id)] = std::string(key);
    }

    auto lookup = [&](std::string_view t, const std::string &ctx) {
        auto it = bpe.vocab.find(t);
        if (it == bpe.vocab.end()) parse_error(ctx + ": '" + std::string(t) + "' is not in the vocab");
        return it->second;
    };
    if (auto m = field(model, "merges")) {
        array merges;
        if (m->get_array().get(merges)) parse_error("model.merges must be an array");
        uint32_t rank = 0;
        std::string joined;
        for (element x : merges) {
            std::string_view a, b, s;
            std::string ctx = "model.merges[" + std::to_string(rank) + "]";
            array pair;
            if (!x.get_string().get(s)) {  // "a b"
                size_t sp = s.find(' ');
                if (sp == std::string_view::npos || s.find(' ', sp + 1) != std::string_view::npos)
                    parse_error(ctx + ": '" + std::string(s) + "' is not two tokens separated by one space");
                a = s.substr(0, sp);
                b = s.substr(sp + 1);
            } else if (!x.get_array().get(pair)) {  // ["a", "b"]
                if (pair.size() != 2 || pair.at(0).get_string().get(a) || pair.at(1).get_string().get(b))
                    parse_error(ctx + ": must be a pair of strings");
            } else
                parse_error(ctx + ": must be a string or a pair");
            int32_t ia = lookup(a, ctx), ib = lookup(b, ctx);
            joined.assign(a);
            joined.append(bpe.prefix.empty() ? b : b.substr(std::min(b.size(), bpe.prefix.size())));
            int32_t ij = lookup(joined, ctx);
            bpe.merges.try_emplace(Bpe::key(ia, ib), rank, ij);
            ++rank;
        }
    }
    bpe.unk_token = str_or(model, "unk_token", "", "model");
    if (!bpe.unk_token.empty()) {
        auto it = bpe.vocab.find(bpe.unk_token);
        if (it != bpe.vocab.end()) bpe.unk = it->second;
    }
    bpe.prefix = str_or(model, "continuing_subword_prefix", "", "model");
    bpe.suffix = str_or(model, "end_of_word_suffix", "", "model");
    bpe.fuse_unk = bool_or(model, "fuse_unk", false, "model");
    bpe.byte_fallback = bool_or(model, "byte_fallback", false, "model");
    bpe.ignore_merges = bool_or(model, "ignore_merges", false, "model");
    if (auto d = field(model, "dropout")) {
        double p = 0;
        if (d->get_double().get(p)) parse_error("model.dropout must be a number or null");
        if (p > 0) throw Error(CMF_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is a training feature and is not supported");
    }
    if (bpe.byte_fallback) {
        bpe.have_byte_ids = true;
        char name[8];
        for (int b = 0; b < 256; ++b) {
            std::snprintf(name, sizeof name, "<0x%02X>", b);
            auto it = bpe.vocab.find(std::string_view(name));
            if (it == bpe.vocab.end()) {
                bpe.have_byte_ids = false;
                break;
            }
            bpe.byte_ids[b] = it->second;
        }
    }
    im.size = bpe.id_to_tok.size();

    // added tokens
    if (auto at = field(root, "added_tokens")) {
        array arr;
        if (at->get_array().get(arr)) parse_error("added_tokens must be an array");
        size_t i = 0;
        for (element x : arr) {
            std::string ctx = "added_tokens[" + std::to_string(i++) + "]";
            object o = obj_of(x, ctx);
            AddedToken t;
            t.content = str_field(o, "content", ctx);
            int64_t id = int_field(o, "id", ctx);
            if (id < 0 || id > kMaxTokenId)
                parse_error(ctx + ": id " + std::to_string(id) + " outside 0.." + std::to_string(kMaxTokenId));
            t.id = int32_t(id);
            t.special = bool_or(o, "special", false, ctx);
            t.lstrip = bool_or(o, "lstrip", false, ctx);
            t.rstrip = bool_or(o, "rstrip", false, ctx);
            t.single_word = bool_or(o, "single_word", false, ctx);
            t.normalized = bool_or(o, "normalized", !t.special, ctx);
            if (t.content.empty()) parse_error(ctx + ": empty content");
            im.added_by_id[t.id] = im.added.size();
            im.added_by_content[t.content] = t.id;
            (t.normalized ? im.norm_trie : im.raw_trie).add(t.content, int32_t(im.added.size()));
            im.size = std::max(im.size, size_t(t.id) + 1);
            im.added.push_back(std::move(t));
        }
    }

    if (auto n = field(root, "normalizer")) im.normalizer = make_normalizer(*n, "normalizer");
    if (auto p = field(root, "pre_tokenizer")) im.pre = make_pre_tokenizer(*p, "pre_tokenizer");
    if (auto p = field(root, "post_processor")) im.post = make_post_processor(*p, "post_processor");
    if (auto d = field(root, "decoder")) im.decoder = make_decoder(*d, "decoder");
    return tok;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
    if (!valid_utf8(text)) throw Error(CMF_ERR_INVALID_ARGUMENT, "tokenizer: input text is not valid UTF-8");
    const Impl &im = *impl_;
    std::vector<int32_t> ids;
    std::vector<std::pair<std::string, int32_t>> parts;
    std::vector<bool> starts;
    im.split_added(text, im.raw_trie, parts, true, starts);
    for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].second >= 0) ids.push_back(parts[i].second);
        else im.encode_segment(std::move(parts[i].first), starts[i], ids);
    }
    if (add_special_tokens && im.post) im.post->apply(ids);
    return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    return utf8_lossy(impl_->decode(ids, skip_special_tokens, false));
}
std::string Tokenizer::decode_bytes(std::span<const int32_t> ids, bool skip_special_tokens) const {
    return impl_->decode(ids, skip_special_tokens, true);
}

size_t Tokenizer::vocab_size() const { return impl_->size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
    auto a = impl_->added_by_content.find(token);
    if (a != impl_->added_by_content.end()) return a->second;
    auto it = impl_->bpe.vocab.find(token);
    if (it != impl_->bpe.vocab.end()) return it->second;
    return std::nullopt;
}

bool Tokenizer::id_to_token(int32_t id, std::string &out) const {
    auto a = impl_->added_by_id.find(id);
    if (a != impl_->added_by_id.end()) {
        out = impl_->added[a->second].content;
        return true;
    }
    if (id >= 0 && size_t(id) < impl_->bpe.id_to_tok.size() && !impl_->bpe.id_to_tok[size_t(id)].empty()) {
        out = impl_->bpe.id_to_tok[size_t(id)];
        return true;
    }
    return false;
}

bool Tokenizer::is_special(int32_t id) const {
    auto a = impl_->added_by_id.find(id);
    return a != impl_->added_by_id.end() && impl_->added[a->second].special;
}

// ---- streaming ----
// The decoder sees ids_[prefix_, end): a few already-emitted tokens give the
// context that decoders such as Metaspace need; the new text is the part of
// that decode past the text of ids_[prefix_, read_).
std::string StreamDecoder::push(int32_t id) {
    ids_.push_back(id);
    std::span<const int32_t> all(ids_);
    std::string before, now;
    try {
        before = tok_.decode_bytes(all.subspan(prefix_, read_ - prefix_), skip_);
        now = tok_.decode_bytes(all.subspan(prefix_), skip_);
    } catch (...) {
        ids_.pop_back();  // an id outside the vocabulary leaves the stream as it was
        throw;
    }
    if (now.size() <= before.size() || now.compare(0, before.size(), before) != 0) {
        if (now.size() < before.size() || now.compare(0, now.size(), before, 0, now.size()) != 0) {
            // The decoder rewrote earlier text (should not happen with HF decoders): restart the window.
            prefix_ = read_;
        }
        return {};
    }
    std::string fresh = now.substr(before.size());
    size_t complete = utf8_complete_prefix(fresh);
    if (complete < fresh.size()) return {};  // hold until the character is complete
    prefix_ = read_;
    read_ = ids_.size();
    if (prefix_ > 0 && ids_.size() > 64) {  // keep the window small
        ids_.erase(ids_.begin(), ids_.begin() + long(prefix_));
        read_ -= prefix_;
        prefix_ = 0;
    }
    return utf8_lossy(fresh);
}

std::string StreamDecoder::finish() {
    std::span<const int32_t> all(ids_);
    std::string before = tok_.decode_bytes(all.subspan(prefix_, read_ - prefix_), skip_);
    std::string now = tok_.decode_bytes(all.subspan(prefix_), skip_);
    std::string out;
    if (now.size() > before.size() && now.compare(0, before.size(), before) == 0) out = utf8_lossy(now.substr(before.size()));
    ids_.clear();
    prefix_ = read_ = 0;
    return out;
}

}  // namespace cmf::text
