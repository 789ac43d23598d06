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

class ChatTemplate {
public:
    // Parses `source`; throws cmf::Error(CMF_ERR_TEMPLATE) with the line.
    explicit ChatTemplate(std::string_view source);
    ~ChatTemplate();
    // Renders with the variables of `context_json` (a JSON object: messages,
    // tools, add_generation_prompt, bos_token, ...). `now_unix` is the time
    // strftime_now formats (local time); < 0 means the current time.
    std::string render(std::string_view context_json, int64_t now_unix = -1) const;

private:
    std::unique_ptr<JinjaTemplate> t_;
};

// The ChatML template used when a model has none (spec §6.1).
extern const char *const kChatmlTemplate;

}  // namespace cmf::text
