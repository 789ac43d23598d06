#include "session_util.hpp"

#include <boost/json.hpp>

#include <cerrno>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
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

// Whether this command line gave --decode-copy (its notifier runs before
// --no-decode-copy's).
static bool &decode_copy_asked() {
    static bool asked = false;
    return asked;
}

void add_session_options(boost::program_options::options_description &desc, SessionFlags &flags) {
    namespace po = boost::program_options;
    desc.add_options()("kv-cache", po::value(&flags.kv_cache)->default_value(flags.kv_cache),
                       "KV cache element type: f32; f16 (half the memory and the bytes attention reads); or q8, "
                       "blocks of 32 int8 values with an f16 scale (0.27 of f32's)")
        ("backend", po::value(&flags.backend)->default_value(""),
         "compute backend by name (cmfhost plugins lists them); default: the first one loaded")
        ("mtp", po::value(&flags.mtp)->default_value(flags.mtp),
         "the model's MTP head (model.mtp.*), when it has one: on = draft tokens for speculative decoding "
         "(greedy output unchanged, sampling distribution unchanged), off = plain decoding")
        ("task", po::value(&flags.task), "run the file's task mask NAME (see `cmfhost masks`): masked neurons, heads and layers are skipped")
        ("skill", po::value(&flags.skill), "run skill ID: each tensor is read from skill.ID.<name> where the file has one")
        ("blend", po::value(&flags.blend), "soft blend of skills \"a:0.7,b:0.3\": tensors are the weighted sums (f32)")
        ("moe-mask", po::value(&flags.moe_mask), "MoE routing restricted to the experts covering --moe-mask-cover of the selections counted in this stats file")
        ("moe-mask-cover", po::value(&flags.moe_cover)->default_value(flags.moe_cover), "share of the recorded routing the --moe-mask experts cover")
        // The cpu backend reads CMF_CPU_DECODE_COPY when the runtime starts,
        // which every command does after parsing its options.
        // (po::notify runs the notifiers in the options' name order:
        // decode-copy's before no-decode-copy's, which refuses the pair.)
        ("decode-copy", po::bool_switch()->notifier([](bool on) {
             if (on) ::setenv("CMF_CPU_DECODE_COPY", "1", 1);
             decode_copy_asked() = on;
         }),
         "copy every weight whose dtype has a faster decode layout into it when loading (q4_block: each row's "
         "scales after its nibbles, read as one stream), however much memory that takes; by default they are copied "
         "while the copies fit in half the memory available at start (docs/runtime.md; CMF_CPU_DECODE_COPY=1)")
        ("no-decode-copy", po::bool_switch()->notifier([](bool on) {
             if (on && decode_copy_asked()) throw po::error("--decode-copy and --no-decode-copy contradict each other");
             if (on) ::setenv("CMF_CPU_DECODE_COPY", "0", 1);
         }),
         "read every weight from the model file as it is stored: no decode copies (CMF_CPU_DECODE_COPY=0)");
}

void add_route_stats_option(boost::program_options::options_description &desc, SessionFlags &flags) {
    desc.add_options()("route-stats", boost::program_options::value(&flags.route_stats),
                       "write the mixture-of-experts routing statistics to FILE: {\"<layer>\":[count per expert],...}, "
                       "how often each expert was among a token's top-k (the CMF_MOE_STATS format expert pruning reads)");
}

namespace {
// Only options that are not the default, so that defaults run with any arch plugin.
std::string batch_arch_options(const cmf_model *m, const SessionFlags &flags) {
    std::string o;
    if (flags.kv_cache != "f32") o = "kv_cache=" + flags.kv_cache;
    if (model_has_mtp(m)) o += std::string(o.empty() ? "" : ",") + "mtp=off";
    return o;
}
}  // namespace

BatchPtr make_batch(cmf_runtime *rt, const cmf_model *m, cmf_batch_options bo, const SessionFlags &flags,
                    const std::string &what) {
    const std::string arch_options = batch_arch_options(m, flags);
    if (!arch_options.empty()) bo.arch_options = arch_options.c_str();
    bo.task = flags.task.c_str();
    bo.skill = flags.skill.c_str();
    bo.blend = flags.blend.c_str();
    bo.moe_mask = flags.moe_mask.c_str();
    bo.moe_mask_cover = flags.moe_cover;
    cmf_batch *b = nullptr;
    check(cmf_batch_create_for_model(rt, m, &bo, &b), what);
    return BatchPtr(b);
}

bool model_has_mtp(const cmf_model *m) {
    cmf_tensor_info ti;
    cmf_tensor_info_init(&ti);
    cmf_error *e = cmf_tensor(m, "model.mtp.eh_proj.weight", &ti);
    cmf_error_free(e);
    return e == nullptr;
}

void check_kv_cache_flag(const SessionFlags &flags) {
    if (flags.kv_cache != "f32" && flags.kv_cache != "f16" && flags.kv_cache != "q8")
        throw Failure("--kv-cache must be f32, f16 or q8, not '" + flags.kv_cache + "'", 2);
}

SessionPtr make_session(cmf_runtime *rt, const cmf_model *m, uint64_t n_ctx, const SessionFlags &flags) {
    check_kv_cache_flag(flags);
    if (flags.mtp != "on" && flags.mtp != "off") throw Failure("--mtp must be on or off, not '" + flags.mtp + "'", 2);
    cmf_session_options o;
    cmf_session_options_init(&o);
    o.n_ctx = n_ctx;
    if (flags.profile) o.flags |= CMF_SESSION_PROFILE;
    // The arch's model options (kv_cache=f16|q8, mtp=off), passed only when
    // they are not the default, so that defaults run with any arch plugin.
    std::string arch_options;
    if (flags.kv_cache != "f32") arch_options = "kv_cache=" + flags.kv_cache;
    if (flags.mtp == "off" && model_has_mtp(m)) arch_options += std::string(arch_options.empty() ? "" : ",") + "mtp=off";
    if (!arch_options.empty()) o.arch_options = arch_options.c_str();
    if (!flags.backend.empty()) o.backend = flags.backend.c_str();
    if (flags.skill == "auto" || flags.blend == "auto")
        throw Failure("--skill auto and --blend auto route a prompt: this command has none", 2);
    o.task = flags.task.c_str();
    o.skill = flags.skill.c_str();
    o.blend = flags.blend.c_str();
    o.moe_mask = flags.moe_mask.c_str();
    o.moe_mask_cover = flags.moe_cover;
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

void write_route_stats(cmf_session *s, const SessionFlags &flags) {
    if (flags.route_stats.empty()) return;
    char *json = nullptr;
    check(cmf_session_route_stats(s, &json), "routing statistics");
    const std::string text(json);
    cmf_string_free(json);
    const std::string tmp = flags.route_stats + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        out.close();
        if (!out) {
            std::error_code ec;
            std::filesystem::remove(tmp, ec);
            throw Failure("cannot write " + tmp, 1);
        }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, flags.route_stats, ec);
    if (ec) {
        std::filesystem::remove(tmp, ec);
        throw Failure("cannot write " + flags.route_stats + ": " + ec.message(), 1);
    }
    size_t layers = 0;
    for (char c : text) layers += c == '[';
    std::fprintf(stderr, "routing statistics -> %s (%zu MoE layers)\n", flags.route_stats.c_str(), layers);
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

RoutePtr route_text(cmf_runtime *rt, const cmf_model *m, const cmf_tokenizer *t, const std::string &text,
                    size_t max_tokens) {
    std::vector<int32_t> ids = encode(t, text, 0);
    if (max_tokens > 0 && ids.size() > max_tokens) ids.resize(max_tokens);
    if (ids.empty()) throw Failure("the text to route encodes to no tokens", 2);
    cmf_route *r = nullptr;
    check(cmf_route_prompt(rt, m, ids.data(), ids.size(), nullptr, &r), "route");
    return RoutePtr(r);
}

bool file_routes(const cmf_model *m) {
    cmf_model_info info;
    cmf_model_info_init(&info);
    check(cmf_model_get_info(m, &info), "model");
    if (info.skills_json == nullptr || *info.skills_json == '\0') return false;
    boost::json::error_code ec;
    boost::json::value v = boost::json::parse(info.skills_json, ec);
    if (ec || !v.is_array()) return false;
    for (const auto &s : v.as_array())
        if (s.is_object() && s.as_object().contains("selection")) return true;
    return false;
}

void resolve_routing(cmf_runtime *rt, const cmf_model *m, const cmf_tokenizer *t, const std::string &text,
                     SessionFlags &flags, bool route_by_default, size_t max_tokens) {
    if (flags.skill == "none" || flags.skill == "backbone") {
        flags.skill.clear();
        return;
    }
    const bool by_default = route_by_default && flags.skill.empty() && flags.blend.empty() && file_routes(m);
    if (flags.blend == "auto") {
        RoutePtr r = route_text(rt, m, t, text, max_tokens);
        char *spec = nullptr;
        check(cmf_route_auto_blend(r.get(), &spec), "blend auto");
        flags.blend = spec;
        cmf_string_free(spec);
        std::fprintf(stderr, "blend auto: %s\n", flags.blend.c_str());
    } else if (flags.skill == "auto" || by_default) {
        RoutePtr r = route_text(rt, m, t, text, max_tokens);
        cmf_route_score s;
        cmf_route_score_init(&s);
        check(cmf_route_score_at(r.get(), 0, &s), "route");
        flags.skill = s.id;
        std::fprintf(stderr, "routed to skill: %s (E = %.4f)\n", s.id, double(s.error));
    }
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
