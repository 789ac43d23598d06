#include "convert/sentencepiece.hpp"

#include "common/error.hpp"

#include <cmf/json_writer.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace cmf::convert {

namespace {

[[noreturn]] void bad(const std::string &what) { throw Error(CMF_ERR_PARSE, "SentencePiece model: " + what); }

// Protocol buffers wire format, the four wire types a ModelProto uses.
class Wire {
public:
    explicit Wire(std::string_view b) : b_(b) {}
    bool done() const { return i_ >= b_.size(); }

    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (i_ >= b_.size()) bad("truncated varint");
            const uint8_t c = uint8_t(b_[i_++]);
            v |= uint64_t(c & 0x7f) << shift;
            if (c < 0x80) return v;
        }
        bad("varint longer than 10 bytes");
    }
    // Next field: number and wire type.
    std::pair<uint32_t, uint32_t> key() {
        const uint64_t k = varint();
        if ((k >> 3) == 0 || (k >> 3) > 0x1fffffff) bad("invalid field number");
        return {uint32_t(k >> 3), uint32_t(k & 7)};
    }
    std::string_view bytes() {
        const uint64_t n = varint();
        if (n > b_.size() - i_) bad("a length-delimited field runs past the end of its message");
        std::string_view s = b_.substr(i_, size_t(n));
        i_ += size_t(n);
        return s;
    }
    float fixed32() {
        if (b_.size() - i_ < 4) bad("truncated fixed32");
        float f;
        std::memcpy(&f, b_.data() + i_, 4);  // little-endian on every target we build for
        i_ += 4;
        return f;
    }
    void skip(uint32_t wire) {
        switch (wire) {
        case 0: varint(); break;
        case 1:
            if (b_.size() - i_ < 8) bad("truncated fixed64");
            i_ += 8;
            break;
        case 2: bytes(); break;
        case 5: fixed32(); break;
        default: bad("unknown wire type " + std::to_string(wire));
        }
    }

private:
    std::string_view b_;
    size_t i_ = 0;
};

void expect(uint32_t wire, uint32_t want, const char *field) {
    if (wire != want) bad(std::string(field) + " has wire type " + std::to_string(wire));
}

SpmPiece parse_piece(std::string_view msg) {
    SpmPiece p;
    Wire w(msg);
    while (!w.done()) {
        auto [f, wt] = w.key();
        if (f == 1) expect(wt, 2, "SentencePiece.piece"), p.piece = std::string(w.bytes());
        else if (f == 2) expect(wt, 5, "SentencePiece.score"), p.score = w.fixed32();
        else if (f == 3) expect(wt, 0, "SentencePiece.type"), p.type = int32_t(w.varint());
        else w.skip(wt);
    }
    if (p.type < kSpmNormal || p.type > kSpmByte) bad("piece \"" + p.piece + "\" has unknown type " + std::to_string(p.type));
    return p;
}

// Unicode code point boundaries of a UTF-8 string (Python's str indices).
std::vector<size_t> code_point_starts(const std::string &s) {
    std::vector<size_t> at;
    for (size_t i = 0; i < s.size(); ++i)
        if ((uint8_t(s[i]) & 0xc0) != 0x80) at.push_back(i);
    return at;
}

void added_token(json::Writer &w, uint64_t id, const std::string &content, bool special) {
    w.begin_object();
    w.key("id").u64(id);
    w.key("content").string(content);
    w.key("single_word").boolean(false);
    w.key("lstrip").boolean(false);
    w.key("rstrip").boolean(false);
    w.key("normalized").boolean(false);
    w.key("special").boolean(special);
    w.end_object();
}

void string_pattern(json::Writer &w, const char *s) { w.key("pattern").begin_object().key("String").string(s).end_object(); }

}  // namespace

std::string bos_eos_post_processor_json(const std::string &bos, uint64_t bos_id, const std::string &eos, uint64_t eos_id) {
    if (bos.empty() && eos.empty()) return "null";
    json::Writer w;
    auto special = [&](const std::string &piece, int type_id) {
        w.begin_object().key("SpecialToken").begin_object().key("id").string(piece).key("type_id").u64(uint64_t(type_id));
        w.end_object().end_object();
    };
    auto sequence = [&](const char *id, int type_id) {
        w.begin_object().key("Sequence").begin_object().key("id").string(id).key("type_id").u64(uint64_t(type_id));
        w.end_object().end_object();
    };
    auto one = [&](const char *seq, int type_id) {
        if (!bos.empty()) special(bos, type_id);
        sequence(seq, type_id);
        if (!eos.empty()) special(eos, type_id);
    };
    w.begin_object().key("type").string("TemplateProcessing");
    w.key("single").begin_array();
    one("A", 0);
    w.end_array();
    w.key("pair").begin_array();
    one("A", 0);
    one("B", 1);
    w.end_array();
    w.key("special_tokens").begin_object();
    for (auto [piece, id] : {std::pair{&bos, bos_id}, std::pair{&eos, eos_id}}) {
        if (piece->empty() || (piece == &eos && eos == bos)) continue;
        w.key(*piece).begin_object().key("id").string(*piece);
        w.key("ids").begin_array().u64(id).end_array();
        w.key("tokens").begin_array().string(*piece).end_array().end_object();
    }
    w.end_object().end_object();
    return w.take();
}

SpmModel parse_sentencepiece(std::string_view bytes) {
    if (bytes.empty()) bad("empty file");
    SpmModel m;
    Wire w(bytes);
    while (!w.done()) {
        auto [f, wt] = w.key();
        if (f == 1) {
            expect(wt, 2, "ModelProto.pieces");
            m.pieces.push_back(parse_piece(w.bytes()));
        } else if (f == 2) {
            expect(wt, 2, "ModelProto.trainer_spec");
            Wire t(w.bytes());
            while (!t.done()) {
                auto [g, gt] = t.key();
                if (g == 3) expect(gt, 0, "TrainerSpec.model_type"), m.model_type = int32_t(t.varint());
                else if (g == 35) expect(gt, 0, "TrainerSpec.byte_fallback"), m.byte_fallback = t.varint() != 0;
                else if (g == 40) expect(gt, 0, "TrainerSpec.unk_id"), m.unk_id = int32_t(t.varint());
                else if (g == 45) expect(gt, 2, "TrainerSpec.unk_piece"), m.unk_piece = std::string(t.bytes());
                else t.skip(gt);
            }
        } else if (f == 3) {
            expect(wt, 2, "ModelProto.normalizer_spec");
            Wire n(w.bytes());
            while (!n.done()) {
                auto [g, gt] = n.key();
                if (g == 2) expect(gt, 2, "NormalizerSpec.precompiled_charsmap"), m.has_precompiled_charsmap = !n.bytes().empty();
                else if (g == 3) expect(gt, 0, "NormalizerSpec.add_dummy_prefix"), m.add_dummy_prefix = n.varint() != 0;
                else if (g == 4) expect(gt, 0, "NormalizerSpec.remove_extra_whitespaces"), m.remove_extra_whitespaces = n.varint() != 0;
                else if (g == 5) expect(gt, 0, "NormalizerSpec.escape_whitespaces"), m.escape_whitespaces = n.varint() != 0;
                else n.skip(gt);
            }
        } else {
            w.skip(wt);
        }
    }
    if (m.pieces.empty()) bad("no pieces (not a SentencePiece model?)");
    if (m.unk_id < 0 || size_t(m.unk_id) >= m.pieces.size()) bad("unk_id " + std::to_string(m.unk_id) + " is not a piece");
    return m;
}

std::string build_hf_bpe_tokenizer_json(const std::vector<SpmPiece> &pieces, const HfBpeOptions &opts) {
    if (pieces.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "tokenizer: no pieces");
    for (size_t i = 0; i < pieces.size(); ++i)  // the merge order sorts by score
        if (std::isnan(pieces[i].score))
            throw Error(CMF_ERR_PARSE, "tokenizer: piece " + std::to_string(i) + " (\"" + pieces[i].piece + "\") has a NaN score");
    // The vocabulary the merges are searched in: every piece by its first
    // id, plus "\t" as the byte piece <0x09> when the vocabulary has no tab
    // of its own (HF's GemmaSentencePieceExtractor).
    std::unordered_map<std::string, uint64_t> vocab;
    vocab.reserve(pieces.size() * 2);
    for (uint64_t i = 0; i < pieces.size(); ++i) vocab.emplace(pieces[i].piece, i);
    if (!vocab.count("\t"))
        if (auto it = vocab.find("<0x09>"); it != vocab.end()) vocab.emplace("\t", it->second);

    // Merges as HF's generate_merges builds them: for each piece (first
    // occurrence, in order) every split into two known pieces, ordered by
    // the parts' ids; then all of them by (piece score, left length, right
    // length in code points), descending and stable.
    struct Merge {
        uint32_t piece;  // index of the merged piece (its score)
        uint32_t split;  // byte offset of the split
        uint32_t len_l, len_r;
        uint64_t id_l, id_r;
    };
    std::vector<Merge> merges;
    std::unordered_set<std::string> seen;
    seen.reserve(pieces.size() * 2);
    std::vector<Merge> local;
    for (uint32_t i = 0; i < pieces.size(); ++i) {
        const std::string &s = pieces[i].piece;
        if (!seen.insert(s).second) continue;
        const std::vector<size_t> cps = code_point_starts(s);
        local.clear();
        for (size_t k = 1; k < cps.size(); ++k) {
            auto l = vocab.find(s.substr(0, cps[k])), r = vocab.find(s.substr(cps[k]));
            if (l != vocab.end() && r != vocab.end())
                local.push_back({i, uint32_t(cps[k]), uint32_t(k), uint32_t(cps.size() - k), l->second, r->second});
        }
        std::stable_sort(local.begin(), local.end(),
                         [](const Merge &a, const Merge &b) { return std::tie(a.id_l, a.id_r) < std::tie(b.id_l, b.id_r); });
        merges.insert(merges.end(), local.begin(), local.end());
    }
    std::stable_sort(merges.begin(), merges.end(), [&](const Merge &a, const Merge &b) {
        const float sa = pieces[a.piece].score, sb = pieces[b.piece].score;
        return std::tie(sa, a.len_l, a.len_r) > std::tie(sb, b.len_l, b.len_r);
    });

    std::unordered_set<std::string> extra(opts.extra_special.begin(), opts.extra_special.end());
    auto id_of = [&](const std::string &piece) -> uint64_t {
        auto it = vocab.find(piece);
        if (it == vocab.end() || pieces[it->second].piece != piece)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "tokenizer: the vocabulary has no piece \"" + piece + "\"");
        return it->second;
    };
    if (!vocab.count(opts.unk_piece))
        throw Error(CMF_ERR_INVALID_ARGUMENT, "tokenizer: the unknown piece \"" + opts.unk_piece + "\" is not in the vocabulary");

    json::Writer w;
    w.begin_object();
    w.key("version").string("1.0");
    w.key("truncation").null();
    w.key("padding").null();
    // Control and user-defined pieces, and the unknown piece, match as whole
    // tokens before the model runs.
    w.key("added_tokens").begin_array();
    for (uint64_t i = 0; i < pieces.size(); ++i) {
        const SpmPiece &p = pieces[i];
        if (p.type == kSpmControl || p.type == kSpmUserDefined || p.type == kSpmUnknown)
            added_token(w, i, p.piece, p.type != kSpmUserDefined || extra.count(p.piece));
    }
    w.end_array();
    w.key("normalizer").begin_object().key("type").string("Replace");
    string_pattern(w, " ");
    w.key("content").string("\xe2\x96\x81").end_object();
    w.key("pre_tokenizer").begin_object().key("type").string("Split");
    string_pattern(w, " ");
    w.key("behavior").string("MergedWithPrevious").key("invert").boolean(false).end_object();
    w.key("post_processor").raw(bos_eos_post_processor_json(opts.bos_piece, opts.bos_piece.empty() ? 0 : id_of(opts.bos_piece),
                                                             opts.eos_piece, opts.eos_piece.empty() ? 0 : id_of(opts.eos_piece)));
    w.key("decoder").begin_object().key("type").string("Sequence").key("decoders").begin_array();
    w.begin_object().key("type").string("Replace");
    string_pattern(w, "\xe2\x96\x81");
    w.key("content").string(" ").end_object();
    w.begin_object().key("type").string("ByteFallback").end_object();
    w.begin_object().key("type").string("Fuse").end_object();
    w.end_array().end_object();
    w.key("model").begin_object();
    w.key("type").string("BPE");
    w.key("dropout").null();
    w.key("unk_token").string(opts.unk_piece);
    w.key("continuing_subword_prefix").null();
    w.key("end_of_word_suffix").null();
    w.key("fuse_unk").boolean(true);
    w.key("byte_fallback").boolean(true);
    w.key("ignore_merges").boolean(false);
    w.key("vocab").begin_object();
    seen.clear();
    for (uint64_t i = 0; i < pieces.size(); ++i)
        if (seen.insert(pieces[i].piece).second) w.key(pieces[i].piece).u64(i);
    w.end_object();
    w.key("merges").begin_array();
    for (const Merge &m : merges) {
        const std::string &s = pieces[m.piece].piece;
        w.begin_array().string(std::string_view(s).substr(0, m.split)).string(std::string_view(s).substr(m.split)).end_array();
    }
    w.end_array();
    w.end_object();
    w.end_object();
    return w.take();
}

std::string hf_tokenizer_json_from_sentencepiece(const SpmModel &m, const HfBpeOptions &opts) {
    auto refuse = [](const std::string &what) {
        throw Error(CMF_ERR_UNSUPPORTED, "SentencePiece model: " + what +
                                             "; only byte-fallback BPE models without normalization rules convert to "
                                             "tokenizer.json (the form Hugging Face writes for Gemma)");
    };
    if (m.model_type != 2)
        refuse(std::string("the model is ") + (m.model_type == 1 ? "a unigram model" : "not a BPE model") + " (model_type " +
               std::to_string(m.model_type) + ")");
    if (!m.byte_fallback) refuse("byte_fallback is off");
    if (m.has_precompiled_charsmap) refuse("the normalizer has a precompiled character map");
    if (m.add_dummy_prefix) refuse("the normalizer adds a dummy prefix");
    if (m.remove_extra_whitespaces) refuse("the normalizer removes extra whitespace");
    if (!m.escape_whitespaces) refuse("the normalizer does not escape whitespace");
    HfBpeOptions o = opts;
    o.unk_piece = m.pieces[size_t(m.unk_id)].piece;
    return build_hf_bpe_tokenizer_json(m.pieces, o);
}

}  // namespace cmf::convert
