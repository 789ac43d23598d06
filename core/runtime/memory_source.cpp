#include "runtime/memory_source.hpp"

#include "common/error.hpp"

namespace cmf::runtime {

MemoryModel::MemoryModel() = default;

MemoryModel::Entry &MemoryModel::insert(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape) {
    if (by_name_.count(name)) throw Error(CMF_ERR_INVALID_ARGUMENT, "MemoryModel: duplicate tensor " + name);
    if (shape.size() > CMF_MAX_DIMS) throw Error(CMF_ERR_INVALID_ARGUMENT, "MemoryModel: too many dims for " + name);
    by_name_.emplace(name, entries_.size());
    Entry &e = entries_.emplace_back();
    e.name = name;
    e.view.struct_size = sizeof e.view;
    e.view.dtype = dtype;
    e.view.ndim = static_cast<uint32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) e.view.shape[i] = shape[i];
    return e;
}

void MemoryModel::add(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape,
                      std::vector<uint8_t> bytes) {
    Entry &e = insert(name, dtype, shape);
    e.bytes = std::move(bytes);
    e.view.data = e.bytes.data();
    e.view.nbytes = e.bytes.size();
    payload_bytes_ += e.view.nbytes;
}

void MemoryModel::add_borrowed(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape,
                               const void *data, uint64_t nbytes) {
    Entry &e = insert(name, dtype, shape);
    e.view.data = data;
    e.view.nbytes = nbytes;
    payload_bytes_ += nbytes;
}

cmf_error *MemoryModel::tensor_fn(void *user, const char *name, cmf_tensor_view *out) {
    auto *m = static_cast<MemoryModel *>(user);
    auto it = name ? m->by_name_.find(name) : m->by_name_.end();
    if (it == m->by_name_.end()) return make_error(CMF_ERR_MISSING_TENSOR, std::string("missing tensor ") + (name ? name : "(null)"));
    *out = m->entries_[it->second].view;
    return nullptr;
}

cmf_error *MemoryModel::tensor_at_fn(void *user, uint64_t index, const char **name, cmf_tensor_view *out) {
    auto *m = static_cast<MemoryModel *>(user);
    if (index >= m->entries_.size()) return make_error(CMF_ERR_BOUNDS, "tensor index out of range");
    const Entry &e = m->entries_[index];
    *name = e.name.c_str();
    *out = e.view;
    return nullptr;
}

const cmf_model_source *MemoryModel::source() {
    src_ = cmf_model_source{};
    src_.struct_size = sizeof src_;
    src_.user = this;
    src_.arch_json = arch_json_.c_str();
    src_.arch_json_len = arch_json_.size();
    src_.header_json = nullptr;
    src_.header_json_len = 0;
    src_.tensor_count = entries_.size();
    src_.tensor = tensor_fn;
    src_.tensor_at = tensor_at_fn;
    return &src_;
}

}  // namespace cmf::runtime
