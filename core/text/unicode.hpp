// UTF-8 and Unicode helpers for the tokenizer. Unicode properties and
// normalization come from utf8proc (no tables of our own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cmf::text {

enum class NormForm { NFC, NFD, NFKC, NFKD };

std::string utf8_encode(uint32_t cp);
// Decodes the code point at s[i] (s valid UTF-8); returns its byte length.
size_t utf8_decode(std::string_view s, size_t i, uint32_t &cp);
// Decodes the last code point of non-empty valid `s`; returns its length.
size_t utf8_last(std::string_view s, uint32_t &cp);

// Rust's char::is_whitespace (Unicode White_Space).
bool is_unicode_whitespace(uint32_t cp);
// Rust's char::is_alphanumeric (letters and numbers).
bool is_alnum_cp(uint32_t cp);

std::string normalize_unicode(std::string_view s, NormForm form);
std::string lowercase(std::string_view s);
// UTF-8 of the simple uppercase mapping of one code point.
std::string uppercase_cp(uint32_t cp);
std::string strip_whitespace(std::string_view s, bool left, bool right);

}  // namespace cmf::text
