// C entry points that read a model's chat bundle (spec §6.1): its tokenizer
// (vocab section), special ids and chat rendering (header.tokenizer_config).
#include "common/error.hpp"
#include "common/c_api_util.hpp"
#include "common/json.hpp"

#include <cmf/cmf.h>

#include <boost/json.hpp>
#include <simdjson.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using cmf::Error;
using cmf::guard;

namespace {

struct TokenizerDeleter {
    void operator()(cmf_tokenizer *t) const { cmf_tokenizer_free(t); }
};
using TokenizerPtr = std::unique_ptr<cmf_tokenizer, TokenizerDeleter>;

// The vocab tokenizer, or null when the file has no vocab section.
TokenizerPtr vocab_tokenizer(const cmf_model *m) {
    const void *data = nullptr;
    uint64_t len = 0;
    cmf::throw_if_error(cmf_model_vocab(m, &data, &len), "vocab section");
    if (len == 0) return nullptr;
    cmf_tokenizer *t = nullptr;
    cmf::throw_if_error(cmf_tokenizer_create(static_cast<const char *>(data), static_cast<size_t>(len), &t),
                        "vocab section (tokenizer.json)");
    return TokenizerPtr(t);
}

int32_t token_id(const cmf_tokenizer *t, const char *piece) {
    int32_t id = -1;
    if (cmf_error *e = cmf_tokenizer_token_to_id(t, piece, std::strlen(piece), &id)) {
        cmf_error_free(e);
        return -1;
    }
    return id;
}

struct ChatBundle {
    int32_t bos = -1, pad = -1;
    std::vector<int32_t> eos;
    std::string chat_template;
};

int32_t id_field(simdjson::dom::object o, const char *key) {
    simdjson::dom::element v;
    if (o[key].get(v) != simdjson::SUCCESS || v.is_null()) return -1;
    uint64_t u = 0;
    if (v.get_uint64().get(u) != simdjson::SUCCESS || u > INT32_MAX)
        throw Error(CMF_ERR_PARSE, std::string("header.tokenizer_config.") + key + ": expected a token id or null");
    return static_cast<int32_t>(u);
}

ChatBundle read_bundle(const cmf_model *m) {
    cmf_model_info info;
    cmf_model_info_init(&info);
    cmf::throw_if_error(cmf_model_get_info(m, &info));
    ChatBundle b;
    const char *tc = info.tokenizer_config_json ? info.tokenizer_config_json : "";
    if (*tc == '\0') return b;
    simdjson::dom::parser parser;
    simdjson::dom::element root = cmf::parse_json(parser, tc, "header.tokenizer_config");
    if (root.is_null()) return b;
    simdjson::dom::object o;
    if (root.get_object().get(o)) throw Error(CMF_ERR_PARSE, "header.tokenizer_config: expected an object or null");
    b.bos = id_field(o, "bos_token_id");
    b.pad = id_field(o, "pad_token_id");
    simdjson::dom::element ev;
    if (o["eos_token_ids"].get(ev) == simdjson::SUCCESS && !ev.is_null()) {
        simdjson::dom::array a;
        if (ev.get_array().get(a)) throw Error(CMF_ERR_PARSE, "header.tokenizer_config.eos_token_ids: expected an array");
        for (auto x : a) {
            uint64_t u = 0;
            if (x.get_uint64().get(u) || u > INT32_MAX)
                throw Error(CMF_ERR_PARSE, "header.tokenizer_config.eos_token_ids: expected token ids");
            b.eos.push_back(static_cast<int32_t>(u));
        }
    }
    simdjson::dom::element tv;
    if (o["chat_template"].get(tv) == simdjson::SUCCESS && !tv.is_null()) {
        std::string_view s;
        if (tv.get_string().get(s)) throw Error(CMF_ERR_PARSE, "header.tokenizer_config.chat_template: expected a string");
        b.chat_template = std::string(s);
    }
    return b;
}

// The context HF's apply_chat_template gives a template: the caller's keys,
// plus bos_token/eos_token spelled out from the model's ids when absent.
std::string with_special_tokens(std::string_view context, const ChatBundle &b, const cmf_model *m) {
    simdjson::dom::parser parser;
    simdjson::dom::element root = cmf::parse_json(parser, context, "chat context");
    simdjson::dom::object obj;
    if (root.get_object().get(obj))
        throw Error(CMF_ERR_PARSE, "chat context: expected an object with \"messages\" and template variables");
    boost::json::object extra;
    auto tok = vocab_tokenizer(m);
    auto piece = [&](int32_t id) -> std::string {
        if (!tok || id < 0) return {};
        char *p = nullptr;
        size_t n = 0;
        if (cmf_error *e = cmf_tokenizer_id_to_token(tok.get(), id, &p, &n)) {
            cmf_error_free(e);
            return {};
        }
        std::string r(p, n);
        cmf_string_free(p);
        return r;
    };
    simdjson::dom::element unused;
    if (obj["bos_token"].get(unused) != simdjson::SUCCESS && b.bos >= 0) extra["bos_token"] = piece(b.bos);
    if (obj["eos_token"].get(unused) != simdjson::SUCCESS && !b.eos.empty()) extra["eos_token"] = piece(b.eos[0]);
    if (extra.empty()) return std::string(context);
    // Splice the extra keys in after the opening brace (the caller's keys keep
    // their spelling byte for byte).
    std::string body = boost::json::serialize(extra);  // "{...}"
    size_t brace = context.find('{');
    std::string_view rest = context.substr(brace + 1);
    bool empty_obj = rest.find_first_not_of(" \t\r\n") != std::string_view::npos &&
                     rest[rest.find_first_not_of(" \t\r\n")] == '}';
    return std::string(context.substr(0, brace + 1)) + body.substr(1, body.size() - 2) + (empty_obj ? "" : ",") +
           std::string(rest);
}

}  // namespace

extern "C" {

CMF_API cmf_error *cmf_model_tokenizer(const cmf_model *m, cmf_tokenizer **out) {
    return guard([&] {
        if (m == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_model_tokenizer: NULL argument");
        auto t = vocab_tokenizer(m);
        if (!t) throw Error(CMF_ERR_NOT_FOUND, "the model file has no tokenizer (no vocab section: its checkpoint had no "
                                           "tokenizer.json or tokenizer.model), so text cannot be encoded; "
                                           "logits --ids and bench work on token ids");
        *out = t.release();
    });
}

CMF_API void cmf_model_special_ids_init(cmf_model_special_ids *ids) {
    if (ids == nullptr) return;
    std::memset(ids, 0, sizeof *ids);
    ids->struct_size = sizeof *ids;
    ids->bos_id = -1;
    ids->pad_id = -1;
}

CMF_API cmf_error *cmf_model_get_special_ids(const cmf_model *m, cmf_model_special_ids *out) {
    return guard([&] {
        if (m == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_model_get_special_ids: NULL argument");
        if (out->struct_size < sizeof(uint32_t))  // before the work, not only at the copy
            throw Error(CMF_ERR_INVALID_ARGUMENT, "struct_size not set (call cmf_model_special_ids_init)");
        ChatBundle b = read_bundle(m);
        if (auto t = vocab_tokenizer(m)) {
            if (b.eos.empty()) {
                // ChatML fallback: the usual stop tokens, if the vocabulary has them.
                for (const char *p : {"<|im_end|>", "<|endoftext|>"})
                    if (int32_t id = token_id(t.get(), p); id >= 0) b.eos.push_back(id);
            }
            // Gemma's chat template ends every turn with <end_of_turn>, and
            // not every checkpoint lists it among its eos ids (Gemma 1).
            if (int32_t id = token_id(t.get(), "<end_of_turn>");
                id >= 0 && std::find(b.eos.begin(), b.eos.end(), id) == b.eos.end())
                b.eos.push_back(id);
        }
        if (b.eos.size() > CMF_MAX_EOS_IDS)
            throw Error(CMF_ERR_UNSUPPORTED, "header.tokenizer_config.eos_token_ids: " + std::to_string(b.eos.size()) +
                                                 " ids, more than CMF_MAX_EOS_IDS (" + std::to_string(CMF_MAX_EOS_IDS) + ")");
        cmf_model_special_ids r;
        cmf_model_special_ids_init(&r);
        r.bos_id = b.bos;
        r.pad_id = b.pad;
        r.n_eos_ids = static_cast<uint32_t>(b.eos.size());
        for (size_t k = 0; k < b.eos.size(); ++k) r.eos_ids[k] = b.eos[k];
        r.has_chat_template = b.chat_template.empty() ? 0 : 1;
        cmf::capi::copy_out(out, r);
    });
}

CMF_API cmf_error *cmf_model_render_chat(const cmf_model *m, const char *context_json, size_t len, char **out,
                                         size_t *out_len) {
    return guard([&] {
        if (m == nullptr || context_json == nullptr || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_model_render_chat: NULL argument");
        // The file's template through the Jinja interpreter (core/text); an
        // empty template selects the ChatML fallback of spec §6.1.
        ChatBundle b = read_bundle(m);
        std::string context = with_special_tokens(std::string_view(context_json, len), b, m);
        char *p = nullptr;
        size_t n = 0;
        cmf::throw_if_error(cmf_chat_render(b.chat_template.data(), b.chat_template.size(), context.data(),
                                            context.size(), nullptr, &p, &n));
        *out = p;
        if (out_len) *out_len = n;
    });
}

}  // extern "C"
