// libcmf's entry to the shared JSON reader (sdk/cmf/json_read.hpp): every
// JSON libcmf reads from a file or a caller goes through these, so big
// integers, NaN/Infinity and a byte order mark read the same everywhere.
// The reader's errors (cmf::sdk::Error) become cmf::Error here.
#pragma once

#include "common/error.hpp"

#include <cmf/json_read.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace cmf {

// Runs `body`, rethrowing the shared reader's errors as cmf::Error.
template <class F>
auto json_call(F &&body) -> decltype(body()) {
    try {
        return body();
    } catch (const sdk::Error &e) {
        throw Error(e.code(), e.what());
    }
}

inline simdjson::dom::element parse_json(simdjson::dom::parser &p, std::string_view text, std::string_view source) {
    return json_call([&] { return json::parse(p, text, source); });
}

inline json::Object parse_json_object(simdjson::dom::parser &p, std::string_view text, std::string source) {
    return json_call([&] { return json::parse_object(p, text, std::move(source)); });
}

}  // namespace cmf
