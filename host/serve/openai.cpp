#include "serve/openai.hpp"

#include <boost/json.hpp>
#include <simdjson.h>

#include <cmath>
#include <cstdio>
#include <random>

namespace cmfhost::serve {

namespace json = boost::json;
using simdjson::dom::element;
using simdjson::dom::object;

ApiError bad_param(const std::string &param, const std::string &message) {
    return ApiError(400, "invalid_request_error", message, param);
}

std::string error_json(const ApiError &e) {
    json::object err{{"message", e.what()}, {"type", e.type}};
    err["param"] = e.param.empty() ? json::value(nullptr) : json::value(e.param);
    err["code"] = e.code.empty() ? json::value(nullptr) : json::value(e.code);
    return json::serialize(json::object{{"error", err}});
}

namespace {

// A field that is absent or null reads as absent.
std::optional<element> field(object o, const char *key) {
    element v;
    if (o[key].get(v) != simdjson::SUCCESS || v.is_null()) return std::nullopt;
    return v;
}

double number(element v, const char *key) {
    double d = 0;
    if (v.is_int64()) return double(int64_t(v.get_int64()));
    if (v.is_uint64()) return double(uint64_t(v.get_uint64()));
    if (v.get_double().get(d) != simdjson::SUCCESS) throw bad_param(key, std::string("'") + key + "' must be a number");
    return d;
}

double number_in(object o, const char *key, double def, double lo, double hi) {
    auto v = field(o, key);
    if (!v) return def;
    double d = number(*v, key);
    if (!(d >= lo && d <= hi))
        throw bad_param(key, std::string("'") + key + "' must be between " + json::serialize(json::value(lo)) + " and " +
                                 json::serialize(json::value(hi)) + ", not " + json::serialize(json::value(d)));
    return d;
}

int64_t integer(element v, const char *key) {
    int64_t i = 0;
    if (v.get_int64().get(i) != simdjson::SUCCESS) throw bad_param(key, std::string("'") + key + "' must be an integer");
    return i;
}

bool boolean(object o, const char *key, bool def) {
    auto v = field(o, key);
    if (!v) return def;
    bool b = false;
    if (v->get_bool().get(b) != simdjson::SUCCESS) throw bad_param(key, std::string("'") + key + "' must be true or false");
    return b;
}

std::string string_of(element v, const char *key) {
    std::string_view s;
    if (v.get_string().get(s) != simdjson::SUCCESS) throw bad_param(key, std::string("'") + key + "' must be a string");
    return std::string(s);
}

// Fields the server understands but cannot honour: refused, never ignored.
void refuse_unsupported(object o) {
    if (auto v = field(o, "n"); v && (!v->is_int64() || int64_t(v->get_int64()) != 1))
        throw bad_param("n", "only n = 1 is supported");
    if (auto v = field(o, "best_of"); v && (!v->is_int64() || int64_t(v->get_int64()) != 1))
        throw bad_param("best_of", "only best_of = 1 is supported");
    // logprobs: a bool (chat) or a count (completions); false and 0 ask for none.
    if (auto v = field(o, "logprobs"); v && !(v->is_bool() && !bool(v->get_bool())) &&
                                       !(v->is_int64() && int64_t(v->get_int64()) == 0))
        throw bad_param("logprobs", "logprobs are not supported");
    if (field(o, "top_logprobs")) throw bad_param("top_logprobs", "logprobs are not supported");
    if (boolean(o, "echo", false)) throw bad_param("echo", "echo is not supported");
    if (field(o, "suffix")) throw bad_param("suffix", "suffix is not supported");
    if (auto v = field(o, "frequency_penalty"); v && number(*v, "frequency_penalty") != 0)
        throw bad_param("frequency_penalty", "frequency_penalty is not supported (presence_penalty is)");
    if (auto v = field(o, "logit_bias")) {
        object lb;
        if (v->get_object().get(lb) != simdjson::SUCCESS || lb.size() != 0)
            throw bad_param("logit_bias", "logit_bias is not supported");
    }
    if (auto v = field(o, "tools")) {
        simdjson::dom::array a;
        if (v->get_array().get(a) != simdjson::SUCCESS || a.size() != 0)
            throw bad_param("tools", "tools (function calling) are not supported");
    }
    if (auto v = field(o, "response_format")) {
        object rf;
        std::string_view t;
        if (v->get_object().get(rf) != simdjson::SUCCESS || rf["type"].get_string().get(t) != simdjson::SUCCESS ||
            t != "text")
            throw bad_param("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
}

// A message's content: a string, or an array of {"type": "text", "text"} parts.
std::string message_content(element c, size_t i) {
    const std::string param = "messages[" + std::to_string(i) + "].content";
    std::string_view s;
    if (c.get_string().get(s) == simdjson::SUCCESS) return std::string(s);
    simdjson::dom::array parts;
    if (c.get_array().get(parts) != simdjson::SUCCESS)
        throw bad_param(param, param + " must be a string or an array of text parts");
    std::string out;
    for (element p : parts) {
        object po;
        std::string_view type, text;
        if (p.get_object().get(po) != simdjson::SUCCESS || po["type"].get_string().get(type) != simdjson::SUCCESS)
            throw bad_param(param, param + ": each part must be an object with a \"type\"");
        if (type != "text") throw bad_param(param, param + ": only text parts are supported, not \"" + std::string(type) + "\"");
        if (po["text"].get_string().get(text) != simdjson::SUCCESS)
            throw bad_param(param, param + ": a text part needs a \"text\" string");
        out += text;
    }
    return out;
}

std::string chat_context(object o) {
    auto mv = field(o, "messages");
    if (!mv) throw bad_param("messages", "'messages' is required");
    simdjson::dom::array msgs;
    if (mv->get_array().get(msgs) != simdjson::SUCCESS || msgs.size() == 0)
        throw bad_param("messages", "'messages' must be a non-empty array");
    json::array out;
    size_t i = 0;
    for (element m : msgs) {
        const std::string where = "messages[" + std::to_string(i) + "]";
        object mo;
        if (m.get_object().get(mo) != simdjson::SUCCESS) throw bad_param(where, where + " must be an object");
        std::string_view role;
        if (mo["role"].get_string().get(role) != simdjson::SUCCESS)
            throw bad_param(where + ".role", where + ".role must be a string");
        if (role != "system" && role != "developer" && role != "user" && role != "assistant")
            throw bad_param(where + ".role", where + ".role must be system, developer, user or assistant, not \"" +
                                                 std::string(role) + "\"");
        auto c = field(mo, "content");
        if (!c) throw bad_param(where + ".content", where + ".content is required");
        // Chat templates know "system"; "developer" is OpenAI's newer name for it.
        out.push_back(json::object{{"role", role == "developer" ? "system" : std::string(role)},
                                   {"content", message_content(*c, i)}});
        ++i;
    }
    return json::serialize(json::object{{"messages", out}, {"add_generation_prompt", true}});
}

std::vector<std::string> stop_strings(object o) {
    auto v = field(o, "stop");
    if (!v) return {};
    std::vector<std::string> out;
    std::string_view s;
    if (v->get_string().get(s) == simdjson::SUCCESS) {
        out.emplace_back(s);
    } else {
        simdjson::dom::array a;
        if (v->get_array().get(a) != simdjson::SUCCESS) throw bad_param("stop", "'stop' must be a string or an array of strings");
        for (element e : a) {
            if (e.get_string().get(s) != simdjson::SUCCESS) throw bad_param("stop", "'stop' must be a string or an array of strings");
            out.emplace_back(s);
        }
    }
    if (out.size() > 4) throw bad_param("stop", "'stop' holds at most 4 strings");
    for (const auto &x : out)
        if (x.empty()) throw bad_param("stop", "a stop string must not be empty");
    return out;
}

}  // namespace

GenRequest parse_gen_request(std::string_view body, Endpoint endpoint) {
    simdjson::dom::parser parser;
    element root;
    if (auto err = parser.parse(simdjson::padded_string(body)).get(root))
        throw ApiError(400, "invalid_request_error", std::string("the request body is not valid JSON: ") +
                                                         simdjson::error_message(err));
    object o;
    if (root.get_object().get(o) != simdjson::SUCCESS)
        throw ApiError(400, "invalid_request_error", "the request body must be a JSON object");
    GenRequest r;
    r.endpoint = endpoint;
    if (auto v = field(o, "model")) string_of(*v, "model");  // any name: the server runs one model
    refuse_unsupported(o);
    if (endpoint == Endpoint::Chat) {
        r.chat_context = chat_context(o);
    } else {
        auto p = field(o, "prompt");
        if (!p) throw bad_param("prompt", "'prompt' is required");
        std::string_view s;
        simdjson::dom::array a;
        if (p->get_string().get(s) == simdjson::SUCCESS) {
            r.prompt = std::string(s);
        } else if (p->get_array().get(a) == simdjson::SUCCESS && a.size() == 1 &&
                   a.at(0).get_string().get(s) == simdjson::SUCCESS) {
            r.prompt = std::string(s);
        } else {
            throw bad_param("prompt", "'prompt' must be a string (or an array of one string)");
        }
        if (r.prompt.empty()) throw bad_param("prompt", "'prompt' must not be empty");
    }
    r.stream = boolean(o, "stream", false);
    if (auto so = field(o, "stream_options")) {
        object soo;
        if (so->get_object().get(soo) != simdjson::SUCCESS)
            throw bad_param("stream_options", "'stream_options' must be an object");
        if (!r.stream) throw bad_param("stream_options", "'stream_options' needs \"stream\": true");
        r.include_usage = boolean(soo, "include_usage", false);
    }
    for (const char *key : {"max_tokens", "max_completion_tokens"}) {
        if (auto v = field(o, key)) {
            int64_t n = integer(*v, key);
            if (n < 1 || n > int64_t(UINT32_MAX)) throw bad_param(key, std::string("'") + key + "' must be at least 1");
            r.max_tokens = uint32_t(n);
        }
    }
    cmf_generate_options &g = r.sampling;
    cmf_generate_options_init(&g);
    // OpenAI's defaults: temperature 1, top_p 1, no other filter or penalty.
    g.temperature = float(number_in(o, "temperature", 1.0, 0.0, 2.0));
    g.top_p = float(number_in(o, "top_p", 1.0, 1e-9, 1.0));
    g.presence_penalty = float(number_in(o, "presence_penalty", 0.0, -2.0, 2.0));
    // Extensions other local servers accept too.
    g.top_k = 0;
    if (auto v = field(o, "top_k")) {
        int64_t k = integer(*v, "top_k");
        if (k < 0 || k > INT32_MAX) throw bad_param("top_k", "'top_k' must be >= 0 (0 = off)");
        g.top_k = int32_t(k);
    }
    g.min_p = float(number_in(o, "min_p", 0.0, 0.0, 1.0));
    g.repetition_penalty = float(number_in(o, "repetition_penalty", 1.0, 1e-3, 10.0));
    if (auto v = field(o, "seed")) {
        g.seed = uint64_t(integer(*v, "seed"));
    } else {
        std::random_device rd;
        g.seed = (uint64_t(rd()) << 32) ^ rd();
    }
    r.stop = stop_strings(o);
    return r;
}

std::string StopScanner::push(std::string_view piece) {
    if (matched_) return {};
    held_.append(piece);
    size_t first = std::string::npos;
    for (const auto &s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        matched_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    // Hold back the longest end of the text that starts a stop string.
    size_t keep = 0;
    for (const auto &s : stops_)
        for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                keep = k;
                break;
            }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopScanner::flush() {
    std::string out;
    out.swap(held_);
    return matched_ ? std::string() : out;
}

namespace {
json::object usage_obj(const Usage &u) {
    return json::object{{"prompt_tokens", u.prompt_tokens},
                        {"completion_tokens", u.completion_tokens},
                        {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}
json::object head(Endpoint e, const ResponseMeta &m, bool chunk) {
    const char *object = e == Endpoint::Chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return json::object{{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}
}  // namespace

std::string full_response_json(Endpoint e, const ResponseMeta &m, const std::string &text, const char *finish_reason,
                               const Usage &u) {
    json::object r = head(e, m, false);
    json::object choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
    if (e == Endpoint::Chat)
        choice["message"] = json::object{{"role", "assistant"}, {"content", text}};
    else
        choice["text"] = text;
    r["choices"] = json::array{choice};
    r["usage"] = usage_obj(u);
    return json::serialize(r);
}

std::string chunk_json(Endpoint e, const ResponseMeta &m, bool first, const std::string &text,
                       const char *finish_reason, const Usage *u) {
    json::object r = head(e, m, true);
    json::object choice{{"index", 0}, {"logprobs", nullptr}};
    choice["finish_reason"] = finish_reason ? json::value(finish_reason) : json::value(nullptr);
    if (e == Endpoint::Chat) {
        json::object delta;
        if (first) delta["role"] = "assistant";
        if (first || !text.empty()) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
    }
    r["choices"] = json::array{choice};
    if (u != nullptr) r["usage"] = usage_obj(*u);
    return json::serialize(r);
}

std::string usage_chunk_json(Endpoint e, const ResponseMeta &m, const Usage &u) {
    json::object r = head(e, m, true);
    r["choices"] = json::array{};
    r["usage"] = usage_obj(u);
    return json::serialize(r);
}

std::string models_json(const std::string &model_id, int64_t created) {
    json::object model{{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "cmf"}};
    return json::serialize(json::object{{"object", "list"}, {"data", json::array{model}}});
}

std::string new_id(const char *prefix) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
    return buf;
}

}  // namespace cmfhost::serve
