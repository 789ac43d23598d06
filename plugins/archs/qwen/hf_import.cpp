#include "hf_import.hpp"

#include <cmf/json_read.hpp>

namespace cmf::archs::qwen {

using sdk::Error;

namespace {

bool listed(std::string_view list, std::string_view item) {
    size_t pos = 0;
    while (pos <= list.size()) {
        size_t end = list.find(',', pos);
        if (end == std::string_view::npos) end = list.size();
        if (list.substr(pos, end - pos) == item) return true;
        pos = end + 1;
    }
    return false;
}

std::string model_type_of(std::string_view json) {
    simdjson::dom::parser p;
    return json::parse_object(p, json, "config.json").str("model_type").value_or("");
}

bool ends_with(const std::string &s, const char *suffix) {
    size_t n = std::char_traits<char>::length(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// qwen3_next stores the GDN input projections fused and grouped by key head
// (HF modeling_qwen3_next.py, fix_query_key_value_ordering); CMF stores the split Qwen3.5 layout. Pure row selections.
std::vector<PlanEntry> split_fused_gdn(const ArchView &a, const std::string &name, const Shape &s) {
    const uint64_t nk = a.lin_nk, nv = a.lin_nv, dk = a.lin_dk, dv = a.lin_dv, H = a.hidden;
    if (!nk || !nv || nv % nk) throw Error(CMF_ERR_BOUNDS, "tensor \"" + name + "\" is a fused GDN projection but the config's linear_* geometry is missing");
    const uint64_t rep = nv / nk;
    const std::string base = name.substr(0, name.rfind("in_proj_"));
    std::vector<PlanEntry> out;
    if (ends_with(name, "in_proj_qkvz.weight")) {
        const uint64_t gw = 2 * dk + 2 * rep * dv;
        if (s != Shape{nk * gw, H}) shape_error(name, s, shape_str({nk * gw, H}));
        PlanEntry qkv{base + "in_proj_qkv.weight", {2 * nk * dk + nv * dv, H}, std::nullopt, false, {}};
        PlanEntry z{base + "in_proj_z.weight", {nv * dv, H}, std::nullopt, false, {}};
        for (uint64_t g = 0; g < nk; ++g) qkv.rows.push_back({g * gw, dk});
        for (uint64_t g = 0; g < nk; ++g) qkv.rows.push_back({g * gw + dk, dk});
        for (uint64_t g = 0; g < nk; ++g) qkv.rows.push_back({g * gw + 2 * dk, rep * dv});
        for (uint64_t g = 0; g < nk; ++g) z.rows.push_back({g * gw + 2 * dk + rep * dv, rep * dv});
        out.push_back(std::move(qkv));
        out.push_back(std::move(z));
    } else {
        if (s != Shape{2 * nv, H}) shape_error(name, s, shape_str({2 * nv, H}));
        PlanEntry b{base + "in_proj_b.weight", {nv, H}, std::nullopt, false, {}};
        PlanEntry av{base + "in_proj_a.weight", {nv, H}, std::nullopt, false, {}};
        for (uint64_t g = 0; g < nk; ++g) b.rows.push_back({g * 2 * rep, rep});
        for (uint64_t g = 0; g < nk; ++g) av.rows.push_back({g * 2 * rep + rep, rep});
        out.push_back(std::move(b));
        out.push_back(std::move(av));
    }
    return out;
}

}  // namespace

std::string import_config(std::string_view json) {
    std::string mt = model_type_of(json);
    if (!mt.empty() && !listed(kModelTypes, mt))
        throw Error(CMF_ERR_UNSUPPORTED, "config.json: model_type \"" + mt + "\" is not a Qwen model this plugin converts (" + kModelTypes + ")");
    return build_arch_json(json);
}

std::vector<PlanEntry> import_tensor(const ArchView &a, const std::string &hf_name, const Shape &s) {
    const std::string name = canonical_name(a, hf_name);
    if (name.empty()) return {};
    if (ends_with(name, ".linear_attn.in_proj_qkvz.weight") || ends_with(name, ".linear_attn.in_proj_ba.weight"))
        return split_fused_gdn(a, name, s);
    return plan_tensor(a, hf_name, s);
}

}  // namespace cmf::archs::qwen
