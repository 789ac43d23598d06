// The CPU backend plugin: the default compute path. Weights stay where the
// file mapping has them (zero copy); every parallel loop runs on the
// runtime's pool through host->parallel_for. Activation buffers are host
// memory from host->alloc_aligned.
//
// How a matmul over a stored 2-D weight is computed, first match wins:
//  - few tokens (decode, n_batch < kGemmMinBatch): memory-bound; the
//    backend's own row kernels for f32/f16/bf16 (f16 widened with F16C in
//    registers), else the codec's matmul_rows, else dequantized row tiles;
//  - many tokens (prefill): compute-bound; the activations are packed once
//    (pack_x), then each panel of kPanelRows weight rows is widened to f32
//    (f16/bf16 conversion, or the codec's dequantize_rows), packed (pack_w)
//    and run through the register-blocked gemm_packed kernel over all tokens.
//    A codec's own matmul_rows is kept only for small batches
//    (< kGemmMinBatchCodec; q8 with the codec's AVX-512 VNNI kernels
//    < kGemmMinBatchQ8Vnni), where its fused dot products win over decode
//    + GEMM;
//  - many tokens and a codec with an exact int8 view of the weight
//    (cmf_codec_vt.int8_rows: q8_row, q4_block/q4_tiled): the int8 GEMM of
//    gemm_i8.hpp instead (matmul_int8 below), unless kInt8Gemm is false or
//    the environment sets CMF_CPU_INT8_GEMM=0 (A/B benchmarks);
//  - many tokens, bf16 weights and an AMD CPU with AVX-512 BF16: the bf16
//    GEMM of gemm_bf16.hpp (the activations rounded to bf16), unless the
//    environment sets CMF_CPU_BF16_GEMM=0 (=1: on other CPUs too).
#include "backend.hpp"
#include "delta_net.hpp"
#include "gemm_bf16.hpp"
#include "gemm_i8.hpp"
#include "kernels.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/cpu_features.hpp>
#include <cmf/plugin.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

namespace {

using cmf::sdk::Error;
using cmf::cpu::as_backend;
using cmf::cpu::gelu_tanh;
using cmf::cpu::Backend;
using cmf::cpu::parallel;
using cmf::cpu::pool_threads;
using cmf::cpu::vector_of;

constexpr uint64_t kGemmMinBatch = 4;
// Measured on the 0.6B shape at q8_row: pp64 went from 12 tok/s through
// the fused kernel to the f16 GEMM's rate through dequantized panels.
constexpr uint64_t kGemmMinBatchCodec = 16;
// q8 weights (q8_row, q8_2f) when the codec runs its AVX-512 VNNI kernels:
// its k-token kernel (16 rows x 64 columns transposed in registers, up to 8
// tokens a pass, each row group read from memory once) outran the int8 GEMM
// below about 90 tokens. bench_qwen --gemm 3072x1024 --dtype q8, 60
// matrices streamed, 2 threads, GFLOP/s, GEMM / k-token: pp16 214 / 514,
// pp32 367 / 610, pp64 507-536 / 600-677, pp96 811 / 776, pp256 983 / 844.
constexpr uint64_t kGemmMinBatchQ8Vnni = 64;
// The codec plugin picks its VNNI kernels by the same test (the CPU, capped
// by CMF_CODECS_ISA).
bool codec_q8_vnni() {
    static const bool yes = cmf::cpu_has_avx512_vnni() && cmf::isa_cap_from_env("CMF_CODECS_ISA") >= 2;
    return yes;
}
// The smallest batch a codec weight's matmul takes a GEMM for.
uint64_t gemm_min_batch_codec(const cmf_backend_weight *w) {
    const bool q8 = w->view.dtype == CMF_DTYPE_Q8_ROW || w->view.dtype == CMF_DTYPE_Q8_2F;
    return q8 && codec_q8_vnni() ? kGemmMinBatchQ8Vnni : kGemmMinBatchCodec;
}
// Rows per prefill chunk: two packed panels, so the AVX-512 GEMM's 32-row
// micro-kernel sees both (the AVX2 one runs them one after the other).
constexpr uint64_t kPanelRows = 2 * cmf::cpu::kGemmRows;
// The int8 prefill GEMM for weights with an int8 view (see the top).
constexpr bool kInt8Gemm = true;
// Weight rows per int8 work item: four 8-row groups (64 KiB of packed int16
// codes at 1024 columns: L2), half as many work items as the f32 GEMM's
// 16-row panels; each 4-token activation tile meets all of them from L1.
constexpr uint64_t kInt8PanelRows = 4 * cmf::cpu::i8::kRows;


// Fills in how `w` (view set) is multiplied: its codec, int8 view, fused kernel.
void init_weight(Backend *be, cmf_backend_weight &w) {
    const cmf_tensor_view *t = &w.view;
    w.rows = t->ndim == 2 ? t->shape[0] : 1;
    w.cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    w.in_cols = w.cols;
    w.codec = nullptr;
    w.codec_ctx = nullptr;
    w.int8 = false;
    w.matmul_rows_x = nullptr;
    if (t->dtype != CMF_DTYPE_F32) {
        w.codec = be->host->find_codec(be->host->host_ctx, t->dtype, &w.codec_ctx);
        if (w.codec == nullptr) throw Error(CMF_ERR_UNKNOWN_DTYPE, "no codec plugin provides dtype " + std::to_string(t->dtype));
        uint64_t expect = 0;
        if (cmf_error *e = w.codec->expected_size(w.codec_ctx, t->ndim, t->shape, &expect)) throw cmf::sdk::HostError{e};
        if (expect != CMF_SIZE_VARIABLE && expect != t->nbytes)
            throw Error(CMF_ERR_BOUNDS, "weight_bind: payload size does not match its shape and dtype");
    } else if (t->nbytes != w.rows * w.cols * sizeof(float)) {
        throw Error(CMF_ERR_BOUNDS, "weight_bind: f32 payload size does not match its shape");
    }
    if (be->int8_gemm && t->ndim == 2 && w.codec != nullptr &&
        w.codec->struct_size >= offsetof(cmf_codec_vt, int8_rows) + sizeof(void *) && w.codec->int8_rows != nullptr) {
        // Asking costs an error object when the answer is no: once per bind.
        cmf_error *e = w.codec->int8_rows(w.codec_ctx, t, 0, 0, nullptr, nullptr);
        w.int8 = e == nullptr;
        if (e != nullptr) be->host->error_free(e);
    }
    if (w.codec != nullptr && w.codec->struct_size >= offsetof(cmf_codec_vt, matmul_rows_x) + sizeof(void *))
        w.matmul_rows_x = w.codec->matmul_rows_x;
}

void decode_vector(cmf_backend_weight &w) {
    w.vec.resize(w.cols);
    if (w.codec == nullptr) {
        std::memcpy(w.vec.data(), w.view.data, w.cols * sizeof(float));
    } else if (cmf_error *e = w.codec->dequantize_rows(w.codec_ctx, &w.view, 0, 1, w.vec.data())) {
        throw cmf::sdk::HostError{e};
    }
}

}  // namespace

namespace cmf::cpu {
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kCopyChunk = size_t(64) << 20;

PageMemory::PageMemory(size_t bytes, const char *what, bool reserve)
    : size_((std::max<size_t>(bytes, 1) + kHugePage - 1) & ~(kHugePage - 1)) {
    if (bytes > SIZE_MAX / 2)  // (the rounding and the alignment slack below would wrap)
        throw Error(CMF_ERR_OUT_OF_MEMORY, std::string(what) + ": cannot map " + std::to_string(bytes) + " bytes");
    map_bytes_ = size_ + kHugePage;
    map_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (reserve ? 0 : MAP_NORESERVE),
                -1, 0);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        throw Error(CMF_ERR_OUT_OF_MEMORY, std::string(what) + ": cannot map " + std::to_string(size_) + " bytes");
    }
    data_ = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(map_) + kHugePage - 1) & ~uintptr_t(kHugePage - 1));
    madvise(data_, size_, MADV_HUGEPAGE);
}
PageMemory::~PageMemory() {
    if (map_ != nullptr) munmap(map_, map_bytes_);
}

std::shared_ptr<PageMemory> CopyArena::take(size_t bytes, uint8_t **at) {
    const size_t need = (bytes + 63) & ~size_t(63);
    std::lock_guard<std::mutex> lock(mutex_);
    if (chunk_ == nullptr || chunk_->size() - used_ < need) {
        chunk_ = std::make_shared<PageMemory>(std::max(need, kCopyChunk));
        used_ = 0;
    }
    *at = chunk_->data() + used_;
    used_ += need;
    return chunk_;
}
}  // namespace cmf::cpu

namespace {

// The first unsigned number in a file, if it holds one ("max" does not).
bool read_u64_file(const char *path, uint64_t &v) {
    FILE *f = std::fopen(path, "r");
    if (f == nullptr) return false;
    unsigned long long n = 0;
    const bool ok = std::fscanf(f, "%llu", &n) == 1;
    std::fclose(f);
    v = n;
    return ok;
}
// What the process's memory cgroup still allows (its limit less its usage,
// page cache included, so on the low side), or UINT64_MAX without a limit:
// in a container MemAvailable is the host's.
uint64_t cgroup_room() {
    uint64_t limit = 0, usage = 0;
    if ((read_u64_file("/sys/fs/cgroup/memory.max", limit) && read_u64_file("/sys/fs/cgroup/memory.current", usage)) ||
        (read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes", limit) &&
         read_u64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes", usage)))
        return limit > usage ? limit - usage : 0;
    return UINT64_MAX;
}

// What the decode copies may take: CMF_CPU_DECODE_COPY_BUDGET_MIB, else
// half of the memory the kernel reports available when the backend starts
// (MemAvailable, or the cgroup's room where that is less): a model that
// fits is copied whole, one that does not keeps streaming most of its
// weights from the file's mapping, whose pages the kernel can drop under
// pressure where it cannot drop the copies.
uint64_t decode_copy_budget(const cmf_host_api *host) {
    if (const char *env = std::getenv("CMF_CPU_DECODE_COPY_BUDGET_MIB"); env != nullptr) {
        char *end = nullptr;
        const unsigned long long mib = std::strtoull(env, &end, 10);
        if (end != env && *end == '\0') return uint64_t(mib) << 20;
        host->log(host->host_ctx, CMF_LOG_WARN,
                  ("cpu backend: CMF_CPU_DECODE_COPY_BUDGET_MIB=" + std::string(env) +
                   " is not a number of MiB; using half the available memory")
                      .c_str());
    }
    uint64_t available = 0;
    if (FILE *f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        unsigned long long kib = 0;
        while (std::fgets(line, sizeof line, f) != nullptr)
            if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
                available = uint64_t(kib) << 10;
                break;
            }
        std::fclose(f);
    }
    if (available == 0) available = uint64_t(sysconf(_SC_AVPHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
    return std::min(available, cgroup_room()) / 2;
}

// CMF_CPU_DECODE_COPY: a matrix whose codec has a decode layout for it is
// copied into that layout, and the weight reads the copy from then on. The
// host is told the source bytes are no longer read here: where they are a
// model file's mapping it drops their pages, so the weights are not held
// in memory twice (read again from the file should anyone read them).
void make_decode_copy(Backend *be, cmf_backend_weight &w) {
    if (w.view.ndim != 2 || w.codec == nullptr ||
        w.codec->struct_size < offsetof(cmf_codec_vt, decode_copy) + sizeof(void *) || w.codec->decode_copy == nullptr)
        return;
    // Its dtype and size first, then the codec writes it where it stays.
    uint64_t bytes = 0;
    int32_t dtype = -1;
    if (cmf_error *e = w.codec->decode_copy(w.codec_ctx, &w.view, nullptr, 0, &bytes, &dtype)) throw cmf::sdk::HostError{e};
    if (dtype < 0) return;
    if (be->decode_copy == Backend::DecodeCopy::within_budget) {
        uint64_t now = be->copied.load();
        do {
            if (now + bytes > be->copy_budget) {
                if (!be->budget_reached.exchange(true))
                    be->host->log(be->host->host_ctx, CMF_LOG_INFO,
                                  ("cpu backend: decode copies stop at " + std::to_string(now >> 20) + " MiB (budget " +
                                   std::to_string(be->copy_budget >> 20) +
                                   " MiB: half the memory available at start unless CMF_CPU_DECODE_COPY_BUDGET_MIB "
                                   "sets it): the other weights are read from the file as they are")
                                      .c_str());
                return;
            }
        } while (!be->copied.compare_exchange_weak(now, now + bytes));
    } else {
        be->copied += bytes;
    }
    // The reservation goes back if the copy fails (the weight is then
    // dropped without weight_free).
    struct Reserved {
        Backend *be;
        uint64_t bytes;
        ~Reserved() { be->copied -= bytes; }
    } reserved{be, bytes};
    uint8_t *at = nullptr;
    std::shared_ptr<cmf::cpu::PageMemory> chunk = be->copies.take(bytes, &at);
    if (cmf_error *e = w.codec->decode_copy(w.codec_ctx, &w.view, at, bytes, &bytes, &dtype)) throw cmf::sdk::HostError{e};
    w.decode_copy_bytes = reserved.bytes;
    reserved.bytes = 0;
    if (be->host->struct_size >= offsetof(cmf_host_api, release_pages) + sizeof(void *) && be->host->release_pages != nullptr)
        be->host->release_pages(be->host->host_ctx, w.view.data, w.view.nbytes);
    w.view.dtype = dtype;
    w.view.data = at;
    w.view.nbytes = bytes;
    w.view.facts = 0;  // the copy's codec has established nothing about these bytes
    w.decode_copy = std::move(chunk);
    init_weight(be, w);
}

cmf_error *weight_bind(void *ctx, const cmf_tensor_view *t, cmf_backend_weight **out) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (t == nullptr || out == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "weight_bind: NULL argument");
        if (t->ndim < 1 || t->ndim > 2)
            throw Error(CMF_ERR_UNSUPPORTED, "weight_bind: a weight must be 1-D (vector) or 2-D (matrix)");
        auto w = std::make_unique<cmf_backend_weight>();
        w->view = *t;
        init_weight(be, *w);
        if (t->ndim == 1) decode_vector(*w);
        if (be->decode_copy != Backend::DecodeCopy::never) make_decode_copy(be, *w);
        *out = w.release();
    });
}

// Rows left out of a row subset are never read: the mapping is told not to
// read around the rows that are (MADV_RANDOM: a fault brings in its own
// page only) nor to collapse the payload into 2 MiB pages (which would read
// all of it). Advice only: on memory that is not a file mapping it changes
// nothing that matters.
void advise_sparse_reads(const cmf_tensor_view &t) {
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t a = reinterpret_cast<uintptr_t>(t.data) & ~(page - 1);
    const uintptr_t b = (reinterpret_cast<uintptr_t>(t.data) + t.nbytes + page - 1) & ~(page - 1);
    if (b <= a) return;
    madvise(reinterpret_cast<void *>(a), b - a, MADV_RANDOM);
    madvise(reinterpret_cast<void *>(a), b - a, MADV_NOHUGEPAGE);
}

// The column blocks holding `idx` (granularity g), their payload through
// the codec (f32: here), and where each selected column lands in it.
void gather_columns(Backend *be, cmf_backend_weight &w, const uint32_t *idx, uint64_t n) {
    const cmf_tensor_view src = w.view;
    uint64_t g = 1;
    const bool f32 = src.dtype == CMF_DTYPE_F32;
    const bool has_select = w.codec != nullptr &&
                            w.codec->struct_size >= offsetof(cmf_codec_vt, select_columns) + sizeof(void *) &&
                            w.codec->select_columns != nullptr;
    if (!f32) {
        g = 0;
        if (has_select)
            if (cmf_error *e = w.codec->select_columns(w.codec_ctx, &src, nullptr, 0, nullptr, &g)) throw cmf::sdk::HostError{e};
    }
    if (g == 0) {
        // This dtype cannot select columns: the whole rows are read, the
        // left-out columns' inputs are 0.
        w.x_map.assign(idx, idx + n);
        w.in_cols = n;
        return;
    }
    std::vector<uint64_t> blocks;
    for (uint64_t j = 0; j < n; ++j)
        if (blocks.empty() || blocks.back() != idx[j] / g) blocks.push_back(idx[j] / g);
    if (f32) {
        const float *p = static_cast<const float *>(src.data);
        w.gathered.resize(w.rows * n * sizeof(float));
        float *d = reinterpret_cast<float *>(w.gathered.data());
        for (uint64_t r = 0; r < w.rows; ++r)
            for (uint64_t j = 0; j < n; ++j) *d++ = p[r * w.cols + idx[j]];
    } else {
        cmf_byte_sink sink{};
        sink.struct_size = sizeof sink;
        sink.user = &w.gathered;
        sink.append = [](void *user, const void *data, size_t len) -> cmf_error * {
            auto *v = static_cast<std::vector<uint8_t> *>(user);
            const uint8_t *p = static_cast<const uint8_t *>(data);
            v->insert(v->end(), p, p + len);
            return nullptr;
        };
        if (cmf_error *e = w.codec->select_columns(w.codec_ctx, &src, blocks.data(), blocks.size(), &sink, &g))
            throw cmf::sdk::HostError{e};
    }
    cmf_tensor_view v = src;
    v.shape[1] = blocks.size() * g;
    v.data = w.gathered.data();
    v.nbytes = w.gathered.size();
    v.facts = 0;  // other bytes than the ones the source's facts were established of
    const uint64_t rows = w.rows;
    w.view = v;
    init_weight(be, w);
    w.rows = rows;
    w.in_cols = n;
    if (g > 1) {  // inputs land inside their quant groups
        w.x_map.resize(n);
        uint64_t k = 0;
        for (uint64_t j = 0; j < n; ++j) {
            while (blocks[k] != idx[j] / g) ++k;
            w.x_map[j] = k * g + idx[j] % g;
        }
    }
}

cmf_error *weight_bind_subset(void *ctx, const cmf_tensor_view *t, uint32_t axis, const uint32_t *idx, uint64_t n,
                              cmf_backend_weight **out) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (t == nullptr || out == nullptr || idx == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "weight_bind_subset: NULL argument");
        if (t->ndim < 1 || t->ndim > 2)
            throw Error(CMF_ERR_UNSUPPORTED, "weight_bind_subset: a weight must be 1-D (vector) or 2-D (matrix)");
        if (axis > 1 || (axis == 1 && t->ndim != 2))
            throw Error(CMF_ERR_INVALID_ARGUMENT, "weight_bind_subset: axis " + std::to_string(axis) + " of a " +
                                                      std::to_string(t->ndim) + "-D tensor");
        const uint64_t extent = t->ndim == 1 ? t->shape[0] : t->shape[axis];
        if (n == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "weight_bind_subset: no index selected");
        for (uint64_t j = 0; j < n; ++j) {
            if (idx[j] >= extent)
                throw Error(CMF_ERR_BOUNDS, "weight_bind_subset: index " + std::to_string(idx[j]) + " beyond " + std::to_string(extent));
            if (axis == 1 && j > 0 && idx[j] <= idx[j - 1])
                throw Error(CMF_ERR_INVALID_ARGUMENT, "weight_bind_subset: columns must be ascending and distinct");
        }
        auto w = std::make_unique<cmf_backend_weight>();
        w->view = *t;
        init_weight(be, *w);
        if (t->ndim == 1) {
            decode_vector(*w);
            std::vector<float> sel(n);
            for (uint64_t j = 0; j < n; ++j) sel[j] = w->vec[idx[j]];
            w->vec = std::move(sel);
            w->cols = w->in_cols = n;
        } else if (axis == 0) {
            for (uint64_t j = 0; j < n; ++j) {
                if (!w->runs.empty() && w->runs.back().src + w->runs.back().len == idx[j]) ++w->runs.back().len;
                else w->runs.push_back({idx[j], 1, j});
            }
            w->rows = n;
            if (n < extent) advise_sparse_reads(*t);
        } else {
            gather_columns(be, *w, idx, n);
        }
        *out = w.release();
    });
}

void weight_free(void *ctx, cmf_backend_weight *w) {
    if (w != nullptr) as_backend(ctx)->copied -= w->decode_copy_bytes;
    delete w;
}

// ---- matmul -------------------------------------------------------------------

struct MatmulJob {
    const cmf_backend_weight *w;
    const float *x;
    uint64_t n_batch;
    float *y;
    const cmf_host_api *host;
    cmf_error *error;  // first error of any chunk (see record_error)
    const float *xp;   // prefill: x packed for the GEMM (kernels.hpp layout)
    const int16_t *xq;  // int8 prefill: x quantized and packed (gemm_i8.hpp layout)
    const float *xd;    //   and its block scales
    uint64_t x_id;      // this call's cmf_codec_vt.matmul_rows_x id
    cmf_range_fn inner = nullptr;  // matmul_chunk_runs: the row loop of one run
    const uint32_t *xb = nullptr;  // bf16 prefill: x rounded and packed (gemm_bf16.hpp layout)
};

// A fresh nonzero x_id per matmul call, unique in the process: every row
// range of one call shares it, so the codec quantizes x once per thread.
uint64_t next_x_id() {
    static std::atomic<uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

void record_error(MatmulJob *job, cmf_error *e) {
    // Chunks run concurrently: keep the first error, release the others.
    cmf_error *expected = nullptr;
    if (!__atomic_compare_exchange_n(&job->error, &expected, e, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        job->host->error_free(e);
}

// Source rows of output rows [r0, r1): f(src_begin, src_end, output offset from r0).
template <class F>
void for_source_rows(const cmf_backend_weight *w, uint64_t r0, uint64_t r1, F &&f) {
    if (w->runs.empty()) return f(r0, r1, uint64_t(0));
    auto it = std::upper_bound(w->runs.begin(), w->runs.end(), r0,
                               [](uint64_t v, const cmf_backend_weight::Run &r) { return v < r.dst + r.len; });
    for (; it != w->runs.end() && it->dst < r1; ++it) {
        const uint64_t a = std::max(r0, it->dst), b = std::min(r1, it->dst + it->len);
        f(it->src + (a - it->dst), it->src + (b - it->dst), a - r0);
    }
}

bool native_dtype(int32_t dtype) {
    return dtype == CMF_DTYPE_F32 || dtype == CMF_DTYPE_F16 || dtype == CMF_DTYPE_BF16;
}

void matmul_chunk_native(void *user, uint64_t r0, uint64_t r1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    const auto &k = cmf::cpu::kernels();
    switch (w->view.dtype) {
    case CMF_DTYPE_F16:
        k.matmul_f16(static_cast<const uint16_t *>(w->view.data), w->cols, job->x, w->cols, job->n_batch, r0, r1,
                     job->y, w->rows);
        break;
    case CMF_DTYPE_BF16:
        k.matmul_bf16(static_cast<const uint16_t *>(w->view.data), w->cols, job->x, w->cols, job->n_batch, r0, r1,
                      job->y, w->rows);
        break;
    default:
        k.matmul_f32(static_cast<const float *>(w->view.data), w->cols, job->x, w->cols, job->n_batch, r0, r1, job->y,
                     w->rows);
    }
}

void matmul_chunk_codec(void *user, uint64_t r0, uint64_t r1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    cmf_error *e = w->matmul_rows_x != nullptr
                       ? w->matmul_rows_x(w->codec_ctx, &w->view, job->x, w->cols, job->n_batch, r0, r1, job->y,
                                          w->rows, job->x_id)
                       : w->codec->matmul_rows(w->codec_ctx, &w->view, job->x, w->cols, job->n_batch, r0, r1, job->y,
                                               w->rows);
    if (e) record_error(job, e);
}

void matmul_chunk_dequant(void *user, uint64_t r0, uint64_t r1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    constexpr uint64_t kTileRows = 16;
    std::vector<float> tile(kTileRows * w->cols);
    for (uint64_t t0 = r0; t0 < r1; t0 += kTileRows) {
        uint64_t t1 = std::min(r1, t0 + kTileRows);
        if (cmf_error *e = w->codec->dequantize_rows(w->codec_ctx, &w->view, t0, t1, tile.data())) {
            record_error(job, e);
            return;
        }
        // The tile holds rows t0..t1; write them to their columns of y.
        cmf::cpu::kernels().matmul_f32(tile.data() - t0 * w->cols, w->cols, job->x, w->cols, job->n_batch, t0, t1,
                                       job->y, w->rows);
    }
}

// A thread's scratch of n elements that starts on a 64-byte line. The GEMM
// micro-kernels load whole zmm rows of their packed panels and pack_w reads
// the widened rows a zmm at a time; a std::vector starts only 16-byte
// aligned, and where in a line it started changed with whatever the
// process had allocated before: q1s's decode copies moved the f32 GEMM's
// panels off their lines and its pp512 from 265-269 to 225-227 tok/s;
// aligned, f16's pp512 went from 243-256 to 265-271 (the Intel Xeon VM).
template <class T>
T *line_aligned(std::vector<T> &v, uint64_t n) {
    v.resize(n + 64 / sizeof(T));
    const uintptr_t at = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (64 - at % 64) % 64 / sizeof(T);
}

// Prefill: [p0, p1) are panels of kPanelRows weight rows. Each panel is
// widened to f32 (f32 weights are read in place) and packed k-major into a
// per-thread buffer, where it stays in L2 while it meets every token block
// of the activations, packed once for the whole matmul (job->xp).
void matmul_chunk_gemm(void *user, uint64_t p0, uint64_t p1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    const auto &k = cmf::cpu::kernels();
    const uint64_t cols = w->cols;
    // Thread-local: a chunk runs to completion on one thread, and the pool
    // threads live as long as the runtime, so no allocation (and no fresh
    // pages to fault in) per chunk.
    thread_local std::vector<float> wide_room, packed_room;
    float *const wide = w->view.dtype == CMF_DTYPE_F32 && w->runs.empty() ? nullptr : line_aligned(wide_room, kPanelRows * cols);
    float *const packed = line_aligned(packed_room, cmf::cpu::packed_w_floats(kPanelRows, cols));
    for (uint64_t p = p0; p < p1; ++p) {
        const uint64_t r0 = p * kPanelRows, r1 = std::min(w->rows, r0 + kPanelRows);
        const float *src = wide;
        if (w->view.dtype == CMF_DTYPE_F32 && w->runs.empty()) {
            src = static_cast<const float *>(w->view.data) + r0 * cols;
        } else {
            bool failed = false;
            for_source_rows(w, r0, r1, [&](uint64_t s0, uint64_t s1, uint64_t off) {
                const uint64_t n = (s1 - s0) * cols;
                float *dst = wide + off * cols;
                switch (w->view.dtype) {
                case CMF_DTYPE_F32: std::memcpy(dst, static_cast<const float *>(w->view.data) + s0 * cols, n * sizeof(float)); break;
                case CMF_DTYPE_F16: k.convert_f16(static_cast<const uint16_t *>(w->view.data) + s0 * cols, n, dst); break;
                case CMF_DTYPE_BF16: k.convert_bf16(static_cast<const uint16_t *>(w->view.data) + s0 * cols, n, dst); break;
                default:
                    if (cmf_error *e = w->codec->dequantize_rows(w->codec_ctx, &w->view, s0, s1, dst)) {
                        if (!failed) record_error(job, e);
                        else job->host->error_free(e);
                        failed = true;
                    }
                }
            });
            if (failed) return;
        }
        k.pack_w(src, cols, r1 - r0, cols, packed);
        k.gemm_packed(packed, r1 - r0, cols, job->xp, job->n_batch, job->y + r0, w->rows);
    }
}

// int8 prefill: [p0, p1) are panels of kInt8PanelRows weight rows. The codec
// writes each panel's codes and block scales (int8_rows), they are packed
// into a per-thread buffer and multiplied with every token tile of the
// activations, quantized and packed once for the whole matmul (job->xq,
// job->xd).
void matmul_chunk_int8(void *user, uint64_t p0, uint64_t p1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    namespace i8 = cmf::cpu::i8;
    const auto &k = i8::kernels();
    const uint64_t cols = w->cols, nb = i8::blocks(cols);
    thread_local std::vector<int8_t> codes;
    thread_local std::vector<float> scales, wd;
    thread_local std::vector<int16_t> wp_room;
    codes.resize(kInt8PanelRows * nb * i8::kBlock);
    scales.resize(kInt8PanelRows * nb);
    int16_t *const wp = line_aligned(wp_room, i8::packed_w_count(kInt8PanelRows, cols));
    wd.resize(i8::packed_wd_floats(kInt8PanelRows, cols));
    for (uint64_t p = p0; p < p1; ++p) {
        const uint64_t r0 = p * kInt8PanelRows, r1 = std::min(w->rows, r0 + kInt8PanelRows);
        bool failed = false;
        for_source_rows(w, r0, r1, [&](uint64_t s0, uint64_t s1, uint64_t off) {
            if (failed) return;
            if (cmf_error *e = w->codec->int8_rows(w->codec_ctx, &w->view, s0, s1, codes.data() + off * nb * i8::kBlock,
                                                   scales.data() + off * nb)) {
                record_error(job, e);
                failed = true;
            }
        });
        if (failed) return;
        k.pack_w(codes.data(), scales.data(), r1 - r0, cols, wp, wd.data());
        k.gemm(wp, wd.data(), r1 - r0, cols, job->xq, job->xd, job->n_batch, job->y + r0, w->rows);
    }
}

// bf16 prefill: [p0, p1) are panels of kPanelRows weight rows, packed as
// stored (no widening) and multiplied with every token block of job->xb.
void matmul_chunk_bf16(void *user, uint64_t p0, uint64_t p1) {
    auto *job = static_cast<MatmulJob *>(user);
    const cmf_backend_weight *w = job->w;
    namespace b16 = cmf::cpu::bf16;
    const uint64_t cols = w->cols;
    const auto *src = static_cast<const uint16_t *>(w->view.data);
    thread_local std::vector<uint32_t> packed_room;
    const uint64_t words = b16::packed_w_words(kPanelRows, cols);
    uint32_t *const packed = line_aligned(packed_room, words);
    const b16::GemmFn gemm = b16::gemm();
    for (uint64_t p = p0; p < p1; ++p) {
        const uint64_t r0 = p * kPanelRows, r1 = std::min(w->rows, r0 + kPanelRows);
        if (r1 - r0 < kPanelRows) std::fill(packed, packed + words, 0u);
        for_source_rows(w, r0, r1, [&](uint64_t s0, uint64_t s1, uint64_t off) {
            b16::pack_w(src + s0 * cols, cols, s1 - s0, cols, off, packed);
        });
        gemm(packed, r1 - r0, cols, job->xb, job->n_batch, job->y + r0, w->rows);
    }
}

cmf_error *matmul_bf16(Backend *be, MatmulJob &job) {
    namespace b16 = cmf::cpu::bf16;
    const uint64_t cols = job.w->cols;
    thread_local std::vector<uint32_t> xb;  // the calling thread's: it waits for both loops
    xb.resize(b16::packed_x_words(job.n_batch, cols));
    uint32_t *dst = xb.data();  // by pointer: in a pool thread `xb` names that thread's own buffer
    job.xb = dst;
    parallel(be, b16::x_blocks(job.n_batch), 8,
             [&](uint64_t b0, uint64_t b1) { b16::pack_x(job.x, cols, job.n_batch, cols, b0, b1, dst); });
    const uint64_t panels = (job.w->rows + kPanelRows - 1) / kPanelRows;
    be->host->parallel_for(be->host->host_ctx, 0, panels, 1, matmul_chunk_bf16, &job);
    return job.error;
}

// The row loop of a decode-size matmul (n_batch below the GEMM paths).
cmf_range_fn decode_chunk_fn(const cmf_backend_weight *w) {
    if (native_dtype(w->view.dtype)) return matmul_chunk_native;
    return w->codec != nullptr && w->codec->matmul_rows != nullptr ? matmul_chunk_codec : matmul_chunk_dequant;
}

// Output rows [c0, c1) of a row subset: each run's part through the row
// loop job->inner, over source rows, writing output rows (y shifted by
// the run's dst - src).
void matmul_chunk_runs(void *user, uint64_t c0, uint64_t c1) {
    auto *job = static_cast<MatmulJob *>(user);
    const auto &runs = job->w->runs;
    auto it = std::upper_bound(runs.begin(), runs.end(), c0,
                               [](uint64_t v, const cmf_backend_weight::Run &r) { return v < r.dst + r.len; });
    for (; it != runs.end() && it->dst < c1; ++it) {
        const uint64_t a = std::max(c0, it->dst), b = std::min(c1, it->dst + it->len);
        MatmulJob seg = *job;
        seg.error = nullptr;
        seg.y = job->y + (int64_t(it->dst) - int64_t(it->src));
        job->inner(&seg, it->src + (a - it->dst), it->src + (b - it->dst));
        if (seg.error != nullptr) record_error(job, seg.error);
    }
}

// decode_chunk_fn, through the runs of a row subset.
cmf_range_fn row_loop(MatmulJob &job) {
    cmf_range_fn fn = decode_chunk_fn(job.w);
    if (job.w->runs.empty()) return fn;
    job.inner = fn;
    return matmul_chunk_runs;
}

// Enough rows per chunk to amortise scheduling, few enough to balance: at
// least 16 KiB-ish of row elements, and at most about 8 chunks per thread.
// Every chunk of a codec's matmul_rows used to re-check the codec's
// quantized-activation cache (a memcmp of x): with 16-row chunks that was
// 5.4 % of a q4 tg run (perf, 0.6B shape), 0.9 % with 8 chunks per thread.
uint64_t decode_grain(Backend *be, uint64_t rows, uint64_t cols) {
    const uint64_t threads = pool_threads(be);
    return std::max<uint64_t>({4, 16384 / std::max<uint64_t>(1, cols), (rows + 8 * threads - 1) / (8 * threads)});
}

cmf_error *matmul_int8(Backend *be, MatmulJob &job) {
    namespace i8 = cmf::cpu::i8;
    const cmf_backend_weight *w = job.w;
    // The calling thread's buffers: it waits for both loops.
    thread_local std::vector<int16_t> xq;
    thread_local std::vector<float> xd;
    xq.resize(i8::packed_xq_count(job.n_batch, w->cols));
    xd.resize(i8::packed_xd_floats(job.n_batch, w->cols));
    job.xq = xq.data();
    job.xd = xd.data();
    struct QuantJob {
        const float *x;
        uint64_t n_batch, cols;
        int16_t *xq;
        float *xd;
    } qj{job.x, job.n_batch, w->cols, xq.data(), xd.data()};
    be->host->parallel_for(
        be->host->host_ctx, 0, i8::x_tiles(job.n_batch), 4,
        [](void *u, uint64_t t0, uint64_t t1) {
            auto *j = static_cast<QuantJob *>(u);
            i8::kernels().quantize_x(j->x, j->cols, j->n_batch, j->cols, t0, t1, j->xq, j->xd);
        },
        &qj);
    const uint64_t panels = (w->rows + kInt8PanelRows - 1) / kInt8PanelRows;
    be->host->parallel_for(be->host->host_ctx, 0, panels, 1, matmul_chunk_int8, &job);
    return job.error;
}

// The payload columns' inputs of a column subset whose inputs do not map
// one to one: x scattered into the calling thread's buffer, 0 elsewhere.
const float *columns_of(const cmf_backend_weight *w, const float *x, uint64_t n_batch) {
    if (w->x_map.empty()) return x;
    thread_local std::vector<float> wide;
    wide.assign(n_batch * w->cols, 0.0f);
    for (uint64_t b = 0; b < n_batch; ++b)
        for (uint64_t j = 0; j < w->in_cols; ++j) wide[b * w->cols + w->x_map[j]] = x[b * w->in_cols + j];
    return wide.data();
}

cmf_error *matmul_op(void *ctx, const cmf_backend_weight *w, const float *x, uint64_t n_batch, float *y) {
    Backend *be = as_backend(ctx);
    if (w == nullptr || x == nullptr || y == nullptr)
        return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul: NULL argument");
    if (w->view.ndim != 2) return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul: the weight is not 2-D");
    x = columns_of(w, x, n_batch);
    MatmulJob job{w, x, n_batch, y, be->host, nullptr, nullptr, nullptr, nullptr, next_x_id()};
    bool has_kernel = w->codec != nullptr && w->codec->matmul_rows != nullptr;
    const uint64_t min_codec = gemm_min_batch_codec(w);
    if (w->int8 && n_batch >= min_codec) return matmul_int8(be, job);
    if (w->view.dtype == CMF_DTYPE_BF16 && n_batch >= kGemmMinBatch && cmf::cpu::bf16::gemm() != nullptr)
        return matmul_bf16(be, job);
    if (n_batch >= (has_kernel ? min_codec : kGemmMinBatch)) {
        // The activations are packed once, shared by every chunk. The
        // buffer belongs to the calling thread (it waits for the loop).
        thread_local std::vector<float> xp;
        const auto &k = cmf::cpu::kernels();
        float *const packed_x = line_aligned(xp, cmf::cpu::packed_x_floats(n_batch, w->cols));
        job.xp = packed_x;
        struct PackJob {
            const cmf::cpu::Kernels *k;
            const float *x;
            uint64_t n_batch, cols;
            float *xp;
        } pj{&k, x, n_batch, w->cols, packed_x};
        be->host->parallel_for(
            be->host->host_ctx, 0, cmf::cpu::gemm_x_blocks(n_batch), 8,
            [](void *u, uint64_t b0, uint64_t b1) {
                auto *j = static_cast<PackJob *>(u);
                j->k->pack_x(j->x, j->cols, j->n_batch, j->cols, b0, b1, j->xp);
            },
            &pj);
        const uint64_t panels = (w->rows + kPanelRows - 1) / kPanelRows;
        be->host->parallel_for(be->host->host_ctx, 0, panels, 1, matmul_chunk_gemm, &job);
        return job.error;
    }
    cmf_range_fn fn = row_loop(job);
    be->host->parallel_for(be->host->host_ctx, 0, w->rows, decode_grain(be, w->rows, w->cols), fn, &job);
    return job.error;
}

// Decode's fused matmuls: the rows of several weights (each with its own x,
// or one x for all) laid end to end form one parallel loop, each chunk cut
// at the weights' boundaries. Every row is computed by the same kernel it
// gets from a single matmul, so the results equal separate calls bit for bit.
struct MultiJob {
    std::vector<MatmulJob> jobs;
    std::vector<cmf_range_fn> fns;
    std::vector<uint64_t> row_end;  // rows of weights 0..i together
};

void matmul_chunk_multi(void *user, uint64_t r0, uint64_t r1) {
    auto *m = static_cast<MultiJob *>(user);
    // The weight holding r0 (chunks are contiguous: find it once).
    size_t i = size_t(std::upper_bound(m->row_end.begin(), m->row_end.end(), r0) - m->row_end.begin());
    for (; i < m->jobs.size() && r0 < r1; ++i) {
        const uint64_t start = i == 0 ? 0 : m->row_end[i - 1], e = std::min(r1, m->row_end[i]);
        m->fns[i](&m->jobs[i], r0 - start, e - start);
        r0 = e;
    }
}

// Runs the decode-size jobs of `m` (jobs and fns set) as one loop; returns
// the first error.
cmf_error *run_multi(Backend *be, MultiJob &m) {
    uint64_t rows = 0, cols = 1;
    m.row_end.resize(m.jobs.size());
    for (size_t i = 0; i < m.jobs.size(); ++i) {
        m.row_end[i] = rows += m.jobs[i].w->rows;
        cols = std::max(cols, m.jobs[i].w->cols);
    }
    if (rows > 0)
        be->host->parallel_for(be->host->host_ctx, 0, rows, decode_grain(be, rows, cols), matmul_chunk_multi, &m);
    cmf_error *first = nullptr;
    for (MatmulJob &j : m.jobs) {
        if (j.error == nullptr) continue;
        if (first == nullptr) first = j.error;
        else be->host->error_free(j.error);
    }
    return first;
}

// Whether a matmul of n_batch rows over w takes a GEMM path (prefill) rather
// than the decode row loop.
bool takes_gemm(const cmf_backend_weight *w, uint64_t n_batch) {
    const bool has_kernel = w->codec != nullptr && w->codec->matmul_rows != nullptr;
    const uint64_t min_codec = gemm_min_batch_codec(w);
    return (w->int8 && n_batch >= min_codec) || n_batch >= (has_kernel ? min_codec : kGemmMinBatch);
}

cmf_error *matmul_multi(void *ctx, const cmf_backend_weight *const *ws, uint32_t n_weights, const float *x,
                        uint64_t n_batch, float *const *ys) {
    Backend *be = as_backend(ctx);
    if (ws == nullptr || ys == nullptr || x == nullptr || n_weights == 0)
        return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul_multi: NULL argument or no weights");
    for (uint32_t i = 0; i < n_weights; ++i) {
        if (ws[i] == nullptr || ys[i] == nullptr)
            return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul_multi: NULL weight or output");
        if (ws[i]->view.ndim != 2)
            return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul_multi: a weight is not 2-D");
        if (ws[i]->in_cols != ws[0]->in_cols)
            return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, ("matmul_multi: weights of " + std::to_string(ws[0]->in_cols) +
                                                          " and " + std::to_string(ws[i]->in_cols) + " columns")
                                                             .c_str());
    }
    bool mapped = false;
    for (uint32_t i = 0; i < n_weights; ++i) mapped = mapped || !ws[i]->x_map.empty();
    // Prefill's GEMMs are long loops already (and pack x per weight layout):
    // one call each. So are column subsets (each maps x its own way).
    if (n_batch >= kGemmMinBatch || mapped) {
        for (uint32_t i = 0; i < n_weights; ++i)
            if (cmf_error *e = matmul_op(ctx, ws[i], x, n_batch, ys[i])) return e;
        return nullptr;
    }
    thread_local MultiJob m;
    m.jobs.clear();
    m.fns.clear();
    const uint64_t x_id = next_x_id();  // one x: the codecs quantize it once for all weights
    for (uint32_t i = 0; i < n_weights; ++i) {
        m.jobs.push_back(MatmulJob{ws[i], x, n_batch, ys[i], be->host, nullptr, nullptr, nullptr, nullptr, x_id});
        m.fns.push_back(row_loop(m.jobs.back()));
    }
    return run_multi(be, m);
}

cmf_error *matmul_grouped(void *ctx, uint32_t n_groups, const cmf_backend_weight *const *ws, const float *const *xs,
                          const uint64_t *n_rows, float *const *ys) {
    Backend *be = as_backend(ctx);
    if (n_groups == 0) return nullptr;
    if (ws == nullptr || xs == nullptr || n_rows == nullptr || ys == nullptr)
        return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul_grouped: NULL argument");
    for (uint32_t g = 0; g < n_groups; ++g) {
        if (n_rows[g] == 0) continue;
        if (ws[g] == nullptr || xs[g] == nullptr || ys[g] == nullptr)
            return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul_grouped: NULL weight, input or output");
        if (ws[g]->view.ndim != 2)
            return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "matmul_grouped: a weight is not 2-D");
    }
    // Large groups (an expert's tokens in prefill) run one GEMM each; the
    // small ones one row loop together, the groups that share an x (a
    // decode token's experts) sharing one activation id.
    thread_local MultiJob m;
    m.jobs.clear();
    m.fns.clear();
    for (uint32_t g = 0; g < n_groups; ++g) {
        if (n_rows[g] == 0) continue;
        if (takes_gemm(ws[g], n_rows[g]) || !ws[g]->x_map.empty()) {
            if (cmf_error *e = matmul_op(ctx, ws[g], xs[g], n_rows[g], ys[g])) return e;
            continue;
        }
        uint64_t x_id = 0;
        for (const MatmulJob &j : m.jobs)
            if (j.x == xs[g] && j.n_batch == n_rows[g] && j.w->cols == ws[g]->cols) x_id = j.x_id;
        if (x_id == 0) x_id = next_x_id();
        m.jobs.push_back(MatmulJob{ws[g], xs[g], n_rows[g], ys[g], be->host, nullptr, nullptr, nullptr, nullptr, x_id});
        m.fns.push_back(row_loop(m.jobs.back()));
    }
    return run_multi(be, m);
}

// ---- buffers ------------------------------------------------------------------

cmf_error *buffer_alloc(void *ctx, size_t n_bytes, float **out) {
    Backend *be = as_backend(ctx);
    if (out == nullptr) return be->host->error_create(CMF_ERR_INVALID_ARGUMENT, "buffer_alloc: NULL out");
    if (!cmf::cpu::kUnderAsan && n_bytes >= Backend::kHugeBufferBytes) {
        return cmf::sdk::call(be->host, [&] {
            auto mem = std::make_unique<cmf::cpu::PageMemory>(n_bytes, "buffer_alloc", /*reserve=*/true);
            *out = reinterpret_cast<float *>(mem->data());
            std::lock_guard<std::mutex> lock(be->huge_buffers_mu);
            be->huge_buffers.emplace(mem->data(), std::move(mem));
        });
    }
    void *p = be->host->alloc_aligned(std::max<size_t>(64, (n_bytes + 63) / 64 * 64), 64);
    if (p == nullptr) return be->host->error_create(CMF_ERR_OUT_OF_MEMORY, "buffer_alloc: out of memory");
    *out = static_cast<float *>(p);
    return nullptr;
}

void buffer_free(void *ctx, float *buf) {
    if (buf == nullptr) return;
    Backend *be = as_backend(ctx);
    std::unique_ptr<cmf::cpu::PageMemory> huge;  // unmapped outside the lock
    {
        std::lock_guard<std::mutex> lock(be->huge_buffers_mu);
        if (auto it = be->huge_buffers.find(buf); it != be->huge_buffers.end()) {
            huge = std::move(it->second);
            be->huge_buffers.erase(it);
        }
    }
    if (huge == nullptr) be->host->free_aligned(buf);
}

// memcpy, on every thread for large copies. A decode step reads back its
// logits (600 KB at a 151936 vocabulary); the head's rows were written by
// both threads, each into its own cache, and the pool cuts the copy into
// the same contiguous halves, so each thread copies what it holds: 94-108
// -> 50-59 us per token (profile, q4 0.6B, 3 alternating rounds).
void copy_bytes(Backend *be, void *dst, const void *src, size_t n) {
    constexpr size_t kPiece = size_t(64) << 10, kParallelFrom = size_t(256) << 10;
    if (n == 0) return;  // (memcpy wants valid pointers even for 0 bytes)
    if (n < kParallelFrom) {
        std::memcpy(dst, src, n);
        return;
    }
    parallel(be, (n + kPiece - 1) / kPiece, 1, [&](uint64_t p0, uint64_t p1) {
        const size_t b = size_t(p0) * kPiece, e = std::min(n, size_t(p1) * kPiece);
        std::memcpy(static_cast<char *>(dst) + b, static_cast<const char *>(src) + b, e - b);
    });
}

cmf_error *buffer_write(void *ctx, float *dst, const void *src, size_t n) {
    if ((dst == nullptr || src == nullptr) && n > 0)
        return as_backend(ctx)->host->error_create(CMF_ERR_INVALID_ARGUMENT, "buffer_write: NULL argument");
    copy_bytes(as_backend(ctx), dst, src, n);
    return nullptr;
}

cmf_error *buffer_read(void *ctx, void *dst, const float *src, size_t n) {
    if ((dst == nullptr || src == nullptr) && n > 0)
        return as_backend(ctx)->host->error_create(CMF_ERR_INVALID_ARGUMENT, "buffer_read: NULL argument");
    copy_bytes(as_backend(ctx), dst, src, n);
    return nullptr;
}

cmf_error *copy(void *ctx, float *dst, const float *src, uint64_t n) {
    return buffer_write(ctx, dst, src, n * sizeof(float));
}

// ---- element-wise -------------------------------------------------------------

// Sum of squares in double (at least as accurate as HF's f32 mean, whatever
// the summation order) as eight
// independent partial sums, which the compiler keeps in vector registers:
// one running sum waits on each add's latency, and that made a decode
// step's rms_norm calls (qwen3's per-head q/k norms: 2 x 16 rows of 128 per
// layer) cost 2.4-3.0 us each, single-threaded between the matmuls.
double sum_squares_f64(const float *x, uint64_t n) {
    double acc[8] = {};
    uint64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (uint64_t l = 0; l < 8; ++l) acc[l] += double(x[j + l]) * double(x[j + l]);
    for (uint64_t l = 0; j < n; ++j, ++l) acc[l] += double(x[j]) * double(x[j]);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

cmf_error *rms_norm(void *ctx, const float *x, const cmf_backend_weight *w, uint64_t n_rows, uint64_t dim, float eps,
                    int32_t style, float *y) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        const float *wv = vector_of(w, dim, "rms_norm");
        if (style != CMF_NORM_QWEN && style != CMF_NORM_GEMMA)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "rms_norm: unknown norm style " + std::to_string(style));
        bool gemma = style == CMF_NORM_GEMMA;
        parallel(be, n_rows, std::max<uint64_t>(1, 4096 / std::max<uint64_t>(1, dim)), [&](uint64_t r0, uint64_t r1) {
            for (uint64_t r = r0; r < r1; ++r) {
                const float *xr = x + r * dim;
                float *yr = y + r * dim;
                const double ss = sum_squares_f64(xr, dim);
                float inv = static_cast<float>(1.0 / std::sqrt(ss / double(dim) + double(eps)));
                if (gemma)
                    for (uint64_t j = 0; j < dim; ++j) yr[j] = (xr[j] * inv) * (1.0f + wv[j]);
                else
                    for (uint64_t j = 0; j < dim; ++j) yr[j] = (xr[j] * inv) * wv[j];
            }
        });
    });
}

// cos/sin of every rotary pair's angle at one position, as HF computes
// them: angle = pos * inv_freq in f32, cos and sin times the table's scale
// (1, or YaRN's attention factor). The table is rope's inv_freq = 1 /
// theta^(2i/d) in f32, or one an arch gave rope_freqs.
struct RopeAngles {
    float theta = 0;  // the table came from this base (0: given by the arch)
    float scale = 1;
    uint64_t pos = UINT64_MAX;
    std::vector<float> inv_freq, cs, sn;
    void set_freqs(float th, uint32_t rd) {
        if (th == theta && rd == 2 * inv_freq.size() && scale == 1.0f) return;
        theta = th, scale = 1.0f, pos = UINT64_MAX;
        const uint32_t half = rd / 2;
        inv_freq.resize(half), cs.resize(half), sn.resize(half);
        for (uint32_t i = 0; i < half; ++i)
            inv_freq[i] = 1.0f / std::pow(th, static_cast<float>(2 * i) / static_cast<float>(rd));
    }
    void set_table(const float *table, uint32_t half, float sc) {
        if (theta == 0 && sc == scale && half == inv_freq.size() &&
            (half == 0 || std::memcmp(table, inv_freq.data(), half * sizeof(float)) == 0))
            return;
        theta = 0, scale = sc, pos = UINT64_MAX;
        inv_freq.assign(table, table + half);
        cs.resize(half), sn.resize(half);
    }
    void set_pos(uint64_t p) {
        if (p == pos) return;
        const float fp = static_cast<float>(p);
        for (size_t i = 0; i < inv_freq.size(); ++i) {
            const float a = fp * inv_freq[i];
            cs[i] = std::cos(a) * scale;
            sn[i] = std::sin(a) * scale;
        }
        pos = p;
    }
};

void rope_token(float *xt, uint32_t n_heads, uint32_t head_dim, const RopeAngles &ang) {
    const uint64_t half = ang.cs.size();
    const float *cs = ang.cs.data(), *sn = ang.sn.data();
    for (uint32_t h = 0; h < n_heads; ++h) {
        float *v = xt + uint64_t(h) * head_dim;
        for (uint64_t i = 0; i < half; ++i) {
            float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

void check_rope_args(const char *op, uint64_t ld, uint32_t n_heads, uint32_t head_dim, uint32_t rot_dim) {
    if (rot_dim % 2 != 0 || rot_dim > head_dim || uint64_t(n_heads) * head_dim > ld)
        throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(op) + ": rot_dim must be even and <= head_dim, heads must fit ld");
}

// Each thread keeps its last table and position's angles: a decode step
// (one token, run on the calling thread) rotates q and k of every layer at
// the same position, so the 2 x layers calls share one set of pow/cos/sin
// (they were most of rope's 3.5 us per call).
thread_local RopeAngles t_rope_angles;

template <class SetTable>
void rope_tokens(Backend *be, float *x, uint64_t n_tokens, uint64_t ld, uint32_t n_heads, uint32_t head_dim, uint64_t pos0,
                 const SetTable &set_table) {
    parallel(be, n_tokens, 1, [&](uint64_t t0, uint64_t t1) {
        RopeAngles &ang = t_rope_angles;
        set_table(ang);
        for (uint64_t t = t0; t < t1; ++t) {
            ang.set_pos(pos0 + t);
            rope_token(x + t * ld, n_heads, head_dim, ang);
        }
    });
}

cmf_error *rope(void *ctx, float *x, uint64_t n_tokens, uint64_t ld, uint32_t n_heads, uint32_t head_dim,
                uint32_t rot_dim, uint64_t pos0, float theta) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        check_rope_args("rope", ld, n_heads, head_dim, rot_dim);
        if (!(theta > 0)) throw Error(CMF_ERR_INVALID_ARGUMENT, "rope: theta must be > 0");
        rope_tokens(be, x, n_tokens, ld, n_heads, head_dim, pos0, [&](RopeAngles &a) { a.set_freqs(theta, rot_dim); });
    });
}

cmf_error *rope_freqs(void *ctx, float *x, uint64_t n_tokens, uint64_t ld, uint32_t n_heads, uint32_t head_dim,
                      uint32_t rot_dim, uint64_t pos0, const float *inv_freq, float scale) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        check_rope_args("rope_freqs", ld, n_heads, head_dim, rot_dim);
        if (inv_freq == nullptr && rot_dim > 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "rope_freqs: NULL inv_freq");
        if (!std::isfinite(scale)) throw Error(CMF_ERR_INVALID_ARGUMENT, "rope_freqs: scale must be finite");
        rope_tokens(be, x, n_tokens, ld, n_heads, head_dim, pos0,
                    [&](RopeAngles &a) { a.set_table(inv_freq, rot_dim / 2, scale); });
    });
}

// Prefill attention (and attention_full) is flash attention on the packed
// operands of the matmul GEMM. K and V^T of every KV head are packed once
// per call; a work item takes the query rows of one or more heads of a GQA
// group over a block of tokens (every row against the same packed K and V)
// and walks the keys in chunks of kFlashKeys: S = Q K^T of the chunk, mask
// and scale, the rows' running max and softmax denominator, then O = O a +
// P V with P unnormalised (O divided by the denominator at the end). Each
// chunk of K and V is read once per item for all of its rows. Two whole-row
// GEMMs per (24 queries, head) before this re-read S, P and each 16-row
// panel of V^T beyond L1 for every 24 queries and 16 head dims: 88 ms per
// layer for 512 tokens at depth 4096 on two cores (bench_qwen --attention
// 4096 --pp 512), 54 ms now (the GEMM at its weight-matmul rate, 74 % of
// the time). Chunks of 128 keys and items of 96 rows took 63 ms; 256 keys
// gained 4 %, 512 nothing more; 192 rows 5 %, 384 rows 3 % more.
// Fewer tokens than kAttnBlock take the per-token path (attention_rows).
constexpr uint64_t kAttnBlock = 4 * cmf::cpu::kGemmTokens;
constexpr uint64_t kFlashKeys = 16 * cmf::cpu::kGemmRows;    // keys per chunk
constexpr uint64_t kFlashRows = 64 * cmf::cpu::kGemmTokens;  // query rows (head x token) per work item

// ---- KV cache rows: f32, f16 bits or q8 blocks (kv_write / attention_kv) ----
// The cache is named by a pointer type P: const float *, const uint16_t *
// (f16 bits) or KvQ8 (CMF_KV_DTYPE_Q8_32 blocks), each with pointer
// arithmetic in elements.
struct KvQ8 {
    const uint8_t *p;    // the block holding the element
    uint32_t phase = 0;  // the element's index in it (a head may start mid-block)
    KvQ8 operator+(uint64_t elems) const {
        const uint64_t e = phase + elems;
        return {p + e / 32 * 34, static_cast<uint32_t>(e % 32)};
    }
};
template <class P>
constexpr bool kv_is_f32 = std::is_same_v<P, const float *>;
template <class P>
constexpr bool kv_is_q8 = std::is_same_v<P, KvQ8>;
// n_rows rows of `cols` elements (row stride ld elements, a multiple of 32:
// every row starts at the same phase) of a q8 cache as f32 rows of `cols`
// floats in out. A range that starts or ends mid-block widens its whole
// blocks into a buffer first.
void kv_q8_rows(const cmf::cpu::Kernels &k, KvQ8 src, uint64_t ld, uint64_t n_rows, uint64_t cols, float *out) {
    const uint64_t blocks = (src.phase + cols + 31) / 32;
    if (src.phase == 0 && cols % 32 == 0) {
        for (uint64_t r = 0; r < n_rows; ++r) k.dequant_q8_32((src + r * ld).p, blocks, out + r * cols);
        return;
    }
    thread_local std::vector<float> whole;
    whole.resize(blocks * 32);
    for (uint64_t r = 0; r < n_rows; ++r) {
        k.dequant_q8_32((src + r * ld).p, blocks, whole.data());
        std::memcpy(out + r * cols, whole.data() + src.phase, cols * sizeof(float));
    }
}
// A q8 run whose heads start mid-block is widened this many keys at a time
// into a buffer that stays in L1/L2: f(j, n, rows) gets keys [j, j + n) as
// f32 rows of the KV heads `cols` covers, in key order.
constexpr uint64_t kQ8KeysPerSlice = 32;
template <class F>
void kv_q8_slices(const cmf::cpu::Kernels &k, KvQ8 rows, uint64_t ldrow, uint64_t n_keys, uint64_t cols, F &&f) {
    thread_local std::vector<float> tmp;
    tmp.resize(kQ8KeysPerSlice * cols);
    for (uint64_t j = 0; j < n_keys; j += kQ8KeysPerSlice) {
        const uint64_t n = std::min(kQ8KeysPerSlice, n_keys - j);
        kv_q8_rows(k, rows + j * ldrow, ldrow, n, cols, tmp.data());
        f(j, n, static_cast<const float *>(tmp.data()));
    }
}

// A run of cache rows against every head (Kernels::heads_dot / heads_axpy).
template <class P>
void kv_heads_dot(const cmf::cpu::Kernels &k, const float *q, P rows, uint64_t ldrow, uint64_t n_keys,
                  uint32_t n_heads, uint32_t group, uint32_t head_dim, float *out, uint64_t ldo) {
    if constexpr (kv_is_f32<P>) {
        k.heads_dot(q, rows, ldrow, n_keys, n_heads, group, head_dim, out, ldo);
    } else if constexpr (kv_is_q8<P>) {
        if (rows.phase == 0 && head_dim % 32 == 0)  // heads of whole blocks: the fused kernel
            return k.heads_dot_q8(q, rows.p, ldrow / 32 * 34, n_keys, n_heads, group, head_dim, out, ldo);
        const uint64_t cols = uint64_t(n_heads / group) * head_dim;  // the KV heads these query heads read
        kv_q8_slices(k, rows, ldrow, n_keys, cols, [&](uint64_t j, uint64_t n, const float *wide) {
            k.heads_dot(q, wide, cols, n, n_heads, group, head_dim, out + j, ldo);
        });
    } else {
        k.heads_dot_f16(q, rows, ldrow, n_keys, n_heads, group, head_dim, out, ldo);
    }
}
template <class P>
void kv_heads_axpy(const cmf::cpu::Kernels &k, const float *a, uint64_t lda, P rows, uint64_t ldrow, uint64_t n_keys,
                   uint32_t n_heads, uint32_t group, uint32_t head_dim, float *o) {
    if constexpr (kv_is_f32<P>) {
        k.heads_axpy(a, lda, rows, ldrow, n_keys, n_heads, group, head_dim, o);
    } else if constexpr (kv_is_q8<P>) {
        if (rows.phase == 0 && head_dim % 32 == 0)
            return k.heads_axpy_q8(a, lda, rows.p, ldrow / 32 * 34, n_keys, n_heads, group, head_dim, o);
        const uint64_t cols = uint64_t(n_heads / group) * head_dim;
        kv_q8_slices(k, rows, ldrow, n_keys, cols, [&](uint64_t j, uint64_t n, const float *wide) {
            k.heads_axpy(a + j, lda, wide, cols, n, n_heads, group, head_dim, o);
        });
    } else {
        k.heads_axpy_f16(a, lda, rows, ldrow, n_keys, n_heads, group, head_dim, o);
    }
}
// n_rows rows of `cols` cache elements (row stride ld) as f32: an f32
// cache's rows themselves (*ld_out = ld), else widened into tmp (*ld_out = cols).
template <class P>
const float *kv_rows_f32(const cmf::cpu::Kernels &k, P src, uint64_t ld, uint64_t n_rows, uint64_t cols,
                         std::vector<float> &tmp, uint64_t *ld_out) {
    if constexpr (kv_is_f32<P>) {
        *ld_out = ld;
        return src;
    } else {
        tmp.resize(n_rows * cols);
        if constexpr (kv_is_q8<P>)
            kv_q8_rows(k, src, ld, n_rows, cols, tmp.data());
        else
            for (uint64_t r = 0; r < n_rows; ++r) k.convert_f16(src + r * ld, cols, tmp.data() + r * cols);
        *ld_out = cols;
        return tmp.data();
    }
}

// Rows of the cache holding positions [p, p + n_rows) of one head (offset
// `head` elements into each row) as f32: position j is row j, or row
// j % ring in a ring of `ring` rows (ring > 0). Consecutive rows go through
// kv_rows_f32; a run that wraps around the ring is gathered into tmp.
template <class P>
const float *kv_positions_f32(const cmf::cpu::Kernels &k, P cache, uint64_t kvd, uint64_t head, uint64_t ring,
                              uint64_t p, uint64_t n_rows, uint64_t cols, std::vector<float> &tmp, uint64_t *ld_out) {
    const uint64_t r = ring ? p % ring : p;
    if (ring == 0 || r + n_rows <= ring) return kv_rows_f32(k, cache + r * kvd + head, kvd, n_rows, cols, tmp, ld_out);
    tmp.resize(n_rows * cols);
    for (uint64_t j = 0; j < n_rows; ++j) {
        const P src = cache + ((p + j) % ring) * kvd + head;
        if constexpr (kv_is_f32<P>)
            std::memcpy(tmp.data() + j * cols, src, cols * sizeof(float));
        else if constexpr (kv_is_q8<P>)
            kv_q8_rows(k, src, kvd, 1, cols, tmp.data() + j * cols);
        else
            k.convert_f16(src, cols, tmp.data() + j * cols);
    }
    *ld_out = cols;
    return tmp.data();
}

// K and V^T of every KV head of keys [kbase, kbase + n_keys), packed as
// GEMM operands: K into kp (n_kv * packed_w_floats(n_keys, hd) floats, K
// as "weights" with rows = keys, cols = head dims: the keys of a chunk are
// consecutive panels), V^T into vp in chunks of kFlashKeys keys (chunk c
// at c * v_chunk_floats(hd) floats into its head's n_chunks(n_keys) chunks,
// each packed as the weights of rows = head dims, cols = its keys).
inline uint64_t flash_chunks(uint64_t n_keys) { return (n_keys + kFlashKeys - 1) / kFlashKeys; }
inline uint64_t v_chunk_floats(uint64_t hd) { return cmf::cpu::packed_w_floats(hd, kFlashKeys); }
template <class P>
void pack_kv_heads(Backend *be, P k_cache, P v_cache, uint64_t ring, uint64_t kbase, uint64_t n_keys,
                   uint32_t n_kv, uint64_t hd, uint64_t kvd, float *kp, float *vp) {
    using cmf::cpu::kGemmRows;
    static_assert(kFlashKeys % kGemmRows == 0, "a key panel lies in one chunk");
    const auto &k = cmf::cpu::kernels();
    const uint64_t k_stride = cmf::cpu::packed_w_floats(n_keys, hd), v_stride = flash_chunks(n_keys) * v_chunk_floats(hd);
    const uint64_t d_panels = (hd + kGemmRows - 1) / kGemmRows, key_panels = (n_keys + kGemmRows - 1) / kGemmRows;
    parallel(be, uint64_t(n_kv) * key_panels, 8, [&](uint64_t i0, uint64_t i1) {
        thread_local std::vector<float> k_tmp, v_tmp;  // an f16 cache's panel rows widened
        for (uint64_t i = i0; i < i1; ++i) {
            const uint64_t kvh = i / key_panels, j0 = (i % key_panels) * kGemmRows;
            const uint64_t nj = std::min(kGemmRows, n_keys - j0);
            uint64_t ldk = 0, ldv = 0;
            const float *kr = kv_positions_f32(k, k_cache, kvd, kvh * hd, ring, kbase + j0, nj, hd, k_tmp, &ldk);
            const float *vr = kv_positions_f32(k, v_cache, kvd, kvh * hd, ring, kbase + j0, nj, hd, v_tmp, &ldv);
            k.pack_w(kr, ldk, nj, hd, kp + kvh * k_stride + j0 * hd);
            // The chunk holding these keys: its first key and key count.
            const uint64_t c0 = j0 - j0 % kFlashKeys, ck = std::min(kFlashKeys, n_keys - c0);
            float *vdst = vp + kvh * v_stride + c0 / kFlashKeys * v_chunk_floats(hd);
            for (uint64_t p = 0; p < d_panels; ++p) {
                const uint64_t d0 = p * kGemmRows, nd = std::min(kGemmRows, hd - d0);
                for (uint64_t j = j0; j < j0 + nj; ++j) {
                    float *dst = vdst + (p * ck + (j - c0)) * kGemmRows;
                    std::memcpy(dst, vr + (j - j0) * ldv + d0, nd * sizeof(float));
                    std::fill(dst + nd, dst + kGemmRows, 0.0f);
                }
            }
        }
    });
}

// How a flash work item's rows are scored: keys(t) gives the packed keys
// [lo, hi) token t of the block sees (lo and hi never decrease with t);
// scale, then key_bias[key] added (attention_full) or a softcap.
struct FlashScores {
    float scale, softcap = 0.0f;
    const float *key_bias = nullptr;
};

// One flash work item: query heads [0, n_heads) (q + h * hd, stride qd per
// token) of nt tokens, all against the packed K (kh) and chunked V^T (vh)
// of one KV head of n_keys keys; the outputs go to out (same layout as q).
// A row that sees no key gets zeros.
template <class Keys>
void flash_item(const float *q, uint64_t qd, uint64_t nt, uint32_t n_heads, uint64_t hd, const float *kh,
                const float *vh, uint64_t n_keys, float *out, const FlashScores &fs, Keys &&keys) {
    const auto &k = cmf::cpu::kernels();
    const uint64_t nq = nt * n_heads, qblocks = cmf::cpu::gemm_x_blocks(nq);  // row r: head r / nt, token r % nt
    thread_local std::vector<float> qs, qp, sc, pp, o, ot, mx, den, rescale;
    qs.resize(nq * hd);
    qp.resize(cmf::cpu::packed_x_floats(nq, hd));
    sc.resize(nq * kFlashKeys);
    pp.resize(cmf::cpu::packed_x_floats(nq, kFlashKeys));
    o.assign(nq * hd, 0.0f);
    ot.resize(nq * hd);
    mx.assign(nq, -INFINITY);
    den.assign(nq, 0.0f);
    rescale.resize(nq);
    for (uint64_t r = 0; r < nq; ++r)
        std::memcpy(qs.data() + r * hd, q + (r % nt) * qd + (r / nt) * hd, hd * sizeof(float));
    k.pack_x(qs.data(), hd, nq, hd, 0, qblocks, qp.data());
    // The keys any row sees, and their chunks. The scores GEMM of a chunk
    // skips its whole panels outside [first, end) (a causal block's last
    // chunk is mostly future keys); the value GEMM takes the whole chunk
    // (its panels are laid out for all of the chunk's keys), P 0 there.
    const uint64_t first = keys(0).first, end = keys(nt - 1).second;
    const uint64_t c_first = first / kFlashKeys, c_end = flash_chunks(end);
    for (uint64_t c = c_first; c < c_end; ++c) {
        const uint64_t c0 = c * kFlashKeys, ck = std::min(kFlashKeys, n_keys - c0);
        const uint64_t s0 = first > c0 ? (first - c0) / cmf::cpu::kGemmRows * cmf::cpu::kGemmRows : 0;
        const uint64_t s1 = std::min(ck, end - c0);  // unmasked scores lie in [s0, s1)
        k.gemm_packed(kh + (c0 + s0) * hd, s1 - s0, hd, qp.data(), nq, sc.data() + s0, ck);
        for (uint64_t r = 0; r < nq; ++r) {
            float *s = sc.data() + r * ck;
            const auto [lo, hi] = keys(r % nt);
            const uint64_t a = std::clamp(lo, c0, c0 + ck) - c0, b = std::clamp(hi, c0, c0 + ck) - c0;
            float cmax = -INFINITY;
            if (a < b) {
                if (fs.softcap > 0.0f || fs.key_bias != nullptr) {
                    for (uint64_t j = a; j < b; ++j) {
                        float v = s[j] * fs.scale;
                        if (fs.key_bias != nullptr) v += fs.key_bias[c0 + j];
                        if (fs.softcap > 0.0f) v = fs.softcap * std::tanh(v / fs.softcap);
                        s[j] = v;
                        cmax = std::max(cmax, v);
                    }
                } else {
                    cmax = k.scale_max(s + a, b - a, fs.scale);
                }
            }
            if (cmax == -INFINITY) {  // nothing seen in this chunk (or every score -inf)
                std::fill(s, s + ck, 0.0f);
                rescale[r] = 1.0f;
                continue;
            }
            std::fill(s, s + a, -INFINITY);
            std::fill(s + b, s + ck, -INFINITY);
            const float m = std::max(mx[r], cmax);
            rescale[r] = std::exp(mx[r] - m);  // 0 for a row's first seen chunk (o and den are 0 there)
            den[r] = den[r] * rescale[r] + k.exp_sum(s, ck, m);
            mx[r] = m;
        }
        k.pack_x(sc.data(), ck, nq, ck, 0, qblocks, pp.data());
        k.gemm_packed(vh + c * v_chunk_floats(hd), hd, ck, pp.data(), nq, ot.data(), hd);
        for (uint64_t r = 0; r < nq; ++r) {
            float *orow = o.data() + r * hd;
            const float *trow = ot.data() + r * hd, f = rescale[r];
            for (uint64_t d = 0; d < hd; ++d) orow[d] = orow[d] * f + trow[d];
        }
    }
    for (uint64_t r = 0; r < nq; ++r) {
        float *dst = out + (r % nt) * qd + (r / nt) * hd;
        const float inv = den[r] > 0.0f ? 1.0f / den[r] : 0.0f;
        for (uint64_t d = 0; d < hd; ++d) dst[d] = o[r * hd + d] * inv;
    }
}

// Work items of flash attention over n_tokens tokens: for each token block,
// each KV head's query heads in sub-groups (at most kFlashRows / kAttnBlock
// heads, so a block keeps kAttnBlock tokens or more), tokens per block so
// that an item has about kFlashRows rows. Items run largest token block
// first (the causal ones see the most keys).
struct FlashItems {
    uint64_t tokens_per_block, blocks;
    uint32_t heads_per_item, subgroups;
    FlashItems(uint64_t n_tokens, uint32_t group) {
        heads_per_item = std::min<uint32_t>(group, uint32_t(kFlashRows / kAttnBlock));
        subgroups = (group + heads_per_item - 1) / heads_per_item;
        tokens_per_block = std::max<uint64_t>(kAttnBlock, kFlashRows / heads_per_item);
        blocks = (n_tokens + tokens_per_block - 1) / tokens_per_block;
    }
    uint64_t count(uint32_t n_kv) const { return blocks * n_kv * subgroups; }
};

// Runs every item of flash attention: f(t0, t1, h0, nh, kvh) for tokens
// [t0, t1) and query heads [h0, h0 + nh) of KV head kvh.
template <class F>
void for_flash_items(Backend *be, uint64_t n_tokens, uint32_t n_heads, uint32_t group, F &&f) {
    const uint32_t n_kv = n_heads / group;
    const FlashItems it(n_tokens, group);
    parallel(be, it.count(n_kv), 1, [&](uint64_t i0, uint64_t i1) {
        for (uint64_t i = i0; i < i1; ++i) {
            const uint64_t per_block = uint64_t(n_kv) * it.subgroups;
            const uint64_t b = it.blocks - 1 - i / per_block, rest = i % per_block;
            const uint32_t kvh = uint32_t(rest / it.subgroups), sg = uint32_t(rest % it.subgroups);
            const uint64_t t0 = b * it.tokens_per_block, t1 = std::min(n_tokens, t0 + it.tokens_per_block);
            const uint32_t h0 = kvh * group + sg * it.heads_per_item;
            f(t0, t1, h0, std::min(it.heads_per_item, kvh * group + group - h0), kvh);
        }
    });
}

// The packed K/V buffers are as large as the keys they were made from:
// kept for the next call at prefill sizes, released after a long context.
void trim_packed(std::vector<float> &k_buf, std::vector<float> &v_buf) {
    constexpr size_t kKeepFloats = size_t(16) << 20;  // 64 MiB
    if (k_buf.size() + v_buf.size() > kKeepFloats) {
        std::vector<float>().swap(k_buf);
        std::vector<float>().swap(v_buf);
    }
}

template <class P>
void attention_blocked(Backend *be, const float *q, P k_cache, P v_cache, uint64_t ring, float *out,
                       uint64_t n_tokens, uint64_t pos0, uint32_t n_heads, uint32_t group, uint32_t head_dim,
                       uint64_t qd, uint64_t kvd, float scale, uint32_t window, float softcap) {
    // Keys from kbase on are packed: the first position any query sees (a
    // window hides the older ones; a ring no longer holds them).
    const uint64_t kbase = (window > 0 && pos0 + 1 > window) ? pos0 + 1 - window : 0;
    const uint64_t n_keys = pos0 + n_tokens - kbase, hd = head_dim;
    const uint32_t n_kv = n_heads / group;
    const uint64_t k_stride = cmf::cpu::packed_w_floats(n_keys, hd), v_stride = flash_chunks(n_keys) * v_chunk_floats(hd);
    // The calling thread's: it waits for both loops below. The lambdas use
    // the pointers (a thread_local named inside them is the pool thread's).
    thread_local std::vector<float> k_buf, v_buf;
    k_buf.resize(n_kv * k_stride);
    v_buf.resize(n_kv * v_stride);
    float *const kp = k_buf.data(), *const vp = v_buf.data();
    pack_kv_heads(be, k_cache, v_cache, ring, kbase, n_keys, n_kv, hd, kvd, kp, vp);
    const FlashScores fs{scale, softcap};
    for_flash_items(be, n_tokens, n_heads, group, [&](uint64_t t0, uint64_t t1, uint32_t h0, uint32_t nh, uint32_t kvh) {
        flash_item(q + t0 * qd + uint64_t(h0) * hd, qd, t1 - t0, nh, hd, kp + kvh * k_stride, vp + kvh * v_stride,
                   n_keys, out + t0 * qd + uint64_t(h0) * hd, fs, [&](uint64_t t) {
                       // Position p sees [p + 1 - window, p], in packed keys (minus kbase).
                       const uint64_t p = pos0 + t0 + t;
                       const uint64_t lo = (window > 0 && p + 1 > window) ? p + 1 - window : 0;
                       return std::pair<uint64_t, uint64_t>{lo - kbase, p + 1 - kbase};
                   });
    });
    trim_packed(k_buf, v_buf);
}

// attention_full: every query against every key (no causal mask), the
// same blocked GEMMs as prefill attention over K and V packed once per call.
cmf_error *attention_full(void *ctx, const float *q, const float *k, const float *v, float *out, uint64_t n_q,
                          uint64_t n_kv, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale,
                          const float *key_bias) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (n_kv_heads == 0 || n_heads % n_kv_heads != 0)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "attention_full: n_heads must be a multiple of n_kv_heads");
        if (head_dim == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "attention_full: head_dim is 0");
        if (n_q == 0) return;
        if ((q == nullptr || out == nullptr) || (n_kv > 0 && (k == nullptr || v == nullptr)))
            throw Error(CMF_ERR_INVALID_ARGUMENT, "attention_full: NULL argument");
        const uint64_t hd = head_dim, qd = uint64_t(n_heads) * hd, kvd = uint64_t(n_kv_heads) * hd;
        const uint32_t group = n_heads / n_kv_heads;
        if (n_kv == 0) {  // nothing to attend to: every query's keys are "all masked"
            std::fill(out, out + n_q * qd, 0.0f);
            return;
        }
        const uint64_t k_stride = cmf::cpu::packed_w_floats(n_kv, hd), v_stride = flash_chunks(n_kv) * v_chunk_floats(hd);
        thread_local std::vector<float> k_buf, v_buf;
        k_buf.resize(n_kv_heads * k_stride);
        v_buf.resize(n_kv_heads * v_stride);
        float *const kp = k_buf.data(), *const vp = v_buf.data();
        pack_kv_heads(be, k, v, 0, 0, n_kv, n_kv_heads, hd, kvd, kp, vp);
        const FlashScores fs{scale, 0.0f, key_bias};
        for_flash_items(be, n_q, n_heads, group, [&](uint64_t t0, uint64_t t1, uint32_t h0, uint32_t nh, uint32_t kvh) {
            flash_item(q + t0 * qd + uint64_t(h0) * hd, qd, t1 - t0, nh, hd, kp + kvh * k_stride, vp + kvh * v_stride,
                       n_kv, out + t0 * qd + uint64_t(h0) * hd, fs,
                       [&](uint64_t) { return std::pair<uint64_t, uint64_t>{0, n_kv}; });
        });
        trim_packed(k_buf, v_buf);
    });
}

// Decode attention: a run of keys shorter than this is not split further.
constexpr uint64_t kMinKeysPerSplit = 32;

// One split-K work item's result in its slice of the partials buffer: per
// head the unnormalised output (head_dim floats), then per head the run's
// max score, then per head its softmax denominator.
struct SplitPart {
    float *base;
    uint32_t n_heads, head_dim;
    static uint64_t floats(uint32_t n_heads, uint32_t head_dim) { return uint64_t(n_heads) * (head_dim + 2); }
    float *o(uint32_t h) const { return base + uint64_t(h) * head_dim; }
    float *max() const { return base + uint64_t(n_heads) * head_dim; }
    float *sum() const { return max() + n_heads; }
};

// attention / attention_kv over cache rows named by P (kv_heads_dot above).
// ring > 0: the caches are rings of that many rows, position j in row j % ring.
template <class P>
void attention_rows(Backend *be, const float *q, P k_cache, P v_cache, uint64_t ring, float *out,
                    uint64_t n_tokens, uint64_t pos0, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                    float scale, uint32_t window, float softcap) {
    if (n_kv_heads == 0 || n_heads % n_kv_heads != 0)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "attention: n_heads must be a multiple of n_kv_heads");
    const uint64_t qd = uint64_t(n_heads) * head_dim, kvd = uint64_t(n_kv_heads) * head_dim;
    const uint32_t group = n_heads / n_kv_heads;
    const auto &k = cmf::cpu::kernels();
    if (n_tokens == 0) return;
    if (n_tokens >= kAttnBlock) {
        attention_blocked(be, q, k_cache, v_cache, ring, out, n_tokens, pos0, n_heads, group, head_dim, qd, kvd,
                          scale, window, softcap);
        return;
    }
    if (n_tokens > 1) {
        // A few queries: each as its own one-query call. How a query's keys
        // are split below depends on the call's query count, and a
        // speculative two-token pass must give the bits two one-token steps
        // give (greedy output with a draft head equals plain greedy).
        for (uint64_t t = 0; t < n_tokens; ++t)
            attention_rows(be, q + t * qd, k_cache, v_cache, ring, out + t * qd, 1, pos0 + t, n_heads, n_kv_heads,
                           head_dim, scale, window, softcap);
        return;
    }
    // Decode (one token): split-K. The token's key range is cut into
    // `splits` runs; a work item takes one run for every head, reading
    // the cache rows front to back (a row holds all KV heads, so this is
    // one sequential stream: per head, the slices are 4 KiB apart and
    // every key began with a full memory latency), and leaves per head
    // its running max, softmax denominator and unnormalised output. The
    // runs are then merged per head (rescaled to the common max).
    // Runs shorter than kMinKeysPerSplit are not split further; when that
    // leaves fewer items than 2 per thread (a short context: the first 64
    // positions ran on one thread), the KV heads are split too, `hsplits`
    // ranges of whole GQA groups, each item reading its part of every row.
    const uint64_t threads = pool_threads(be);
    auto key_range = [&](uint64_t t) {
        const uint64_t p = pos0 + t;
        const uint64_t j0 = (window > 0 && p + 1 > window) ? p + 1 - window : 0;
        return std::pair<uint64_t, uint64_t>{j0, p + 1};
    };
    const uint64_t longest = key_range(n_tokens - 1).second - key_range(n_tokens - 1).first;
    const uint64_t splits = std::clamp<uint64_t>(std::min((2 * threads + n_tokens - 1) / n_tokens, longest / kMinKeysPerSplit),
                                                 1, 2 * threads);
    const uint64_t hsplits = std::clamp<uint64_t>((2 * threads + n_tokens * splits - 1) / (n_tokens * splits), 1, n_kv_heads);
    // KV heads [kv_begin(hs), kv_begin(hs + 1)) belong to head split hs.
    auto kv_begin = [&](uint64_t hs) { return uint32_t(uint64_t(n_kv_heads) * hs / hsplits); };
    const uint64_t part_floats = SplitPart::floats(n_heads, head_dim);
    thread_local std::vector<float> parts;
    parts.resize(n_tokens * splits * hsplits * part_floats);
    // Item ((t * splits + sp) * hsplits + hs): token t, key run sp, head split hs.
    auto part = [&, base = parts.data()](uint64_t item) { return SplitPart{base + item * part_floats, n_heads, head_dim}; };
    parallel(be, n_tokens * splits * hsplits, 1, [&](uint64_t i0, uint64_t i1) {
        thread_local std::vector<float> sc;  // [head][key of the run]
        for (uint64_t i = i0; i < i1; ++i) {
            const uint64_t t = i / (splits * hsplits), sp = i / hsplits % splits, hs = i % hsplits;
            const auto [j0, j1] = key_range(t);
            const uint64_t a = j0 + (j1 - j0) * sp / splits, b = j0 + (j1 - j0) * (sp + 1) / splits, m = b - a;
            // This item's KV heads [kv0, kv0 + nkv) and query heads [h0, h0 + nq):
            // the same layout as all heads, offset (head h uses KV head h / group).
            const uint32_t kv0 = kv_begin(hs), nkv = kv_begin(hs + 1) - kv0, h0 = kv0 * group, nq = nkv * group;
            const uint64_t kv_off = uint64_t(kv0) * head_dim;
            const SplitPart pt = part(i);
            float *mx = pt.max() + h0, *sum = pt.sum() + h0;
            const float *qt = q + t * qd + uint64_t(h0) * head_dim;
            sc.resize(uint64_t(nq) * m);
            // Every head's scores over the run (sc[h * m + key]), then scaled.
            // The run's rows: [r, r + m1) and, when it wraps around a ring, [0, m - m1).
            const uint64_t r = ring ? a % ring : a, m1 = ring ? std::min(m, ring - r) : m;
            kv_heads_dot(k, qt, k_cache + r * kvd + kv_off, kvd, m1, nq, group, head_dim, sc.data(), m);
            if (m1 < m) kv_heads_dot(k, qt, k_cache + kv_off, kvd, m - m1, nq, group, head_dim, sc.data() + m1, m);
            for (uint32_t h = 0; h < nq; ++h) {
                float *sh = sc.data() + h * m;
                if (softcap > 0.0f) {
                    for (float *v = sh; v != sh + m; ++v) *v = softcap * std::tanh(*v * scale / softcap);
                    mx[h] = m ? *std::max_element(sh, sh + m) : -INFINITY;
                } else {
                    mx[h] = k.scale_max(sh, m, scale);
                }
                sum[h] = m ? k.exp_sum(sh, m, mx[h]) : 0.0f;
            }
            std::fill(pt.o(h0), pt.o(h0 + nq), 0.0f);  // this item's heads' o
            // The whole run at once: sc holds each head's weights over the
            // run's keys (m apart), o(h) = o(h0) + (h-h0)*head_dim.
            kv_heads_axpy(k, sc.data(), m, v_cache + r * kvd + kv_off, kvd, m1, nq, group, head_dim, pt.o(h0));
            if (m1 < m)
                kv_heads_axpy(k, sc.data() + m1, m, v_cache + kv_off, kvd, m - m1, nq, group, head_dim, pt.o(h0));
        }
    });
    // Merge the runs of each (token, head): out = sum_s e^(mx_s - M) o_s / sum_s e^(mx_s - M) sum_s.
    for (uint64_t t = 0; t < n_tokens; ++t)
        for (uint32_t h = 0; h < n_heads; ++h) {
            uint64_t hs = 0;  // the head split holding head h
            while (kv_begin(hs + 1) * group <= h) ++hs;
            auto item = [&](uint64_t sp) { return (t * splits + sp) * hsplits + hs; };
            float big = -INFINITY;
            for (uint64_t sp = 0; sp < splits; ++sp) big = std::max(big, part(item(sp)).max()[h]);
            float *dst = out + t * qd + uint64_t(h) * head_dim;
            std::fill(dst, dst + head_dim, 0.0f);
            float z = 0.0f;
            for (uint64_t sp = 0; sp < splits; ++sp) {
                const SplitPart pt = part(item(sp));
                const float ps = pt.sum()[h];
                if (ps == 0.0f) continue;  // an empty run
                const float w = std::exp(pt.max()[h] - big);
                z += w * ps;
                k.axpy(w, pt.o(h), dst, head_dim);
            }
            const float inv = 1.0f / z;
            for (uint32_t d = 0; d < head_dim; ++d) dst[d] *= inv;
        }
}

cmf_error *attention(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                     uint64_t n_tokens, uint64_t pos0, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                     float scale, uint32_t window, float softcap) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        attention_rows(be, q, k_cache, v_cache, 0, out, n_tokens, pos0, n_heads, n_kv_heads, head_dim, scale, window,
                       softcap);
    });
}

void check_kv_dtype(int32_t dtype, const char *op) {
    if (dtype != CMF_DTYPE_F32 && dtype != CMF_DTYPE_F16 && dtype != CMF_KV_DTYPE_Q8_32)
        throw Error(CMF_ERR_UNSUPPORTED, std::string(op) + ": KV cache dtype " + std::to_string(dtype) +
                                             " is not supported (f32 = 0, f16 = 1 and q8 blocks = " +
                                             std::to_string(CMF_KV_DTYPE_Q8_32) + " are)");
}

// q8 blocks hold 32 elements: a q8 cache's rows must be whole blocks.
void check_q8_row_len(uint64_t row_len, const char *op) {
    if (row_len % 32 != 0)
        throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(op) + ": a q8 KV cache needs rows of a multiple of 32 "
                                                                "elements, not " +
                                                  std::to_string(row_len));
}

// f(k, v) with the caches typed as their dtype says (attention_rows' P).
template <class F>
void with_kv_caches(int32_t dtype, uint32_t n_kv_heads, uint32_t head_dim, const float *k_cache, const float *v_cache, const char *op,
                    F &&f) {
    check_kv_dtype(dtype, op);
    if (dtype == CMF_DTYPE_F32) return f(k_cache, v_cache);
    if (dtype == CMF_DTYPE_F16)
        return f(reinterpret_cast<const uint16_t *>(k_cache), reinterpret_cast<const uint16_t *>(v_cache));
    check_q8_row_len(uint64_t(n_kv_heads) * head_dim, op);
    f(KvQ8{reinterpret_cast<const uint8_t *>(k_cache)}, KvQ8{reinterpret_cast<const uint8_t *>(v_cache)});
}

cmf_error *attention_kv(void *ctx, const float *q, const float *k_cache, const float *v_cache, int32_t cache_dtype,
                        float *out, uint64_t n_tokens, uint64_t pos0, uint32_t n_heads, uint32_t n_kv_heads,
                        uint32_t head_dim, float scale, uint32_t window, float softcap) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        with_kv_caches(cache_dtype, n_kv_heads, head_dim, k_cache, v_cache, "attention_kv", [&](auto kc, auto vc) {
            attention_rows(be, q, kc, vc, 0, out, n_tokens, pos0, n_heads, n_kv_heads, head_dim, scale, window,
                           softcap);
        });
    });
}

cmf_error *attention_ring(void *ctx, const float *q, const float *k_cache, const float *v_cache, int32_t cache_dtype,
                          uint64_t ring_rows, float *out, uint64_t n_tokens, uint64_t pos0, uint32_t n_heads,
                          uint32_t n_kv_heads, uint32_t head_dim, float scale, uint32_t window, float softcap) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        check_kv_dtype(cache_dtype, "attention_ring");
        if (window == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "attention_ring: window must be > 0");
        const uint64_t first = pos0 + 1 > window ? pos0 + 1 - window : 0;
        if (ring_rows == 0 || pos0 + n_tokens - first > ring_rows)
            throw Error(CMF_ERR_BOUNDS, "attention_ring: positions " + std::to_string(first) + ".." +
                                            std::to_string(pos0 + n_tokens - 1) + " do not fit a ring of " +
                                            std::to_string(ring_rows) + " rows");
        with_kv_caches(cache_dtype, n_kv_heads, head_dim, k_cache, v_cache, "attention_ring", [&](auto kc, auto vc) {
            attention_rows(be, q, kc, vc, ring_rows, out, n_tokens, pos0, n_heads, n_kv_heads, head_dim, scale,
                           window, softcap);
        });
    });
}

cmf_error *kv_write(void *ctx, float *cache, int32_t dtype, uint64_t row_len, uint64_t row0, const float *src,
                    uint64_t n_rows) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        check_kv_dtype(dtype, "kv_write");
        if (dtype == CMF_KV_DTYPE_Q8_32) check_q8_row_len(row_len, "kv_write");
        const uint64_t n = n_rows * row_len;
        if (n == 0) return;
        if (cache == nullptr || src == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "kv_write: NULL argument");
        const auto &k = cmf::cpu::kernels();
        if (dtype == CMF_DTYPE_F32) {
            std::memcpy(cache + row0 * row_len, src, n * sizeof(float));
        } else if (dtype == CMF_DTYPE_F16) {
            uint16_t *dst = reinterpret_cast<uint16_t *>(cache) + row0 * row_len;
            parallel(be, n, 16384, [&](uint64_t i0, uint64_t i1) { k.narrow_f16(src + i0, i1 - i0, dst + i0); });
        } else {
            uint8_t *dst = reinterpret_cast<uint8_t *>(cache) + row0 * CMF_KV_Q8_32_ROW_BYTES(row_len);
            parallel(be, n / 32, 512, [&](uint64_t b0, uint64_t b1) {
                k.quant_q8_32(src + b0 * 32, b1 - b0, dst + b0 * 34);
            });
        }
    });
}

cmf_error *gated_act(void *ctx, const float *gate, const float *up, uint64_t n, int32_t act, float *out) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (act != CMF_ACT_SILU && act != CMF_ACT_GELU_TANH && act != CMF_ACT_SIGMOID)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "gated_act: unknown activation " + std::to_string(act));
        parallel(be, n, 8192, [&](uint64_t i0, uint64_t i1) {
            if (act == CMF_ACT_SILU)
                cmf::cpu::kernels().silu_mul(gate + i0, up + i0, i1 - i0, out + i0);
            else if (act == CMF_ACT_SIGMOID)
                cmf::cpu::kernels().sigmoid_mul(gate + i0, up + i0, i1 - i0, out + i0);
            else
                for (uint64_t i = i0; i < i1; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
        });
    });
}

cmf_error *add(void *ctx, float *y, const float *x, uint64_t n) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        parallel(be, n, 16384, [&](uint64_t i0, uint64_t i1) {
            for (uint64_t i = i0; i < i1; ++i) y[i] += x[i];
        });
    });
}

cmf_error *add_bias(void *ctx, float *y, const cmf_backend_weight *b, uint64_t n_rows, uint64_t dim) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        const float *bv = vector_of(b, dim, "add_bias");
        for (uint64_t r = 0; r < n_rows; ++r)
            for (uint64_t j = 0; j < dim; ++j) y[r * dim + j] += bv[j];
    });
}

// ---- mixture of experts: rows gathered, weighted rows summed -----------------

cmf_error *gather_rows(void *ctx, const float *src, uint64_t dim, const int32_t *rows, uint64_t n, float *dst) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (n == 0) return;
        if (src == nullptr || rows == nullptr || dst == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "gather_rows: NULL argument");
        for (uint64_t i = 0; i < n; ++i)
            if (rows[i] < 0) throw Error(CMF_ERR_BOUNDS, "gather_rows: negative row index " + std::to_string(rows[i]));
        parallel(be, n, std::max<uint64_t>(1, 16384 / std::max<uint64_t>(1, dim)), [&](uint64_t i0, uint64_t i1) {
            for (uint64_t i = i0; i < i1; ++i)
                std::memcpy(dst + i * dim, src + uint64_t(rows[i]) * dim, dim * sizeof(float));
        });
    });
}

cmf_error *scatter_rows(void *ctx, const float *x, uint64_t n, uint64_t dim, const int32_t *rows, const float *weights,
                        float *out, uint64_t n_out) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (n_out == 0) return;
        if (out == nullptr || (n > 0 && (x == nullptr || rows == nullptr || weights == nullptr)))
            throw Error(CMF_ERR_INVALID_ARGUMENT, "scatter_rows: NULL argument");
        // The sources of each output row, in increasing i (a counting sort);
        // the calling thread's buffers, read by the workers through pointers.
        thread_local std::vector<uint64_t> first_v, order_v;
        std::vector<uint64_t> &first = first_v, &order = order_v;
        first.assign(n_out + 1, 0);
        for (uint64_t i = 0; i < n; ++i) {
            if (rows[i] < 0 || uint64_t(rows[i]) >= n_out)
                throw Error(CMF_ERR_BOUNDS, "scatter_rows: row " + std::to_string(rows[i]) + " outside the " +
                                                std::to_string(n_out) + " output rows");
            ++first[uint64_t(rows[i]) + 1];
        }
        for (uint64_t r = 0; r < n_out; ++r) first[r + 1] += first[r];
        order.resize(n);
        {
            thread_local std::vector<uint64_t> fill;
            fill.assign(first.begin(), first.end() - 1);
            for (uint64_t i = 0; i < n; ++i) order[fill[uint64_t(rows[i])]++] = i;
        }
        const uint64_t *fp = first.data(), *op = order.data();
        parallel(be, n_out, std::max<uint64_t>(1, 8192 / std::max<uint64_t>(1, dim)), [&](uint64_t r0, uint64_t r1) {
            for (uint64_t r = r0; r < r1; ++r) {
                float *o = out + r * dim;
                std::fill(o, o + dim, 0.0f);
                for (uint64_t k = fp[r]; k < fp[r + 1]; ++k) {
                    const uint64_t i = op[k];
                    const float w = weights[i], *xi = x + i * dim;
                    for (uint64_t j = 0; j < dim; ++j) o[j] += w * xi[j];
                }
            }
        });
    });
}

// ---- hybrids: strided copies, the short convolution, the gated delta rule ----

cmf_error *copy_rows(void *ctx, float *dst, uint64_t ld_dst, const float *src, uint64_t ld_src, uint64_t n_rows,
                     uint64_t row_len) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (n_rows == 0 || row_len == 0) return;
        if (dst == nullptr || src == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "copy_rows: NULL argument");
        if (row_len > ld_dst || row_len > ld_src)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "copy_rows: row_len exceeds a row stride");
        parallel(be, n_rows, std::max<uint64_t>(1, 16384 / row_len), [&](uint64_t r0, uint64_t r1) {
            for (uint64_t r = r0; r < r1; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, row_len * sizeof(float));
        });
    });
}

cmf_error *causal_conv1d_silu(void *ctx, const float *x, uint64_t n_tokens, uint64_t channels,
                              const cmf_backend_weight *w, uint32_t kernel, float *state, float *state_out, float *out) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (kernel < 1) throw Error(CMF_ERR_INVALID_ARGUMENT, "causal_conv1d_silu: kernel must be >= 1");
        const float *wv = vector_of(w, channels * kernel, "causal_conv1d_silu");
        if (n_tokens == 0) return;
        if (x == nullptr || out == nullptr || (kernel > 1 && (state == nullptr || state_out == nullptr)))
            throw Error(CMF_ERR_INVALID_ARGUMENT, "causal_conv1d_silu: NULL argument");
        const uint64_t K = kernel, hist = K - 1, C = channels;
        // u[t] = the input stream: the state's rows, then x.
        auto u = [&](uint64_t t) { return t < hist ? state + t * C : x + (t - hist) * C; };
        const auto &k = cmf::cpu::kernels();
        // Channel blocks; tokens inside, so a block's taps stay in L1.
        constexpr uint64_t kBlock = 256;
        parallel(be, (C + kBlock - 1) / kBlock, 1, [&](uint64_t b0, uint64_t b1) {
            for (uint64_t b = b0; b < b1; ++b) {
                const uint64_t c0 = b * kBlock, c1 = std::min(C, c0 + kBlock);
                cmf::cpu::gdn::conv1d_block(state, x, C, wv, K, c0, c1, n_tokens, out);
                for (uint64_t t = 0; t < n_tokens; ++t) k.silu(out + t * C + c0, c1 - c0, out + t * C + c0);
            }
        });
        if (hist == 0) return;
        // state_out = u[n .. n + hist), then state = u[n - 1 .. n - 1 + hist)
        // (in place, front to back: row r reads row r + n - 1 >= r).
        for (uint64_t r = 0; r < hist; ++r) std::memcpy(state_out + r * C, u(n_tokens + r), C * sizeof(float));
        if (n_tokens > 1)
            for (uint64_t r = 0; r < hist; ++r) std::memmove(state + r * C, u(n_tokens - 1 + r), C * sizeof(float));
    });
}

// The chunked (WY) form takes over from this many tokens; below it, and for
// a call's last token (written to state_out), the recurrence.
constexpr uint64_t kDeltaChunkMin = 16;

cmf_error *gated_delta_net(void *ctx, const float *qkv, uint64_t n_tokens, uint32_t nk, uint32_t nv, uint32_t dk,
                           uint32_t dv, const float *a, const float *b, const cmf_backend_weight *a_log,
                           const cmf_backend_weight *dt_bias, float *state, float *state_out, float *out) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        namespace gdn = cmf::cpu::gdn;
        if (nk == 0 || nv == 0 || dk == 0 || dv == 0 || nv % nk != 0)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "gated_delta_net: heads and dims must be > 0, nv a multiple of nk");
        const float *alog = vector_of(a_log, nv, "gated_delta_net (a_log)");
        const float *dtb = vector_of(dt_bias, nv, "gated_delta_net (dt_bias)");
        if (n_tokens == 0) return;
        if (qkv == nullptr || a == nullptr || b == nullptr || state == nullptr || state_out == nullptr || out == nullptr)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "gated_delta_net: NULL argument");
        const gdn::Dims d{nk, nv, dk, dv};
        const uint64_t kd = uint64_t(nk) * dk, sz = uint64_t(dk) * dv;
        // The calling thread's buffers (it waits for the loops); the workers
        // see them through these pointers, not as their own thread_locals.
        thread_local std::vector<float> qv, kv, bv, gv;
        qv.resize(n_tokens * kd), kv.resize(n_tokens * kd), bv.resize(n_tokens * nv), gv.resize(n_tokens * nv);
        float *q = qv.data(), *k = kv.data(), *beta = bv.data(), *g = gv.data();
        parallel(be, n_tokens, 4, [&](uint64_t t0, uint64_t t1) {
            gdn::prepare(d, qkv, t0, t1, a, b, alog, dtb, q, k, beta, g);
        });
        const gdn::Head in{q, k, qkv, beta, g, out, uint64_t(nv) * dv};
        const uint64_t head = n_tokens - 1;  // tokens advancing `state` in place
        const bool chunked = be->delta_chunked && head >= kDeltaChunkMin;
        parallel(be, nv, 1, [&](uint64_t h0, uint64_t h1) {
            for (uint64_t h = h0; h < h1; ++h) {
                float *S = state + h * sz;
                if (chunked)
                    gdn::chunked(d, uint32_t(h), in, head, S);
                else
                    gdn::recurrent(d, uint32_t(h), in, head, S);
                gdn::step(d, uint32_t(h), in, head, S, state_out + h * sz);
            }
        });
    });
}

cmf_error *embed(void *ctx, const cmf_backend_weight *table, const int32_t *tokens, uint64_t n_tokens, float scale,
                 float *out) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        if (table == nullptr || table->view.ndim != 2) throw Error(CMF_ERR_INVALID_ARGUMENT, "embed: table is not 2-D");
        const uint64_t dim = table->cols;
        for (uint64_t t = 0; t < n_tokens; ++t) {
            if (tokens[t] < 0 || uint64_t(tokens[t]) >= table->rows)
                throw Error(CMF_ERR_BOUNDS, "embed: token id " + std::to_string(tokens[t]) + " outside the table's " +
                                                std::to_string(table->rows) + " rows");
            uint64_t r = uint64_t(tokens[t]);
            float *o = out + t * dim;
            if (table->codec == nullptr) {
                std::memcpy(o, static_cast<const float *>(table->view.data) + r * dim, dim * sizeof(float));
            } else if (cmf_error *e = table->codec->dequantize_rows(table->codec_ctx, &table->view, r, r + 1, o)) {
                throw cmf::sdk::HostError{e};
            }
            if (scale != 1.0f)
                for (uint64_t j = 0; j < dim; ++j) o[j] *= scale;
        }
    });
}

}  // namespace

namespace cmf::cpu {

const float *vector_of(const cmf_backend_weight *w, uint64_t dim, const char *op) {
    if (w == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(op) + ": NULL weight");
    if (w->view.ndim != 1 || w->cols != dim)
        throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(op) + ": weight is not a vector of " + std::to_string(dim) +
                                                  " elements");
    return w->vec.data();
}

cmf_error *matmul(void *ctx, const cmf_backend_weight *w, const float *x, uint64_t n_batch, float *y) {
    return matmul_op(ctx, w, x, n_batch, y);
}

}  // namespace cmf::cpu

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "cpu backend needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto be = std::make_unique<Backend>();
    be->host = host;
    be->int8_gemm = kInt8Gemm;
    if (const char *env = std::getenv("CMF_CPU_INT8_GEMM"); env != nullptr && std::strcmp(env, "0") == 0)
        be->int8_gemm = false;
    if (const char *env = std::getenv("CMF_CPU_DELTA_CHUNKED"); env != nullptr && std::strcmp(env, "0") == 0)
        be->delta_chunked = false;
    if (const char *env = std::getenv("CMF_CPU_DECODE_COPY"); env != nullptr && std::strcmp(env, "1") == 0)
        be->decode_copy = Backend::DecodeCopy::always;
    else if (env != nullptr && std::strcmp(env, "0") == 0)
        be->decode_copy = Backend::DecodeCopy::never;
    else if (env != nullptr && *env != '\0')
        host->log(host->host_ctx, CMF_LOG_WARN,
                  ("cpu backend: CMF_CPU_DECODE_COPY=" + std::string(env) +
                   " is neither 0 nor 1; decode copies within the budget, as when it is unset")
                      .c_str());
    if (be->decode_copy == Backend::DecodeCopy::within_budget) be->copy_budget = decode_copy_budget(host);
    be->description = std::string("x86-64 CPU, kernels: ") + cmf::cpu::kernels().isa;
    cmf_backend_vt &vt = be->vt;
    vt = cmf_backend_vt{};
    vt.struct_size = sizeof vt;
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "cpu";
    vt.version = CMF_CPU_VERSION;
    vt.description = be->description.c_str();
    vt.weight_bind = weight_bind;
    vt.weight_free = weight_free;
    vt.matmul = matmul_op;
    vt.buffer_alloc = buffer_alloc;
    vt.buffer_free = buffer_free;
    vt.buffer_write = buffer_write;
    vt.buffer_read = buffer_read;
    vt.copy = copy;
    vt.rms_norm = rms_norm;
    vt.rope = rope;
    vt.attention = attention;
    vt.gated_act = gated_act;
    vt.add = add;
    vt.add_bias = add_bias;
    vt.embed = embed;
    vt.kv_write = kv_write;
    vt.attention_kv = attention_kv;
    vt.attention_ring = attention_ring;
    vt.matmul_multi = matmul_multi;
    vt.attention_full = attention_full;
    cmf::cpu::set_image_ops(vt);
    vt.rope_freqs = rope_freqs;
    vt.weight_bind_subset = weight_bind_subset;
    vt.matmul_grouped = matmul_grouped;
    vt.gather_rows = gather_rows;
    vt.scatter_rows = scatter_rows;
    vt.copy_rows = copy_rows;
    vt.causal_conv1d_silu = causal_conv1d_silu;
    vt.gated_delta_net = gated_delta_net;
    if (cmf_error *e = host->register_backend(reg, &be->vt, be.get())) return e;
    *plugin_state = be.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) { delete static_cast<Backend *>(plugin_state); }
