#include "convert/dtype_policy.hpp"

#include "common/error.hpp"

#include <cmf/cmf_types.h>

#include <fnmatch.h>

namespace cmf::convert {

namespace {

struct QuantName {
    const char *name;
    int32_t dtype;
    const char *options;
};
const QuantName kNames[] = {
    {"f32", CMF_DTYPE_F32, ""},          {"f16", CMF_DTYPE_F16, ""},          {"fp16", CMF_DTYPE_F16, ""},
    {"bf16", CMF_DTYPE_BF16, ""},        {"q8", CMF_DTYPE_Q8_ROW, ""},        {"q8_row", CMF_DTYPE_Q8_ROW, ""},
    {"q8_2f", CMF_DTYPE_Q8_2F, ""},      {"q82f", CMF_DTYPE_Q8_2F, ""},       {"q8f", CMF_DTYPE_Q8_2F, ""},
    {"q4", CMF_DTYPE_Q4_BLOCK, ""},      {"q4_block", CMF_DTYPE_Q4_BLOCK, ""}, {"q4t", CMF_DTYPE_Q4_TILED, ""},
    {"q4_tiled", CMF_DTYPE_Q4_TILED, ""}, {"q4tp", CMF_DTYPE_Q4TP, ""},       {"q2tp", CMF_DTYPE_Q2TP, ""},
    {"vbit", CMF_DTYPE_VBIT_RO, ""},     {"q1", CMF_DTYPE_Q1, ""},            {"q1p", CMF_DTYPE_Q1, "error_diffusion=1"},
    {"q1s", CMF_DTYPE_Q1S, ""},          {"q1t", CMF_DTYPE_Q1T, ""},
};

const QuantName &quant_entry(const std::string &name) {
    for (const auto &q : kNames)
        if (name == q.name) return q;
    std::string all;
    for (const auto &q : kNames) all += (all.empty() ? "" : ", ") + std::string(q.name);
    throw Error(CMF_ERR_INVALID_ARGUMENT, "unknown quantization \"" + name + "\" (valid: " + all + ")");
}

DtypeChoice choice_of(const std::string &name) {
    const QuantName &q = quant_entry(name);
    return {q.dtype, q.options};
}

bool ends_with(const std::string &s, const char *suffix) {
    size_t n = std::char_traits<char>::length(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Tensors the original keeps in f16 whatever --quant says:
// small gates and routers whose precision matters more than their size.
bool on_f16_list(const std::string &n) {
    for (const char *s : {".linear_attn.in_proj_a.weight", ".linear_attn.in_proj_b.weight", ".mlp.gate.weight",
                          ".shared_expert_gate.weight", ".self_attn.g_proj.weight", "_conv1d.weight", ".f_a_proj.weight",
                          ".f_b_proj.weight", ".b_proj.weight", ".g_a_proj.weight", ".g_b_proj.weight"})
        if (ends_with(n, s)) return true;
    for (const char *s : {"altup", "laurel", "per_layer_input_gate"})
        if (n.find(s) != std::string::npos) return true;
    return false;
}

bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

bool ends_with_any(const std::string &s, std::initializer_list<const char *> suffixes) {
    for (const char *x : suffixes)
        if (ends_with(s, x)) return true;
    return false;
}

// An expert's SwiGLU input plane: gate/up, or w1/w3 in checkpoints that keep
// that spelling.
bool expert_gate_or_up(const std::string &n) {
    const bool expert = contains(n, ".experts.") || contains(n, ".shared_expert.") || contains(n, ".shared_experts.");
    return expert && ends_with_any(n, {".gate_proj.weight", ".up_proj.weight", ".w1.weight", ".w3.weight"});
}

// A dense FFN's gate/up; the draft (`.mtp.`) layer stays 4-bit: it is one
// layer, and its agreement with the trunk is what speculation lives on.
bool dense_gate_or_up(const std::string &n) {
    return !contains(n, ".experts.") && !contains(n, ".shared_expert") && !contains(n, ".mtp.") &&
           ends_with_any(n, {".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.w1.weight", ".mlp.w3.weight"});
}

bool pattern_matches(const std::string &pat, const std::string &name) {
    if (fnmatch(pat.c_str(), name.c_str(), 0) == 0) return true;
    for (size_t i = name.find('.'); i != std::string::npos; i = name.find('.', i + 1))
        if (fnmatch(pat.c_str(), name.c_str() + i + 1, 0) == 0) return true;
    return false;
}

}  // namespace

bool is_routed_expert(const std::string &name) { return contains(name, ".experts."); }

DtypeChoice quant_choice(const std::string &name) { return choice_of(name); }

bool name_matches(const std::string &pattern, const std::string &name) { return pattern_matches(pattern, name); }

int32_t quant_dtype_from_name(const std::string &name) { return quant_entry(name).dtype; }

const char *header_quant_type(int32_t dtype) {
    switch (dtype) {
    case CMF_DTYPE_F32: return "F32";
    case CMF_DTYPE_F16: return "F16";
    case CMF_DTYPE_BF16: return "BF16";
    case CMF_DTYPE_Q8_ROW: return "Q8_ROW";
    case CMF_DTYPE_Q8_2F: return "Q8_2F";
    case CMF_DTYPE_VBIT:
    case CMF_DTYPE_VBIT_RO:
    case CMF_DTYPE_Q1:
    case CMF_DTYPE_Q1S:
    case CMF_DTYPE_Q1T: return "VBIT";
    default: return "Q4_BLOCK";  // q4, q4t, q4tp, q2tp
    }
}

QuantPolicy::QuantPolicy(const std::string &quant, const std::string &quant_map) : base_(choice_of(quant)) {
    size_t pos = 0;
    while (pos < quant_map.size()) {
        size_t end = quant_map.find(',', pos);
        if (end == std::string::npos) end = quant_map.size();
        std::string item = quant_map.substr(pos, end - pos);
        size_t eq = item.rfind('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
            throw Error(CMF_ERR_INVALID_ARGUMENT, "--quant-map entry \"" + item + "\" is not of the form pattern=quant");
        overrides_.emplace_back(item.substr(0, eq), choice_of(item.substr(eq + 1)));
        pos = end + 1;
    }
}

DtypeChoice QuantPolicy::choose(const std::string &name, const std::vector<uint64_t> &shape, bool model_has_experts) const {
    if (ends_with(name, ".tid2eid")) return {CMF_DTYPE_F32, ""};  // index tables must stay exact
    DtypeChoice q = base_;
    for (const auto &[pat, dt] : overrides_)
        if (pattern_matches(pat, name)) {
            q = dt;
            break;
        }
    if (q.dtype == CMF_DTYPE_F32) return q;
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    const bool quantizable = shape.size() == 2 && n >= 32 && !on_f16_list(name);
    if (!quantizable) return {CMF_DTYPE_F16, ""};
    if (shape[1] % 32 != 0) {
        switch (q.dtype) {
        case CMF_DTYPE_Q4_TILED:
        case CMF_DTYPE_Q4TP:
        case CMF_DTYPE_Q2TP:
        case CMF_DTYPE_VBIT_RO:
        case CMF_DTYPE_Q1:
        case CMF_DTYPE_Q1S:
        case CMF_DTYPE_Q1T: return {CMF_DTYPE_Q8_2F, ""};  // group-of-32 codecs need cols % 32 == 0
        default: break;
        }
    }
    if (q.dtype == CMF_DTYPE_Q2TP && !expert_gate_or_up(name) && (model_has_experts || !dense_gate_or_up(name)))
        return {CMF_DTYPE_Q4TP, ""};
    return q;
}

}  // namespace cmf::convert
