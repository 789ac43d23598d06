// The public face of the Jinja interpreter (text/jinja.hpp): parse once,
// render with a JSON context.
#include "text/jinja.hpp"

#include "text/jinja/lexer.hpp"
#include "text/jinja/parser.hpp"
#include "text/jinja/renderer.hpp"

#include <simdjson.h>

namespace cmf::text {

const char *const kChatmlTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

struct JinjaTemplate {
    jinja::NodeP root;
};

ChatTemplate::ChatTemplate(std::string_view source) : t_(std::make_unique<JinjaTemplate>()) {
    t_->root = jinja::parse(jinja::lex(source));
}

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(std::string_view context_json, int64_t now_unix, const RenderLimits &limits) const {
    using namespace jinja;
    simdjson::dom::parser parser;
    simdjson::padded_string padded(context_json);
    simdjson::dom::element doc;
    if (auto err = parser.parse(padded).get(doc))
        throw Error(CMF_ERR_PARSE, std::string("chat context: not valid JSON: ") + simdjson::error_message(err));
    if (!doc.is_object()) throw Error(CMF_ERR_PARSE, "chat context: expected a JSON object (messages, tools, ...)");
    Renderer r(now_unix, limits);
    Value ctx = from_json(doc);
    for (auto &kv : ctx.dict->items) r.scopes_[0][kv.first] = kv.second;
    r.scopes_.emplace_back();  // template-level assignments
    std::string out;
    try {
        r.exec(*t_->root, out);
    } catch (const BreakSignal &) {
        throw Error(CMF_ERR_TEMPLATE, "chat template: 'break' outside a loop");
    } catch (const ContinueSignal &) {
        throw Error(CMF_ERR_TEMPLATE, "chat template: 'continue' outside a loop");
    }
    return out;
}

}  // namespace cmf::text
