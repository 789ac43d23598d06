#include "policy.hpp"

#include "dtype.hpp"

#include <array>

namespace cmf::codecs {

namespace {

bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// Tensors the original converter keeps in f16 even when they are 2-D.
bool keep_f16(std::string_view name) {
    static constexpr std::array<std::string_view, 6> kSuffixes = {
        "linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight", "mlp.gate.weight",
        "shared_expert_gate.weight",    "self_attn.g_proj.weight",      "_conv1d.weight"};
    for (auto s : kSuffixes)
        if (ends_with(name, s)) return true;
    if (ends_with(name, "conv1d.weight")) return true;
    static constexpr std::array<std::string_view, 5> kKda = {"f_a_proj", "f_b_proj", "b_proj", "g_a_proj", "g_b_proj"};
    for (auto s : kKda)
        if (contains(name, std::string(".") + std::string(s) + ".")) return true;
    static constexpr std::array<std::string_view, 3> kGemma3n = {"altup", "laurel", "per_layer_input_gate"};
    for (auto s : kGemma3n)
        if (contains(name, s)) return true;
    return false;
}

bool is_gate_or_up(std::string_view name) {
    return contains(name, "gate_proj") || contains(name, "up_proj") || contains(name, "w1") || contains(name, "w3");
}

}  // namespace

DtypeChoice choose_dtype(std::string_view name, std::span<const uint64_t> shape, std::string_view q) {
    struct Named {
        std::string_view name;
        int32_t dtype;
        const char *options;
        bool needs_groups;  // falls back to q8_2f when cols % 32 != 0
    };
    static constexpr std::array<Named, 19> kNames = {{
        {"q8", CMF_DTYPE_Q8_ROW, "", false},        {"q8_row", CMF_DTYPE_Q8_ROW, "", false},
        {"q8_2f", CMF_DTYPE_Q8_2F, "", false},      {"q82f", CMF_DTYPE_Q8_2F, "", false},
        {"q8f", CMF_DTYPE_Q8_2F, "", false},        {"q4", CMF_DTYPE_Q4_BLOCK, "", false},
        {"q4_block", CMF_DTYPE_Q4_BLOCK, "", false}, {"q4t", CMF_DTYPE_Q4_TILED, "", true},
        {"q4_tiled", CMF_DTYPE_Q4_TILED, "", true}, {"q4tp", CMF_DTYPE_Q4TP, "", true},
        {"q2tp", CMF_DTYPE_Q2TP, "", true},         {"f16", CMF_DTYPE_F16, "", false},
        {"fp16", CMF_DTYPE_F16, "", false},         {"vbit", CMF_DTYPE_VBIT_RO, "", true},
        {"q1", CMF_DTYPE_Q1, "", true},             {"q1p", CMF_DTYPE_Q1, "error_diffusion=1", true},
        {"q1s", CMF_DTYPE_Q1S, "", true},           {"q1t", CMF_DTYPE_Q1T, "", true},
        {"f32", CMF_DTYPE_F32, "", false},
    }};
    const Named *pick = nullptr;
    for (const auto &n : kNames)
        if (n.name == q) pick = &n;
    if (!pick) fail(CMF_ERR_INVALID_ARGUMENT, "unknown --quant '" + std::string(q) + "'");
    if (ends_with(name, ".tid2eid")) return {CMF_DTYPE_F32, ""};
    uint64_t n = elements(shape);
    if (shape.size() != 2 || n < 32 || keep_f16(name)) return {CMF_DTYPE_F16, ""};
    if (pick->needs_groups && shape[1] % 32 != 0) return {CMF_DTYPE_Q8_2F, ""};
    if (pick->dtype == CMF_DTYPE_Q2TP && !is_gate_or_up(name)) return {CMF_DTYPE_Q4TP, ""};
    return {pick->dtype, pick->options};
}

const char *quant_type_label(std::string_view q) {
    if (q == "q8" || q == "q8_row") return "Q8_ROW";
    if (q == "q8_2f" || q == "q82f" || q == "q8f") return "Q8_2F";
    if (q == "f16" || q == "fp16") return "F16";
    if (q == "f32") return "F32";
    if (q == "vbit" || q == "q1" || q == "q1p" || q == "q1s" || q == "q1t") return "VBIT";
    if (q == "q4" || q == "q4_block" || q == "q4t" || q == "q4_tiled" || q == "q4tp" || q == "q2tp") return "Q4_BLOCK";
    fail(CMF_ERR_INVALID_ARGUMENT, "unknown --quant '" + std::string(q) + "'");
}

}  // namespace cmf::codecs
