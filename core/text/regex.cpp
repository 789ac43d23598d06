#include "text/regex.hpp"

#include "common/error.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

namespace cmf::text {

namespace {
pcre2_code *as_code(void *p) { return static_cast<pcre2_code *>(p); }

// Patterns come from tokenizer.json, so a pattern can backtrack
// exponentially. One match may take at most this many steps of PCRE2's
// matcher (its default, 10^7, lets a pathological pattern spend seconds per
// match, and a text has as many matches as characters); real tokenizer
// patterns take a few dozen per match.
constexpr uint32_t kMatchLimit = 1'000'000;

struct MatchData {
    pcre2_match_data *md;
    pcre2_match_context *ctx;
    explicit MatchData(const pcre2_code *code)
        : md(pcre2_match_data_create_from_pattern(code, nullptr)), ctx(pcre2_match_context_create(nullptr)) {
        if (!md || !ctx) {
            pcre2_match_data_free(md);
            pcre2_match_context_free(ctx);
            throw Error(CMF_ERR_OUT_OF_MEMORY, "pcre2 match data");
        }
        pcre2_set_match_limit(ctx, kMatchLimit);
    }
    ~MatchData() {
        pcre2_match_data_free(md);
        pcre2_match_context_free(ctx);
    }
};

// Byte length of the UTF-8 sequence starting with lead byte `c` (1 for junk).
size_t seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

// Length of a valid sequence at s[i], 0 when ill-formed, SIZE_MAX when it is
// a valid but truncated prefix at the end of s.
size_t valid_seq_at(std::string_view s, size_t i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) return 1;
    size_t n;
    uint32_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    for (size_t k = 1; k < n; ++k) {
        if (i + k >= s.size()) return SIZE_MAX;
        auto b = static_cast<unsigned char>(s[i + k]);
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    }
    return n;
}
}  // namespace

Regex::Regex(std::string_view pattern, bool literal, const std::string &what) : what_(what) {
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
    if (!code_) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(err, buf, sizeof buf);
        throw Error(CMF_ERR_PARSE, what + ": regex does not compile at offset " + std::to_string(off) + ": " +
                                       reinterpret_cast<const char *>(buf));
    }
    // JIT is an optimisation only: without it pcre2_match interprets.
    (void)pcre2_jit_compile(as_code(code_), PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
    std::vector<std::pair<size_t, size_t>> out;
    MatchData m(as_code(code_));
    size_t pos = 0;
    while (pos <= text.size()) {
        int rc = pcre2_match(as_code(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                             PCRE2_NO_UTF_CHECK, m.md, m.ctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
            throw Error(CMF_ERR_UNSUPPORTED, what_ + ": the regex backtracks too much on this text (over " +
                                                 std::to_string(kMatchLimit) + " steps for one match)");
        if (rc < 0) {
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(rc, buf, sizeof buf);
            throw Error(CMF_ERR_INTERNAL, std::string("regex match failed: ") + reinterpret_cast<const char *>(buf));
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m.md);
        size_t b = ov[0], e = ov[1];
        if (e > b) {
            out.emplace_back(b, e);
            pos = e;
        } else {  // empty match: step over one code point
            if (b >= text.size()) break;
            pos = b + seq_len(static_cast<unsigned char>(text[b]));
        }
    }
    return out;
}

std::string Regex::replace_all(std::string_view text, std::string_view with) const {
    std::string out;
    size_t prev = 0;
    for (auto [b, e] : find_all(text)) {
        out.append(text.substr(prev, b - prev));
        out.append(with);
        prev = e;
    }
    out.append(text.substr(prev));
    return out;
}

bool valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        size_t n = valid_seq_at(s, i);
        if (n == 0 || n == SIZE_MAX) return false;
        i += n;
    }
    return true;
}

std::string utf8_lossy(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        size_t n = valid_seq_at(s, i);
        if (n == 0 || n == SIZE_MAX) {
            out += "\xEF\xBF\xBD";
            // Skip the maximal ill-formed subpart (at least one byte).
            size_t k = i + 1;
            while (k < s.size() && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80 && k - i < 4 &&
                   seq_len(static_cast<unsigned char>(s[i])) > k - i)
                ++k;
            i = (n == SIZE_MAX) ? s.size() : (k > i + 1 && valid_seq_at(s.substr(0, k), i) == SIZE_MAX ? k : i + 1);
            continue;
        }
        out.append(s.substr(i, n));
        i += n;
    }
    return out;
}

size_t utf8_complete_prefix(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        size_t n = valid_seq_at(s, i);
        if (n == SIZE_MAX) return i;
        i += n == 0 ? 1 : n;
    }
    return s.size();
}

}  // namespace cmf::text
