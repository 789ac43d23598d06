// Routing a prompt to a skill (spec §9): recon-argmin over the selection
// descriptors of the file's skill registry. phi = the mean over the prompt
// of the backbone's residual stream after layer phi_layer (unit-normalised
// for metric "mse_unit"); each skill's error is phi's squared distance to
// its affine subspace, e = max(|r|^2 - sum_k (b_k . r)^2, 0) with
// r = phi - mean, normalised E = e / max(|phi|^2, 1e-12). Without the
// file's routing calibration the winner is the smallest E and the prompt is
// novel when E_min > tau (0.30); with it, probabilities softmax(-e / T),
// the leader margin in 1/(1+e) units and a novelty score (the winner's
// error as a z-score against its own, the margin, the confidence) compared
// with novelty_theta, as the original computes them.
#pragma once

#include "runtime/skills.hpp"

#include <cmf/cmf.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace cmf { class Runtime; }

namespace cmf::runtime {

struct SkillScore {
    std::string id;
    float error = 0;        // E, normalised
    float raw_error = 0;    // e
    float probability = 0;  // 0 without calibration
};

struct Routing {
    std::vector<SkillScore> scores;  // best first
    std::vector<std::pair<std::string, std::string>> skipped;  // (id, why) of skills that cannot route
    float confidence = 0, margin = 0, novelty = 0;  // novelty NaN without calibration
    bool is_novel = true, calibrated = false;
    float tau = 0.30f;
};

// The decision from per-skill rows (id, e, err_mean, err_std, |phi|^2).
struct ErrorRow {
    std::string id;
    float e = 0;
    std::optional<float> err_mean, err_std;
    float phi_sq = 0;
};
Routing decide(const std::vector<ErrorRow> &rows, const std::optional<RoutingCalibration> &calib, float tau);

// e of phi against a descriptor (phi already unit-normalised for mse_unit).
float reconstruction_error(const std::vector<float> &phi, const SelectionDescriptor &d);

// Routes `tokens` over the registry of `m`: one backbone session probes
// each distinct phi_layer. Throws CMF_ERR_INVALID_ARGUMENT without tokens,
// CMF_ERR_NOT_FOUND when no skill has a usable descriptor.
Routing route(Runtime &rt, const cmf_model *m, std::span<const int32_t> tokens, float tau = 0.30f);

// "auto" blend weights: the two best routes, w proportional to exp(-E / 0.4), as "id:w,id:w".
std::string auto_blend(const Routing &r);

}  // namespace cmf::runtime
