// cmfhost tokenize / detokenize / render: the text side of cmf.h from the
// command line. The tokenizer (chat template) comes from a MODEL's own vocab
// section (header.tokenizer_config), or from --tokenizer tokenizer.json
// (--tokenizer-config tokenizer_config.json).
#include "cli.hpp"

#include <boost/json.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

namespace cmfhost {

namespace {

std::string read_file(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Failure("cannot open '" + path + "'");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

struct TokenizerDeleter {
    void operator()(cmf_tokenizer *t) const { cmf_tokenizer_free(t); }
};
using TokenizerPtr = std::unique_ptr<cmf_tokenizer, TokenizerDeleter>;

// An opened .cmf and the runtime it needs (codecs validate it on open).
struct OpenedModel {
    RuntimePtr rt;
    cmf_model *model = nullptr;
    explicit OpenedModel(const std::string &path) : rt(make_runtime(CommonOptions{})) {
        check(cmf_open(rt.get(), path.c_str(), nullptr, &model), path);
    }
    ~OpenedModel() { cmf_close(model); }
    OpenedModel(const OpenedModel &) = delete;
    OpenedModel &operator=(const OpenedModel &) = delete;
};

// The tokenizer of a model file (its vocab section) or of a tokenizer.json.
TokenizerPtr load_tokenizer(const std::string &path, const std::string &model = {}) {
    if (!model.empty()) {
        if (!path.empty()) throw Failure("give MODEL or --tokenizer, not both", 2);
        OpenedModel m(model);
        cmf_tokenizer *t = nullptr;
        check(cmf_model_tokenizer(m.model, &t), model);
        return TokenizerPtr(t);  // the tokenizer owns a copy of the JSON
    }
    if (path.empty()) throw Failure("give MODEL or --tokenizer tokenizer.json", 2);
    std::string json = read_file(path);
    cmf_tokenizer *t = nullptr;
    check(cmf_tokenizer_create(json.data(), json.size(), &t), path);
    return TokenizerPtr(t);
}

std::vector<int32_t> encode(const cmf_tokenizer *t, const std::string &text, bool special) {
    int32_t *ids = nullptr;
    size_t n = 0;
    check(cmf_tokenizer_encode(t, text.data(), text.size(), special ? CMF_ENCODE_ADD_SPECIAL : 0, &ids, &n));
    std::vector<int32_t> v(ids, ids + n);
    cmf_ids_free(ids);
    return v;
}

std::string take_string(char *s, size_t n) {
    std::string r(s, n);
    cmf_string_free(s);
    return r;
}

}  // namespace

int cmd_tokenize(const std::vector<std::string> &args) {
    std::string tokenizer, file, text;
    bool special = false, json = false;
    po::options_description desc("options");
    desc.add_options()
        ("tokenizer", po::value(&tokenizer), "HF tokenizer.json to use")
        ("file", po::value(&file), "JSON array of strings to encode; prints a JSON array of id arrays")
        ("special", po::bool_switch(&special), "add special tokens (HF add_special_tokens=True, e.g. Gemma's <bos>)")
        ("json", po::bool_switch(&json), "print {\"ids\": [...], \"pieces\": [...]}")
        ("inputs", po::value<std::vector<std::string>>(), "[MODEL] [TEXT] (positional)");
    po::positional_options_description pos;
    pos.add("inputs", -1);
    po::variables_map vm;
    if (!parse_args("tokenize", "(MODEL | --tokenizer tokenizer.json) (TEXT | --file strings.json) [--special] [--json]",
                    args, desc, pos, vm))
        return 0;
    std::vector<std::string> inputs;
    if (vm.count("inputs")) inputs = vm["inputs"].as<std::vector<std::string>>();
    std::string model;
    if (tokenizer.empty() && !inputs.empty()) {
        model = inputs.front();
        inputs.erase(inputs.begin());
    }
    if (inputs.size() > 1) throw Failure("give one TEXT (quote it)", 2);
    if (!inputs.empty()) {
        text = inputs.front();
        vm.insert({"text", po::variable_value(text, false)});
    }
    TokenizerPtr t = load_tokenizer(tokenizer, model);
    if (!file.empty()) {
        if (vm.count("text")) throw Failure("give TEXT or --file, not both", 2);
        boost::json::value v = parse_user_json(read_file(file), file);
        if (!v.is_array()) throw Failure(file + ": expected a JSON array of strings");
        boost::json::array out;
        for (const auto &s : v.as_array()) {
            if (!s.is_string()) throw Failure(file + ": expected a JSON array of strings");
            boost::json::array ids;
            for (int32_t id : encode(t.get(), std::string(s.as_string()), special)) ids.push_back(id);
            out.push_back(std::move(ids));
        }
        std::cout << boost::json::serialize(out) << "\n";
        return 0;
    }
    if (!vm.count("text")) throw Failure("give TEXT or --file", 2);
    std::vector<int32_t> ids = encode(t.get(), text, special);
    if (json) {
        boost::json::array jids, pieces;
        for (int32_t id : ids) {
            char *s = nullptr;
            size_t n = 0;
            check(cmf_tokenizer_id_to_token(t.get(), id, &s, &n));
            jids.push_back(id);
            pieces.push_back(boost::json::string(take_string(s, n)));
        }
        std::cout << boost::json::serialize(boost::json::object{{"ids", jids}, {"pieces", pieces}}) << "\n";
        return 0;
    }
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
    return 0;
}

int cmd_detokenize(const std::vector<std::string> &args) {
    std::string tokenizer;
    std::vector<std::string> idwords;
    bool skip = false;
    po::options_description desc("options");
    desc.add_options()
        ("tokenizer", po::value(&tokenizer), "HF tokenizer.json to use")
        ("skip-special", po::bool_switch(&skip), "drop special tokens")
        ("ids", po::value(&idwords)->multitoken(), "[MODEL] then token ids (positional; spaces or commas between them)");
    po::positional_options_description pos;
    pos.add("ids", -1);
    po::variables_map vm;
    if (!parse_args("detokenize", "(MODEL | --tokenizer tokenizer.json) [--skip-special] IDS...", args, desc, pos, vm))
        return 0;
    std::string model;
    if (tokenizer.empty() && !idwords.empty()) {
        model = idwords.front();
        idwords.erase(idwords.begin());
    }
    TokenizerPtr t = load_tokenizer(tokenizer, model);
    std::vector<int32_t> ids;
    for (auto w : idwords) {
        for (char &c : w)
            if (c == ',' || c == '[' || c == ']') c = ' ';
        std::istringstream ss(w);
        std::string tok;
        while (ss >> tok) {
            try {
                size_t used = 0;
                long v = std::stol(tok, &used);
                if (used != tok.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(tok);
                ids.push_back(int32_t(v));
            } catch (const std::exception &) {
                throw Failure("'" + tok + "' is not a token id", 2);
            }
        }
    }
    char *s = nullptr;
    size_t n = 0;
    check(cmf_tokenizer_decode(t.get(), ids.data(), ids.size(), skip ? CMF_DECODE_SKIP_SPECIAL : 0, &s, &n));
    std::cout << take_string(s, n) << "\n";
    return 0;
}

}  // namespace cmfhost

namespace cmfhost {

namespace {
boost::json::value parse_json_file(const std::string &path) { return parse_user_json(read_file(path), path); }

// tokenizer_config.json's chat_template: a string, or a list of {name, template}
// (HF picks "tool_use" when tools are given and it exists, else "default").
std::string pick_template(const boost::json::object &cfg, bool has_tools, const std::string &path) {
    auto it = cfg.find("chat_template");
    if (it == cfg.end() || it->value().is_null()) return {};  // ChatML fallback
    if (it->value().is_string()) return std::string(it->value().as_string());
    if (!it->value().is_array()) throw Failure(path + ": chat_template must be a string or a list");
    std::string dflt, tool_use;
    for (const auto &e : it->value().as_array()) {
        if (!e.is_object() || !e.as_object().contains("name") || !e.as_object().contains("template"))
            throw Failure(path + ": chat_template entries need 'name' and 'template'");
        std::string name(e.as_object().at("name").as_string()), tmpl(e.as_object().at("template").as_string());
        if (name == "default") dflt = tmpl;
        if (name == "tool_use") tool_use = tmpl;
    }
    if (has_tools && !tool_use.empty()) return tool_use;
    if (dflt.empty()) throw Failure(path + ": chat_template list has no 'default' entry");
    return dflt;
}
}  // namespace

int cmd_render(const std::vector<std::string> &args) {
    std::string config, messages, model;
    bool gen_prompt = false, thinking = false;
    long long now = -1;
    po::options_description desc("options");
    desc.add_options()
        ("tokenizer-config", po::value(&config), "HF tokenizer_config.json (chat_template, bos_token, eos_token, ...)")
        ("messages", po::value(&messages), "conversation: a JSON array of messages, or an object with 'messages' "
                                           "plus template variables (tools, enable_thinking, ...)")
        ("add-generation-prompt", po::bool_switch(&gen_prompt), "end with the assistant turn's opening")
        ("enable-thinking", po::bool_switch(&thinking), "set enable_thinking=true")
        ("now", po::value(&now), "unix time strftime_now formats (default: the current time)")
        ("model", po::value(&model), "a .cmf whose chat bundle to use (positional)");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("render", "(MODEL | --tokenizer-config tokenizer_config.json) --messages conv.json "
                              "[--add-generation-prompt] [--enable-thinking]",
                    args, desc, pos, vm))
        return 0;
    if (messages.empty()) throw Failure("--messages is required", 2);
    if (!model.empty()) {
        if (!config.empty()) throw Failure("give MODEL or --tokenizer-config, not both", 2);
        boost::json::value conv = parse_json_file(messages);
        boost::json::object ctx;
        if (conv.is_array()) ctx["messages"] = conv;
        else if (conv.is_object() && conv.as_object().contains("messages")) ctx = conv.as_object();
        else throw Failure(messages + ": expected an array of messages or an object with 'messages'");
        if (!ctx.contains("tools")) ctx["tools"] = nullptr;
        if (!ctx.contains("documents")) ctx["documents"] = nullptr;
        if (!ctx.contains("add_generation_prompt")) ctx["add_generation_prompt"] = false;
        if (gen_prompt) ctx["add_generation_prompt"] = true;
        if (thinking) ctx["enable_thinking"] = true;
        std::string ctx_json = boost::json::serialize(ctx);
        OpenedModel m(model);
        char *s = nullptr;
        size_t n = 0;
        check(cmf_model_render_chat(m.model, ctx_json.data(), ctx_json.size(), &s, &n));
        std::cout << take_string(s, n);
        std::cout.flush();
        return 0;
    }
    if (config.empty()) throw Failure("give MODEL or --tokenizer-config tokenizer_config.json", 2);
    boost::json::value cfgv = parse_json_file(config);
    if (!cfgv.is_object()) throw Failure(config + ": expected a JSON object");
    const auto &cfg = cfgv.as_object();
    boost::json::value conv = parse_json_file(messages);
    boost::json::object ctx;
    // HF passes the special tokens (strings, or AddedToken objects' content).
    for (const auto &kv : cfg) {
        std::string_view k = kv.key();
        if (k.size() < 6 || k.substr(k.size() - 6) != "_token") continue;
        if (kv.value().is_string()) ctx[k] = kv.value();
        else if (kv.value().is_object() && kv.value().as_object().contains("content"))
            ctx[k] = kv.value().as_object().at("content");
    }
    ctx["add_generation_prompt"] = false;
    if (conv.is_array()) ctx["messages"] = conv;
    else if (conv.is_object()) {
        if (!conv.as_object().contains("messages")) throw Failure(messages + ": the object has no 'messages'");
        for (const auto &kv : conv.as_object()) ctx[kv.key()] = kv.value();
    } else
        throw Failure(messages + ": expected an array of messages or an object with 'messages'");
    // HF always passes these two, None when absent.
    if (!ctx.contains("tools")) ctx["tools"] = nullptr;
    if (!ctx.contains("documents")) ctx["documents"] = nullptr;
    if (gen_prompt) ctx["add_generation_prompt"] = true;
    if (thinking) ctx["enable_thinking"] = true;
    bool has_tools = ctx.contains("tools") && !ctx.at("tools").is_null();
    std::string tmpl = pick_template(cfg, has_tools, config);
    std::string ctx_json = boost::json::serialize(ctx);
    cmf_chat_options opts;
    cmf_chat_options_init(&opts);
    opts.now_unix = now;
    char *s = nullptr;
    size_t n = 0;
    check(cmf_chat_render(tmpl.data(), tmpl.size(), ctx_json.data(), ctx_json.size(), &opts, &s, &n));
    std::cout << take_string(s, n);
    std::cout.flush();
    return 0;
}

}  // namespace cmfhost
