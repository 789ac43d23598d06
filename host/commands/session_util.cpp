#include "session_util.hpp"

#include <boost/json.hpp>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <unistd.h>

namespace cmfhost {

std::string default_model_path() {
    std::error_code ec;
    auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return "";
    return (exe.parent_path() / ".." / "share" / "cmf" / "models" / "default.cmf").lexically_normal().string();
}

std::string resolve_model(const std::string &given) {
    if (!given.empty()) return given;
    std::string def = default_model_path();
    std::error_code ec;
    if (def.empty() || !std::filesystem::is_regular_file(def, ec))
        throw Failure("no MODEL given and no default model installed at " + (def.empty() ? std::string("<unknown>") : def) +
                          "; pass the path of a .cmf file",
                      2);
    std::cerr << "using the default model " << def << "\n";
    return def;
}

void add_session_options(boost::program_options::options_description &desc, SessionFlags &flags) {
    desc.add_options()("kv-cache", boost::program_options::value(&flags.kv_cache)->default_value(flags.kv_cache),
                       "KV cache element type: f32, or f16 (half the memory and the bytes attention reads)")(
        "backend", boost::program_options::value(&flags.backend)->default_value(""),
        "compute backend by name (cmfhost plugins lists them); default: the first one loaded");
}

SessionPtr make_session(cmf_runtime *rt, const cmf_model *m, uint64_t n_ctx, const SessionFlags &flags) {
    if (flags.kv_cache != "f32" && flags.kv_cache != "f16")
        throw Failure("--kv-cache must be f32 or f16, not '" + flags.kv_cache + "'", 2);
    cmf_session_options o;
    cmf_session_options_init(&o);
    o.n_ctx = n_ctx;
    if (flags.profile) o.flags |= CMF_SESSION_PROFILE;
    // The arch's model option (the qwen arch's kv_cache=f32|f16), passed only
    // when it is not the default, so that f32 runs with any arch plugin.
    const std::string arch_options = "kv_cache=" + flags.kv_cache;
    if (flags.kv_cache != "f32") o.arch_options = arch_options.c_str();
    if (!flags.backend.empty()) o.backend = flags.backend.c_str();
    // A pipeline container (provenance.pipeline) makes images, not text.
    cmf_model_info info;
    cmf_model_info_init(&info);
    check(cmf_model_get_info(m, &info));
    if (info.provenance_json[0] != '\0') {
        boost::system::error_code ec;
        const boost::json::value prov = boost::json::parse(info.provenance_json, ec);
        if (!ec && prov.is_object() && prov.as_object().contains("pipeline") && prov.at("pipeline").is_string())
            throw Failure("this file is an image pipeline (" + std::string(prov.at("pipeline").as_string()) +
                              ", arch " + info.arch_name + "), not a text model: generate images with "
                              "`cmfhost imagine MODEL -p PROMPT -o out.png`",
                          2);
    }
    cmf_session *s = nullptr;
    check(cmf_session_create_for_model(rt, m, &o, &s), "cannot create a session");
    return SessionPtr(s);
}

TokenizerPtr model_tokenizer(const cmf_model *m) {
    cmf_tokenizer *t = nullptr;
    check(cmf_model_tokenizer(m, &t), "tokenizer");
    return TokenizerPtr(t);
}

ChatModel open_chat_model(const CommonOptions &common, const std::string &path) {
    ChatModel c;
    c.rt = make_runtime(common);
    c.model = open_model(c.rt.get(), path);
    c.tok = model_tokenizer(c.model.get());
    cmf_model_special_ids_init(&c.special);
    check(cmf_model_get_special_ids(c.model.get(), &c.special), "special ids");
    return c;
}

std::vector<int32_t> encode(const cmf_tokenizer *t, const std::string &text, uint32_t flags) {
    int32_t *ids = nullptr;
    size_t n = 0;
    check(cmf_tokenizer_encode(t, text.data(), text.size(), flags, &ids, &n), "tokenize");
    std::vector<int32_t> v(ids, ids + n);
    cmf_ids_free(ids);
    return v;
}

std::vector<int32_t> parse_ids(const std::string &s) {
    std::vector<int32_t> v;
    size_t i = 0;
    while (i <= s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        std::string w = s.substr(i, j - i);
        char *end = nullptr;
        errno = 0;
        long x = std::strtol(w.c_str(), &end, 10);
        if (w.empty() || *end != '\0' || errno || x < 0 || x > INT32_MAX)
            throw Failure("--ids: '" + w + "' is not a token id (expected e.g. 1,2,3)", 2);
        v.push_back(static_cast<int32_t>(x));
        i = j + 1;
    }
    return v;
}

std::string render_chat(const cmf_model *m, const std::vector<std::pair<std::string, std::string>> &messages) {
    boost::json::array msgs;
    for (const auto &[role, content] : messages) msgs.push_back(boost::json::object{{"role", role}, {"content", content}});
    std::string ctx = boost::json::serialize(boost::json::object{{"messages", msgs}, {"add_generation_prompt", true}});
    char *out = nullptr;
    size_t n = 0;
    check(cmf_model_render_chat(m, ctx.data(), ctx.size(), &out, &n), "chat template (use --raw for plain completion)");
    std::string s(out, n);
    cmf_string_free(out);
    return s;
}

const char *stop_reason_name(int32_t r) {
    switch (r) {
        case CMF_STOP_MAX_TOKENS: return "max-tokens";
        case CMF_STOP_EOS: return "eos";
        case CMF_STOP_CALLBACK: return "callback";
        case CMF_STOP_CANCELLED: return "cancelled";
        case CMF_STOP_CONTEXT_FULL: return "context-full";
        default: return "?";
    }
}

}  // namespace cmfhost
