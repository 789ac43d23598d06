#include "runtime/container_source.hpp"

#include "common/error.hpp"

#include <cstring>
#include <string>

namespace cmf::runtime {
namespace {

// The source struct first, so the callbacks' `user` (this object) also
// serves as the struct handed out.
struct ContainerSource {
    cmf_model_source src{};
    const cmf_model *model = nullptr;
    std::string arch_json;    // copies: the info strings are borrowed anyway,
    std::string header_json;  // but owning them keeps the lengths exact
};

void to_view(const cmf_tensor_info &t, cmf_tensor_view *out) {
    std::memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->dtype = t.dtype;
    out->ndim = t.ndim;
    for (uint32_t k = 0; k < t.ndim && k < CMF_MAX_DIMS; ++k) out->shape[k] = t.shape[k];
    out->data = t.data;
    out->nbytes = t.nbytes;
}

// Errors come from cmf_tensor / cmf_tensor_at, i.e. made by the host's own
// error functions, and are passed through unchanged.
cmf_error *tensor_fn(void *user, const char *name, cmf_tensor_view *out) {
    auto *cs = static_cast<ContainerSource *>(user);
    if (name == nullptr || out == nullptr) return make_error(CMF_ERR_INVALID_ARGUMENT, "model source: NULL argument");
    cmf_tensor_info info;
    cmf_tensor_info_init(&info);
    if (cmf_error *e = cmf_tensor(cs->model, name, &info)) return e;
    to_view(info, out);
    return nullptr;
}

cmf_error *tensor_at_fn(void *user, uint64_t index, const char **name, cmf_tensor_view *out) {
    auto *cs = static_cast<ContainerSource *>(user);
    if (name == nullptr || out == nullptr) return make_error(CMF_ERR_INVALID_ARGUMENT, "model source: NULL argument");
    cmf_tensor_info info;
    cmf_tensor_info_init(&info);
    if (cmf_error *e = cmf_tensor_at(cs->model, static_cast<size_t>(index), &info)) return e;
    *name = info.name;
    to_view(info, out);
    return nullptr;
}

}  // namespace

std::shared_ptr<const cmf_model_source> make_container_source(const cmf_model *m) {
    if (m == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "model source: NULL model");
    cmf_model_info info;
    cmf_model_info_init(&info);
    throw_if_error(cmf_model_get_info(m, &info), "model source");
    auto cs = std::make_shared<ContainerSource>();
    cs->model = m;
    cs->arch_json = info.arch_json ? info.arch_json : "";
    cs->header_json.assign(info.header_json ? info.header_json : "", info.header_json_len);
    if (cs->arch_json.empty()) throw Error(CMF_ERR_PARSE, "the model's header has no arch object");
    cs->src.struct_size = sizeof(cmf_model_source);
    cs->src.user = cs.get();
    cs->src.arch_json = cs->arch_json.c_str();
    cs->src.arch_json_len = cs->arch_json.size();
    cs->src.header_json = cs->header_json.c_str();
    cs->src.header_json_len = cs->header_json.size();
    cs->src.tensor_count = cmf_tensor_count(m);
    cs->src.tensor = tensor_fn;
    cs->src.tensor_at = tensor_at_fn;
    // Aliasing constructor: the source struct lives as long as its owner.
    return std::shared_ptr<const cmf_model_source>(cs, &cs->src);
}

}  // namespace cmf::runtime
