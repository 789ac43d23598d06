// cmfhost ppl: teacher-forced perplexity of a text file, in windows of --ctx
// tokens each evaluated from an empty context (token 0 of a window is not
// scored, as in core's runtime::perplexity).
#include "session_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace cmfhost {

int cmd_ppl(const std::vector<std::string> &args) {
    CommonOptions common;
    SessionFlags session_flags("f32");
    session_flags.mtp = "off";
    std::string model, file;
    uint64_t n_ctx = 512;
    po::options_description desc("options");
    desc.add_options()
        ("model", po::value(&model), "model file (.cmf); default: <prefix>/share/cmf/models/default.cmf")
        ("file,f", po::value(&file)->required(), "UTF-8 text file to score")
        ("ctx", po::value(&n_ctx)->default_value(512), "window length in tokens");
    add_common_options(desc, common);
    add_session_options(desc, session_flags);
    add_route_stats_option(desc, session_flags);
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("ppl", "[MODEL] --file TEXT [--ctx 512]", args, desc, pos, vm)) return 0;
    if (n_ctx < 2) throw Failure("--ctx must be at least 2", 2);
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Failure("cannot read " + file, 1);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();

    model = resolve_model(model);
    auto rt = make_runtime(common);
    auto m = open_model(rt.get(), model);
    auto tok = model_tokenizer(m.get());
    auto tokens = encode(tok.get(), text, 0);
    if (tokens.size() < 2) throw Failure(file + ": needs at least 2 tokens, has " + std::to_string(tokens.size()), 1);
    // --skill auto / --blend auto route the text's first 128 tokens.
    resolve_routing(rt.get(), m.get(), tok.get(), text, session_flags, false, 128);
    auto s = make_session(rt.get(), m.get(), n_ctx, session_flags);
    const uint64_t window = std::min<uint64_t>(n_ctx, cmf_session_n_ctx(s.get()));
    const uint64_t V = cmf_session_vocab_size(s.get());
    std::vector<float> logits;
    double nll = 0;
    uint64_t count = 0;
    for (size_t w0 = 0; w0 + 1 < tokens.size(); w0 += window) {
        size_t n = std::min<size_t>(window, tokens.size() - w0);
        if (n < 2) break;
        check(cmf_session_reset(s.get()), "session");
        logits.assign(n * V, 0.0f);
        check(cmf_session_eval(s.get(), tokens.data() + w0, n, CMF_LOGITS_ALL, logits.data(), logits.size()), "eval");
        for (size_t i = 0; i + 1 < n; ++i) {
            const float *l = logits.data() + i * V;
            double mx = *std::max_element(l, l + V);
            double z = 0;
            for (uint64_t j = 0; j < V; ++j) z += std::exp(double(l[j]) - mx);
            nll += std::log(z) + mx - l[tokens[w0 + i + 1]];
            ++count;
        }
    }
    const double ppl = std::exp(nll / double(count));
    write_route_stats(s.get(), session_flags);
    std::printf("perplexity %.6f over %llu scored tokens (%zu tokens, windows of %llu)\n", ppl,
                static_cast<unsigned long long>(count), tokens.size(), static_cast<unsigned long long>(window));
    return 0;
}

}  // namespace cmfhost
