// codecs_bench: per dtype, on a fixed seeded 2048x4096 Gaussian tensor:
//  - dequantize throughput (GB/s of payload read, and of f32 written),
//  - matvec (n_batch = 1) effective GB/s of weight bytes on 1 and 2 threads,
//  - batched matmul (n_batch = 8) GFLOP/s on 2 threads,
//  - relative RMS reconstruction error.
// Not a test: run by hand, numbers go to docs/performance.md.
// Usage: codecs_bench [rows cols]
#include "dtypes/all.hpp"
#include "kernels/kernels.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// The fastest of the runs within 0.4 s: on a shared machine the mean
// measures the other processes as much as the kernel, the minimum measures
// the kernel (runs are short, so some of them run undisturbed).
template <class F>
double seconds_per_run(F &&f) {
    f();  // warm up
    double best = 1e30;
    auto t0 = Clock::now();
    do {
        auto t = Clock::now();
        f();
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t).count());
    } while (std::chrono::duration<double>(Clock::now() - t0).count() < 0.4);
    return best;
}

void parallel_rows(int threads, uint64_t rows, const std::function<void(uint64_t, uint64_t)> &body) {
    if (threads == 1) return body(0, rows);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        uint64_t r0 = rows * t / threads, r1 = rows * (t + 1) / threads;
        pool.emplace_back([&, r0, r1] { body(r0, r1); });
    }
    for (auto &th : pool) th.join();
}

}  // namespace

int main(int argc, char **argv) {
    uint64_t rows = argc > 2 ? std::strtoull(argv[1], nullptr, 10) : 2048;
    uint64_t cols = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4096;
    std::vector<uint64_t> shape{rows, cols};
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 0.02f);
    std::vector<float> w(rows * cols), x(8 * cols);
    for (auto &v : w) v = g(rng);
    for (auto &v : x) v = g(rng);
    std::printf("codecs_bench %llux%llu, kernels: %s\n", (unsigned long long)rows, (unsigned long long)cols,
                cmf::codecs::kernels::active_isa());
    std::printf("%-9s %8s %8s %10s %10s %10s %10s %11s\n", "dtype", "bits/w", "relerr", "deq GB/s", "deq f32GB/s",
                "mv1 GB/s", "mv2 GB/s", "mm8x2 GF/s");
    auto all = cmf::codecs::make_all_dtypes();
    for (const auto &d : all) {
        if (!d->can_quantize() || (d->flags() & CMF_CODEC_RESERVED)) continue;
        std::vector<uint8_t> p;
        d->quantize(shape, w.data(), nullptr, p);
        cmf_tensor_view t{};
        t.struct_size = sizeof t;
        t.dtype = d->id();
        t.ndim = 2;
        t.shape[0] = rows;
        t.shape[1] = cols;
        t.data = p.data();
        t.nbytes = p.size();
        std::vector<float> out(rows * cols);
        d->dequantize_rows(t, 0, rows, out.data());
        double num = 0, den = 0;
        for (uint64_t i = 0; i < rows * cols; ++i) {
            num += (double(out[i]) - w[i]) * (double(out[i]) - w[i]);
            den += double(w[i]) * w[i];
        }
        double deq = seconds_per_run([&] { d->dequantize_rows(t, 0, rows, out.data()); });
        double mv1 = 0, mv2 = 0, mm = 0;
        std::vector<float> y(8 * rows);
        if (d->has_matmul()) {
            mv1 = seconds_per_run([&] { d->matmul_rows(t, x.data(), cols, 1, 0, rows, y.data(), rows); });
            mv2 = seconds_per_run([&] {
                parallel_rows(2, rows, [&](uint64_t a, uint64_t b) { d->matmul_rows(t, x.data(), cols, 1, a, b, y.data(), rows); });
            });
            mm = seconds_per_run([&] {
                parallel_rows(2, rows, [&](uint64_t a, uint64_t b) { d->matmul_rows(t, x.data(), cols, 8, a, b, y.data(), rows); });
            });
        }
        double gb = double(p.size()) / 1e9;
        std::printf("%-9s %8.3f %8.5f %10.2f %10.2f %10.2f %10.2f %11.2f\n", d->name(), 8.0 * p.size() / (rows * cols),
                    std::sqrt(num / den), gb / deq, 4e-9 * rows * cols / deq, mv1 ? gb / mv1 : 0.0, mv2 ? gb / mv2 : 0.0,
                    mm ? 2e-9 * 8 * rows * cols / mm : 0.0);
        std::fflush(stdout);
    }
}
