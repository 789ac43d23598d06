#include "thread_pool.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

namespace cmf {

struct ThreadPool::Impl {
    explicit Impl(int n) : arena(n) {}
    tbb::task_arena arena;
};

ThreadPool::ThreadPool(int32_t n_threads) {
    threads_ = n_threads > 0 ? n_threads : physical_cores();
    impl_ = std::make_unique<Impl>(threads_);
}

ThreadPool::~ThreadPool() = default;

void ThreadPool::parallel_for(uint64_t begin, uint64_t end, uint64_t grain,
                              void (*fn)(void *, uint64_t, uint64_t), void *user) {
    if (end <= begin) return;
    if (grain == 0) grain = 1;
    if (threads_ == 1 || end - begin <= grain) {
        fn(user, begin, end);
        return;
    }
    impl_->arena.execute([&] {
        tbb::parallel_for(tbb::blocked_range<uint64_t>(begin, end, grain),
                          [&](const tbb::blocked_range<uint64_t> &r) { fn(user, r.begin(), r.end()); });
    });
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
