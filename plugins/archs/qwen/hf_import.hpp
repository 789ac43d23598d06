// Qwen family converter hooks: qwen2, qwen3, qwen2_moe, qwen3_moe,
// qwen3_next, qwen3_5 (+ _text, _moe wrappers). HF config -> arch block and
// HF tensor -> CMF tensor plan (docs/convert.md).
#pragma once

#include "../common/hf_arch.hpp"

namespace cmf::archs::qwen {

// Comma-separated, as registered in cmf_arch_vt.
inline constexpr const char *kModelTypes =
    "qwen2,qwen3,qwen2_moe,qwen3_moe,qwen3_next,qwen3_5,qwen3_5_text,qwen3_5_moe,qwen3_5_moe_text";

std::string import_config(std::string_view hf_config_json);
std::vector<PlanEntry> import_tensor(const ArchView &arch, const std::string &hf_name, const Shape &shape);

}  // namespace cmf::archs::qwen
