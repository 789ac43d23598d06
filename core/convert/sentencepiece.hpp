// SentencePiece models (tokenizer.model) and the Hugging Face tokenizer.json
// that HF's converter (convert_slow_tokenizer.py, GemmaConverter) writes for
// a byte-fallback BPE vocabulary, so a checkpoint that ships only
// tokenizer.model still gets a vocab section.
//
// Two steps with a seam between them: parse_sentencepiece() reads the
// protobuf into pieces/scores/types, and build_hf_bpe_tokenizer_json() turns
// such arrays into tokenizer.json. The second step takes plain arrays, so
// any source of a SentencePiece vocabulary (e.g. a GGUF file's
// tokenizer.ggml.tokens/scores/token_type, which number the types the same
// way) can use it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cmf::convert {

// SentencePiece piece types (sentencepiece_model.proto; GGUF's token_type
// uses the same numbers).
enum SpmPieceType : int32_t {
    kSpmNormal = 1,
    kSpmUnknown = 2,
    kSpmControl = 3,
    kSpmUserDefined = 4,
    kSpmUnused = 5,
    kSpmByte = 6,
};

struct SpmPiece {
    std::string piece;  // UTF-8, spaces spelled U+2581
    float score = 0;
    int32_t type = kSpmNormal;
};

// The parts of a ModelProto the conversion reads.
struct SpmModel {
    std::vector<SpmPiece> pieces;
    int32_t model_type = 1;  // 1 unigram, 2 BPE, 3 word, 4 char
    bool byte_fallback = false;
    int32_t unk_id = 0;
    std::string unk_piece = "<unk>";
    bool add_dummy_prefix = true;
    bool remove_extra_whitespaces = true;
    bool escape_whitespaces = true;
    bool has_precompiled_charsmap = false;
};

// Parses the bytes of a tokenizer.model. Throws cmf::Error (CMF_ERR_PARSE)
// naming what is malformed.
SpmModel parse_sentencepiece(std::string_view bytes);

struct HfBpeOptions {
    std::string unk_piece = "<unk>";
    // TemplateProcessing post-processor: the bos/eos pieces prepended and
    // appended when encoding with special tokens (tokenizer_config's
    // add_bos_token / add_eos_token). Empty: none.
    std::string bos_piece, eos_piece;
    // Pieces that are marked special even though they are user-defined
    // (Gemma's <start_of_turn> and <end_of_turn>).
    std::vector<std::string> extra_special;
};

// tokenizer.json for a byte-fallback BPE vocabulary in HF's Gemma form: the
// vocabulary in piece order (U+0009 for the piece <0x09> when the vocabulary
// has no tab piece of its own is added to the merge search, as HF does),
// merges generated from the pieces' scores, control and user-defined pieces
// (and the unknown piece) as added tokens, normalizer Replace(" ", U+2581),
// pre-tokenizer Split(" ", merged_with_previous), decoder Replace(U+2581,
// " ") + ByteFallback + Fuse, BPE with fuse_unk and byte_fallback.
std::string build_hf_bpe_tokenizer_json(const std::vector<SpmPiece> &pieces, const HfBpeOptions &opts);

// The post-processor HF's LlamaTokenizerFast / GemmaTokenizerFast build from
// tokenizer_config's add_bos_token / add_eos_token (update_post_processor):
// TemplateProcessing with bos before and eos after each sequence, as JSON;
// "null" when neither is added. An empty piece is not added.
std::string bos_eos_post_processor_json(const std::string &bos_piece, uint64_t bos_id, const std::string &eos_piece,
                                        uint64_t eos_id);

// tokenizer.json for a parsed model; refuses what the Gemma form cannot
// express (a unigram model, a normalizer that is not the identity, a dummy
// prefix) with CMF_ERR_UNSUPPORTED naming it.
std::string hf_tokenizer_json_from_sentencepiece(const SpmModel &model, const HfBpeOptions &opts);

}  // namespace cmf::convert
