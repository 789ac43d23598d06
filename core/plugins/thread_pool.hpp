// The runtime's one thread pool: a oneTBB task_arena that every parallel
// loop of libcmf and of its plugins (through host->parallel_for) runs in, so
// a runtime never uses more threads than it was given.
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

    // fn(user, begin, end) over chunks of [begin, end), each >= grain long.
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
