// Per-operation timing of a session's backend (CMF_SESSION_PROFILE,
// `cmfhost bench --profile`).
//
// The profile stands between the arch and the backend: the arch is given a
// copy of the backend's vtable whose every operation is a shim that reads
// the clock, calls the backend's own operation and adds the elapsed time to
// (phase, operation, weight). Backend calls are synchronous (a parallel
// operation returns when all its threads are done), so the wall time of a
// call is the time that operation cost the forward pass. Neither the arch
// nor the backend knows it is being timed; the clock reads cost ~50 ns per
// call (a few hundred calls per decoded token).
#pragma once

#include <cmf/cmf_plugin.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace cmf::runtime {

class BackendProfile {
public:
    // What the session is doing while a call is timed.
    enum class Phase : int { bind = 0, prefill = 1, decode = 2 };

    // Wraps `inner` (the backend's vtable) and its context. Members past the
    // ones this build knows are not offered to the arch: a shim must exist
    // for every operation the arch can reach.
    BackendProfile(const cmf_backend_vt &inner, void *inner_ctx);
    BackendProfile(const BackendProfile &) = delete;
    BackendProfile &operator=(const BackendProfile &) = delete;

    // The vtable and context to hand to the arch instead of the backend's.
    const cmf_backend_vt *vt() const { return &vt_; }
    void *ctx() { return this; }

    void set_phase(Phase p) { phase_ = p; }
    void reset() { stats_.clear(); }
    // {"ops":[{"phase","op","weight","calls","seconds","weight_bytes",
    // "read_bytes"}, ...]}, sorted by phase, then by time (largest first);
    // read_bytes: the bytes the calls read: a weight's payload per call (a
    // matmul_grouped call reads the groups it is given: the experts a token
    // picked); attention and attention_kv the K and V cache rows their
    // queries attend (kv_read_bytes).
    std::string to_json() const;

    // Used by the shims.
    struct Stat {
        uint64_t calls = 0;
        double seconds = 0;
        uint64_t bytes = 0;  // bytes read over the calls (read_bytes)
    };
    // `bytes`: UINT64_MAX = the weight's payload (0 without one).
    void record(const char *op, const cmf_backend_weight *w, double seconds, uint64_t bytes = UINT64_MAX);
    // The payload bytes of a bound weight (0 if unknown).
    uint64_t bytes_of(const cmf_backend_weight *w) const;
    // A profile key for a matmul_grouped call's weights, by their dtypes:
    // "experts q4_block" (the groups change from token to token).
    const cmf_backend_weight *grouped_key(const cmf_backend_weight *const *ws, uint32_t n);
    void note_weight(const cmf_backend_weight *w, const cmf_tensor_view &t);
    void note_subset(const cmf_backend_weight *w, const cmf_tensor_view &t, uint32_t axis, uint64_t n);
    void forget_weight(const cmf_backend_weight *w);
    // The weights of one matmul_multi call as one profile key, labelled
    // "q4_block [2048,1024]+[1024,1024]+[1024,1024]" (bytes: their sum).
    const cmf_backend_weight *group_of(const cmf_backend_weight *const *ws, uint32_t n);
    const cmf_backend_vt &inner() const { return inner_; }
    void *inner_ctx() const { return inner_ctx_; }

private:
    struct WeightInfo {
        std::string label;  // "q4_block [3072,1024]"
        uint64_t bytes = 0;
    };
    cmf_backend_vt inner_{};
    void *inner_ctx_ = nullptr;
    cmf_backend_vt vt_{};
    Phase phase_ = Phase::bind;
    // Keyed by the op's name (a string literal, compared by address) and the
    // weight (matmul, rms_norm, add_bias, embed), else nullptr.
    std::map<std::tuple<int, const char *, const cmf_backend_weight *>, Stat> stats_;
    std::map<const cmf_backend_weight *, WeightInfo> weights_;
    // Keys made up for fused calls' weight lists (their addresses are the keys).
    std::map<std::vector<const cmf_backend_weight *>, std::unique_ptr<char>> groups_;
    std::map<std::string, std::unique_ptr<char>> grouped_;
};

}  // namespace cmf::runtime
