// The public face of the Jinja interpreter (text/jinja.hpp): parse once,
// render with a JSON context.
#include "text/jinja.hpp"

#include "common/json.hpp"

#include "text/jinja/lexer.hpp"
#include "text/jinja/parser.hpp"
#include "text/jinja/renderer.hpp"

#include <simdjson.h>

#include <string_view>
#include <unordered_map>

namespace cmf::text {

const char *const kChatmlTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace jinja {
namespace {

// The render context as template values. Linear in the document: an
// object's keys are placed through a map (json.loads keeps a repeated key's
// last value at its first position, as Object::set does).
Value from_json(simdjson::dom::element e) {
    using simdjson::dom::element_type;
    switch (e.type()) {
    case element_type::ARRAY: {
        Value v = Value::array();
        simdjson::dom::array arr;
        if (e.get(arr)) return v;
        for (simdjson::dom::element x : arr) v.list->push_back(from_json(x));
        return v;
    }
    case element_type::OBJECT: {
        Value v = Value::object();
        simdjson::dom::object obj;
        if (e.get(obj)) return v;
        std::unordered_map<std::string_view, size_t> at;
        for (auto kv : obj) {
            auto [it, fresh] = at.emplace(kv.key, v.dict->items.size());
            if (fresh) v.dict->items.emplace_back(std::string(kv.key), from_json(kv.value));
            else v.dict->items[it->second].second = from_json(kv.value);
        }
        return v;
    }
    case element_type::INT64: return Value::integer(e.get_int64().value_unsafe());
    case element_type::UINT64: return Value::number(double(e.get_uint64().value_unsafe()));
    case element_type::DOUBLE: return Value::number(e.get_double().value_unsafe());
    case element_type::STRING: {
        // NaN and the infinities of Python-written JSON arrive as the shared
        // reader's sentinel strings; a template sees them as the floats they are.
        double d;
        if (json::sentinel_number(e.get_string().value_unsafe(), d)) return Value::number(d);
        return Value::str(std::string(e.get_string().value_unsafe()));
    }
    case element_type::BOOL: return Value::boolean(e.get_bool().value_unsafe());
    case element_type::NULL_VALUE: return Value::none();
    }
    return Value::none();
}

}  // namespace
}  // namespace jinja

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
    simdjson::dom::element doc = parse_json(parser, context_json, "chat context");
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
