#include "thread_pool.hpp"

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cmf {
namespace {

using RangeFn = void (*)(void *, uint64_t, uint64_t);
using Clock = std::chrono::steady_clock;

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// How long a server spins without work before it goes back to TBB. Decode's
// gaps between loops are a few microseconds, between tokens (sampling,
// streaming the text) tens; a chat waiting for its user idles out.
constexpr std::chrono::microseconds kServerIdle{1000};

// Set while a thread runs a chunk: a parallel_for called from there runs inline.
thread_local bool t_in_chunk = false;

// The loop being run. [begin, end) is cut into one contiguous block per
// thread, so each thread streams its own stretch of rows (a decode matmul
// reads its weight once; interleaved chunks made every chunk a new stream
// and cost ~3 % of a q4 matmul's speed). A block's chunks shrink towards its
// end (a third of what is left, down to the grain): its owner takes them from
// the front, a thread that has run out of its own takes them from the back,
// so the last chunks, where threads wait for each other, are the small ones.
//
// What crosses between cores is kept to a few cache lines, each moved once
// a loop where it can be: a transfer between the two cores of the machines
// decode runs on costs about 270 ns one way (a ping-pong's round trip 550
// ns), as long as a 0.3 MB slice of a weight takes to stream. So
// - each block is one line holding everything its claimers read: the word
//   (the loop's epoch in the high 32 bits, the block's front and back chunk
//   index in 16 bits each; a claim is a CAS on it), the function and the
//   block's range, from which a chunk's bounds are computed (chunk_bounds)
//   rather than read from a table in another line;
// - a waiting server watches its own block's word only (a new epoch there
//   opens the next loop) and looks at the others' once per loop, to steal
//   when its own block is done: watching them all kept the caller's block
//   line shared, and every claim of the caller had to fetch it back;
// - a thread adds the chunks it ran to `done` once per loop, not once per
//   chunk (one RMW of a contended line each).
// A block's fields are read after a successful claim: the loop cannot finish
// (and the caller cannot rewrite them) before the claimed chunk is done and
// counted, and the CAS acquires the caller's release of the opened word.
// The pool's size is capped at kMaxThreads. Chunk indices count within a
// block (at most kMaxChunksPerBlock), so they fit the word's 16-bit fields
// whatever the thread count; the cap kept a loop's chunks under 2^16 when
// they were numbered across the whole loop.
constexpr int32_t kMaxThreads = 2047;
constexpr uint64_t kMaxChunksPerBlock = 32;
constexpr uint64_t kEmpty = 0;                 // front 0, back 0: nothing to claim

uint64_t block_word(uint64_t tag, uint64_t front, uint64_t back) { return tag | (front << 16) | back; }
uint64_t block_front(uint64_t w) { return (w >> 16) & 0xFFFFu; }
uint64_t block_back(uint64_t w) { return w & 0xFFFFu; }
uint64_t block_tag(uint64_t w) { return w & ~uint64_t(0xFFFFFFFFu); }

struct alignas(64) Block {
    std::atomic<uint64_t> word{0};
    // The open loop's part in this block (written before the word opens).
    RangeFn fn = nullptr;
    void *user = nullptr;
    uint64_t b0 = 0, b1 = 0, grain = 1;
};

// Size of the chunk at `at` of a block ending at b1 that has cut `index`
// chunks before it: a third of what is left, at least the grain, the whole
// rest when less than a grain would remain or the block's last chunk index
// is reached.
uint64_t chunk_size(uint64_t at, uint64_t b1, uint64_t grain, uint64_t index) {
    const uint64_t left = b1 - at;
    const uint64_t size = std::max(grain, (left + 2) / 3);
    return left - std::min(left, size) < grain || index + 1 == kMaxChunksPerBlock ? left : size;
}
uint64_t block_chunks(uint64_t b0, uint64_t b1, uint64_t grain) {
    uint64_t n = 0;
    for (uint64_t at = b0; at < b1; ++n) at += chunk_size(at, b1, grain, n);
    return n;
}
// Bounds of chunk i of block b (at most kMaxChunksPerBlock steps of integer
// arithmetic: far less than fetching a table's line from another core).
void chunk_bounds(const Block &b, uint64_t i, uint64_t &lo, uint64_t &hi) {
    uint64_t at = b.b0;
    for (uint64_t k = 0; k < i; ++k) at += chunk_size(at, b.b1, b.grain, k);
    lo = at;
    hi = at + chunk_size(at, b.b1, b.grain, i);
}

struct Team {
    explicit Team(int32_t threads) : blocks(new Block[size_t(threads)]), n_blocks(threads) {}
    std::unique_ptr<Block[]> blocks;
    const int32_t n_blocks;
    alignas(64) std::atomic<uint64_t> done{0};  // chunks of the open loop finished
    alignas(64) std::atomic<int32_t> live{0};   // servers enqueued or running
    std::atomic<int32_t> next_slot{0};          // hands servers their blocks
    std::atomic<bool> stop{false};
    std::mutex error_mu;
    std::exception_ptr error;  // the first exception of the open loop
};

// Takes one chunk of the open loop, from the front of block `own`, else from
// the back of another block; false when none is left. On success *from is
// the block it came from and [lo, hi) the chunk.
bool claim(Team &t, int32_t own, const Block *&from, uint64_t &lo, uint64_t &hi) {
    for (int32_t k = 0; k < t.n_blocks; ++k) {
        const bool stealing = k != 0;
        Block &b = t.blocks[size_t((own + k) % t.n_blocks)];
        uint64_t w = b.word.load(std::memory_order_relaxed);
        for (;;) {
            const uint64_t front = block_front(w), back = block_back(w);
            if (front >= back) break;
            const uint64_t to = stealing ? block_word(block_tag(w), front, back - 1)
                                         : block_word(block_tag(w), front + 1, back);
            if (b.word.compare_exchange_weak(w, to, std::memory_order_acquire, std::memory_order_relaxed)) {
                from = &b;
                chunk_bounds(b, stealing ? back - 1 : front, lo, hi);
                return true;
            }
        }
    }
    return false;
}

// Claims and runs chunks of the open loop until none is left; true if it ran
// any. (All the chunks one call runs belong to one loop: the loop cannot
// finish while this thread holds chunks it has not counted.)
bool run_chunks(Team &t, int32_t own) {
    uint64_t ran = 0, lo = 0, hi = 0;
    const Block *from = nullptr;
    while (claim(t, own, from, lo, hi)) {
        t_in_chunk = true;
        try {
            from->fn(from->user, lo, hi);
        } catch (...) {
            std::lock_guard<std::mutex> lock(t.error_mu);
            if (!t.error) t.error = std::current_exception();
        }
        t_in_chunk = false;
        ++ran;
    }
    if (ran != 0) t.done.fetch_add(ran, std::memory_order_release);
    return ran != 0;
}

bool has_open_chunks(const Team &t) {
    for (int32_t k = 0; k < t.n_blocks; ++k) {
        const uint64_t w = t.blocks[size_t(k)].word.load(std::memory_order_seq_cst);
        if (block_front(w) < block_back(w)) return true;
    }
    return false;
}

// A server: one of the arena's workers, lent to the pool while loops come.
void serve(Team &t) {
    // Block 0 is the caller's; servers share out the others.
    const int32_t own = 1 + t.next_slot.fetch_add(1, std::memory_order_relaxed) % std::max(1, t.n_blocks - 1);
    const std::atomic<uint64_t> &watch = t.blocks[size_t(own % t.n_blocks)].word;
    auto idle_since = Clock::now();
    uint32_t spins = 0;
    // The epoch of the last loop this server claimed from (publish gives
    // every block a new tag, a block without chunks too); ~0: none yet.
    uint64_t seen = ~uint64_t(0);
    while (!t.stop.load(std::memory_order_relaxed)) {
        const uint64_t tag = block_tag(watch.load(std::memory_order_acquire));
        if (tag != seen) {
            seen = tag;
            if (run_chunks(t, own)) {
                spins = 0;
                idle_since = Clock::now();
            }
            continue;
        }
        cpu_relax();
        if (++spins < 2048) continue;  // read the clock only now and then
        spins = 0;
        if (Clock::now() - idle_since < kServerIdle) continue;
        // Leave. The caller publishes a loop and then reads `live` to decide
        // whether to enqueue servers; we drop `live` and then look for a loop
        // (seq_cst on both sides), so either it sees us gone or we see its
        // loop. Its chunks belong to an epoch this server has not claimed
        // from (when it last did, none was left), so the next turn takes them.
        t.live.fetch_sub(1, std::memory_order_seq_cst);
        if (t.stop.load(std::memory_order_relaxed) || !has_open_chunks(t)) return;
        t.live.fetch_add(1, std::memory_order_seq_cst);
        idle_since = Clock::now();
    }
    t.live.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace

struct ThreadPool::Impl {
    // oneTBB lends an arena at most its global worker limit, by default one
    // fewer than the machine's logical CPUs: a pool of 3 threads on 2 CPUs
    // would silently run on 2. The pool raises the limit to its own size for
    // as long as it lives (global_control takes the largest active value), so
    // the threads asked for are the threads that run.
    explicit Impl(int32_t n)
        : limit(tbb::global_control::max_allowed_parallelism, size_t(n)), arena(n),
          team(std::make_shared<Team>(n)) {}
    ~Impl() {
        team->stop.store(true);
        // Servers still queued run, see `stop` and return; wait for all of them.
        arena.execute([&] { servers.wait(); });
    }

    // Publishes [begin, end) cut for `threads` threads, chunks >= grain;
    // returns the number of chunks.
    uint64_t publish(int32_t threads, RangeFn fn, void *user, uint64_t begin, uint64_t end, uint64_t grain) {
        Team &t = *team;
        const uint64_t tag = (++epoch & 0xFFFFFFFFu) << 32;
        // Nothing of the previous loop is left to claim (all its chunks are
        // done and counted), so the blocks are free to rewrite before their
        // words open.
        const uint64_t n = end - begin;
        // Blocks of at least one grain: fewer blocks than threads on short loops.
        const uint64_t blocks = std::clamp<uint64_t>(n / grain, 1, uint64_t(threads));
        uint64_t count = 0;
        t.done.store(0, std::memory_order_relaxed);
        for (int32_t k = 0; k < threads; ++k) {
            Block &b = t.blocks[size_t(k)];
            uint64_t word = tag | kEmpty;
            if (uint64_t(k) < blocks) {
                b.fn = fn;
                b.user = user;
                b.b0 = begin + n * uint64_t(k) / blocks;
                b.b1 = begin + n * (uint64_t(k) + 1) / blocks;
                b.grain = grain;
                const uint64_t chunks = block_chunks(b.b0, b.b1, grain);
                count += chunks;
                word = block_word(tag, 0, chunks);
            }
            b.word.store(word, std::memory_order_release);
        }
        // Orders the words before run()'s read of `live` (a leaving server
        // orders its decrement before its look at the words).
        std::atomic_thread_fence(std::memory_order_seq_cst);
        return count;
    }

    void run(int32_t threads, RangeFn fn, void *user, uint64_t begin, uint64_t end, uint64_t grain) {
        std::lock_guard<std::mutex> caller(caller_mu);
        Team &t = *team;
        const uint64_t count = publish(threads, fn, user, begin, end, grain);
        // Lend the arena's workers: one server per thread besides this one.
        for (int32_t have = t.live.load(std::memory_order_seq_cst); have < threads - 1; ++have) {
            t.live.fetch_add(1, std::memory_order_seq_cst);
            arena.enqueue(servers.defer([keep = team] { serve(*keep); }));
        }
        run_chunks(t, 0);
        for (uint32_t spins = 0; t.done.load(std::memory_order_acquire) < count;) {
            // A server holding a chunk may have been preempted: stop burning the core it needs.
            if (++spins < (1u << 14)) cpu_relax();
            else std::this_thread::yield();
        }
        std::exception_ptr error;
        {
            std::lock_guard<std::mutex> lock(t.error_mu);
            std::swap(error, t.error);
        }
        if (error) std::rethrow_exception(error);
    }

    tbb::global_control limit;  // declared first: outlives the arena
    tbb::task_arena arena;      // its workers are the servers' threads
    tbb::task_group servers;
    std::shared_ptr<Team> team;  // shared with queued servers
    std::mutex caller_mu;        // one loop at a time
    uint64_t epoch = 0;
};

ThreadPool::ThreadPool(int32_t n_threads) {
    threads_ = std::min(n_threads > 0 ? n_threads : physical_cores(), kMaxThreads);
    impl_ = std::make_unique<Impl>(threads_);
}

ThreadPool::~ThreadPool() = default;

void ThreadPool::parallel_for(uint64_t begin, uint64_t end, uint64_t grain, RangeFn fn, void *user) {
    if (end <= begin) return;
    if (grain == 0) grain = 1;
    const uint64_t n = end - begin;
    if (threads_ == 1 || n <= grain || t_in_chunk) {
        fn(user, begin, end);
        return;
    }
    impl_->run(threads_, fn, user, begin, end, grain);
}

int32_t ThreadPool::physical_cores() noexcept {
    // Hyper-threads share a core's load/store units; for memory-bound decode
    // one thread per physical core is the better default.
    try {
        std::set<std::pair<int, int>> cores;
        unsigned logical = std::thread::hardware_concurrency();
        for (unsigned cpu = 0; cpu < (logical ? logical : 1024u); ++cpu) {
            std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
            std::ifstream core_f(base + "core_id"), pkg_f(base + "physical_package_id");
            int core = -1, pkg = -1;
            if (!(core_f >> core) || !(pkg_f >> pkg)) break;
            cores.emplace(pkg, core);
        }
        if (!cores.empty()) return static_cast<int32_t>(cores.size());
        return logical ? static_cast<int32_t>(logical) : 1;
    } catch (...) {
        return 1;
    }
}

}  // namespace cmf
