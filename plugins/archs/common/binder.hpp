// The tensors of a model source by name, bound on a backend on demand with
// their shapes checked: what every arch does before it runs anything. The
// decoder binds through it, and so does each component of a pipeline
// (names under a prefix such as "dit." or "vae.").
#pragma once

#include <cmf/cmf_plugin.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cmf::archs {

struct Weight {
    cmf_backend_weight *w = nullptr;
    uint64_t rows = 0, cols = 0;  // 1-D: rows 1, cols = length
    explicit operator bool() const { return w != nullptr; }
};

// Throws a backend error out through sdk::call unchanged.
void check(cmf_error *e);

// Whether the backend's vtable has `member` (at byte `offset`) and it is set.
template <class Member>
bool backend_has(const cmf_backend_vt *be, size_t offset, Member member) {
    return be->struct_size >= offset + sizeof(void *) && member != nullptr;
}

class Binder {
public:
    // Indexes every tensor of `src`; names are looked up as prefix + name.
    // Weights bound later are appended to `owned` (the caller frees them).
    Binder(const cmf_model_source *src, const cmf_backend_vt *be, void *be_ctx, std::string prefix,
           std::vector<cmf_backend_weight *> &owned);

    bool present(const std::string &name) const { return index_.count(prefix_ + name) != 0; }
    const std::string &prefix() const { return prefix_; }
    // The stored view of prefix + name (CMF_ERR_MISSING_TENSOR if absent).
    const cmf_tensor_view &view(const std::string &name) const;
    // The stored view of prefix + name with its shape checked as bind()
    // checks it (for a decision made before binding, e.g. on its rows).
    const cmf_tensor_view &checked(const std::string &name, std::initializer_list<uint64_t> shape) const;

    // Binds a tensor and checks its shape ({rows, cols} for 2-D, {len} for
    // 1-D; 0 = any), else CMF_ERR_BOUNDS naming the tensor and both shapes.
    Weight bind(const std::string &name, std::initializer_list<uint64_t> shape);
    // Binds a tensor of 3 or more dimensions (a convolution kernel [out, in,
    // kh, kw]) as the 2-D [shape[0], product of the rest] it is row-major,
    // after checking its shape as bind() does.
    Weight bind_flat(const std::string &name, std::initializer_list<uint64_t> shape);
    // Binds rows (axis 0) or columns (axis 1) `idx` of a tensor (elements of
    // a 1-D one) through the backend's weight_bind_subset, after checking
    // its shape as bind() does; the Weight has the selected shape.
    Weight bind_subset(const std::string &name, std::initializer_list<uint64_t> shape, uint32_t axis,
                       const std::vector<uint32_t> &idx);


    // Binds a tensor of any rank holding `len` values as the 1-D vector of
    // them it is row-major (a depthwise convolution's [C, 1, K] taps).
    Weight bind_values(const std::string &name, uint64_t len);

    // The 2-D tensors bound whole by bind() (full name, stored view), in
    // binding order: the weights a forward pass reads row after row.
    const std::vector<std::pair<std::string, cmf_tensor_view>> &whole() const { return whole_; }

    // f(full name, view) for every tensor of the source (any prefix).
    template <class F>
    void each(F &&f) const {
        for (const auto &[name, v] : index_) f(name, v);
    }

private:
    const cmf_backend_vt *be_;
    void *be_ctx_;
    std::string prefix_;
    std::vector<cmf_backend_weight *> &owned_;
    std::unordered_map<std::string, cmf_tensor_view> index_;
    std::vector<std::pair<std::string, cmf_tensor_view>> whole_;
};

}  // namespace cmf::archs
