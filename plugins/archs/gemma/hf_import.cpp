#include "hf_import.hpp"

#include <cmf/json_read.hpp>

namespace cmf::archs::gemma {

using sdk::Error;

std::string import_config(std::string_view json) {
    simdjson::dom::parser p;
    const std::string m = json::parse_object(p, json, "config.json").str("model_type").value_or("");
    if (!m.empty() && m != "gemma" && m != "gemma2" && m != "gemma3" && m != "gemma3_text")
        throw Error(CMF_ERR_UNSUPPORTED, "config.json: model_type \"" + m + "\" is not a Gemma model this plugin converts (" + kModelTypes + ")");
    return build_arch_json(json);
}

std::vector<PlanEntry> import_tensor(const ArchView &a, const std::string &hf_name, const Shape &s) {
    // Gemma has no fused or packed tensors; the wrapper renames
    // (language_model.model.* -> model.*) and vision drops are shared.
    // Gemma ties its head: a stored lm_head equal in shape to the
    // embedding is still kept (the loader prefers it when present).
    return plan_tensor(a, hf_name, s);
}

}  // namespace cmf::archs::gemma
