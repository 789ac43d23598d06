// Template source -> tokens: text runs and the tokens inside {{ }} and {% %}
// tags, with Hugging Face's whitespace control applied while lexing
// (trim_blocks, lstrip_blocks, '-' and '+' markers) and {% raw %} blocks
// turned into text. Comments disappear here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cmf::text::jinja {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
struct Token {
    Tok type;
    std::string text;
    int line;
};

// Ends with one Tok::End. Fails (CMF_ERR_TEMPLATE) on unclosed tags,
// comments, strings or raw blocks and on characters no token starts with.
std::vector<Token> lex(std::string_view src);

}  // namespace cmf::text::jinja
