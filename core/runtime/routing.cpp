#include "runtime/routing.hpp"

#include "common/error.hpp"
#include "container/model.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/container_source.hpp"
#include "runtime/session.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

namespace cmf::runtime {

namespace {

// The original's novelty ensemble: weights and the margin's sharpness.
constexpr float kNoveltyEnergy = 0.5f, kNoveltyMargin = 0.25f, kNoveltyConf = 0.25f, kMarginK = 8.0f;

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void softmax(std::vector<float> &v) {
    if (v.empty()) return;
    const float mx = *std::max_element(v.begin(), v.end());
    float s = 0;
    for (float &x : v) s += (x = std::exp(x - mx));
    for (float &x : v) x /= std::max(s, 1e-30f);
}

}  // namespace

float reconstruction_error(const std::vector<float> &phi, const SelectionDescriptor &d) {
    const size_t hidden = phi.size();
    std::vector<float> r(hidden);
    float rr = 0;
    for (size_t i = 0; i < hidden; ++i) {
        r[i] = phi[i] - d.mean[i];
        rr += r[i] * r[i];
    }
    float proj = 0;
    for (uint64_t k = 0; k < d.rank; ++k) {
        const float *b = d.basis.data() + k * hidden;
        float c = 0;
        for (size_t i = 0; i < hidden; ++i) c += b[i] * r[i];
        proj += c * c;
    }
    return std::max(rr - proj, 0.0f);
}

Routing decide(const std::vector<ErrorRow> &rows, const std::optional<RoutingCalibration> &calib, float tau) {
    Routing out;
    out.tau = tau;
    out.calibrated = calib.has_value();
    std::vector<size_t> idx(rows.size());
    std::iota(idx.begin(), idx.end(), size_t(0));
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return rows[a].e < rows[b].e; });
    for (size_t i : idx) out.scores.push_back({rows[i].id, rows[i].e / std::max(rows[i].phi_sq, 1e-12f), rows[i].e, 0});
    if (out.scores.empty()) {
        out.novelty = 1;
        out.is_novel = true;
        return out;
    }
    if (!calib) {
        out.novelty = std::nanf("");
        out.is_novel = out.scores[0].error > tau;
        return out;
    }
    std::vector<float> logits;
    for (size_t i : idx) logits.push_back(-rows[i].e / std::max(calib->temperature, 1e-3f));
    softmax(logits);
    for (size_t k = 0; k < out.scores.size(); ++k) out.scores[k].probability = logits[k];
    out.confidence = logits[0];
    auto inv = [](float e) { return 1.0f / (1.0f + e); };
    const ErrorRow &top = rows[idx[0]];
    out.margin = idx.size() > 1 ? inv(top.e) - inv(rows[idx[1]].e) : inv(top.e);
    const float em = top.err_mean.value_or(0.0f), es = std::max(top.err_std.value_or(1.0f), 1e-4f);
    const float z = (top.e - em) / es;
    out.novelty = kNoveltyEnergy * sigmoid(z) + kNoveltyMargin / (1.0f + out.margin * kMarginK) +
                  kNoveltyConf * (1.0f - out.confidence);
    out.is_novel = out.novelty > calib->novelty_theta;
    return out;
}

Routing route(Runtime &rt, const cmf_model *cm, std::span<const int32_t> tokens, float tau) {
    if (cm == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "route: NULL model");
    if (tokens.empty()) throw Error(CMF_ERR_INVALID_ARGUMENT, "route: the prompt has no tokens");
    const cmf::container::Model &m = *cm;
    const Registry reg = read_registry(m);
    const auto &arch = m.header().arch;
    const uint64_t visits = arch.num_layers * std::max<uint64_t>(arch.num_loops, 1);
    std::vector<std::pair<std::string, std::string>> skipped;
    std::map<uint64_t, std::vector<const SkillRecord *>> by_layer;
    for (const auto &s : reg.skills) {
        if (!s.selection) {
            skipped.emplace_back(s.id, s.selection_problem.empty() ? "no selection descriptor"
                                                                   : "selection: " + s.selection_problem);
        } else if (s.selection->phi_layer >= visits) {
            skipped.emplace_back(s.id, "selection: phi_layer " + std::to_string(s.selection->phi_layer) +
                                           " beyond the model's " + std::to_string(visits) + " layers");
        } else {
            by_layer[s.selection->phi_layer].push_back(&s);
        }
    }
    if (by_layer.empty())
        throw Error(CMF_ERR_NOT_FOUND, reg.skills.empty() ? "route: the file has no skills"
                                                          : "route: no skill of the file has a usable selection descriptor");
    // The backbone, probed once per phi layer.
    auto src = make_container_source(cm);
    SessionConfig cfg;
    cfg.n_ctx = tokens.size();
    Session probe(rt, *src, cfg);
    std::vector<ErrorRow> rows;
    for (const auto &[layer, skills] : by_layer) {
        const std::vector<float> phi = probe.probe(tokens, layer + 1, arch.hidden_size);
        for (const SkillRecord *s : skills) {
            std::vector<float> p = phi;
            if (s->selection->metric == "mse_unit") {
                float n = 0;
                for (float x : p) n += x * x;
                n = std::max(std::sqrt(n), 1e-12f);
                for (float &x : p) x /= n;
            }
            float phi_sq = 0;
            for (float x : p) phi_sq += x * x;
            rows.push_back({s->id, reconstruction_error(p, *s->selection), s->selection->err_mean, s->selection->err_std,
                            phi_sq});
        }
    }
    Routing r = decide(rows, reg.routing, tau);
    r.skipped = std::move(skipped);
    return r;
}

std::string auto_blend(const Routing &r) {
    if (r.scores.size() < 2) throw Error(CMF_ERR_NOT_FOUND, "blend auto needs at least 2 routable skills");
    constexpr float kT = 0.4f;
    const float mx = -r.scores[0].error / kT;
    const float w0 = 1.0f, w1 = std::exp(-r.scores[1].error / kT - mx);
    char buf[64];
    std::string out;
    std::snprintf(buf, sizeof buf, ":%.6g,", double(w0 / (w0 + w1)));
    out += r.scores[0].id + buf;
    std::snprintf(buf, sizeof buf, ":%.6g", double(w1 / (w0 + w1)));
    out += r.scores[1].id + buf;
    return out;
}

}  // namespace cmf::runtime
