// cmfhost explain: why a prompt goes where it goes, without generating:
// every skill's reconstruction error (and those that cannot route, with the
// reason), the margin between the first two, the novelty verdict, then the
// first-token distribution of the model the prompt is routed to.
#include "session_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace cmfhost {

int cmd_explain(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string model, prompt;
    size_t top = 5;
    po::options_description desc("options");
    desc.add_options()
        ("model", po::value(&model)->required(), "model file (.cmf)")
        ("prompt,p", po::value(&prompt)->required(), "the prompt (plain text, no chat template)")
        ("top", po::value(&top)->default_value(top), "first-token candidates to show");
    add_common_options(desc, common);
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("explain", "MODEL -p TEXT [--top 5]", args, desc, pos, vm)) return 0;
    auto rt = make_runtime(common);
    auto m = open_model(rt.get(), model);
    auto tok = model_tokenizer(m.get());
    std::vector<int32_t> ids = encode(tok.get(), prompt, 0);
    if (ids.empty()) throw Failure("empty prompt: nothing to explain", 2);
    std::printf("explain: %s\nprompt: %zu tokens\n", model.c_str(), ids.size());
    SessionFlags flags("f32");
    cmf_route *raw = nullptr;
    cmf_error *e = cmf_route_prompt(rt.get(), m.get(), ids.data(), ids.size(), nullptr, &raw);
    if (e != nullptr && cmf_error_code(e) == CMF_ERR_NOT_FOUND) {
        std::printf("\nrouting: none (%s): the backbone answers\n", cmf_error_message(e));
        cmf_error_free(e);
    } else {
        check(e, "route");
        RoutePtr r(raw);
        cmf_route_info info;
        cmf_route_info_init(&info);
        check(cmf_route_get_info(r.get(), &info), "route");
        std::printf("\nrouting (recon-argmin, E = |r - BB^T r|^2 / |phi|^2, lower is closer):\n");
        std::vector<cmf_route_score> scores(info.score_count);
        float emax = 1e-6f;
        for (uint64_t i = 0; i < info.score_count; ++i) {
            cmf_route_score_init(&scores[i]);
            check(cmf_route_score_at(r.get(), i, &scores[i]), "route");
            emax = std::max(emax, scores[i].error);
        }
        for (uint64_t i = 0; i < info.score_count; ++i) {
            const auto &s = scores[i];
            const int fill = int(std::lround((1.0 - double(s.error) / double(emax)) * 20));
            std::string bar;
            for (int k = 0; k < fill; ++k) bar += "\u2588";
            std::printf("  %-16s E = %.4f  err = %.3e", s.id, double(s.error), double(s.raw_error));
            if (info.calibrated) std::printf("  p = %.3f", double(s.probability));
            std::printf("  %s%s\n", bar.c_str(), i == 0 ? "  <- chosen" : "");
        }
        for (uint64_t i = 0; i < info.skipped_count; ++i) {
            const char *id = nullptr, *why = nullptr;
            check(cmf_route_skipped_at(r.get(), i, &id, &why), "route");
            std::printf("  %-16s cannot route: %s\n", id, why);
        }
        // The margin and novelty: the file's calibrated recipe, or E's own
        // margin and the fixed threshold without calibration.
        if (info.calibrated) {
            std::printf("margin %.4f (1/(1+e) units)  confidence %.3f  novelty %.3f \u2192 %s\n", double(info.margin),
                        double(info.confidence), double(info.novelty), info.is_novel ? "out of scope (novel)" : "in scope");
        } else {
            const double margin = scores.size() > 1 ? double(scores[1].error - scores[0].error) : double(scores[0].error);
            std::printf("margin %.4f (E of the second minus the first)  novelty: uncalibrated file, E_min %.4f vs "
                        "\u03c4 %g \u2192 %s\n",
                        margin, double(scores[0].error), double(info.tau), info.is_novel ? "out of scope (novel)" : "in scope");
        }
        flags.skill = scores[0].id;
    }
    // The first token the routed model would emit.
    auto s = make_session(rt.get(), m.get(), ids.size() + 1, flags);
    const uint64_t V = cmf_session_vocab_size(s.get());
    std::vector<float> logits(V);
    check(cmf_session_eval(s.get(), ids.data(), ids.size(), CMF_LOGITS_LAST, logits.data(), logits.size()), "eval");
    const float mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (float l : logits) z += std::exp(double(l - mx));
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    top = std::min<size_t>(top, V);
    std::partial_sort(order.begin(), order.begin() + long(top), order.end(),
                      [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    std::printf("\nfirst token (%s):\n", flags.skill.empty() ? "backbone" : ("skill " + flags.skill).c_str());
    for (size_t i = 0; i < top; ++i) {
        char *piece = nullptr;
        size_t n = 0;
        check(cmf_tokenizer_decode(tok.get(), &order[i], 1, 0, &piece, &n), "decode");
        std::printf("  %6d  p = %.4f  %s\n", order[i], std::exp(double(logits[size_t(order[i])] - mx)) / z, piece);
        cmf_string_free(piece);
    }
    return 0;
}

}  // namespace cmfhost
