#include "convert/gguf_tokenizer.hpp"

#include "common/error.hpp"
#include "convert/gguf.hpp"
#include "convert/sentencepiece.hpp"
#include "text/regex.hpp"

#include <cmf/json_writer.hpp>

#include <algorithm>
#include <optional>
#include <set>

namespace cmf::convert {

namespace {

// llama.cpp's token types (llama_token_type).
enum : int64_t { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };

// Qwen2's pre-tokenizer split (its tokenizer.json, Split with Isolated).
constexpr const char *kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

[[noreturn]] void parse_fail(const gguf::File &f, const std::string &what) { throw Error(CMF_ERR_PARSE, f.path() + ": " + what); }

const gguf::Value *array_of(const gguf::File &f, const char *key, uint32_t want_elem_kind /* 0 int, 1 float, 2 string */) {
    const gguf::Value *v = f.get(key);
    if (!v) return nullptr;
    if (v->type != gguf::ARRAY) parse_fail(f, std::string("metadata key ") + key + " is not an array");
    const bool is_str = v->elem_type == gguf::STRING;
    const bool is_float = v->elem_type == gguf::F32v || v->elem_type == gguf::F64v;
    if ((want_elem_kind == 2) != is_str || (want_elem_kind == 1 && !is_float && is_str) || (want_elem_kind == 0 && (is_float || is_str)))
        parse_fail(f, std::string("metadata key ") + key + " holds elements of the wrong type");
    return v;
}

void byte_level(json::Writer &w, bool trim_offsets, bool use_regex) {
    w.begin_object();
    w.key("type").string("ByteLevel");
    w.key("add_prefix_space").boolean(false);
    w.key("trim_offsets").boolean(trim_offsets);
    w.key("use_regex").boolean(use_regex);
    w.end_object();
}

std::string bpe_tokenizer_json(const gguf::File &f, const std::vector<std::string> &tokens, const std::vector<int64_t> &types) {
    const std::string pre = f.get_str("tokenizer.ggml.pre").value_or("default");
    const bool qwen2 = pre == "qwen2";
    if (!qwen2 && pre != "default" && pre != "gpt2" && pre != "gpt-2")
        throw Error(CMF_ERR_UNSUPPORTED, f.path() + ": tokenizer.ggml.pre \"" + pre +
                                             "\" is not a pre-tokenizer import-gguf rebuilds (qwen2, gpt2/default)");
    std::vector<std::string> merges;
    if (const gguf::Value *m = array_of(f, "tokenizer.ggml.merges", 2)) merges = m->strs;
    for (const auto &m : merges) {
        if (m.find(' ') == std::string::npos || m.front() == ' ')
            parse_fail(f, "tokenizer.ggml.merges holds \"" + m + "\", which is not two tokens separated by a space");
        if (!text::valid_utf8(m)) parse_fail(f, "tokenizer.ggml.merges holds a merge that is not valid UTF-8");
    }
    const std::optional<uint64_t> bos = f.get_u64("tokenizer.ggml.bos_token_id");
    const bool add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
    if (add_bos && (!bos || *bos >= tokens.size())) parse_fail(f, "tokenizer.ggml.add_bos_token is set but there is no valid bos_token_id");

    json::Writer w;
    w.begin_object();
    w.key("version").string("1.0");
    w.key("truncation").null();
    w.key("padding").null();
    w.key("added_tokens").begin_array();
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (types[i] != CONTROL && types[i] != USER_DEFINED) continue;
        w.begin_object();
        w.key("id").u64(i);
        w.key("content").string(tokens[i]);
        w.key("single_word").boolean(false);
        w.key("lstrip").boolean(false);
        w.key("rstrip").boolean(false);
        w.key("normalized").boolean(false);
        w.key("special").boolean(types[i] == CONTROL);
        w.end_object();
    }
    w.end_array();
    w.key("normalizer");
    if (qwen2) w.begin_object().key("type").string("NFC").end_object();
    else w.null();
    w.key("pre_tokenizer");
    if (qwen2) {
        w.begin_object();
        w.key("type").string("Sequence");
        w.key("pretokenizers").begin_array();
        w.begin_object();
        w.key("type").string("Split");
        w.key("pattern").begin_object().key("Regex").string(kQwen2Split).end_object();
        w.key("behavior").string("Isolated");
        w.key("invert").boolean(false);
        w.end_object();
        byte_level(w, false, false);
        w.end_array();
        w.end_object();
    } else {
        byte_level(w, true, true);
    }
    w.key("post_processor");
    if (add_bos) {
        w.begin_object();
        w.key("type").string("TemplateProcessing");
        w.key("single").begin_array();
        w.begin_object().key("SpecialToken").begin_object().key("id").string(tokens[*bos]).key("type_id").u64(0).end_object().end_object();
        w.begin_object().key("Sequence").begin_object().key("id").string("A").key("type_id").u64(0).end_object().end_object();
        w.end_array();
        w.key("pair").begin_array();
        w.begin_object().key("SpecialToken").begin_object().key("id").string(tokens[*bos]).key("type_id").u64(0).end_object().end_object();
        w.begin_object().key("Sequence").begin_object().key("id").string("A").key("type_id").u64(0).end_object().end_object();
        w.begin_object().key("Sequence").begin_object().key("id").string("B").key("type_id").u64(1).end_object().end_object();
        w.end_array();
        w.key("special_tokens").begin_object();
        w.key(tokens[*bos]).begin_object();
        w.key("id").string(tokens[*bos]);
        w.key("ids").begin_array().u64(*bos).end_array();
        w.key("tokens").begin_array().string(tokens[*bos]).end_array();
        w.end_object();
        w.end_object();
        w.end_object();
    } else {
        byte_level(w, false, false);
    }
    w.key("decoder");
    byte_level(w, false, false);
    w.key("model").begin_object();
    w.key("type").string("BPE");
    w.key("dropout").null();
    w.key("unk_token").null();
    w.key("continuing_subword_prefix").string("");
    w.key("end_of_word_suffix").string("");
    w.key("fuse_unk").boolean(false);
    w.key("byte_fallback").boolean(false);
    w.key("ignore_merges").boolean(false);
    w.key("vocab").begin_object();
    std::set<std::string_view> seen;
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (types[i] != NORMAL && types[i] != BYTE && types[i] != UNKNOWN) continue;
        if (!seen.insert(tokens[i]).second) parse_fail(f, "tokenizer.ggml.tokens holds \"" + tokens[i] + "\" twice");
        w.key(tokens[i]).u64(i);
    }
    w.end_object();
    w.key("merges").begin_array();
    for (const auto &m : merges) {
        const size_t sp = m.find(' ');
        w.begin_array().string(std::string_view(m).substr(0, sp)).string(std::string_view(m).substr(sp + 1)).end_array();
    }
    w.end_array();
    w.end_object();
    w.end_object();
    return w.take();
}

// tokenizer.ggml.model "llama" (a SentencePiece BPE vocabulary with byte
// fallback: Gemma): pieces, scores and types are what tokenizer.model held,
// so HF's Gemma-form tokenizer.json is built from them as from the
// tokenizer.model itself (convert/sentencepiece.hpp).
std::string spm_tokenizer_json(const gguf::File &f, const std::vector<std::string> &tokens, const std::vector<int64_t> &types) {
    const gguf::Value *scores = array_of(f, "tokenizer.ggml.scores", 1);
    if (!scores) parse_fail(f, "tokenizer.ggml.model is \"llama\" but there are no tokenizer.ggml.scores");
    if (scores->count != tokens.size())
        parse_fail(f, "tokenizer.ggml.scores has " + std::to_string(scores->count) + " entries for " + std::to_string(tokens.size()) + " tokens");
    std::vector<SpmPiece> pieces(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i)
        pieces[i] = SpmPiece{tokens[i], static_cast<float>(scores->nums[i]), static_cast<int32_t>(types[i])};
    HfBpeOptions opts;
    auto piece = [&](const char *key) -> std::string {
        auto id = f.get_u64(key);
        return id && *id < tokens.size() ? tokens[*id] : std::string();
    };
    if (auto unk = piece("tokenizer.ggml.unknown_token_id"); !unk.empty()) opts.unk_piece = unk;
    // HF's Gemma tokenizer adds <bos> unless tokenizer_config says not to;
    // llama.cpp's converter records that choice as add_bos_token.
    if (f.get_bool("tokenizer.ggml.add_bos_token").value_or(true)) opts.bos_piece = piece("tokenizer.ggml.bos_token_id");
    if (f.get_bool("tokenizer.ggml.add_eos_token").value_or(false)) opts.eos_piece = piece("tokenizer.ggml.eos_token_id");
    opts.extra_special = {"<start_of_turn>", "<end_of_turn>"};
    try {
        return build_hf_bpe_tokenizer_json(pieces, opts);
    } catch (const Error &e) {
        throw Error(e.code(), f.path() + ": tokenizer.ggml.*: " + e.message());
    }
}

}  // namespace

GgufTokenizer build_gguf_tokenizer(const gguf::File &f) {
    GgufTokenizer out;
    const gguf::Value *toks = array_of(f, "tokenizer.ggml.tokens", 2);
    const uint64_t n = toks ? toks->count : 0;
    auto id_key = [&](const char *key) -> std::optional<uint64_t> {
        auto v = f.get_u64(key);
        if (v && toks && *v >= n) parse_fail(f, std::string(key) + " " + std::to_string(*v) + " is not below the " + std::to_string(n) + " tokens");
        return v;
    };

    // header.tokenizer_config: template, stop ids, bos, pad (as the HF converter writes it).
    json::Writer c;
    c.begin_object();
    if (auto t = f.get_str("tokenizer.chat_template")) {
        if (!text::valid_utf8(*t)) parse_fail(f, "tokenizer.chat_template is not valid UTF-8");
        c.key("chat_template").string(*t);
    }
    c.key("eos_token_ids").begin_array();
    std::vector<uint64_t> stops;
    for (const char *k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
        if (auto v = id_key(k); v && std::find(stops.begin(), stops.end(), *v) == stops.end()) stops.push_back(*v);
    for (uint64_t s : stops) c.u64(s);
    c.end_array();
    for (auto [out_key, key] : {std::pair{"bos_token_id", "tokenizer.ggml.bos_token_id"}, std::pair{"pad_token_id", "tokenizer.ggml.padding_token_id"}}) {
        c.key(out_key);
        if (auto v = id_key(key)) c.u64(*v);
        else c.null();
    }
    c.end_object();
    out.tokenizer_config_json = c.take();

    if (!toks) return out;
    std::vector<int64_t> types(n, NORMAL);
    if (const gguf::Value *t = array_of(f, "tokenizer.ggml.token_type", 0)) {
        if (t->count != n)
            parse_fail(f, "tokenizer.ggml.token_type has " + std::to_string(t->count) + " entries for " + std::to_string(n) + " tokens");
        types = t->ints;
    }
    for (uint64_t i = 0; i < n; ++i) {
        if (types[i] < NORMAL || types[i] > BYTE)
            parse_fail(f, "tokenizer.ggml.token_type of token " + std::to_string(i) + " is " + std::to_string(types[i]) + ", not a llama.cpp token type (1-6)");
        if (!text::valid_utf8(toks->strs[i])) parse_fail(f, "token " + std::to_string(i) + " of tokenizer.ggml.tokens is not valid UTF-8");
    }
    const std::string model = f.get_str("tokenizer.ggml.model").value_or("");
    if (model == "gpt2") out.tokenizer_json = bpe_tokenizer_json(f, toks->strs, types);
    else if (model == "llama") out.tokenizer_json = spm_tokenizer_json(f, toks->strs, types);
    else
        throw Error(CMF_ERR_UNSUPPORTED, f.path() + ": tokenizer.ggml.model \"" + model +
                                             "\" is not a tokenizer import-gguf rebuilds (gpt2: byte-level BPE; llama: SentencePiece BPE)");
    return out;
}

}  // namespace cmf::convert
