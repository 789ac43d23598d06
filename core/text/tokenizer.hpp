// A Hugging Face `tokenizer.json` (BPE models) loaded into memory: encode text
// to ids and decode ids to text with the semantics of HF's `tokenizers` library.
//
// Pipeline of encode: split on added tokens -> normalizer -> pre-tokenizer ->
// BPE per pre-token word (cached) -> post-processor (only with
// add_special_tokens). Unsupported component types are refused at load with
// an error naming the component.
//
// Thread-safety: a loaded Tokenizer is immutable apart from its internal word
// cache, which is locked; encode/decode may run from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cmf::text {

// The largest token id a tokenizer.json may use. Ids index a dense table,
// so an id of 2^31 would ask for gigabytes; the largest real vocabularies
// have about 2^18 entries.
inline constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;

class Tokenizer {
public:
    // Parses tokenizer.json bytes. Throws cmf::Error (CMF_ERR_PARSE for
    // malformed JSON/fields, CMF_ERR_UNSUPPORTED naming the component type).
    static std::unique_ptr<Tokenizer> from_json(std::string_view json);
    ~Tokenizer();

    // `text` must be valid UTF-8 (CMF_ERR_INVALID_ARGUMENT otherwise).
    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
    // HF decode: ids -> tokens (special ones dropped when asked) -> decoder.
    // The result is valid UTF-8 (ill-formed bytes become U+FFFD).
    std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
    // Like decode, but byte-fallback groups are not validated and no lossy
    // conversion is applied: the raw bytes, for streaming.
    std::string decode_bytes(std::span<const int32_t> ids, bool skip_special_tokens) const;

    // One past the largest id (model vocab and added tokens).
    size_t vocab_size() const;
    std::optional<int32_t> token_to_id(std::string_view token) const;
    // The token string of `id` ("" and false when absent).
    bool id_to_token(int32_t id, std::string &out) const;
    bool is_special(int32_t id) const;

    struct Impl;

private:
    Tokenizer();
    std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer: push ids one at a time, get the text they add.
// Never returns a partial UTF-8 sequence: bytes of an unfinished character
// are held until the token completing it arrives (or finish()).
class StreamDecoder {
public:
    StreamDecoder(const Tokenizer &tok, bool skip_special_tokens) : tok_(tok), skip_(skip_special_tokens) {}
    // Text newly completed by `id` (often empty while a character is pending).
    std::string push(int32_t id);
    // Whatever is still held, ill-formed bytes replaced by U+FFFD.
    std::string finish();

private:
    const Tokenizer &tok_;
    bool skip_;
    std::vector<int32_t> ids_;
    size_t prefix_ = 0;  // ids_[prefix_, read_) are already emitted: context for the decoder
    size_t read_ = 0;
};

}  // namespace cmf::text
