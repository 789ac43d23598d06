// Replacing the values of tensors of an existing .cmf (the original's
// `patch-tensor`): each given tensor is encoded from f32 with its own dtype
// (or one named dtype) and either rewritten in its slot in place, when every
// new payload fits (container/in_place.hpp: journaled, crash-safe), or
// written with everything else copied byte for byte into a new file
// (temp + rename).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cmf { class Runtime; }

namespace cmf::convert {

struct PatchValues {
    std::string name;
    const float *values = nullptr;  // row-major, one per element of the tensor
    uint64_t count = 0;
};

struct PatchOptions {
    std::string model;
    std::string output;  // "" = in place
    std::string dtype;   // "" = each tensor's own dtype; else a --quant name
};

void patch_tensors(Runtime &rt, const PatchOptions &opts, const std::vector<PatchValues> &patches);

}  // namespace cmf::convert
