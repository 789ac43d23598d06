#include "file_mappings.hpp"

#include <map>
#include <mutex>
#include <sys/mman.h>
#include <unistd.h>

namespace cmf::file_mappings {

namespace {
struct Registry {
    std::mutex mutex;
    std::map<uintptr_t, uintptr_t> ranges;  // first byte -> one past the last
};
Registry &registry() {
    static Registry r;
    return r;
}
}  // namespace

void add(const void *p, uint64_t n) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.ranges[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + n;
}

void remove(const void *p) noexcept {
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.ranges.erase(reinterpret_cast<uintptr_t>(p));
}

bool release_pages(const void *p, uint64_t n) noexcept {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (n == 0 || a + n < a) return false;
    Registry &r = registry();
    // Held through the madvise: the mapping cannot be removed (and then
    // unmapped) in between.
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.ranges.upper_bound(a);
    if (it == r.ranges.begin()) return false;
    --it;
    if (a < it->first || a + n > it->second) return false;
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t from = (a + page - 1) & ~(page - 1), to = (a + n) & ~(page - 1);
    if (to <= from) return false;
    return ::madvise(reinterpret_cast<void *>(from), to - from, MADV_DONTNEED) == 0;
}

}  // namespace cmf::file_mappings
