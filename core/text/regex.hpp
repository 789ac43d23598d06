// A compiled Unicode regex (PCRE2, UTF + UCP, JIT when available) that lists
// the non-empty matches in a UTF-8 string. Used by the pre-tokenizers and the
// Replace normalizer/decoder; tokenizer.json regexes are Oniguruma/Rust
// syntax, which PCRE2 accepts for every construct real tokenizers use
// (\p{L}, inline (?i:...), look-ahead).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cmf::text {

class Regex {
public:
    // `literal`: the pattern is a plain string to find (HF's {"String": ...}).
    // Throws cmf::Error(CMF_ERR_PARSE) naming `what` when it does not compile.
    Regex(std::string_view pattern, bool literal, const std::string &what);
    ~Regex();
    Regex(const Regex &) = delete;
    Regex &operator=(const Regex &) = delete;

    // Byte ranges [begin, end) of successive non-overlapping, non-empty
    // matches. `text` must be valid UTF-8 (checked by the caller). A match
    // that backtracks past a limit (a pathological pattern) is
    // cmf::Error(CMF_ERR_UNSUPPORTED) naming `what`.
    std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
    // Every match replaced by `with` (no group references).
    std::string replace_all(std::string_view text, std::string_view with) const;

private:
    std::string what_;      // where the pattern comes from, for errors
    void *code_ = nullptr;  // pcre2_code_8
};

// True when `s` is well-formed UTF-8.
bool valid_utf8(std::string_view s);
// `s` with each ill-formed sequence replaced by U+FFFD (like from_utf8_lossy).
std::string utf8_lossy(std::string_view s);
// Length of the leading byte sequence of `s` that ends on a complete code
// point, treating a truncated multi-byte sequence at the very end as pending.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace cmf::text
