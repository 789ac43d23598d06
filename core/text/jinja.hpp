// A Jinja2 interpreter for chat templates, with Hugging Face's environment:
// trim_blocks and lstrip_blocks on, `tojson` as HF defines it (json.dumps,
// ensure_ascii=False), `raise_exception`, `strftime_now`, the sandbox's
// immutability (no list.append), and jinja2's default Undefined (prints "",
// iterates empty, errors on attribute access).
//
// Covered: if/elif/else, for (tuple unpacking, `if` filter, else, loop.*,
// break/continue), set (incl. namespace attributes, block set), macro, call,
// filter blocks, raw; expressions with Python semantics (slicing, `in`, `~`,
// ternaries, string/dict methods) and the filters and tests real chat
// templates use. Not covered: include/extends/import/block (refused with an
// error naming the tag). Errors are cmf::Error(CMF_ERR_TEMPLATE) whose
// message names the template line.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace cmf::text {

struct JinjaTemplate;

// What one render may do, so that an untrusted template (they come inside
// model files) always finishes: jinja2 has no such limits beyond Python's
// recursion limit. Going over one is a CMF_ERR_TEMPLATE error naming the
// limit and the template line. The defaults are far beyond what chat
// templates do (a Qwen3 template over a ten-message conversation with tools
// takes about 10^4 steps).
struct RenderLimits {
    // Units of work: every statement and expression evaluated, every item a
    // loop, filter or method goes through, every 64 bytes of a string built,
    // copied or scanned. 10^7 is a few seconds of work.
    uint64_t steps = 10'000'000;
    // The longest string a render may build, the output included.
    uint64_t bytes = uint64_t(64) << 20;
    // Statements, expressions and macro calls nested inside each other at
    // run time, and the nesting of a value walked by ==, <, repr or tojson
    // (a namespace can be made to contain itself); keeps the stack bounded.
    int depth = 500;
};

class ChatTemplate {
public:
    // Parses `source`; throws cmf::Error(CMF_ERR_TEMPLATE) with the line.
    explicit ChatTemplate(std::string_view source);
    ~ChatTemplate();
    // Renders with the variables of `context_json` (a JSON object: messages,
    // tools, add_generation_prompt, bos_token, ...). `now_unix` is the time
    // strftime_now formats (local time); < 0 means the current time.
    std::string render(std::string_view context_json, int64_t now_unix = -1, const RenderLimits &limits = {}) const;

private:
    std::unique_ptr<JinjaTemplate> t_;
};

// The ChatML template used when a model has none (spec §6.1).
extern const char *const kChatmlTemplate;

}  // namespace cmf::text
