// cmfhost tokenize / detokenize / render: the text side of cmf.h from the
// command line. Today the tokenizer comes from --tokenizer (tokenizer.json);
// a MODEL positional (the file's own tokenizer section) joins once the
// container lands, so the options are kept apart from the inputs.
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

TokenizerPtr load_tokenizer(const std::string &path) {
    if (path.empty()) throw Failure("--tokenizer tokenizer.json is required", 2);
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
        ("text", po::value(&text), "the text to encode (positional)");
    po::positional_options_description pos;
    pos.add("text", 1);
    po::variables_map vm;
    if (!parse_args("tokenize", "--tokenizer tokenizer.json (TEXT | --file strings.json) [--special] [--json]", args,
                    desc, pos, vm))
        return 0;
    TokenizerPtr t = load_tokenizer(tokenizer);
    if (!file.empty()) {
        if (vm.count("text")) throw Failure("give TEXT or --file, not both", 2);
        boost::json::value v;
        try {
            v = boost::json::parse(read_file(file));
        } catch (const std::exception &e) {
            throw Failure(file + ": not valid JSON: " + e.what());
        }
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
        ("ids", po::value(&idwords)->multitoken(), "token ids (positional; spaces or commas between them)");
    po::positional_options_description pos;
    pos.add("ids", -1);
    po::variables_map vm;
    if (!parse_args("detokenize", "--tokenizer tokenizer.json [--skip-special] IDS...", args, desc, pos, vm)) return 0;
    TokenizerPtr t = load_tokenizer(tokenizer);
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
