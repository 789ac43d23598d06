#include "runtime/backend_profile.hpp"

#include "common/dtype_name.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

namespace cmf::runtime {

namespace {

using Clock = std::chrono::steady_clock;

// The weight a call works with, for the operations that take one (else nullptr).
template <class... A>
const cmf_backend_weight *weight_of(const A &...) {
    return nullptr;
}
template <class... A>
const cmf_backend_weight *weight_of(const cmf_backend_weight *w, const A &...) {
    return w;
}
template <class X, class... A>
const cmf_backend_weight *weight_of(const X &, const cmf_backend_weight *w, const A &...) {
    return w;
}

// Shim<&cmf_backend_vt::op, name>::call has op's signature: it times the
// backend's own op under `name` (and the weight, when the op takes one).
template <auto Member, const char *Name>
struct Shim;
template <class R, class... A, R (*cmf_backend_vt::*Member)(void *, A...), const char *Name>
struct Shim<Member, Name> {
    static R call(void *ctx, A... a) {
        auto *p = static_cast<BackendProfile *>(ctx);
        const auto t0 = Clock::now();
        struct Record {  // also when the op returns an error
            BackendProfile *p;
            Clock::time_point t0;
            const cmf_backend_weight *w;
            ~Record() { p->record(Name, w, std::chrono::duration<double>(Clock::now() - t0).count()); }
        } rec{p, t0, weight_of(a...)};
        return (p->inner().*Member)(p->inner_ctx(), a...);
    }
};

#define CMF_PROFILE_OPS(X)                                                                                            \
    X(matmul) X(buffer_alloc) X(buffer_free) X(buffer_write) X(buffer_read) X(copy) X(rms_norm) X(rope) X(attention) \
        X(gated_act) X(add) X(add_bias) X(embed) X(kv_write) X(attention_kv) X(attention_ring) X(modulate)     \
        X(add_gated) X(activation) X(layer_norm) X(rope_table) X(attention_full) X(conv2d) X(group_norm)        \
        X(upsample2x)
#define CMF_PROFILE_NAME(op) constexpr char k_##op[] = #op;
CMF_PROFILE_OPS(CMF_PROFILE_NAME)
#undef CMF_PROFILE_NAME

// weight_bind / weight_free are timed (phase bind) and also label the weight.
constexpr char k_weight_bind[] = "weight_bind";
cmf_error *bind_shim(void *ctx, const cmf_tensor_view *t, cmf_backend_weight **out) {
    auto *p = static_cast<BackendProfile *>(ctx);
    const auto t0 = Clock::now();
    cmf_error *e = p->inner().weight_bind(p->inner_ctx(), t, out);
    p->record(k_weight_bind, nullptr, std::chrono::duration<double>(Clock::now() - t0).count());
    if (e == nullptr && t != nullptr && out != nullptr && *out != nullptr) p->note_weight(*out, *t);
    return e;
}
void free_shim(void *ctx, cmf_backend_weight *w) {
    auto *p = static_cast<BackendProfile *>(ctx);
    p->forget_weight(w);
    p->inner().weight_free(p->inner_ctx(), w);
}

// matmul_multi's weights are a list: timed under one key for the list.
constexpr char k_matmul_multi[] = "matmul_multi";
cmf_error *matmul_multi_shim(void *ctx, const cmf_backend_weight *const *ws, uint32_t n, const float *x,
                             uint64_t n_batch, float *const *ys) {
    auto *p = static_cast<BackendProfile *>(ctx);
    const auto t0 = Clock::now();
    cmf_error *e = p->inner().matmul_multi(p->inner_ctx(), ws, n, x, n_batch, ys);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    p->record(k_matmul_multi, ws != nullptr && n > 0 ? p->group_of(ws, n) : nullptr, seconds);
    return e;
}

const char *phase_name(int p) {
    switch (p) {
    case 1: return "prefill";
    case 2: return "decode";
    default: return "bind";
    }
}

}  // namespace

BackendProfile::BackendProfile(const cmf_backend_vt &inner, void *inner_ctx) : inner_ctx_(inner_ctx) {
    // Only the members the backend has: anything past its struct_size stays NULL.
    std::memcpy(&inner_, &inner, std::min<size_t>(inner.struct_size, sizeof inner_));
    inner_.struct_size = static_cast<uint32_t>(std::min<size_t>(inner.struct_size, sizeof inner_));
    vt_ = cmf_backend_vt{};
    vt_.struct_size = inner_.struct_size;
    vt_.abi_version = inner_.abi_version;
    vt_.name = inner_.name;
    vt_.version = inner_.version;
    vt_.description = inner_.description;
    if (inner_.weight_bind) vt_.weight_bind = bind_shim;
    if (inner_.weight_free) vt_.weight_free = free_shim;
#define CMF_PROFILE_WRAP(op) \
    if (inner_.op) vt_.op = Shim<&cmf_backend_vt::op, k_##op>::call;
    CMF_PROFILE_OPS(CMF_PROFILE_WRAP)
#undef CMF_PROFILE_WRAP
    if (inner_.matmul_multi) vt_.matmul_multi = matmul_multi_shim;
}

void BackendProfile::forget_weight(const cmf_backend_weight *w) {
    weights_.erase(w);
    for (auto it = groups_.begin(); it != groups_.end();) {
        if (std::find(it->first.begin(), it->first.end(), w) == it->first.end()) {
            ++it;
            continue;
        }
        weights_.erase(reinterpret_cast<const cmf_backend_weight *>(it->second.get()));
        it = groups_.erase(it);
    }
}

const cmf_backend_weight *BackendProfile::group_of(const cmf_backend_weight *const *ws, uint32_t n) {
    std::vector<const cmf_backend_weight *> list(ws, ws + n);
    auto it = groups_.find(list);
    if (it == groups_.end()) {
        it = groups_.emplace(std::move(list), std::make_unique<char>()).first;
        WeightInfo info;
        std::string dtype;
        for (uint32_t i = 0; i < n; ++i) {
            auto w = weights_.find(ws[i]);
            const std::string label = w == weights_.end() ? "?" : w->second.label;
            if (w != weights_.end()) info.bytes += w->second.bytes;
            // "q4_block [a,b]": the dtype once when every weight shares it.
            const size_t space = label.find(' ');
            const std::string head = space == std::string::npos ? label : label.substr(0, space);
            if (i == 0) {
                dtype = head;
                info.label = label;
            } else {
                info.label += "+" + (head == dtype && space != std::string::npos ? label.substr(space + 1) : label);
            }
        }
        weights_[reinterpret_cast<const cmf_backend_weight *>(it->second.get())] = std::move(info);
    }
    return reinterpret_cast<const cmf_backend_weight *>(it->second.get());
}

void BackendProfile::record(const char *op, const cmf_backend_weight *w, double seconds) {
    Stat &s = stats_[{static_cast<int>(phase_), op, w}];
    ++s.calls;
    s.seconds += seconds;
}

void BackendProfile::note_weight(const cmf_backend_weight *w, const cmf_tensor_view &t) {
    std::string shape = "[";
    for (uint32_t i = 0; i < t.ndim && i < CMF_MAX_DIMS; ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    weights_[w] = WeightInfo{cmf::dtype_name(t.dtype) + " " + shape + "]", t.nbytes};
}

std::string BackendProfile::to_json() const {
    // Weights of one shape and dtype (the same matrix of every layer) share an entry.
    struct Row {
        int phase = 0;
        const char *op = nullptr;
        std::string weight;
        uint64_t weight_bytes = 0;
        Stat stat;
    };
    std::map<std::tuple<int, std::string, std::string>, Row> merged;
    for (const auto &[key, stat] : stats_) {
        const auto &[phase, op, w] = key;
        auto it = w ? weights_.find(w) : weights_.end();
        const WeightInfo *info = it == weights_.end() ? nullptr : &it->second;
        Row &r = merged[{phase, op, info ? info->label : std::string()}];
        r.phase = phase;
        r.op = op;
        if (info) r.weight = info->label, r.weight_bytes = info->bytes;
        r.stat.calls += stat.calls;
        r.stat.seconds += stat.seconds;
    }
    std::vector<Row> rows;
    for (auto &[key, r] : merged) rows.push_back(std::move(r));
    std::sort(rows.begin(), rows.end(), [](const Row &a, const Row &b) {
        return a.phase != b.phase ? a.phase < b.phase : a.stat.seconds > b.stat.seconds;
    });
    boost::json::array ops;
    for (const Row &r : rows)
        ops.push_back(boost::json::object{{"phase", phase_name(r.phase)},
                                          {"op", r.op},
                                          {"weight", r.weight},
                                          {"calls", r.stat.calls},
                                          {"seconds", r.stat.seconds},
                                          {"weight_bytes", r.weight_bytes}});
    return boost::json::serialize(boost::json::object{{"ops", std::move(ops)}});
}

}  // namespace cmf::runtime
