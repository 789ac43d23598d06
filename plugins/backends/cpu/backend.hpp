// What the CPU backend's translation units share: the bound weight, the
// backend object, the loop helper over the runtime's pool, and the
// operations one file implements and another builds on (conv2d runs
// through matmul).
#pragma once

#include <cmf/cmf_plugin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace cmf::cpu {
// Built with AddressSanitizer (GCC defines the macro, clang answers the
// feature test): buffer_alloc then keeps every buffer on the heap, where
// ASan sees overruns, and the tests skip what only holds for mappings.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAsan = true;
#else
inline constexpr bool kUnderAsan = false;
#endif
#else
inline constexpr bool kUnderAsan = false;
#endif

// Anonymous memory, 2 MiB-aligned and advised into 2 MiB pages (the pages a
// mapped model's weights get where the kernel gives them). Pages are made
// when first touched; `what` names the memory in the out-of-memory error.
// `reserve`: the mapping counts against the kernel's overcommit check as
// malloc's do, so that a size the machine cannot hold fails here, with an
// error, rather than when its pages are touched (a decode copy's chunks are
// mapped without: they are filled at once, within a budget).
class PageMemory {
public:
    explicit PageMemory(size_t bytes, const char *what = "decode copy", bool reserve = false);
    ~PageMemory();
    PageMemory(const PageMemory &) = delete;
    PageMemory &operator=(const PageMemory &) = delete;
    uint8_t *data() const { return data_; }
    size_t size() const { return size_; }

private:
    void *map_ = nullptr;
    size_t map_bytes_ = 0;
    uint8_t *data_ = nullptr;
    size_t size_ = 0;
};
// Where decode copies live: chunks of at least 64 MiB handed out in turn,
// so that a model's many 1-4 MB matrices sit in 2 MiB pages (a mapping of
// each copy alone gets 4 KiB pages below 2 MiB: of a 0.6B q4 model's 320
// MiB of copies only the 83 MiB head was in 2 MiB pages that way, and its
// decode read them slower). A chunk is unmapped when the last weight in it
// is freed.
class CopyArena {
public:
    // Room for `bytes` (64-byte aligned) and the chunk it lies in.
    std::shared_ptr<PageMemory> take(size_t bytes, uint8_t **at);

private:
    std::mutex mutex_;
    std::shared_ptr<PageMemory> chunk_;
    size_t used_ = 0;
};
}  // namespace cmf::cpu

struct cmf_backend_weight {
    cmf_tensor_view view;
    const cmf_codec_vt *codec;  // NULL for f32
    void *codec_ctx;
    uint64_t rows;  // outputs per token (a row subset: the selected rows)
    uint64_t cols;  // columns of the payload the kernels read (`view`)
    // weight_bind_subset, rows: the selected rows as runs of consecutive
    // source rows; output row dst + i is source row src + i. Empty: all rows.
    struct Run {
        uint64_t src, len, dst;
    };
    std::vector<Run> runs;
    // weight_bind_subset, columns: the caller gives in_cols inputs per
    // token; input j is column x_map[j] of the payload (the other columns,
    // left-out columns sharing a quant group with selected ones, get 0).
    // in_cols == cols and x_map empty when the inputs are the columns.
    uint64_t in_cols = 0;
    std::vector<uint64_t> x_map;
    std::vector<uint8_t> gathered;  // the selected columns' payload (`view` points here)
    // 1-D vectors (norm weights, biases) are decoded to f32 once at bind
    // time: they are tiny and read by element-wise operations.
    std::vector<float> vec;
    // The codec hands this weight over as int8 codes + block scales
    // (cmf_codec_vt.int8_rows answered yes at bind time).
    bool int8 = false;
    // The codec's matmul_rows_x, when its struct_size covers it (else NULL).
    decltype(cmf_codec_vt::matmul_rows_x) matmul_rows_x = nullptr;
    // CMF_CPU_DECODE_COPY=1: the chunk holding the payload in the
    // memory-only layout its codec made (cmf_codec_vt.decode_copy); `view`
    // then points into it, with that layout's dtype, and every operation
    // reads the copy.
    std::shared_ptr<cmf::cpu::PageMemory> decode_copy;
    uint64_t decode_copy_bytes = 0;  // its size, counted against Backend::copy_budget
};

namespace cmf::cpu {

struct Backend {
    const cmf_host_api *host;
    std::string description;
    cmf_backend_vt vt;
    bool int8_gemm = true;
    // Prefill of the gated delta rule in the chunked (WY) form; the
    // environment's CMF_CPU_DELTA_CHUNKED=0 keeps the recurrence (A/B runs).
    bool delta_chunked = true;
    // Matrices whose codec offers a decode layout (cmf_codec_vt.decode_copy)
    // are copied into it when bound, for faster decode, while the copies
    // fit copy_budget (by default half the memory available when the
    // backend starts; CMF_CPU_DECODE_COPY=1: always, =0: never;
    // docs/runtime.md, "Decode copies").
    enum class DecodeCopy { never, within_budget, always };
    DecodeCopy decode_copy = DecodeCopy::within_budget;
    uint64_t copy_budget = 0;  // within_budget only
    std::atomic<uint64_t> copied{0};          // bytes of the live copies
    std::atomic<bool> budget_reached{false};  // logged once
    cmf::cpu::CopyArena copies;
    // buffer_alloc's buffers of kHugeBufferBytes and more (a session's KV
    // cache above all), each a PageMemory: a cache grows a row at a time,
    // and in 4 KiB pages every second Qwen3-0.6B row of each layer's K and V
    // was a new page to fault, dear where page tables are virtualised
    // (docs/performance.md, "KV caches in 2 MiB pages"). Smaller buffers
    // come from the host's allocator, as do all under AddressSanitizer
    // (which then sees their overruns).
    static constexpr size_t kHugeBufferBytes = size_t(2) << 20;
    std::mutex huge_buffers_mu;
    std::unordered_map<const void *, std::unique_ptr<cmf::cpu::PageMemory>> huge_buffers;
};

inline Backend *as_backend(void *ctx) { return static_cast<Backend *>(ctx); }

// Threads of the runtime pool the loops run on (work is cut per thread).
inline uint64_t pool_threads(const Backend *be) {
    return static_cast<uint64_t>(std::max(1, be->host->num_threads(be->host->host_ctx)));
}

// Runs body(begin, end) over [0, n) on the runtime pool.
template <class F>
void parallel(Backend *be, uint64_t n, uint64_t grain, F &&body) {
    if (n == 0) return;
    // One chunk's worth: run here; entering the pool costs more than the
    // work (decode calls many tiny element-wise operations per token).
    if (n <= grain) {
        body(uint64_t(0), n);
        return;
    }
    auto tramp = [](void *user, uint64_t b, uint64_t e) { (*static_cast<F *>(user))(b, e); };
    be->host->parallel_for(be->host->host_ctx, 0, n, std::max<uint64_t>(1, grain), tramp, &body);
}

// GELU with the tanh approximation (PyTorch's approximate="tanh").
inline float gelu_tanh(float t) {
    constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * t * (1.0f + std::tanh(kC * (t + 0.044715f * t * t * t)));
}

// The f32 values of a bound 1-D weight of `dim` elements; throws
// cmf::sdk::Error naming `op` when w is not such a vector.
const float *vector_of(const cmf_backend_weight *w, uint64_t dim, const char *op);

// cmf_backend_vt.matmul (cpu_backend.cpp).
cmf_error *matmul(void *ctx, const cmf_backend_weight *w, const float *x, uint64_t n_batch, float *y);

// The image and diffusion operations (image_ops.cpp) into `vt`.
void set_image_ops(cmf_backend_vt &vt);

}  // namespace cmf::cpu
