// Gemma family converter hooks: gemma, gemma2, gemma3 (+ gemma3_text and
// the multimodal gemma3 wrapper, whose text part is under text_config and
// language_model.*). HF config -> arch block and tensor plans (docs/convert.md).
#pragma once

#include "../common/hf_arch.hpp"

namespace cmf::archs::gemma {

inline constexpr const char *kModelTypes = "gemma,gemma2,gemma3,gemma3_text";

std::string import_config(std::string_view hf_config_json);
std::vector<PlanEntry> import_tensor(const ArchView &arch, const std::string &hf_name, const Shape &shape);

}  // namespace cmf::archs::gemma
