#include "text/jinja/lexer.hpp"

#include "text/jinja/value.hpp"
#include "text/unicode.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>

namespace cmf::text::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

std::vector<Token> lex(std::string_view src) {
    std::vector<Token> toks;
    size_t pos = 0;
    int line = 1;
    bool strip_next = false;  // a '-' closed the last tag: strip leading whitespace of the next text
    bool trim_next = false;   // trim_blocks: drop one newline after a block/comment tag
    bool line_start = true;   // the text about to be pushed begins a line (for lstrip_blocks)
    auto count_lines = [&](std::string_view s) {
        for (char c : s)
            if (c == '\n') ++line;
    };
    auto push_text = [&](std::string text, bool next_is_block, bool next_minus, bool next_plus) {
        if (strip_next) {
            size_t k = 0;
            while (k < text.size() && is_space(text[k])) ++k;
            line_start = k > 0 && text[k - 1] == '\n';
            text.erase(0, k);
        } else if (trim_next) {
            line_start = false;
            if (text.rfind("\r\n", 0) == 0) {
                text.erase(0, 2);
                line_start = true;
            } else if (!text.empty() && text[0] == '\n') {
                text.erase(0, 1);
                line_start = true;
            }
        } else if (!toks.empty()) {
            line_start = false;
        }
        if (next_minus) {
            while (!text.empty() && is_space(text.back())) text.pop_back();
        } else if (next_is_block && !next_plus) {
            // lstrip_blocks: spaces/tabs between a line start and a block tag.
            size_t k = text.size();
            while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
            if ((k > 0 && text[k - 1] == '\n') || (k == 0 && line_start)) text.erase(k);
        }
        if (!text.empty()) toks.push_back({Tok::Text, std::move(text), line});
    };
    while (pos < src.size()) {
        size_t open = src.find('{', pos);
        while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
               src[open + 1] != '#')
            open = src.find('{', open + 1);
        if (open == std::string_view::npos || open + 1 >= src.size()) {
            std::string text(src.substr(pos));
            int l0 = line;
            push_text(text, false, false, false);
            if (!toks.empty() && toks.back().type == Tok::Text) toks.back().line = l0;
            count_lines(src.substr(pos));
            break;
        }
        char kind = src[open + 1];
        bool minus = open + 2 < src.size() && src[open + 2] == '-';
        bool plus = open + 2 < src.size() && src[open + 2] == '+';
        std::string text(src.substr(pos, open - pos));
        int text_line = line;
        size_t before = toks.size();
        push_text(text, kind != '{', minus, plus);
        if (toks.size() > before) toks.back().line = text_line;
        count_lines(src.substr(pos, open - pos));
        strip_next = trim_next = false;
        size_t p = open + 2 + ((minus || plus) ? 1 : 0);
        int tag_line = line;
        if (kind == '#') {
            size_t close = src.find("#}", p);
            if (close == std::string_view::npos) fail(tag_line, "unclosed comment");
            count_lines(src.substr(p, close + 2 - p));
            strip_next = close > p && src[close - 1] == '-';
            trim_next = !strip_next;
            pos = close + 2;
            continue;
        }
        toks.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", tag_line});
        size_t tag_start = toks.size();
        // tokens inside the tag
        const char *close2 = kind == '{' ? "}}" : "%}";
        bool closed = false;
        while (p < src.size()) {
            char c = src[p];
            if (is_space(c)) {
                if (c == '\n') ++line;
                ++p;
                continue;
            }
            if (c == '-' && src.substr(p + 1, 2) == close2) {
                strip_next = true;
                p += 3;
                closed = true;
                break;
            }
            if (src.substr(p, 2) == close2) {
                p += 2;
                closed = true;
                trim_next = kind == '%';
                break;
            }
            if (c == '\'' || c == '"') {
                std::string s;
                size_t k = p + 1;
                while (k < src.size() && src[k] != c) {
                    if (src[k] == '\\' && k + 1 < src.size()) {
                        char e = src[++k];
                        switch (e) {
                        case 'n': s += '\n'; break;
                        case 't': s += '\t'; break;
                        case 'r': s += '\r'; break;
                        case '\\': s += '\\'; break;
                        case '\'': s += '\''; break;
                        case '"': s += '"'; break;
                        case '0': s += '\0'; break;
                        case 'u':
                        case 'x': {
                            size_t n = e == 'u' ? 4 : 2;
                            uint32_t cp = 0;
                            for (size_t q = 0; q < n && k + 1 < src.size(); ++q) {
                                char h = src[++k];
                                cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
                            }
                            s += utf8_encode(cp);
                            break;
                        }
                        default: s += '\\'; s += e;
                        }
                        ++k;
                        continue;
                    }
                    if (src[k] == '\n') ++line;
                    s += src[k++];
                }
                if (k >= src.size()) fail(tag_line, "unterminated string");
                toks.push_back({Tok::String, std::move(s), line});
                p = k + 1;
                continue;
            }
            if (std::isdigit(static_cast<unsigned char>(c))) {
                size_t k = p;
                while (k < src.size() && (std::isdigit(static_cast<unsigned char>(src[k])) || src[k] == '_')) ++k;
                bool is_float = false;
                if (k + 1 < src.size() && src[k] == '.' && std::isdigit(static_cast<unsigned char>(src[k + 1]))) {
                    is_float = true;
                    ++k;
                    while (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) ++k;
                }
                if (k < src.size() && (src[k] == 'e' || src[k] == 'E')) {
                    size_t q = k + 1;
                    if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
                    if (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) {
                        is_float = true;
                        k = q;
                        while (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) ++k;
                    }
                }
                std::string num(src.substr(p, k - p));
                num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
                toks.push_back({is_float ? Tok::Float : Tok::Int, num, line});
                p = k;
                continue;
            }
            if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
                size_t k = p;
                while (k < src.size() && (std::isalnum(static_cast<unsigned char>(src[k])) || src[k] == '_')) ++k;
                toks.push_back({Tok::Name, std::string(src.substr(p, k - p)), line});
                p = k;
                continue;
            }
            static const char *ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                        "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "=", "!"};
            bool matched = false;
            for (const char *op : ops) {
                size_t n = std::strlen(op);
                if (src.substr(p, n) == op) {
                    toks.push_back({Tok::Op, op, line});
                    p += n;
                    matched = true;
                    break;
                }
            }
            if (!matched) fail(line, std::string("unexpected character '") + c + "'");
        }
        if (!closed) fail(tag_line, std::string("tag not closed with '") + close2 + "'");
        toks.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", line});
        // {% raw %} ... {% endraw %}: text verbatim
        if (kind == '%' && toks.size() == tag_start + 2 && toks[tag_start].type == Tok::Name && toks[tag_start].text == "raw") {
            toks.resize(tag_start - 1);
            size_t q = p;
            for (;;) {
                size_t o = src.find("{%", q);
                if (o == std::string_view::npos) fail(tag_line, "raw block not closed with endraw");
                size_t k = o + 2;
                bool m = k < src.size() && src[k] == '-';
                if (m || (k < src.size() && src[k] == '+')) ++k;
                while (k < src.size() && is_space(src[k])) ++k;
                if (src.substr(k, 6) == "endraw") {
                    size_t e = src.find("%}", k);
                    if (e == std::string_view::npos) fail(tag_line, "raw block not closed");
                    std::string raw(src.substr(p, o - p));
                    if (strip_next) {
                        size_t z = 0;
                        while (z < raw.size() && is_space(raw[z])) ++z;
                        raw.erase(0, z);
                    } else if (trim_next && !raw.empty() && raw[0] == '\n')
                        raw.erase(0, 1);
                    if (m)
                        while (!raw.empty() && is_space(raw.back())) raw.pop_back();
                    if (!raw.empty()) toks.push_back({Tok::Text, raw, line});
                    count_lines(src.substr(p, e + 2 - p));
                    strip_next = src[e - 1] == '-';
                    trim_next = !strip_next;
                    p = e + 2;
                    break;
                }
                q = o + 2;
            }
        }
        pos = p;
    }
    toks.push_back({Tok::End, "", line});
    return toks;
}

}  // namespace cmf::text::jinja
