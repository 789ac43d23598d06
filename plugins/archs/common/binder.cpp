#include "binder.hpp"

#include <cmf/plugin.hpp>

#include <cstddef>

namespace cmf::archs {

using cmf::sdk::Error;
using cmf::sdk::HostError;

void check(cmf_error *e) {
    if (e != nullptr) throw HostError{e};
}

Binder::Binder(const cmf_model_source *src, const cmf_backend_vt *be, void *be_ctx, std::string prefix,
               std::vector<cmf_backend_weight *> &owned)
    : be_(be), be_ctx_(be_ctx), prefix_(std::move(prefix)), owned_(owned) {
    for (uint64_t i = 0; i < src->tensor_count; ++i) {
        const char *name = nullptr;
        cmf_tensor_view v{};
        v.struct_size = sizeof v;
        check(src->tensor_at(src->user, i, &name, &v));
        if (name == nullptr) throw Error(CMF_ERR_INTERNAL, "model source returned a tensor without a name");
        index_.emplace(name, v);
    }
}

const cmf_tensor_view &Binder::view(const std::string &short_name) const {
    const std::string name = prefix_ + short_name;
    auto it = index_.find(name);
    if (it == index_.end()) throw Error(CMF_ERR_MISSING_TENSOR, "missing tensor " + name);
    return it->second;
}

namespace {

void check_shape(const std::string &name, const cmf_tensor_view &v, std::initializer_list<uint64_t> shape) {
    bool ok = v.ndim == shape.size();
    uint32_t d = 0;
    for (uint64_t s : shape) {
        ok = ok && (s == 0 || v.shape[d] == s);
        ++d;
    }
    if (ok) return;
    std::string got;
    for (uint32_t i = 0; i < v.ndim; ++i) got += (i ? "," : "") + std::to_string(v.shape[i]);
    std::string want;
    for (uint64_t s : shape) want += (want.empty() ? "" : ",") + (s ? std::to_string(s) : std::string("*"));
    throw Error(CMF_ERR_BOUNDS, "tensor " + name + " has shape [" + got + "], expected [" + want + "]");
}

}  // namespace

const cmf_tensor_view &Binder::checked(const std::string &short_name, std::initializer_list<uint64_t> shape) const {
    const cmf_tensor_view &v = view(short_name);
    check_shape(prefix_ + short_name, v, shape);
    return v;
}

Weight Binder::bind(const std::string &short_name, std::initializer_list<uint64_t> shape) {
    const cmf_tensor_view &v = checked(short_name, shape);
    Weight w;
    check(be_->weight_bind(be_ctx_, &v, &w.w));
    owned_.push_back(w.w);
    if (v.ndim == 2) whole_.emplace_back(prefix_ + short_name, v);
    w.rows = v.ndim == 2 ? v.shape[0] : 1;
    w.cols = v.ndim == 2 ? v.shape[1] : v.shape[0];
    return w;
}

Weight Binder::bind_flat(const std::string &short_name, std::initializer_list<uint64_t> shape) {
    const cmf_tensor_view &v = view(short_name);
    check_shape(prefix_ + short_name, v, shape);
    if (v.ndim < 2) throw Error(CMF_ERR_BOUNDS, "tensor " + prefix_ + short_name + " is not a kernel of 2 or more dimensions");
    cmf_tensor_view flat = v;
    uint64_t cols = 1;
    for (uint32_t i = 1; i < v.ndim; ++i) cols *= v.shape[i];
    flat.ndim = 2;
    flat.shape[1] = cols;
    for (uint32_t i = 2; i < CMF_MAX_DIMS; ++i) flat.shape[i] = 0;
    Weight w;
    check(be_->weight_bind(be_ctx_, &flat, &w.w));
    owned_.push_back(w.w);
    w.rows = flat.shape[0];
    w.cols = cols;
    return w;
}

Weight Binder::bind_subset(const std::string &short_name, std::initializer_list<uint64_t> shape, uint32_t axis,
                           const std::vector<uint32_t> &idx) {
    const cmf_tensor_view &v = checked(short_name, shape);
    if (!backend_has(be_, offsetof(cmf_backend_vt, weight_bind_subset), be_->weight_bind_subset))
        throw Error(CMF_ERR_UNSUPPORTED, std::string("backend '") + (be_->name ? be_->name : "?") +
                                             "' cannot bind part of tensor " + prefix_ + short_name +
                                             " (no weight_bind_subset)");
    Weight w;
    check(be_->weight_bind_subset(be_ctx_, &v, axis, idx.data(), idx.size(), &w.w));
    owned_.push_back(w.w);
    w.rows = v.ndim == 2 ? v.shape[0] : 1;
    w.cols = v.ndim == 2 ? v.shape[1] : v.shape[0];
    (axis == 0 && v.ndim == 2 ? w.rows : w.cols) = idx.size();
    return w;
}

Weight Binder::bind_values(const std::string &short_name, uint64_t len) {
    const cmf_tensor_view &v = view(short_name);
    uint64_t n = 1;
    std::string got;
    for (uint32_t i = 0; i < v.ndim; ++i) {
        n *= v.shape[i];
        got += (i ? "," : "") + std::to_string(v.shape[i]);
    }
    if (n != len)
        throw Error(CMF_ERR_BOUNDS, "tensor " + prefix_ + short_name + " has shape [" + got + "], expected " +
                                        std::to_string(len) + " values");
    cmf_tensor_view flat = v;
    flat.ndim = 1;
    flat.shape[0] = len;
    for (uint32_t i = 1; i < CMF_MAX_DIMS; ++i) flat.shape[i] = 0;
    Weight w;
    check(be_->weight_bind(be_ctx_, &flat, &w.w));
    owned_.push_back(w.w);
    w.rows = 1;
    w.cols = len;
    return w;
}

}  // namespace cmf::archs
