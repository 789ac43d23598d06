// cmfhost route: which skill of the file a prompt goes to, as the
// original's `route` prints it: each routable skill's error E (and, with the
// file's calibration, its raw error and probability), then the winner.
#include "session_util.hpp"

#include <cmath>
#include <cstdio>

namespace cmfhost {

int cmd_route(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string model, prompt;
    float tau = 0.30f;
    po::options_description desc("options");
    desc.add_options()
        ("model", po::value(&model)->required(), "model file (.cmf) with skills")
        ("prompt,p", po::value(&prompt)->required(), "the prompt (plain text, no chat template)")
        ("tau", po::value(&tau)->default_value(tau), "files without a routing calibration: novel when the best E exceeds this");
    add_common_options(desc, common);
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("route", "MODEL -p TEXT [--tau 0.3]", args, desc, pos, vm)) return 0;
    auto rt = make_runtime(common);
    auto m = open_model(rt.get(), model);
    auto tok = model_tokenizer(m.get());
    std::vector<int32_t> ids = encode(tok.get(), prompt, 0);
    if (ids.empty()) throw Failure("the prompt encodes to no tokens", 2);
    cmf_route_options o;
    cmf_route_options_init(&o);
    o.novelty_tau = tau;
    cmf_route *raw = nullptr;
    cmf_error *e = cmf_route_prompt(rt.get(), m.get(), ids.data(), ids.size(), &o, &raw);
    if (e != nullptr && cmf_error_code(e) == CMF_ERR_NOT_FOUND) {
        std::printf("no routable skills in this container (%s)\n", cmf_error_message(e));
        cmf_error_free(e);
        return 0;
    }
    check(e, "route");
    RoutePtr r(raw);
    cmf_route_info info;
    cmf_route_info_init(&info);
    check(cmf_route_get_info(r.get(), &info), "route");
    for (uint64_t i = 0; i < info.score_count; ++i) {
        cmf_route_score s;
        cmf_route_score_init(&s);
        check(cmf_route_score_at(r.get(), i, &s), "route");
        if (info.calibrated)
            std::printf("  %-20s E = %.4f  err = %.3e  p = %.3f\n", s.id, double(s.error), double(s.raw_error),
                        double(s.probability));
        else
            std::printf("  %-20s E = %.4f\n", s.id, double(s.error));
    }
    cmf_route_score best;
    cmf_route_score_init(&best);
    check(cmf_route_score_at(r.get(), 0, &best), "route");
    if (info.calibrated)
        std::printf("winner: %s  confidence %.3f  margin %.3f  novelty %.3f \u2192 %s\n", best.id, double(info.confidence),
                    double(info.margin), double(info.novelty), info.is_novel ? "OOD (novel)" : "in-scope");
    else
        std::printf("winner: %s  (%s; uncalibrated file: E_min vs \u03c4=%g)\n", best.id, info.is_novel ? "OOD" : "in-scope",
                    double(info.tau));
    return 0;
}

}  // namespace cmfhost
