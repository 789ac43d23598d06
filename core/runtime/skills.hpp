// The skill registry of a CMF file (header "skills", spec §9) as the
// runtime uses it: ids, the tensors each skill replaces, the selection
// descriptors that route a prompt to a skill (recon-argmin over affine
// subspaces of a hidden state) and the file's routing calibration.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cmf::container { class Model; }

namespace cmf::runtime {

struct SelectionDescriptor {
    std::string metric;           // "mse" or "mse_unit"
    uint64_t phi_layer = 0;       // phi = mean over the prompt of the residual after layer phi_layer
    uint64_t rank = 0;
    std::vector<float> mean;      // hidden
    std::vector<float> basis;     // rank x hidden, orthonormal rows
    std::optional<float> err_mean, err_std;
};

struct SkillRecord {
    std::string id, name;
    std::vector<uint64_t> layers;
    std::optional<SelectionDescriptor> selection;
    std::string selection_problem;  // why `selection` is absent though the record has one ("" if fine)
    std::string base_dir_hash;      // skill files only
    std::string json;               // the record as stored (minified)
};

struct RoutingCalibration {
    float temperature = 1, novelty_theta = 0.5f, target_fpr = 0.05f;
    uint64_t samples = 0;
};

struct Registry {
    std::vector<SkillRecord> skills;
    std::optional<RoutingCalibration> routing;
    const SkillRecord *find(const std::string &id) const;
    std::string ids() const;  // "a, b, c" (or "none")
};

// The registry of an opened model; descriptors are decoded (base64 f16) and
// checked against hidden_size: a malformed one is kept as selection_problem.
Registry read_registry(const cmf::container::Model &m);

// [A-Za-z0-9_-]+, as the original's tools enforce for skill ids.
bool valid_skill_id(const std::string &id);

// base64 (standard alphabet, padded) of little-endian f16 values, and back.
std::string encode_f16_base64(const std::vector<float> &v);
std::vector<float> decode_f16_base64(const std::string &b64, const std::string &what);

}  // namespace cmf::runtime
