// C entry points that read a model's chat bundle (COMPAT §6): its tokenizer
// (vocab section), special ids and chat rendering (header.tokenizer_config).
#include "common/error.hpp"

#include <cmf/cmf.h>

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
    simdjson::dom::element root;
    if (auto err = parser.parse(simdjson::padded_string(std::string_view(tc))).get(root))
        throw Error(CMF_ERR_PARSE, std::string("header.tokenizer_config: invalid JSON: ") + simdjson::error_message(err));
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

// ChatML (spec §6.1 fallback): what the Qwen family's templates emit for
// plain role/content messages.
std::string render_chatml(simdjson::dom::array messages, bool add_generation_prompt) {
    std::string out;
    size_t i = 0;
    for (auto msg : messages) {
        std::string_view role, content;
        if (msg["role"].get_string().get(role))
            throw Error(CMF_ERR_PARSE, "chat context: messages[" + std::to_string(i) + "].role: expected a string");
        if (msg["content"].get_string().get(content))
            throw Error(CMF_ERR_PARSE, "chat context: messages[" + std::to_string(i) + "].content: expected a string");
        out += "<|im_start|>";
        out += role;
        out += '\n';
        out += content;
        out += "<|im_end|>\n";
        ++i;
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

}  // namespace

extern "C" {

CMF_API cmf_error *cmf_model_tokenizer(const cmf_model *m, cmf_tokenizer **out) {
    return guard([&] {
        if (m == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_model_tokenizer: NULL argument");
        auto t = vocab_tokenizer(m);
        if (!t) throw Error(CMF_ERR_NOT_FOUND, "the model file has no vocab section (no tokenizer.json was packed into it)");
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
        if (out->struct_size < sizeof(uint32_t))
            throw Error(CMF_ERR_INVALID_ARGUMENT, "struct_size not set (call cmf_model_special_ids_init)");
        ChatBundle b = read_bundle(m);
        if (b.eos.empty()) {
            // ChatML fallback: the usual stop tokens, if the vocabulary has them.
            if (auto t = vocab_tokenizer(m))
                for (const char *p : {"<|im_end|>", "<|endoftext|>"})
                    if (int32_t id = token_id(t.get(), p); id >= 0) b.eos.push_back(id);
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
        uint32_t n = out->struct_size;
        std::memcpy(reinterpret_cast<char *>(out) + sizeof(uint32_t), reinterpret_cast<const char *>(&r) + sizeof(uint32_t),
                    std::min<size_t>(n, sizeof r) - sizeof(uint32_t));
    });
}

CMF_API cmf_error *cmf_model_render_chat(const cmf_model *m, const char *context_json, size_t len, char **out,
                                         size_t *out_len) {
    return guard([&] {
        if (m == nullptr || context_json == nullptr || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "cmf_model_render_chat: NULL argument");
        ChatBundle b = read_bundle(m);
        simdjson::dom::parser parser;
        simdjson::dom::element root;
        if (auto err = parser.parse(simdjson::padded_string(context_json, len)).get(root))
            throw Error(CMF_ERR_PARSE, std::string("chat context: invalid JSON: ") + simdjson::error_message(err));
        simdjson::dom::array messages;
        if (root["messages"].get_array().get(messages))
            throw Error(CMF_ERR_PARSE, "chat context: \"messages\" must be an array of {role, content}");
        bool add_gen = false;
        simdjson::dom::element g;
        if (root["add_generation_prompt"].get(g) == simdjson::SUCCESS && g.get_bool().get(add_gen))
            throw Error(CMF_ERR_PARSE, "chat context: \"add_generation_prompt\" must be a boolean");
        // A general Jinja interpreter is not built yet (docs/runtime.md): the
        // ChatML family is recognised by the marker every such template emits.
        if (!b.chat_template.empty() && b.chat_template.find("<|im_start|>") == std::string::npos)
            throw Error(CMF_ERR_UNSUPPORTED,
                        "the model's chat template is not in the ChatML family and general Jinja templates are not "
                        "interpreted yet; use raw completion");
        std::string text = render_chatml(messages, add_gen);
        char *p = static_cast<char *>(std::malloc(text.size() + 1));
        if (!p) throw std::bad_alloc();
        std::memcpy(p, text.data(), text.size());
        p[text.size()] = '\0';
        *out = p;
        if (out_len) *out_len = text.size();
    });
}

}  // extern "C"
