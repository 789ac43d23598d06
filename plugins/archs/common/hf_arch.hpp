// Shared by the arch plugins' converter hooks: HF config.json -> CMF header
// `arch` block (spec §2, as the original converter fills it; docs/convert.md) and the per-tensor plan
// machinery (docs/convert.md). The family plugins (qwen/, gemma/) decide
// which model types they accept and add their own tensor rules.
//
// Everything here throws cmf::sdk::Error; the plugin glue turns that into a
// host error.
#pragma once

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cmf::archs {

// HF config.json -> the `arch` JSON object, spelled as the original
// converter writes it (its struct declaration order, serde float spelling).
std::string build_arch_json(std::string_view hf_config_json);

// The parts of an `arch` block the tensor planner checks shapes against.
struct ArchView {
    std::string arch_name;
    uint64_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
    std::vector<std::string> layer_types;
    bool tie = false;
    uint64_t mtp_layers = 0;
    // moe (num_experts == 0: none)
    uint64_t num_experts = 0, moe_intermediate = 0, shared_intermediate = 0;
    // gated delta net
    uint64_t lin_conv_k = 0, lin_nk = 0, lin_nv = 0, lin_dk = 0, lin_dv = 0;
};
ArchView parse_arch(std::string_view arch_json);

// One CMF tensor produced from one source tensor.
struct PlanEntry {
    std::string name;
    std::vector<uint64_t> shape;
    std::optional<uint64_t> index;   // take this slab along dim 0 of a >= 3-D source
    bool transpose = false;          // transpose the (2-D) slab
    std::vector<std::pair<uint64_t, uint64_t>> rows;  // (first, count) row ranges; empty = all rows
};
std::string plan_to_json(const std::vector<PlanEntry> &plan);

using Shape = std::vector<uint64_t>;

[[noreturn]] void shape_error(const std::string &name, const Shape &got, const std::string &want);
std::string shape_str(const Shape &s);

// Canonical renames shared by all families (multimodal wrappers, MTP
// spellings). Returns "" when the tensor is dropped (vision towers, rotary
// buffers).
std::string canonical_name(const ArchView &a, const std::string &hf_name);

// The generic planner: renames, shape checks of every known role, fused
// expert banks split per expert. Families call it after handling their own
// special tensors.
std::vector<PlanEntry> plan_tensor(const ArchView &a, const std::string &hf_name, const Shape &shape);

// A whole tensor kept as is under `name` (after shape checks).
PlanEntry keep(const std::string &name, const Shape &shape);

// Glue for cmf_arch_vt.import_config / import_tensor.
cmf_error *import_config_hook(const cmf_host_api *host, const char *json, size_t len, const cmf_byte_sink *out,
                              std::string (*fn)(std::string_view));
cmf_error *import_tensor_hook(const cmf_host_api *host, const char *arch_json, size_t arch_len, const char *hf_name,
                              uint32_t ndim, const uint64_t *shape, const cmf_byte_sink *out,
                              std::vector<PlanEntry> (*fn)(const ArchView &, const std::string &, const Shape &));

}  // namespace cmf::archs
