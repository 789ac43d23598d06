// A GGUF file's tokenizer (tokenizer.ggml.*) as the Hugging Face
// tokenizer.json it was made from, and its chat bundle as the header's
// tokenizer_config block.
//
// tokenizer.ggml.model "gpt2" (byte-level BPE: Qwen): tokens by id with
// their types, merges "a b", and tokenizer.ggml.pre naming the
// pre-tokenizer ("qwen2": NFC + Qwen2's split regex + byte level;
// "default"/"gpt2"/absent: GPT-2's byte level). NORMAL and BYTE tokens form
// the BPE vocabulary; CONTROL tokens are special added tokens and
// USER_DEFINED ones non-special added tokens (llama.cpp's converter marks a
// special HF token, or one that looks special, CONTROL, other added tokens
// USER_DEFINED); UNUSED tokens (llama.cpp's [PADn] fillers up to the
// embedding's rows) are left out, as the HF file never had them.
// tokenizer.ggml.add_bos_token adds a TemplateProcessing post-processor
// that prepends the BOS token.
//
// tokenizer.ggml.model "llama" (SentencePiece BPE with byte fallback:
// Gemma): tokens, scores and token types are the pieces of the
// tokenizer.model the file was made from (the same type numbers), and HF's
// Gemma-form tokenizer.json is built from them as convert does from a
// tokenizer.model (convert/sentencepiece.hpp); <bos> is prepended unless
// add_bos_token is false, <eos> appended when add_eos_token is true.
#pragma once

#include <string>

namespace cmf::convert {

namespace gguf {
class File;
}

struct GgufTokenizer {
    std::string tokenizer_json;         // "" when the file has no tokenizer.ggml.tokens
    std::string tokenizer_config_json;  // {"chat_template"?, "eos_token_ids", "bos_token_id", "pad_token_id"}
};

// Throws cmf::Error(Unsupported) for a tokenizer model or pre-tokenizer it
// cannot rebuild, cmf::Error(Parse) for malformed arrays (lengths, ids out
// of range, a merge without a space, invalid UTF-8).
GgufTokenizer build_gguf_tokenizer(const gguf::File &f);

}  // namespace cmf::convert
