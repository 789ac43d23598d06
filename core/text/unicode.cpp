#include "text/unicode.hpp"

#include "common/error.hpp"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

namespace cmf::text {

std::string utf8_encode(uint32_t cp) {
    utf8proc_uint8_t buf[4];
    auto n = utf8proc_encode_char(utf8proc_int32_t(cp), buf);
    return std::string(reinterpret_cast<char *>(buf), size_t(n));
}

size_t utf8_decode(std::string_view s, size_t i, uint32_t &cp) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    if (i + n > s.size()) n = s.size() - i;
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    cp = v;
    return n;
}

size_t utf8_last(std::string_view s, uint32_t &cp) {
    size_t i = s.size() - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    utf8_decode(s, i, cp);
    return s.size() - i;
}

bool is_unicode_whitespace(uint32_t cp) {
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return true;  // the controls White_Space includes
    auto cat = utf8proc_category(utf8proc_int32_t(cp));
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_alnum_cp(uint32_t cp) {
    auto cat = utf8proc_category(utf8proc_int32_t(cp));
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

namespace {
// True when every code point lies in a range whose characters are all
// NFC_Quick_Check=Yes and never compose with a neighbour: below U+0300 (no
// combining marks there), CJK Unified Ideographs, precomposed Hangul
// syllables. Such text is its own NFC; anything else goes to utf8proc.
bool nfc_quick_yes(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        uint32_t cp;
        i += utf8_decode(s, i, cp);
        if (cp < 0x300 || (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3)) continue;
        return false;
    }
    return true;
}
}  // namespace

std::string normalize_unicode(std::string_view s, NormForm form) {
    // ASCII is invariant under every normalization form.
    bool ascii = true;
    for (unsigned char c : s)
        if (c >= 0x80) {
            ascii = false;
            break;
        }
    if (ascii) return std::string(s);
    if (form == NormForm::NFC && nfc_quick_yes(s)) return std::string(s);
    int opts = UTF8PROC_STABLE;
    switch (form) {
    case NormForm::NFC: opts |= UTF8PROC_COMPOSE; break;
    case NormForm::NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case NormForm::NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::NFKD: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *out = nullptr;
    auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(s.data()), utf8proc_ssize_t(s.size()), &out,
                          utf8proc_option_t(opts));
    if (n < 0) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
    std::string r(reinterpret_cast<char *>(out), size_t(n));
    std::free(out);
    return r;
}

std::string lowercase(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        uint32_t cp;
        i += utf8_decode(s, i, cp);
        out += utf8_encode(uint32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
    }
    return out;
}

std::string uppercase_cp(uint32_t cp) { return utf8_encode(uint32_t(utf8proc_toupper(utf8proc_int32_t(cp)))); }

std::string strip_whitespace(std::string_view s, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (left)
        while (b < e) {
            uint32_t cp;
            size_t n = utf8_decode(s, b, cp);
            if (!is_unicode_whitespace(cp)) break;
            b += n;
        }
    if (right)
        while (e > b) {
            uint32_t cp;
            size_t n = utf8_last(s.substr(0, e), cp);
            if (!is_unicode_whitespace(cp)) break;
            e -= n;
        }
    return std::string(s.substr(b, e - b));
}

}  // namespace cmf::text
