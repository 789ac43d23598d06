// The runtime's thread pool: every index of a loop runs exactly once, in
// chunks of at least the grain, on every thread of the pool; nested loops run
// inline; callers on several threads take turns; exceptions reach the caller;
// a pool can be destroyed while its servers spin.
#include <doctest/doctest.h>

#include "plugin_host/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using cmf::ThreadPool;

// Runs a loop over [begin, end) and records which thread ran each index and
// each chunk's length.
struct Coverage {
    std::vector<std::atomic<int>> hits;
    std::mutex mu;
    std::set<std::thread::id> threads;
    std::vector<uint64_t> chunk_lengths;
    uint64_t base;

    Coverage(uint64_t begin, uint64_t end) : hits(end - begin), base(begin) {}

    static void body(void *u, uint64_t b, uint64_t e) {
        auto *c = static_cast<Coverage *>(u);
        for (uint64_t i = b; i < e; ++i) c->hits[i - c->base].fetch_add(1);
        // Long enough that a second thread joins the loop.
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
        while (std::chrono::steady_clock::now() < until) {
        }
        std::lock_guard<std::mutex> lock(c->mu);
        c->threads.insert(std::this_thread::get_id());
        c->chunk_lengths.push_back(e - b);
    }
};

void check_exactly_once(ThreadPool &pool, uint64_t begin, uint64_t end, uint64_t grain) {
    Coverage c(begin, end);
    pool.parallel_for(begin, end, grain, Coverage::body, &c);
    for (uint64_t i = 0; i < end - begin; ++i) REQUIRE_MESSAGE(c.hits[i].load() == 1, "index " << begin + i);
    if (end > begin) {
        REQUIRE(!c.chunk_lengths.empty());
        // Every chunk but the last (in index order) is at least the grain.
        std::sort(c.chunk_lengths.begin(), c.chunk_lengths.end());
        uint64_t short_chunks = 0;
        for (uint64_t len : c.chunk_lengths) short_chunks += len < grain ? 1 : 0;
        CHECK(short_chunks <= 1);
    }
}

}  // namespace

TEST_CASE("thread_pool: every index exactly once, chunks at least the grain") {
    for (int32_t threads : {1, 2, 3, 5}) {
        ThreadPool pool(threads);
        CHECK(pool.threads() == threads);
        for (uint64_t n : {0u, 1u, 2u, 7u, 64u, 1000u, 4099u, 100000u})
            for (uint64_t grain : {0u, 1u, 3u, 64u, 5000u}) {
                CAPTURE(threads);
                CAPTURE(n);
                CAPTURE(grain);
                check_exactly_once(pool, 17, 17 + n, grain);
            }
    }
}

TEST_CASE("thread_pool: every thread of the pool takes part in a loop") {
    // Deterministic whatever the machine's load: every chunk waits until as
    // many distinct threads as the pool has have each entered a chunk. A
    // thread blocked in its first chunk cannot take another, so the loop
    // completes only if all the pool's threads run; a generous deadline turns
    // a pool that never gets them (e.g. oneTBB lending fewer workers than the
    // pool was sized for) into a loud failure instead of a hang. Pools larger
    // than the machine's CPU count are included on purpose.
    constexpr int kDeadlineSeconds = 120;
    for (int32_t threads : {2, 3, 4}) {
        CAPTURE(threads);
        ThreadPool pool(threads);
        struct Meet {
            std::mutex mu;
            std::set<std::thread::id> ids;
            int32_t want = 0;
            std::chrono::steady_clock::time_point deadline;
            std::atomic<bool> timed_out{false};
        } meet;
        meet.want = threads;
        meet.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kDeadlineSeconds);
        pool.parallel_for(0, 256, 1, [](void *u, uint64_t, uint64_t) {
            auto *m = static_cast<Meet *>(u);
            {
                std::lock_guard<std::mutex> lock(m->mu);
                m->ids.insert(std::this_thread::get_id());
            }
            for (;;) {
                {
                    std::lock_guard<std::mutex> lock(m->mu);
                    if (int32_t(m->ids.size()) >= m->want) return;
                }
                if (std::chrono::steady_clock::now() > m->deadline) {
                    m->timed_out = true;
                    return;
                }
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        }, &meet);
        CHECK_MESSAGE(!meet.timed_out.load(), "only " << meet.ids.size() << " of " << threads
                                                       << " threads entered the loop within " << kDeadlineSeconds << " s");
        CHECK(int32_t(meet.ids.size()) == threads);
    }
}

TEST_CASE("thread_pool: a loop inside a chunk runs inline on that thread") {
    ThreadPool pool(2);
    struct Outer {
        ThreadPool *pool;
        std::atomic<int> inner_total{0};
        std::atomic<int> foreign{0};  // inner chunks run on another thread than their outer chunk
    } o{&pool};
    pool.parallel_for(0, 64, 1, [](void *u, uint64_t b, uint64_t e) {
        auto *o = static_cast<Outer *>(u);
        for (uint64_t i = b; i < e; ++i) {
            struct Inner {
                std::thread::id owner;
                Outer *o;
            } in{std::this_thread::get_id(), o};
            o->pool->parallel_for(0, 100, 1, [](void *u2, uint64_t b2, uint64_t e2) {
                auto *in = static_cast<Inner *>(u2);
                in->o->inner_total.fetch_add(int(e2 - b2));
                if (std::this_thread::get_id() != in->owner) in->o->foreign.fetch_add(1);
            }, &in);
        }
    }, &o);
    CHECK(o.inner_total.load() == 64 * 100);
    CHECK(o.foreign.load() == 0);
}

TEST_CASE("thread_pool: callers on several threads take turns") {
    ThreadPool pool(2);
    std::vector<std::thread> callers;
    std::atomic<int> bad{0};
    for (int k = 0; k < 4; ++k)
        callers.emplace_back([&, k] {
            for (int rep = 0; rep < 200; ++rep) {
                const uint64_t n = 100 + uint64_t(k) * 37 + uint64_t(rep);
                std::vector<std::atomic<int>> hits(n);
                pool.parallel_for(0, n, 2, [](void *u, uint64_t b, uint64_t e) {
                    auto *h = static_cast<std::vector<std::atomic<int>> *>(u);
                    for (uint64_t i = b; i < e; ++i) (*h)[i].fetch_add(1);
                }, &hits);
                for (auto &h : hits) bad += h.load() != 1;
            }
        });
    for (auto &t : callers) t.join();
    CHECK(bad.load() == 0);
}

TEST_CASE("thread_pool: an exception from a chunk reaches the caller after the loop") {
    ThreadPool pool(2);
    std::atomic<int> ran{0};
    struct Ctx {
        std::atomic<int> *ran;
    } ctx{&ran};
    CHECK_THROWS_WITH_AS(pool.parallel_for(0, 64, 1, [](void *u, uint64_t b, uint64_t e) {
        auto *c = static_cast<Ctx *>(u);
        c->ran->fetch_add(int(e - b));
        if (b <= 40 && 40 < e) throw std::runtime_error("chunk 40 failed");
    }, &ctx), "chunk 40 failed", std::runtime_error);
    CHECK(ran.load() == 64);  // the other chunks still ran
    // The pool still works afterwards.
    check_exactly_once(pool, 0, 1000, 1);
}

TEST_CASE("thread_pool: destroyed right after a loop, while its servers spin") {
    for (int rep = 0; rep < 20; ++rep) {
        ThreadPool pool(3);
        check_exactly_once(pool, 0, 300, 1);
    }
}

TEST_CASE("thread_pool: short loops back to back, and loops after the servers went idle") {
    // A waiting server watches only its own block for the next loop, and
    // leaves after a millisecond without one: every loop, however soon it
    // follows the last or however long after, runs each index once.
    for (int32_t threads : {2, 3}) {
        CAPTURE(threads);
        ThreadPool pool(threads);
        std::vector<std::atomic<int>> hits(64);
        int bad = 0;
        for (int rep = 0; rep < 20000; ++rep) {
            const uint64_t n = 1 + uint64_t(rep) % 64;
            for (uint64_t i = 0; i < n; ++i) hits[i].store(0, std::memory_order_relaxed);
            pool.parallel_for(0, n, 1, [](void *u, uint64_t b, uint64_t e) {
                auto *h = static_cast<std::vector<std::atomic<int>> *>(u);
                for (uint64_t i = b; i < e; ++i) (*h)[i].fetch_add(1, std::memory_order_relaxed);
            }, &hits);
            for (uint64_t i = 0; i < n; ++i) bad += hits[i].load(std::memory_order_relaxed) != 1;
        }
        CHECK(bad == 0);
        for (int rep = 0; rep < 4; ++rep) {
            std::this_thread::sleep_for(std::chrono::milliseconds(3));  // the servers leave
            check_exactly_once(pool, 0, 1000, 8);
        }
    }
}
