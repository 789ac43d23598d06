// bench_qwen: prefill (ppN) and decode (tgN) speed of the qwen arch on the CPU
// backend for a Qwen3-0.6B-shaped model with random weights built in memory,
// plus the machine's memory read bandwidth measured in the same process on
// the same thread pool, so decode can be judged against the bandwidth bound
// (decode tok/s x weight bytes per token / bandwidth).
//
//   bench_qwen [--dtype f16|bf16|f32] [--pp 512] [--tg 128] [--threads 2] [--layers 28] [--bandwidth-only]
//              [--gemm ROWSxCOLS [--dtype q8] [--reps 10] [--matrices 1] [--read-around] [--row-spread S]]
//              [--attention DEPTH [--pp N] [--kv-cache f16|q8]]
//              [--overlap ROUNDS [--overlap-loop-kib KIB] [--overlap-side]] [--plugin-path DIRS]
//
// --gemm times the backend's matmul alone (the prefill GEMM when --pp >= 4):
// one ROWSxCOLS weight (f32/f16/bf16, or q8 (q8_row), q4 (q4_block) or any
// other quantized dtype by name, through its codec) times --pp tokens, --reps times; GFLOP/s of the median and best rep,
// and the weight bytes per second. --matrices N runs N distinct copies in
// rotation, as a model's layers (decode: --pp 1 --matrices 200 streams from
// memory with a join per matmul; the copies sit in 2 MiB pages as a mapped
// model's weights do). --read-around sets every rep against wall read passes
// just before and after it (the share of the read, as --overlap gives it).
// --row-spread S scales row r by 2^(S z), z uniform in [-1, 1] (vbit's
// widths follow its rows' maxima: 1.5 gives it rows of 3 to 6 bits).
// --attention DEPTH times the backend's decode attention alone over --layers
// KV caches of DEPTH rows in rotation (f16, or q8 blocks with --kv-cache q8):
// us per call, KV GB/s; with --pp N
// given too, prefill attention instead: N new tokens at positions DEPTH on
// (the caches hold DEPTH + N rows), ms per call and GFLOP/s (the causal
// product's multiply-adds, QK^T and PV, counted as 2 flops each).
// --overlap ROUNDS: streams with K vector operations per 64-byte line (K from
// 0 to 32) against the read pass and against the same work in L2: the share
// of the read that work of each amount keeps (overlap_bench);
// --overlap-loop-kib KIB cuts the stream into loops of KIB (a token's
// matmuls), --overlap-side adds a second stream as q4_block's scales.
// --plugin-path replaces the build tree's plugins (e.g. a saved older
// backend, to compare two versions in one session).
#include "common/byte_views.hpp"
#include "common/dtype_name.hpp"
#include "common/error.hpp"
#include "half.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/memory_source.hpp"
#include "runtime/session.hpp"

#include <cmf/cmf.h>

#include <algorithm>
#include <array>
#include <utility>
#include <chrono>
#include <cmath>
#include <immintrin.h>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <sys/mman.h>

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// CPU seconds of this process. The bench machine is shared: when other
// processes take cores, wall-clock rates understate the code; the
// CPU-normalised rate (work / (cpu seconds / threads)) is what the threads
// achieved while they actually ran.
double cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

struct Shape {
    uint64_t hidden = 1024, layers = 28, heads = 16, kv = 8, head_dim = 128, ffn = 3072, vocab = 151936;
};

// Cheap deterministic values in [-a, a]: xorshift, no normal distribution
// needed for a speed test (and no denormals).
struct Rng {
    uint64_t s = 0x9E3779B97F4A7C15ull;
    float next(float a) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return (float((s >> 40) & 0xFFFFFF) / float(1 << 24) * 2.0f - 1.0f) * a;
    }
};

void add_tensor(cmf::runtime::MemoryModel &m, Rng &rng, const std::string &name, std::vector<uint64_t> shape,
                int32_t dtype, float scale, float offset = 0.0f) {
    uint64_t n = 1;
    for (auto d : shape) n *= d;
    if (shape.size() == 1) dtype = CMF_DTYPE_F32;  // norms stay f32, as converters keep small tensors precise
    size_t es = dtype == CMF_DTYPE_F32 ? 4 : 2;
    std::vector<uint8_t> bytes(n * es);
    for (uint64_t i = 0; i < n; ++i) {
        float v = offset + rng.next(scale);
        if (dtype == CMF_DTYPE_F32) {
            std::memcpy(bytes.data() + 4 * i, &v, 4);
        } else {
            uint16_t h = dtype == CMF_DTYPE_F16 ? cmf::codecs::f32_to_f16(v) : cmf::codecs::f32_to_bf16(v);
            std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
    }
    m.add(name, dtype, shape, std::move(bytes));
}

std::string arch_json(const Shape &s) {
    std::string types;
    for (uint64_t i = 0; i < s.layers; ++i) types += std::string(i ? "," : "") + "\"FullAttention\"";
    char buf[1024];
    std::snprintf(buf, sizeof buf,
                  "{\"arch_name\":\"qwen3\",\"hidden_size\":%llu,\"intermediate_size\":%llu,\"num_layers\":%llu,"
                  "\"num_attention_heads\":%llu,\"num_kv_heads\":%llu,\"head_dim\":%llu,\"vocab_size\":%llu,"
                  "\"rms_norm_eps\":1e-6,\"norm_style\":\"qwen\",\"rope_theta\":1000000.0,"
                  "\"partial_rotary_factor\":1.0,\"tie_word_embeddings\":true,\"max_position_embeddings\":40960,"
                  "\"layer_types\":[",
                  (unsigned long long)s.hidden, (unsigned long long)s.ffn, (unsigned long long)s.layers,
                  (unsigned long long)s.heads, (unsigned long long)s.kv, (unsigned long long)s.head_dim,
                  (unsigned long long)s.vocab);
    return std::string(buf) + types + "]}";
}

// Read bandwidth: every thread sums its slices of a 1 GiB buffer with
// 256-bit loads into four independent accumulators, once as plain loads and
// once with a software prefetch 512 B ahead (more lines in flight than the
// hardware prefetcher keeps: on this 2-core EPYC 19-20 GB/s plain, 21-27
// with it; a scalar or single-chain sum reads 20-30 % less). The best pass
// of either is the machine's bandwidth: decode is judged against what the
// memory system can give, not against one way of asking for it.
template <bool Prefetch>
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t *p, uint64_t b, uint64_t e) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    uint64_t i = b;
    for (; i + 16 <= e; i += 16) {
        const __m256i *q = reinterpret_cast<const __m256i *>(p + i);
        if constexpr (Prefetch) {
            _mm_prefetch(reinterpret_cast<const char *>(q) + 512, _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char *>(q) + 576, _MM_HINT_T0);
        }
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(q));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(q + 1));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(q + 2));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(q + 3));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(lanes), _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    uint64_t t = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < e; ++i) t += p[i];
    return t;
}

// A 2 MiB-aligned anonymous buffer, optionally advised into 2 MiB pages.
struct PageBuffer {
    static constexpr size_t kHuge = size_t(2) << 20;
    void *map = nullptr;
    size_t map_bytes = 0;
    uint64_t *p = nullptr;
    PageBuffer(size_t bytes, bool huge) : map_bytes(bytes + kHuge) {
        map = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED) throw cmf::Error(CMF_ERR_OUT_OF_MEMORY, "bandwidth buffer: mmap failed");
        p = reinterpret_cast<uint64_t *>((reinterpret_cast<uintptr_t>(map) + kHuge - 1) & ~uintptr_t(kHuge - 1));
        ::madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    }
    ~PageBuffer() { ::munmap(map, map_bytes); }
};

// Words p[0..n) written on the pool (a buffer's pages touched, so a read
// pass reads memory, not the zero page).
void fill_words(cmf::Runtime &rt, uint64_t *p, uint64_t n) {
    rt.pool().parallel_for(0, n, 1 << 20, [](void *u, uint64_t b, uint64_t e) {
        auto *w = static_cast<uint64_t *>(u);
        for (uint64_t i = b; i < e; ++i) w[i] = i * 0x9E3779B97F4A7C15ull;
    }, p);
}

// Best CPU-normalised read rate over 10 passes of a 1 GiB buffer in 4 KiB or
// 2 MiB pages (the weights of a model file mapped by cmf_open get 2 MiB pages
// where the kernel gives them: docs/performance.md, "Page size").
double read_bandwidth_pages(cmf::Runtime &rt, bool huge, double *best_wall, double *median_cpu) {
    const size_t n = (size_t(1) << 30) / sizeof(uint64_t);
    PageBuffer buf(n * sizeof(uint64_t), huge);
    fill_words(rt, buf.p, n);
    struct Job {
        const uint64_t *p;
        uint64_t sum;
    } job{buf.p, 0};
    double best = 0, best_cpu = 0;
    std::vector<double> prefetched;  // CPU-normalised rates of the prefetching passes (the faster kind)
    const double threads = rt.pool().threads();
    for (int rep = 0; rep < 10; ++rep) {  // even passes plain, odd with prefetch
        auto t0 = Clock::now();
        double c0 = cpu_seconds();
        rt.pool().parallel_for(0, n, 1 << 22, rep % 2 == 0 ? +[](void *u, uint64_t b, uint64_t e) {
            auto *j = static_cast<Job *>(u);
            __atomic_fetch_add(&j->sum, sum_avx2<false>(j->p, b, e), __ATOMIC_RELAXED);
        } : +[](void *u, uint64_t b, uint64_t e) {
            auto *j = static_cast<Job *>(u);
            __atomic_fetch_add(&j->sum, sum_avx2<true>(j->p, b, e), __ATOMIC_RELAXED);
        }, &job);
        double s = since(t0), c = cpu_seconds() - c0;
        best = std::max(best, double(n * sizeof(uint64_t)) / s);
        best_cpu = std::max(best_cpu, double(n * sizeof(uint64_t)) / (c / threads));
        if (rep % 2) prefetched.push_back(double(n * sizeof(uint64_t)) / (c / threads));
    }
    if (job.sum == 42) std::printf(" ");  // keep the sum alive
    std::sort(prefetched.begin(), prefetched.end());
    *median_cpu = prefetched[prefetched.size() / 2];
    *best_wall = best;
    return best_cpu;
}

// The machine's read bandwidth: the better of 4 KiB and 2 MiB pages (both
// printed), so decode is judged against the most the memory system gives.
// The median of the prefetching passes is printed too: on a shared VM the
// best pass and a median run differ by 10-20 %, and a median tg rate is
// fairly compared with a median bandwidth.
double read_bandwidth(cmf::Runtime &rt) {
    double wall4k = 0, wall2m = 0, med4k = 0, med2m = 0;
    const double cpu4k = read_bandwidth_pages(rt, false, &wall4k, &med4k);
    const double cpu2m = read_bandwidth_pages(rt, true, &wall2m, &med2m);
    std::printf("memory read bandwidth, 4 KiB pages: %.2f GB/s wall, %.2f CPU-normalised; 2 MiB pages: %.2f wall, %.2f "
                "CPU-normalised\n",
                wall4k / 1e9, cpu4k / 1e9, wall2m / 1e9, cpu2m / 1e9);
    const double best = std::max(wall4k, wall2m), best_cpu = std::max(cpu4k, cpu2m);
    std::printf("memory read bandwidth: %.2f GB/s wall, %.2f GB/s CPU-normalised (median pass %.2f)\n", best / 1e9,
                best_cpu / 1e9, std::max(med4k, med2m) / 1e9);
    return best_cpu;
}

// One wall-clock prefetching read pass (sum_avx2) of `bytes` at p on the
// pool, in bytes per second: the read a stream in the same minute is set
// against (--overlap, --gemm --read-around).
double wall_read_pass(cmf::Runtime &rt, const uint64_t *p, uint64_t bytes) {
    struct R {
        const uint64_t *p;
        uint64_t sum;
    } r{p, 0};
    auto t = Clock::now();
    rt.pool().parallel_for(0, bytes / 8, 1 << 22, [](void *u, uint64_t b, uint64_t e) {
        auto *j = static_cast<R *>(u);
        __atomic_fetch_add(&j->sum, sum_avx2<true>(j->p, b, e), __ATOMIC_RELAXED);
    }, &r);
    const double s = since(t);
    if (r.sum == 42) std::printf(" ");
    return double(bytes) / s;
}

// --overlap: how much of the read bandwidth a stream keeps when each core
// also does K vector operations on every 64-byte line it reads. A decode
// matmul is such a stream (the weights read once, some arithmetic per byte);
// this measures the share a stream with a given amount of work can reach on
// this machine, apart from any one format's kernel, so a dtype's share can
// be set beside what any code with its ceiling gets.
//
// The work is K vpdpbusd per line on the loaded bytes, spread over 16
// accumulators across four lines so no dependency chain binds it; the lines
// are prefetched non-temporally 6 KiB ahead as the q4 row kernels do. The
// ceiling is the same loop over a slice that stays in L2 (one per thread).
// With --overlap-side, a second stream as q4_block's scales beside its
// nibbles: a line of it per 512 B of the main stream, at side_base +
// (offset in the main stream) / 8, prefetched 32 of its lines ahead.
// With --overlap-row-bytes N, the stream ends a "row" every N bytes as a
// row kernel does: its accumulators summed to one number, stored, and
// started again from zero.
const uint8_t *g_main_base = nullptr, *g_side_base = nullptr;
uint64_t g_row_bytes = 0;
template <int K>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) uint64_t work_lines(const uint8_t *p, uint64_t b, uint64_t e,
                                                                           long ahead) {
    const uint8_t *side = g_side_base != nullptr ? g_side_base + (p - g_main_base) / 8 : nullptr;
    __m512i acc[16];
    for (__m512i &a : acc) a = _mm512_setzero_si512();
    const __m512i c = _mm512_set1_epi8(3);
    uint64_t row_sums = 0;
    uint64_t i = b;
    for (; i + 256 <= e; i += 256) {
        for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char *>(p + i + 64 * l) + ahead, _MM_HINT_NTA);
        if (side != nullptr && i % 512 == 0) {
            _mm_prefetch(reinterpret_cast<const char *>(side + i / 8 + 32 * 64), _MM_HINT_NTA);
            acc[15] = _mm512_add_epi64(acc[15], _mm512_loadu_si512(side + i / 8));
        }
        const __m512i v[4] = {_mm512_loadu_si512(p + i), _mm512_loadu_si512(p + i + 64),
                              _mm512_loadu_si512(p + i + 128), _mm512_loadu_si512(p + i + 192)};
        if constexpr (K == 0) {
            for (int l = 0; l < 4; ++l) acc[l] = _mm512_add_epi64(acc[l], v[l]);
        } else {
#pragma GCC unroll 128
            for (int j = 0; j < 4 * K; ++j) acc[j % 16] = _mm512_dpbusd_epi32(acc[j % 16], v[j / K], c);
        }
        if (g_row_bytes != 0 && (p - g_main_base + i + 256) % g_row_bytes == 0) {
            __m512i r = acc[0];
            for (int l = 1; l < 16; ++l) r = _mm512_add_epi32(r, acc[l]);
            alignas(64) int32_t lanes[16];
            _mm512_store_si512(lanes, r);
            int32_t t = 0;
            for (int32_t x : lanes) t += x;
            row_sums += uint64_t(uint32_t(t));
            for (__m512i &a : acc) a = _mm512_setzero_si512();
        }
    }
    __m512i s = acc[0];
    for (int l = 1; l < 16; ++l) s = _mm512_add_epi64(s, acc[l]);
    uint64_t lanes[8];  // not _mm512_reduce_add_epi64: GCC 12 warns inside it (-Werror=uninitialized)
    _mm512_storeu_si512(lanes, s);
    uint64_t t = row_sums;
    for (uint64_t x : lanes) t += x;
    return t;
}

using WorkFn = uint64_t (*)(const uint8_t *, uint64_t, uint64_t, long);
template <int... Ks>
constexpr std::array<std::pair<int, WorkFn>, sizeof...(Ks)> work_table(std::integer_sequence<int, Ks...>) {
    return {std::pair<int, WorkFn>{Ks, &work_lines<Ks>}...};
}

int overlap_bench(cmf::Runtime &rt, int rounds, uint64_t matrix_bytes, bool side) {
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw"))
        throw cmf::Error(CMF_ERR_UNSUPPORTED, "--overlap needs AVX-512 VNNI (its work is vpdpbusd)");
    constexpr auto table = work_table(std::integer_sequence<int, 0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32>{});
    const size_t bytes = size_t(1) << 30;
    PageBuffer buf(bytes, true);
    auto *bytes_p = reinterpret_cast<uint8_t *>(buf.p);
    fill_words(rt, buf.p, bytes / 8);
    const int threads = rt.pool().threads();
    const long ahead = 6144;
    // The main stream's span; with a side stream 7/8 of the buffer, the side
    // (an eighth of it) after it, and the bytes counted are both.
    const uint64_t span = side ? bytes / 8 * 7 : bytes;
    const double counted = side ? 9.0 / 8.0 : 1.0;
    g_main_base = bytes_p;
    g_side_base = side ? bytes_p + span : nullptr;
    struct Job {
        const uint8_t *p;
        WorkFn fn;
        long ahead;
        uint64_t slice, reps, sum;
    };
    // The stream: the buffer in loops of matrix_bytes (a decode token's
    // matmuls, each cut into 8 chunks a thread as decode_grain cuts them), or
    // one loop.
    auto stream = [&](WorkFn fn) {
        Job job{bytes_p, fn, ahead, 0, 0, 0};
        const uint64_t m = matrix_bytes ? matrix_bytes : span;
        auto t = Clock::now();
        for (uint64_t off = 0; off + m <= span; off += m) {
            job.p = bytes_p + off;
            rt.pool().parallel_for(0, m / 256, std::max<uint64_t>(1, m / 256 / (8 * threads)), [](void *u, uint64_t b, uint64_t e) {
                auto *j = static_cast<Job *>(u);
                __atomic_fetch_add(&j->sum, j->fn(j->p, 256 * b, 256 * e, j->ahead), __ATOMIC_RELAXED);
            }, &job);
        }
        const double s = since(t);
        if (job.sum == 42) std::printf(" ");
        return counted * double(span / m * m) / s;
    };
    // The ceiling: every thread works its own 512 KiB slice (in L2) over and over.
    auto ceiling = [&](WorkFn fn) {
        Job job{bytes_p, fn, 0, uint64_t(512) << 10, 0, 0};
        job.reps = (uint64_t(256) << 20) / job.slice;
        fn(bytes_p, 0, job.slice, 0);  // warm
        auto t = Clock::now();
        rt.pool().parallel_for(0, uint64_t(threads), 1, [](void *u, uint64_t b, uint64_t e) {
            auto *j = static_cast<Job *>(u);
            for (uint64_t w = b; w < e; ++w) {
                const uint8_t *p = j->p + w * (uint64_t(4) << 20);
                uint64_t s = 0;
                for (uint64_t r = 0; r < j->reps; ++r) s += j->fn(p, 0, j->slice, 0);
                __atomic_fetch_add(&j->sum, s, __ATOMIC_RELAXED);
            }
        }, &job);
        const double s = since(t);
        if (job.sum == 42) std::printf(" ");
        return counted * double(job.slice * job.reps * uint64_t(threads)) / s;
    };
    auto read = [&] { return wall_read_pass(rt, buf.p, bytes); };
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    std::vector<std::vector<double>> streamed(table.size()), shares(table.size()), ceilings(table.size());
    std::vector<double> reads;
    for (int r = 0; r < rounds; ++r) {
        for (size_t k = 0; k < table.size(); ++k) {
            const double before = read();
            const double got = stream(table[k].second);
            const double after = read();
            reads.push_back(before);
            streamed[k].push_back(got);
            shares[k].push_back(2 * got / (before + after));
            ceilings[k].push_back(ceiling(table[k].second));
        }
    }
    std::printf("streams with work, %d threads, 1 GiB in 2 MiB pages, %s, lines prefetched (NTA) %ld B ahead%s, %d "
                "rounds; read passes %.1f-%.1f GB/s (median %.1f)\n",
                threads,
                matrix_bytes ? ("loops of " + std::to_string(matrix_bytes >> 10) + " KiB").c_str() : "one loop",
                ahead, side ? ", a side stream of a line per 512 B" : "", rounds, *std::min_element(reads.begin(), reads.end()) / 1e9,
                *std::max_element(reads.begin(), reads.end()) / 1e9, median(reads) / 1e9);
    std::printf("%4s %8s %14s %14s %22s %20s\n", "ops", "ops/B", "ceiling GB/s", "streamed GB/s",
                "share of read (range)", "no overlap ... full");
    for (size_t k = 0; k < table.size(); ++k) {
        const double ceil = median(ceilings[k]), rd = median(reads);
        const double lo = 1.0 / (1.0 / rd + 1.0 / ceil), hi = std::min(rd, ceil);
        std::printf("%4d %8.3f %14.1f %14.1f %9.0f %% (%2.0f-%2.0f) %9.0f %% ... %3.0f %%\n", table[k].first,
                    table[k].first / 64.0, ceil / 1e9, median(streamed[k]) / 1e9, 100 * median(shares[k]),
                    100 * *std::min_element(shares[k].begin(), shares[k].end()),
                    100 * *std::max_element(shares[k].begin(), shares[k].end()), 100 * lo / rd, 100 * hi / rd);
    }
    return 0;
}

// The largest data cache of cpu0 (sysfs "size", e.g. "307200K"), 0 if unknown.
uint64_t last_level_cache_bytes() {
    uint64_t best = 0;
    for (int i = 0; i < 8; ++i) {
        std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
        uint64_t n = 0;
        char unit = 0;
        if (!(f >> n)) continue;
        f >> unit;
        best = std::max<uint64_t>(best, n * (unit == 'K' ? 1024 : unit == 'M' ? 1048576 : 1));
    }
    return best;
}

// The backend matmul alone: GFLOP/s (2*rows*cols*tokens per call).
int gemm_bench(cmf_runtime *rt, const std::string &dtype_name, uint64_t rows, uint64_t cols, uint64_t tokens, int reps,
               uint64_t matrices, bool read_around, float row_spread) {
    const cmf::BackendEntry *be = rt->backend("cpu");
    if (be == nullptr) throw cmf::Error(CMF_ERR_PLUGIN, "no cpu backend");
    // q8 and q4 as the converter's --quant spells them; any other dtype by its own name (q4tp, q1t, ...).
    int32_t dtype = dtype_name == "q8" ? CMF_DTYPE_Q8_ROW : dtype_name == "q4" ? CMF_DTYPE_Q4_BLOCK : -1;
    for (int32_t id = 0; id < 64 && dtype < 0; ++id)
        if (cmf::dtype_name(id) == dtype_name) dtype = id;
    if (dtype < 0) throw cmf::Error(CMF_ERR_INVALID_ARGUMENT, "--gemm: unknown --dtype " + dtype_name);
    Rng rng;
    std::vector<float> wf(rows * cols), x(tokens * cols), y(tokens * rows);
    for (auto &v : wf) v = rng.next(0.05f);
    // --row-spread S: row r times 2^(S z), z uniform in [-1, 1]: rows whose
    // maxima differ as a trained matrix's do (vbit then gives its rows
    // different widths: S = 1.5 spreads them over 3 to 6 bits).
    if (row_spread > 0.0f)
        for (uint64_t r = 0; r < rows; ++r) {
            const float f = std::exp2(row_spread * rng.next(1.0f));
            for (uint64_t c = 0; c < cols; ++c) wf[r * cols + c] *= f;
        }
    for (auto &v : x) v = rng.next(1.0f);
    std::vector<uint8_t> bytes;
    if (dtype == CMF_DTYPE_F32) {
        bytes.resize(wf.size() * 4);
        std::memcpy(bytes.data(), wf.data(), bytes.size());
    } else {
        void *cctx = nullptr;
        const cmf_codec_vt *codec = rt->host_api()->find_codec(rt->host_api()->host_ctx, dtype, &cctx);
        if (codec == nullptr || codec->quantize == nullptr) throw cmf::Error(CMF_ERR_UNKNOWN_DTYPE, "no codec quantize");
        cmf_byte_sink sink = cmf::vector_sink(bytes);
        uint64_t shape[2] = {rows, cols};
        cmf::throw_if_error(codec->quantize(cctx, 2, shape, wf.data(), nullptr, &sink));
    }
    // --matrices N: N copies of the weight at distinct addresses, multiplied
    // one after another in each rep, as a model's layers are: with N * size
    // beyond the caches every matmul streams from memory and pays its own
    // start and join, where one weight repeated would stay in L2/L3.
    // The copies sit in one buffer advised into 2 MiB pages, as cmf_open maps
    // a model file's weights where the kernel gives them (docs/performance.md,
    // "Page size"); each copy starts on a 4 KiB boundary.
    const uint64_t stride = (bytes.size() + 4095) & ~uint64_t(4095);
    PageBuffer copies(stride * matrices, true);
    std::vector<cmf_backend_weight *> ws;
    for (uint64_t i = 0; i < matrices; ++i) {
        uint8_t *c = reinterpret_cast<uint8_t *>(copies.p) + i * stride;
        std::memcpy(c, bytes.data(), bytes.size());
        cmf_tensor_view v = cmf::tensor_view(dtype, std::initializer_list<uint64_t>{rows, cols}, c, bytes.size());
        cmf_backend_weight *w = nullptr;
        cmf::throw_if_error(be->vt.weight_bind(be->ctx, &v, &w));
        ws.push_back(w);
    }
    std::vector<double> secs, cpu, reads;
    const double nthr = rt->pool().threads();
    // --read-around: a wall read pass of 1 GiB before every timed rep and
    // after the last, each rep's rate set against the two around it.
    const uint64_t read_bytes = uint64_t(1) << 30;
    std::unique_ptr<PageBuffer> read_buf;
    if (read_around) {
        read_buf = std::make_unique<PageBuffer>(read_bytes, true);
        fill_words(*rt, read_buf->p, read_bytes / 8);
    }
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
        if (read_around && rep > 0) reads.push_back(wall_read_pass(*rt, read_buf->p, read_bytes));
        auto t = Clock::now();
        const double c0 = cpu_seconds();
        for (cmf_backend_weight *w : ws) cmf::throw_if_error(be->vt.matmul(be->ctx, w, x.data(), tokens, y.data()));
        if (rep > 0) {
            secs.push_back(since(t) / double(matrices));
            cpu.push_back((cpu_seconds() - c0) / nthr / double(matrices));
        }
    }
    std::vector<double> shares;
    if (read_around) {
        reads.push_back(wall_read_pass(*rt, read_buf->p, read_bytes));
        for (size_t i = 0; i < secs.size(); ++i)
            shares.push_back(double(bytes.size()) / secs[i] / ((reads[i] + reads[i + 1]) / 2));
        std::sort(shares.begin(), shares.end());
        std::sort(reads.begin(), reads.end());
    }
    for (cmf_backend_weight *w : ws) be->vt.weight_free(be->ctx, w);
    std::sort(secs.begin(), secs.end());
    std::sort(cpu.begin(), cpu.end());
    const double flop = 2.0 * double(rows) * double(cols) * double(tokens);
    std::printf("gemm %s %llux%llu x %llu tokens: median %.1f GFLOP/s wall (%.2f ms), best %.1f; CPU-normalised "
                "median %.1f, best %.1f\n",
                dtype_name.c_str(), (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)tokens,
                flop / secs[secs.size() / 2] / 1e9, secs[secs.size() / 2] * 1e3, flop / secs.front() / 1e9,
                flop / cpu[cpu.size() / 2] / 1e9, flop / cpu.front() / 1e9);
    std::printf("  weight bytes streamed: median %.2f GB/s wall, best %.2f; CPU-normalised median %.2f, best %.2f (%llu "
                "matrices of %.2f MB in rotation)\n",
                double(bytes.size()) / secs[secs.size() / 2] / 1e9, double(bytes.size()) / secs.front() / 1e9,
                double(bytes.size()) / cpu[cpu.size() / 2] / 1e9, double(bytes.size()) / cpu.front() / 1e9,
                (unsigned long long)matrices, double(bytes.size()) / 1e6);
    if (read_around)
        std::printf("  read passes around the reps %.1f-%.1f GB/s wall (median %.1f); each rep's share of the reads around "
                    "it: median %.0f %% (%.0f-%.0f)\n",
                    reads.front() / 1e9, reads.back() / 1e9, reads[reads.size() / 2] / 1e9,
                    100 * shares[shares.size() / 2], 100 * shares.front(), 100 * shares.back());
    // The Intel VM of docs/performance.md reports a 300 MiB L3: a rotation
    // below that streams partly from cache, not memory (a 177 MB rotation
    // read up to 33 GB/s there against a 25 GB/s memory, 2026-12-01).
    const uint64_t l3 = last_level_cache_bytes();
    if (l3 != 0 && double(matrices) * double(bytes.size()) < 2.0 * double(l3))
        std::printf("  note: the rotation (%.0f MB) is under twice the last-level cache (%.0f MB): partly cache-resident; "
                    "raise --matrices to measure memory\n",
                    double(matrices) * double(bytes.size()) / 1e6, double(l3) / 1e6);
    return 0;
}

// `layers` pairs of K and V caches of `rows` rows (Qwen3-0.6B's KV heads)
// in f16 or q8 blocks (CMF_KV_DTYPE_Q8_32), filled through kv_write with the
// same random rows, in backend buffers; and the median-sorted seconds per
// layer of attention_kv over them: n_new tokens at positions pos0.. (rep 0
// warms up).
struct AttentionCaches {
    const cmf::BackendEntry &be;
    int32_t dtype;
    std::vector<float *> ks, vs;
    uint64_t bytes;  // of one cache
    AttentionCaches(const cmf::BackendEntry &b, const Shape &shape, uint64_t rows, int32_t dtype_, Rng &rng)
        : be(b), dtype(dtype_), ks(shape.layers), vs(shape.layers),
          bytes(rows * (dtype_ == CMF_KV_DTYPE_Q8_32 ? CMF_KV_Q8_32_ROW_BYTES(shape.kv * shape.head_dim)
                                                     : shape.kv * shape.head_dim * 2)) {
        const uint64_t row_len = shape.kv * shape.head_dim;
        std::vector<float> fill(rows * row_len);
        for (auto &v : fill) v = rng.next(1.0f);
        for (uint64_t l = 0; l < shape.layers; ++l) {
            cmf::throw_if_error(be.vt.buffer_alloc(be.ctx, bytes, &ks[l]));
            cmf::throw_if_error(be.vt.buffer_alloc(be.ctx, bytes, &vs[l]));
            cmf::throw_if_error(be.vt.kv_write(be.ctx, ks[l], dtype, row_len, 0, fill.data(), rows));
            cmf::throw_if_error(be.vt.kv_write(be.ctx, vs[l], dtype, row_len, 0, fill.data(), rows));
        }
    }
    const char *name() const { return dtype == CMF_KV_DTYPE_Q8_32 ? "q8" : "f16"; }
    ~AttentionCaches() {
        for (size_t l = 0; l < ks.size(); ++l) {
            be.vt.buffer_free(be.ctx, ks[l]);
            be.vt.buffer_free(be.ctx, vs[l]);
        }
    }
    AttentionCaches(const AttentionCaches &) = delete;
    AttentionCaches &operator=(const AttentionCaches &) = delete;

    std::vector<double> time(const Shape &shape, uint64_t n_new, uint64_t pos0, int reps, Rng &rng) const {
        std::vector<float> q(n_new * shape.heads * shape.head_dim), out(q.size());
        for (auto &v : q) v = rng.next(1.0f);
        const float scale = 1.0f / std::sqrt(float(shape.head_dim));
        std::vector<double> secs;
        for (int rep = 0; rep <= reps; ++rep) {
            auto t = Clock::now();
            for (size_t l = 0; l < ks.size(); ++l)
                cmf::throw_if_error(be.vt.attention_kv(be.ctx, q.data(), ks[l], vs[l], dtype, out.data(), n_new,
                                                       pos0, uint32_t(shape.heads), uint32_t(shape.kv),
                                                       uint32_t(shape.head_dim), scale, 0, 0.0f));
            if (rep > 0) secs.push_back(since(t) / double(ks.size()));
        }
        std::sort(secs.begin(), secs.end());
        return secs;
    }
};

// Prefill attention alone: n_new query tokens at positions depth.. over
// `layers` caches of depth + n_new rows in rotation (Qwen3-0.6B's heads).
int prefill_attention_bench(const cmf::BackendEntry &be, const Shape &shape, uint64_t depth, int reps, uint64_t n_new,
                            int32_t kv_dtype) {
    Rng rng;
    const AttentionCaches caches(be, shape, depth + n_new, kv_dtype, rng);
    const std::vector<double> secs = caches.time(shape, n_new, depth, reps, rng);
    const double med = secs[secs.size() / 2];
    // Token t sees depth + t + 1 keys; per key and head 2 * head_dim multiply-adds.
    const double pairs = double(n_new) * double(depth) + double(n_new) * double(n_new + 1) / 2.0;
    const double flops = pairs * double(shape.heads) * double(shape.head_dim) * 4.0;
    std::printf("prefill attention %s cache, %llu tokens at depth %llu, %llu caches in rotation: median %.2f ms per call "
                "(best %.2f) = %.1f GFLOP/s (best %.1f)\n",
                caches.name(), (unsigned long long)n_new, (unsigned long long)depth, (unsigned long long)shape.layers, med * 1e3,
                secs.front() * 1e3, flops / med / 1e9, flops / secs.front() / 1e9);
    return 0;
}

// Decode attention alone: one query token at position depth-1 against
// `layers` distinct f16 or q8 KV caches (Qwen3-0.6B's 16 heads, 8 KV heads,
// head_dim 128) in rotation, as a model's layers are, so the rows stream
// from memory and not from the caches. Prints us per call and the KV bytes
// per second (K and V rows read once per call).
int attention_bench(cmf_runtime *rt, const Shape &shape, uint64_t depth, int reps, uint64_t n_new, int32_t kv_dtype) {
    const cmf::BackendEntry *be = rt->backend("cpu");
    if (be == nullptr || be->vt.attention_kv == nullptr) throw cmf::Error(CMF_ERR_PLUGIN, "no cpu backend attention_kv");
    if (depth == 0) throw cmf::Error(CMF_ERR_INVALID_ARGUMENT, "--attention wants a depth of at least 1");
    if (n_new > 0) return prefill_attention_bench(*be, shape, depth, reps, n_new, kv_dtype);
    Rng rng;
    const AttentionCaches caches(*be, shape, depth, kv_dtype, rng);
    const uint64_t cache_bytes = caches.bytes;
    const std::vector<double> secs = caches.time(shape, 1, depth - 1, reps, rng);
    // The ceiling: the same rows read plainly (read_bandwidth's prefetching
    // sum) on the same pool, one loop per layer as attention makes.
    std::vector<double> plain;
    struct Job {
        const uint64_t *k, *v;
        uint64_t n, sum;
    } job{nullptr, nullptr, cache_bytes / 8, 0};
    for (int rep = 0; rep <= reps; ++rep) {
        auto t = Clock::now();
        for (uint64_t l = 0; l < shape.layers; ++l) {
            job.k = reinterpret_cast<const uint64_t *>(caches.ks[l]);
            job.v = reinterpret_cast<const uint64_t *>(caches.vs[l]);
            rt->pool().parallel_for(0, 2 * job.n, 4096, [](void *u, uint64_t b, uint64_t e) {
                auto *j = static_cast<Job *>(u);
                uint64_t t = 0;
                if (b < j->n) t += sum_avx2<true>(j->k, b, std::min(e, j->n));
                if (e > j->n) t += sum_avx2<true>(j->v, std::max(b, j->n) - j->n, e - j->n);
                __atomic_fetch_add(&j->sum, t, __ATOMIC_RELAXED);
            }, &job);
        }
        if (rep > 0) plain.push_back(since(t) / double(shape.layers));
    }
    if (job.sum == 42) std::printf(" ");  // keep the sum alive
    std::sort(plain.begin(), plain.end());
    const double med = secs[secs.size() / 2];
    std::printf("attention %s cache, depth %llu, %llu caches in rotation (%.1f MB): median %.1f us per call (best %.1f), "
                "KV rows read at %.2f GB/s (best %.2f)\n",
                caches.name(), (unsigned long long)depth, (unsigned long long)shape.layers,
                2.0 * double(cache_bytes) * double(shape.layers) / 1e6, med * 1e6, secs.front() * 1e6,
                2.0 * double(cache_bytes) / med / 1e9, 2.0 * double(cache_bytes) / secs.front() / 1e9);
    std::printf("  a plain read of the same rows: median %.1f us per layer = %.2f GB/s; attention is %.0f %% of it\n",
                plain[plain.size() / 2] * 1e6, 2.0 * double(cache_bytes) / plain[plain.size() / 2] / 1e9,
                100.0 * plain[plain.size() / 2] / med);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    std::string dtype_name = "f16";
    bool bandwidth_only = false;
    uint32_t pp = 512, tg = 128;
    int32_t threads = 2;
    Shape shape;
    std::string gemm, plugin_path = CMF_BENCH_PLUGIN_PATH, kv_cache = "f16";
    int reps = 10;
    uint64_t matrices = 1, attention_depth = 0;
    bool pp_given = false;
    int overlap_rounds = 0;
    bool overlap_side = false, read_around = false;
    float row_spread = 0.0f;
    uint64_t overlap_matrix = 0;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--dtype") dtype_name = next();
        else if (a == "--pp") pp = uint32_t(std::stoul(next())), pp_given = true;
        else if (a == "--tg") tg = uint32_t(std::stoul(next()));
        else if (a == "--threads") threads = std::stoi(next());
        else if (a == "--layers") shape.layers = std::stoull(next());
        else if (a == "--bandwidth-only") bandwidth_only = true;
        else if (a == "--gemm") gemm = next();
        else if (a == "--attention") attention_depth = std::stoull(next());
        else if (a == "--kv-cache") kv_cache = next();
        else if (a == "--reps") reps = std::max(1, std::stoi(next()));
        else if (a == "--matrices") matrices = std::max<uint64_t>(1, std::stoull(next()));
        else if (a == "--plugin-path") plugin_path = next();
        else if (a == "--overlap") overlap_rounds = std::max(1, std::stoi(next()));
        else if (a == "--overlap-side") overlap_side = true;
        else if (a == "--overlap-row-bytes") g_row_bytes = std::stoull(next()) / 256 * 256;
        else if (a == "--read-around") read_around = true;
        else if (a == "--row-spread") row_spread = std::stof(next());
        else if (a == "--overlap-loop-kib") overlap_matrix = std::stoull(next()) << 10;
        else {
            std::fprintf(stderr, "usage: bench_qwen [--dtype f16|bf16|f32] [--pp N] [--tg N] [--threads N] [--layers N] "
                                 "[--bandwidth-only] [--gemm ROWSxCOLS [--dtype f32|f16|bf16|q8|q4|DTYPE] [--reps N] [--matrices N] "
                                 "[--read-around] [--row-spread S]] "
                                 "[--attention DEPTH [--pp N] [--layers N] [--reps N] [--kv-cache f16|q8]] [--overlap ROUNDS [--overlap-loop-kib KIB] "
                                 "[--overlap-side] [--overlap-row-bytes N]] [--plugin-path DIRS]\n");
            return 2;
        }
    }
    int32_t dtype = dtype_name == "f32" ? CMF_DTYPE_F32 : dtype_name == "bf16" ? CMF_DTYPE_BF16 : CMF_DTYPE_F16;

    cmf_runtime_options o;
    cmf_runtime_options_init(&o);
    o.n_threads = threads;
    o.plugin_path = plugin_path.c_str();
    cmf_runtime *rt = nullptr;
    if (cmf_error *e = cmf_runtime_create(&o, &rt)) {
        std::fprintf(stderr, "runtime: %s\n", cmf_error_message(e));
        return 1;
    }
    try {
        const cmf::BackendEntry *be = rt->backend("cpu");
        std::printf("machine: %s, %d threads\n", be ? be->description.c_str() : "?", rt->pool().threads());
        if (!gemm.empty()) {
            const size_t xpos = gemm.find('x');
            if (xpos == std::string::npos) throw cmf::Error(CMF_ERR_INVALID_ARGUMENT, "--gemm wants ROWSxCOLS");
            int rc = gemm_bench(rt, dtype_name, std::stoull(gemm.substr(0, xpos)), std::stoull(gemm.substr(xpos + 1)),
                                pp, reps, matrices, read_around, row_spread);
            cmf_runtime_free(rt);
            return rc;
        }
        if (overlap_rounds > 0) {
            int rc = overlap_bench(*rt, overlap_rounds, overlap_matrix, overlap_side);
            cmf_runtime_free(rt);
            return rc;
        }
        if (attention_depth > 0) {
            if (kv_cache != "f16" && kv_cache != "q8")
                throw cmf::Error(CMF_ERR_INVALID_ARGUMENT, "--kv-cache wants f16 or q8, not " + kv_cache);
            int rc = attention_bench(rt, shape, attention_depth, reps, pp_given ? pp : 0,
                                     kv_cache == "q8" ? CMF_KV_DTYPE_Q8_32 : CMF_DTYPE_F16);
            cmf_runtime_free(rt);
            return rc;
        }
        double bw = read_bandwidth(*rt);
        if (bandwidth_only) {
            cmf_runtime_free(rt);
            return 0;
        }
        const double nthr = rt->pool().threads();

        auto t0 = Clock::now();
        cmf::runtime::MemoryModel m;
        m.set_arch_json(arch_json(shape));
        Rng rng;
        const uint64_t H = shape.hidden, qd = shape.heads * shape.head_dim, kvd = shape.kv * shape.head_dim;
        add_tensor(m, rng, "model.embed_tokens.weight", {shape.vocab, H}, dtype, 0.05f);
        for (uint64_t l = 0; l < shape.layers; ++l) {
            std::string p = "model.layers." + std::to_string(l) + ".";
            add_tensor(m, rng, p + "input_layernorm.weight", {H}, dtype, 0.1f, 1.0f);
            add_tensor(m, rng, p + "post_attention_layernorm.weight", {H}, dtype, 0.1f, 1.0f);
            add_tensor(m, rng, p + "self_attn.q_proj.weight", {qd, H}, dtype, 0.05f);
            add_tensor(m, rng, p + "self_attn.k_proj.weight", {kvd, H}, dtype, 0.05f);
            add_tensor(m, rng, p + "self_attn.v_proj.weight", {kvd, H}, dtype, 0.05f);
            add_tensor(m, rng, p + "self_attn.o_proj.weight", {H, qd}, dtype, 0.05f);
            add_tensor(m, rng, p + "self_attn.q_norm.weight", {shape.head_dim}, dtype, 0.1f, 1.0f);
            add_tensor(m, rng, p + "self_attn.k_norm.weight", {shape.head_dim}, dtype, 0.1f, 1.0f);
            add_tensor(m, rng, p + "mlp.gate_proj.weight", {shape.ffn, H}, dtype, 0.05f);
            add_tensor(m, rng, p + "mlp.up_proj.weight", {shape.ffn, H}, dtype, 0.05f);
            add_tensor(m, rng, p + "mlp.down_proj.weight", {H, shape.ffn}, dtype, 0.03f);
        }
        add_tensor(m, rng, "model.norm.weight", {H}, dtype, 0.1f, 1.0f);
        // Tied head: the embedding table is read whole once per decoded token,
        // so the bytes per token are all the payload.
        const double bytes_per_token = double(m.payload_bytes());
        const double layer_params = double(shape.layers) * double(2 * qd * H + 2 * kvd * H + 3 * shape.ffn * H);
        std::printf("model: Qwen3-0.6B shape, %llu layers, %s weights, %.1f MB, built in %.1f s\n",
                    (unsigned long long)shape.layers, dtype_name.c_str(), bytes_per_token / 1e6, since(t0));

        cmf::runtime::SessionConfig cfg;
        cfg.n_ctx = pp + tg + 8;
        cfg.n_batch = pp ? pp : 512;
        cmf::runtime::Session s(*rt, *m.source(), cfg);
        std::vector<float> logits(s.vocab_size());
        std::vector<int32_t> prompt(pp);
        for (uint32_t i = 0; i < pp; ++i) prompt[i] = int32_t((i * 7919u + 13u) % shape.vocab);

        if (pp > 0) {
            double best = 1e30, best_cpu = 1e30;
            for (int rep = 0; rep < 2; ++rep) {
                s.truncate(0);
                auto t = Clock::now();
                double c0 = cpu_seconds();
                s.eval(prompt, CMF_LOGITS_LAST, logits.data());
                best = std::min(best, since(t));
                best_cpu = std::min(best_cpu, (cpu_seconds() - c0) / nthr);
            }
            // Prefill work: every layer matmul per token (+ attention, small at 512), head once.
            double flop = 2.0 * layer_params * pp + 2.0 * double(shape.vocab) * H;
            std::printf("pp%u: %.1f tok/s wall (%.2f s), %.1f tok/s CPU-normalised; matmuls %.0f GFLOP/s wall, %.0f "
                        "CPU-normalised\n",
                        pp, pp / best, best, pp / best_cpu, flop / best / 1e9, flop / best_cpu / 1e9);
        }
        if (tg > 0) {
            s.truncate(0);
            int32_t tok = 1;
            auto t = Clock::now();
            double c0 = cpu_seconds();
            for (uint32_t i = 0; i < tg; ++i) {
                s.eval(std::span<const int32_t>(&tok, 1), CMF_LOGITS_LAST, logits.data());
                tok = int32_t((tok * 31 + 7) % int32_t(shape.vocab));
            }
            double sec = since(t), csec = (cpu_seconds() - c0) / nthr;
            double tps = tg / sec, tps_cpu = tg / csec;
            double eff_bw = tps_cpu * bytes_per_token;
            std::printf("tg%u: %.2f tok/s wall (%.2f s), %.2f tok/s CPU-normalised = %.2f GB/s of weights = %.0f%% of "
                        "the CPU-normalised bandwidth\n",
                        tg, tps, sec, tps_cpu, eff_bw / 1e9, 100.0 * eff_bw / bw);
        }
    } catch (const cmf::Error &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        cmf_runtime_free(rt);
        return 1;
    }
    cmf_runtime_free(rt);
    return 0;
}
