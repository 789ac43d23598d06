#include "runtime/backend_profile.hpp"

#include "common/dtype_name.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

namespace cmf::runtime {

namespace {

using Clock = std::chrono::steady_clock;

// The weight a call works with, for the operations that take one (else
// nullptr): the first weight among its first two arguments. (A fold, not
// overloads: for ops taking two weights, e.g. conv2d's kernel and bias,
// overloads on the first and second position are ambiguous.)
template <class... A>
const cmf_backend_weight *weight_of(const A &...a) {
    const cmf_backend_weight *w = nullptr;
    size_t i = 0;
    (
        [&](const auto &x) {
            if constexpr (std::is_convertible_v<std::remove_cvref_t<decltype(x)>, const cmf_backend_weight *>)
                if (w == nullptr && i < 2) w = x;
            ++i;
        }(a),
        ...);
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
    X(matmul) X(buffer_alloc) X(buffer_free) X(buffer_write) X(buffer_read) X(copy) X(rms_norm) X(rope)              \
        X(gated_act) X(add) X(add_bias) X(embed) X(kv_write) X(attention_ring) X(modulate)                     \
        X(add_gated) X(activation) X(layer_norm) X(rope_table) X(attention_full) X(conv2d) X(group_norm)        \
        X(upsample2x) X(gather_rows) X(scatter_rows) X(copy_rows) X(causal_conv1d_silu) X(gated_delta_net)
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

// A part of a tensor: labelled with the selected extent of its axis
// ("q8_row [1536 of 3072,1024]"), and weighed as that share of its payload
// (what a row subset reads; a column subset reads its columns' share,
// rounded to whole quant groups).
constexpr char k_weight_bind_subset[] = "weight_bind_subset";
cmf_error *bind_subset_shim(void *ctx, const cmf_tensor_view *t, uint32_t axis, const uint32_t *idx, uint64_t n,
                            cmf_backend_weight **out) {
    auto *p = static_cast<BackendProfile *>(ctx);
    const auto t0 = Clock::now();
    cmf_error *e = p->inner().weight_bind_subset(p->inner_ctx(), t, axis, idx, n, out);
    p->record(k_weight_bind_subset, nullptr, std::chrono::duration<double>(Clock::now() - t0).count());
    if (e == nullptr && t != nullptr && out != nullptr && *out != nullptr && axis < t->ndim && t->shape[axis] > 0)
        p->note_subset(*out, *t, axis, n);
    return e;
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

// matmul_grouped: one key per set of dtypes; the bytes are the weights the
// call was given (the selected experts), summed per call.
constexpr char k_matmul_grouped[] = "matmul_grouped";
cmf_error *matmul_grouped_shim(void *ctx, uint32_t n, const cmf_backend_weight *const *ws, const float *const *xs,
                               const uint64_t *n_rows, float *const *ys) {
    auto *p = static_cast<BackendProfile *>(ctx);
    const auto t0 = Clock::now();
    cmf_error *e = p->inner().matmul_grouped(p->inner_ctx(), n, ws, xs, n_rows, ys);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    uint64_t bytes = 0;
    for (uint32_t i = 0; ws != nullptr && n_rows != nullptr && i < n; ++i)
        if (n_rows[i] > 0) bytes += p->bytes_of(ws[i]);
    p->record(k_matmul_grouped, ws != nullptr && n > 0 ? p->grouped_key(ws, n) : nullptr, seconds, bytes);
    return e;
}

// attention and attention_kv: the cache rows the calls read, K and V. A
// query at position p reads rows max(0, p - window + 1) .. p, so the n
// queries of a call read the rows up to the last one's, from the first
// one's window start (each row once: decode's one query, and a prefill
// tile's keys read once for its queries). Counted so that decode's
// attention shows the rate it streams its cache at beside the matmuls'.
uint64_t kv_read_bytes(int32_t cache_dtype, uint64_t n_kv_heads, uint64_t head_dim, uint64_t n_tokens, uint64_t pos0,
                       uint32_t window) {
    if (n_tokens == 0) return 0;
    const uint64_t row_len = n_kv_heads * head_dim, end = pos0 + n_tokens;
    const uint64_t begin = window > 0 && pos0 + 1 > window ? pos0 + 1 - window : 0;
    const uint64_t row_bytes = cache_dtype == CMF_KV_DTYPE_Q8_32 ? CMF_KV_Q8_32_ROW_BYTES(row_len)
                               : cache_dtype == CMF_DTYPE_F16  ? 2 * row_len
                                                               : 4 * row_len;
    return 2 * (end - begin) * row_bytes;
}
constexpr char k_attention[] = "attention";
cmf_error *attention_shim(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                          uint64_t n_tokens, uint64_t pos0, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                          float scale, uint32_t window, float softcap) {
    auto *p = static_cast<BackendProfile *>(ctx);
    const auto t0 = Clock::now();
    cmf_error *e = p->inner().attention(p->inner_ctx(), q, k_cache, v_cache, out, n_tokens, pos0, n_heads, n_kv_heads,
                                        head_dim, scale, window, softcap);
    p->record(k_attention, nullptr, std::chrono::duration<double>(Clock::now() - t0).count(),
              kv_read_bytes(CMF_DTYPE_F32, n_kv_heads, head_dim, n_tokens, pos0, window));
    return e;
}
constexpr char k_attention_kv[] = "attention_kv";
cmf_error *attention_kv_shim(void *ctx, const float *q, const float *k_cache, const float *v_cache, int32_t cache_dtype,
                             float *out, uint64_t n_tokens, uint64_t pos0, uint32_t n_heads, uint32_t n_kv_heads,
                             uint32_t head_dim, float scale, uint32_t window, float softcap) {
    auto *p = static_cast<BackendProfile *>(ctx);
    const auto t0 = Clock::now();
    cmf_error *e = p->inner().attention_kv(p->inner_ctx(), q, k_cache, v_cache, cache_dtype, out, n_tokens, pos0,
                                           n_heads, n_kv_heads, head_dim, scale, window, softcap);
    p->record(k_attention_kv, nullptr, std::chrono::duration<double>(Clock::now() - t0).count(),
              kv_read_bytes(cache_dtype, n_kv_heads, head_dim, n_tokens, pos0, window));
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
    if (inner_.attention) vt_.attention = attention_shim;
    if (inner_.attention_kv) vt_.attention_kv = attention_kv_shim;
    if (inner_.weight_bind_subset) vt_.weight_bind_subset = bind_subset_shim;
    if (inner_.matmul_grouped) vt_.matmul_grouped = matmul_grouped_shim;
}

uint64_t BackendProfile::bytes_of(const cmf_backend_weight *w) const {
    auto it = weights_.find(w);
    return it == weights_.end() ? 0 : it->second.bytes;
}

const cmf_backend_weight *BackendProfile::grouped_key(const cmf_backend_weight *const *ws, uint32_t n) {
    std::vector<std::string> dtypes;
    for (uint32_t i = 0; i < n; ++i) {
        auto w = weights_.find(ws[i]);
        std::string label = w == weights_.end() ? "?" : w->second.label;
        label = label.substr(0, label.find(' '));
        if (std::find(dtypes.begin(), dtypes.end(), label) == dtypes.end()) dtypes.push_back(label);
    }
    std::sort(dtypes.begin(), dtypes.end());
    std::string label = "experts";
    for (size_t i = 0; i < dtypes.size(); ++i) label += (i ? "+" : " ") + dtypes[i];
    auto it = grouped_.find(label);
    if (it == grouped_.end()) {
        it = grouped_.emplace(label, std::make_unique<char>()).first;
        weights_[reinterpret_cast<const cmf_backend_weight *>(it->second.get())] = WeightInfo{label, 0};
    }
    return reinterpret_cast<const cmf_backend_weight *>(it->second.get());
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

void BackendProfile::record(const char *op, const cmf_backend_weight *w, double seconds, uint64_t bytes) {
    Stat &s = stats_[{static_cast<int>(phase_), op, w}];
    ++s.calls;
    s.seconds += seconds;
    s.bytes += bytes == UINT64_MAX ? bytes_of(w) : bytes;
}

void BackendProfile::note_weight(const cmf_backend_weight *w, const cmf_tensor_view &t) {
    std::string shape = "[";
    for (uint32_t i = 0; i < t.ndim && i < CMF_MAX_DIMS; ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    weights_[w] = WeightInfo{cmf::dtype_name(t.dtype) + " " + shape + "]", t.nbytes};
}

void BackendProfile::note_subset(const cmf_backend_weight *w, const cmf_tensor_view &t, uint32_t axis, uint64_t n) {
    std::string shape = "[";
    for (uint32_t i = 0; i < t.ndim && i < CMF_MAX_DIMS; ++i)
        shape += (i ? "," : "") + (i == axis ? std::to_string(n) + " of " : std::string()) + std::to_string(t.shape[i]);
    const double share = double(n) / double(t.shape[axis]);
    weights_[w] = WeightInfo{cmf::dtype_name(t.dtype) + " " + shape + "]", uint64_t(double(t.nbytes) * share + 0.5)};
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
        r.stat.bytes += stat.bytes;
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
                                          {"weight_bytes", r.weight_bytes},
                                          {"read_bytes", r.stat.bytes}});
    return boost::json::serialize(boost::json::object{{"ops", std::move(ops)}});
}

}  // namespace cmf::runtime
