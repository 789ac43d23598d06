// cmfhost logits: f32 logits of every prompt position (positions x vocab,
// row-major, little-endian as in memory) from an empty context.
#include "session_util.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace cmfhost {

int cmd_logits(const std::vector<std::string> &args) {
    CommonOptions common;
    SessionFlags session_flags("f32");
    session_flags.mtp = "off";
    std::string model, prompt, ids_arg, out;
    bool raw = false;
    po::options_description desc("options");
    desc.add_options()
        ("model", po::value(&model), "model file (.cmf); default: <prefix>/share/cmf/models/default.cmf")
        ("prompt,p", po::value(&prompt), "text (one user turn through the chat template unless --raw)")
        ("ids", po::value(&ids_arg), "token ids instead of text, e.g. 1,2,3")
        ("raw", po::bool_switch(&raw), "tokenize -p as plain text (no chat template)")
        ("out,o", po::value(&out)->required(), "output file: positions x vocab f32");
    add_common_options(desc, common);
    add_session_options(desc, session_flags);
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("logits", "[MODEL] (-p TEXT | --ids 1,2,3) --out logits.f32 [--raw]", args, desc, pos, vm)) return 0;
    if (vm.count("prompt") == vm.count("ids")) throw Failure("give exactly one of -p TEXT or --ids 1,2,3", 2);

    model = resolve_model(model);
    auto rt = make_runtime(common);
    auto m = open_model(rt.get(), model);
    std::vector<int32_t> ids;
    if (vm.count("ids")) {
        ids = parse_ids(ids_arg);
    } else {
        auto tok = model_tokenizer(m.get());
        ids = raw ? encode(tok.get(), prompt, CMF_ENCODE_ADD_SPECIAL)
                  : encode(tok.get(), render_chat(m.get(), {{"user", prompt}}), 0);
    }
    if (ids.empty()) throw Failure("no tokens to evaluate", 2);
    auto s = make_session(rt.get(), m.get(), ids.size(), session_flags);
    const uint64_t V = cmf_session_vocab_size(s.get());
    std::vector<float> logits(ids.size() * V);
    check(cmf_session_eval(s.get(), ids.data(), ids.size(), CMF_LOGITS_ALL, logits.data(), logits.size()), "eval");
    // Temp file + rename: a failed write never leaves a truncated output.
    const std::string tmp = out + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char *>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
        f.close();
        if (!f) {
            std::filesystem::remove(tmp);
            throw Failure("cannot write " + out, 1);
        }
    }
    std::filesystem::rename(tmp, out);
    std::fprintf(stderr, "wrote %zu positions x %llu vocab f32 to %s\n", ids.size(), static_cast<unsigned long long>(V),
                 out.c_str());
    return 0;
}

}  // namespace cmfhost
