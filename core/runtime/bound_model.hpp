// A model bound by its arch plugin on a backend: the arch entry, the arch's
// model handle (bound weights), the backend profile when asked for, and the
// facts the model tells (vocabulary, maximum context). Sessions own one
// with one state; a batch engine owns one with a state per slot.
#pragma once

#include "runtime/backend_profile.hpp"

#include <cmf/cmf_plugin.h>

#include <cstdint>
#include <memory>
#include <string>

namespace cmf {
class Runtime;
struct ArchEntry;
}  // namespace cmf

namespace cmf::runtime {

struct BindConfig {
    std::string backend;       // "" = the runtime's default backend
    std::string arch_options;  // passed to the arch's model_create
    bool profile = false;      // time every backend operation
};

class BoundModel {
public:
    // Finds the arch plugin by the source's arch.arch_name and the backend
    // by name, binds the weights. The source must outlive the model.
    BoundModel(Runtime &rt, const cmf_model_source &src, const BindConfig &cfg);
    ~BoundModel();
    BoundModel(const BoundModel &) = delete;
    BoundModel &operator=(const BoundModel &) = delete;

    uint64_t vocab_size() const { return vocab_; }
    uint64_t max_context() const { return max_context_; }  // 0 = unknown
    const std::string &arch_name() const { return arch_name_; }
    // The context of a state when none is asked for: min(max, 4096), or 4096.
    uint64_t default_n_ctx() const;

    cmf_arch_state *state_create(uint64_t n_ctx);
    void state_free(cmf_arch_state *s);
    void state_truncate(cmf_arch_state *s, uint64_t n_keep);
    void forward(cmf_arch_state *s, const cmf_forward_args &a);
    // The arch runs several states in one pass (cmf_arch_vt.forward_batch).
    bool has_forward_batch() const;
    // One pass over states[i] with args[i]; errors as the arch reports them.
    cmf_error *forward_batch(uint32_t n, cmf_arch_state *const *states, const cmf_forward_args *const *args);

    BackendProfile *profile() { return profile_.get(); }

private:
    cmf_model_source src_;
    const ArchEntry *arch_ = nullptr;
    std::string arch_name_;
    // Stands between the arch and the backend when profiling; declared
    // before model_ so it outlives the weights the model frees through it.
    std::unique_ptr<BackendProfile> profile_;
    cmf_arch_model *model_ = nullptr;
    uint64_t vocab_ = 0;
    uint64_t max_context_ = 0;
};

// The header's arch.arch_name (CMF_ERR_PARSE if absent or not a string).
std::string arch_name_of(const char *arch_json, size_t len);

}  // namespace cmf::runtime
