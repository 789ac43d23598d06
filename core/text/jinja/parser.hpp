// Tokens -> a tree of statements and expressions (recursive descent, with
// Python's operator precedence). Internal to the Jinja interpreter.
#pragma once

#include "text/jinja/lexer.hpp"
#include "text/jinja/value.hpp"

#include <memory>
#include <string>
#include <vector>

namespace cmf::text::jinja {

struct Node;
using NodeP = std::unique_ptr<Node>;
enum class NK {
    // expressions
    Literal, Name, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, And, Or, Not, Cond, ListLit, DictLit, Concat,
    // statements
    Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Body
};
struct Node {
    NK kind;
    int line = 0;
    std::string name;               // Name/Attr/Filter/Test/op/macro name
    Value lit;                      // Literal, Text
    std::vector<NodeP> kids;        // operands, arguments, body statements
    std::vector<std::string> kw;    // keyword names for the last kw.size() kids (calls)
    std::vector<std::string> targets;  // For/Set/Macro params
    bool negate = false;            // "is not"
    NodeP a, b, c;                  // sub-expressions / bodies (If: cond, then, else)
};
inline NodeP mk(NK k, int line) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    return n;
}

// The whole template as one NK::Body. Fails (CMF_ERR_TEMPLATE) on syntax
// errors, unsupported tags (include/extends/import/block) and nesting too
// deep for the recursive descent.
NodeP parse(std::vector<Token> tokens);

}  // namespace cmf::text::jinja
