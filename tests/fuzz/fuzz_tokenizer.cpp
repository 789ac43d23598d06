// libFuzzer target: tokenizer.json loading, then encode and decode.
// Input: tokenizer.json, NUL, text. The text is encoded (with and without
// the post-processor, by the input's size), the ids decoded both ways and
// streamed through the detokenizer; ids made from the text's bytes
// (out-of-vocabulary and negative ones included) are decoded too. Errors are
// expected; a crash, hang, leak or sanitizer report is a bug.
//
// Refused ids are errors, i.e. C++ exceptions inside the library, and an
// exception costs tens of microseconds under ASan: the harness feeds at most
// kRawIds made-up ids and stops a detokenizer stream after kStreamErrors
// refusals (what follows a refusal is then exercised, a thousand more are
// not), so a long text does not make an input a thousand times slower. For
// the same reason a stream takes the first kStreamIds ids of an encoding
// (two decodes per id; the stream's window is reset every few ids, so later
// ids reach no other code) while the whole encoding is decoded at once,
// and only the text's first kTextBytes are encoded: the tokenizer's code
// paths are all met within a few kilobytes, and past them each byte only
// adds work (encoding and decoding 32 KiB took three quarters of an
// input's time in a campaign's profile).
#include "fuzz_util.hpp"

#include <cmf/cmf.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kRawIds = 64;
constexpr int kStreamErrors = 4;
constexpr size_t kStreamIds = 256;
constexpr size_t kTextBytes = 4096;

void decode_all(const cmf_tokenizer *t, const int32_t *ids, size_t n) {
    for (uint32_t flags : {0u, CMF_DECODE_SKIP_SPECIAL}) {
        char *s = nullptr;
        size_t len = 0;
        cmf_error_free(cmf_tokenizer_decode(t, ids, n, flags, &s, &len));
        cmf_string_free(s);
        cmf_detokenizer *d = nullptr;
        if (cmf_error *e = cmf_detokenizer_create(t, flags, &d)) {
            cmf_error_free(e);
            continue;
        }
        int errors = 0;
        for (size_t i = 0; i < std::min(n, kStreamIds) && errors < kStreamErrors; ++i) {
            s = nullptr;
            if (cmf_error *e = cmf_detokenizer_push(d, ids[i], &s, &len)) {
                cmf_error_free(e);
                ++errors;
            }
            cmf_string_free(s);
        }
        s = nullptr;
        cmf_error_free(cmf_detokenizer_finish(d, &s, &len));
        cmf_string_free(s);
        cmf_detokenizer_free(d);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    auto [json, whole_text] = cmf::fuzz::split_at_nul(data, size);
    const std::string_view text = whole_text.substr(0, kTextBytes);
    cmf_tokenizer *t = nullptr;
    if (cmf_error *e = cmf_tokenizer_create(json.data(), json.size(), &t)) {
        cmf_error_free(e);
        return 0;
    }
    int32_t *ids = nullptr;
    size_t n = 0;
    if (cmf_error *e = cmf_tokenizer_encode(t, text.data(), text.size(), (size & 1) ? CMF_ENCODE_ADD_SPECIAL : 0, &ids, &n)) {
        cmf_error_free(e);
    } else {
        decode_all(t, ids, n);
        for (size_t i = 0; i < n && i < 64; ++i) {
            char *piece = nullptr;
            size_t len = 0;
            // A post-processor's template may add ids the vocabulary lacks (as in
            // Hugging Face), so an encoded id can have no token: an error, freed.
            if (cmf_error *e = cmf_tokenizer_id_to_token(t, ids[i], &piece, &len)) {
                cmf_error_free(e);
            } else {
                int32_t back = -1;
                cmf_error_free(cmf_tokenizer_token_to_id(t, piece, len, &back));
            }
            cmf_string_free(piece);
            (void)cmf_tokenizer_is_special(t, ids[i]);
        }
        cmf_ids_free(ids);
    }
    // Arbitrary ids: 4 bytes each from the text, so a decoder meets ids it never produced.
    std::vector<int32_t> raw(std::min(text.size() / 4, kRawIds));
    if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * 4);
    const size_t vocab = cmf_tokenizer_vocab_size(t);
    for (size_t i = 0; i < raw.size(); ++i)
        if (i % 2 == 0 && vocab > 0) raw[i] = int32_t(uint32_t(raw[i]) % vocab);  // half of them in range
    decode_all(t, raw.data(), raw.size());
    cmf_tokenizer_free(t);
    return 0;
}
