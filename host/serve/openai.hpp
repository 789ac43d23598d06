// The OpenAI-compatible request and response bodies of `cmfhost serve`:
// request JSON (parsed with simdjson) into what a generation needs, and the
// response, chunk, error and model-list JSON (emitted with Boost.JSON).
#pragma once

#include <cmf/cmf.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cmfhost::serve {

// A request the server refuses, in OpenAI's error shape:
// {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError : std::runtime_error {
    ApiError(int status_, std::string type_, const std::string &message, std::string param_ = {},
             std::string code_ = {})
        : std::runtime_error(message), status(status_), type(std::move(type_)), param(std::move(param_)),
          code(std::move(code_)) {}
    int status;
    std::string type;   // invalid_request_error, authentication_error, ...
    std::string param;  // the offending field, or ""
    std::string code;   // e.g. "invalid_api_key", or ""
};

// 400 invalid_request_error naming the field.
ApiError bad_param(const std::string &param, const std::string &message);

std::string error_json(const ApiError &e);

enum class Endpoint { Chat, Completion };

// What one /v1/chat/completions or /v1/completions body asks for.
struct GenRequest {
    Endpoint endpoint = Endpoint::Chat;
    std::string chat_context;  // Chat: the template context JSON (messages, add_generation_prompt)
    std::string prompt;        // Completion: the prompt text
    bool stream = false;
    bool include_usage = false;        // stream_options.include_usage
    uint32_t max_tokens = 0;           // 0: until a stop token or the context is full
    cmf_generate_options sampling{};   // temperature, top_p, seed, ... (callbacks unset)
    std::vector<std::string> stop;     // stop strings (not part of the output)
};

// Parses a request body. Throws ApiError (400) naming what is wrong.
GenRequest parse_gen_request(std::string_view body, Endpoint endpoint);

// Finds stop strings in streamed text: holds back the end of the text while
// it could still grow into a stop string, so no part of one is ever sent.
class StopScanner {
public:
    explicit StopScanner(std::vector<std::string> stops) : stops_(std::move(stops)) {}
    // Adds generated text; returns the text that can be sent now. After a
    // stop string is found, matched() is true and nothing more is returned.
    std::string push(std::string_view piece);
    // The text held back (at the end of generation, when no stop matched).
    std::string flush();
    bool matched() const { return matched_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool matched_ = false;
};

// Response bodies. `usage` is {prompt_tokens, completion_tokens, total_tokens}.
struct Usage {
    uint64_t prompt_tokens = 0, completion_tokens = 0;
};
struct ResponseMeta {
    std::string id;       // "chatcmpl-..." / "cmpl-..."
    int64_t created = 0;  // unix seconds
    std::string model;
};
std::string full_response_json(Endpoint e, const ResponseMeta &m, const std::string &text, const char *finish_reason,
                               const Usage &u);
// A stream chunk: the first (role) chunk, a text delta, or the last one with
// the finish reason and usage (finish_reason non-NULL).
std::string chunk_json(Endpoint e, const ResponseMeta &m, bool first, const std::string &text,
                       const char *finish_reason, const Usage *u);
// The stream_options.include_usage chunk: no choices, the usage.
std::string usage_chunk_json(Endpoint e, const ResponseMeta &m, const Usage &u);
std::string models_json(const std::string &model_id, int64_t created);

// A fresh id with the given prefix ("chatcmpl-", "cmpl-").
std::string new_id(const char *prefix);

}  // namespace cmfhost::serve
