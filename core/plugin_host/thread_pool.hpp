// The runtime's one thread pool: every parallel loop of libcmf and of its
// plugins (through host->parallel_for) runs on it, so a runtime never uses
// more threads than it was given.
//
// The threads are oneTBB's: a task_arena of n threads. A loop is not a
// tbb::parallel_for, though. A q4 decode step of the 0.6B shape makes ~140
// loops of 25-180 us, and a tbb::parallel_for costs ~2.2 us to fork and join
// on the 2-core VM, ~5.7 us when its worker has gone to sleep
// (docs/performance.md, 2026-12-01 10:35). So the arena's workers run "server"
// tasks that stay in a spin loop while loops keep coming, claim chunks of the
// published loop (one contiguous block per thread first, then the others'
// leftovers), and go back to TBB (which parks them) after ~1 ms without work.
// Dispatch then costs a few stores and a cache-line transfer (~0.8 us for a
// 2-chunk loop). docs/runtime.md, "The runtime's thread pool".
#pragma once

#include <cstdint>
#include <memory>

namespace cmf {

class ThreadPool {
public:
    // n_threads <= 0: physical cores of the machine.
    explicit ThreadPool(int32_t n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int32_t threads() const noexcept { return threads_; }

    // fn(user, begin, end) over chunks of [begin, end), each >= grain long
    // (the last may be shorter), on all the pool's threads; returns when
    // every chunk is done. A call from inside a chunk (nested) runs inline.
    // Callers on several threads at once take turns loop by loop. An
    // exception thrown by fn is rethrown here once every chunk has finished.
    void parallel_for(uint64_t begin, uint64_t end, uint64_t grain,
                      void (*fn)(void *, uint64_t, uint64_t), void *user);

    // Physical cores (distinct core ids over packages); falls back to the
    // logical CPU count when the topology is not readable.
    static int32_t physical_cores() noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int32_t threads_;
};

}  // namespace cmf
