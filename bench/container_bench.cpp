// container_bench: cmf_open latency and warm verify throughput on generated
// files (not a test; numbers go to docs/performance.md).
// usage: container_bench [DIR] [--big-gb N]   (default DIR = /tmp, N = 2)
#include <cmf/cmf.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
void die(cmf_error *e, const char *what) {
    if (!e) return;
    std::fprintf(stderr, "%s: %s\n", what, cmf_error_message(e));
    std::exit(1);
}
const char *kHeader =
    R"({"format":"cmf","version":2,"arch":{"arch_name":"bench","hidden_size":4096,"intermediate_size":11008,)"
    R"("num_layers":32,"num_attention_heads":32,"num_kv_heads":8,"head_dim":128,"vocab_size":32000,)"
    R"("layer_types":["FullAttention"],"rms_norm_eps":1e-6,"max_position_embeddings":4096},"quant_type":"F32"})";

// `total` bytes of f32 tensors of 4 MiB each (a 7B model has ~300 tensors of this order).
void generate(cmf_runtime *rt, const std::string &path, uint64_t total) {
    const uint64_t tensor_bytes = 4u << 20;
    std::vector<float> buf(tensor_bytes / 4);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(i % 1000) * 0.001f;
    cmf_writer *w = nullptr;
    die(cmf_writer_create(rt, path.c_str(), kHeader, std::strlen(kHeader), nullptr, &w), "writer");
    const uint64_t shape[2] = {1024, 1024};
    for (uint64_t i = 0; i * tensor_bytes < total; ++i) {
        std::string name = "model.layers." + std::to_string(i / 7) + ".t" + std::to_string(i % 7) + ".weight";
        die(cmf_writer_add_tensor(w, name.c_str(), CMF_DTYPE_F32, 2, shape, buf.data(), tensor_bytes), "add");
    }
    die(cmf_writer_finish(w), "finish");
    cmf_writer_free(w);
}

double open_ms(cmf_runtime *rt, const std::string &path, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        auto t0 = Clock::now();
        cmf_model *m = nullptr;
        die(cmf_open(rt, path.c_str(), nullptr, &m), "open");
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        cmf_close(m);
        best = std::min(best, ms);
    }
    return best;
}

double verify_gbs(cmf_runtime *rt, const std::string &path, uint64_t *bytes) {
    cmf_model *m = nullptr;
    die(cmf_open(rt, path.c_str(), nullptr, &m), "open");
    cmf_model_info info;
    cmf_model_info_init(&info);
    die(cmf_model_get_info(m, &info), "info");
    *bytes = info.data_len;
    cmf_verify_options o;
    cmf_verify_options_init(&o);
    o.flags = CMF_VERIFY_SKIP_SIGNATURE;
    double best = 1e30;
    for (int r = 0; r < 4; ++r) {  // first run warms the page cache
        cmf_verify_report *rep = nullptr;
        auto t0 = Clock::now();
        die(cmf_verify(m, &o, &rep), "verify");
        double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (cmf_verify_problem_count(rep)) {
            std::fprintf(stderr, "verify found problems: %s\n", cmf_verify_problem(rep, 0));
            std::exit(1);
        }
        cmf_verify_report_free(rep);
        if (r > 0) best = std::min(best, s);
    }
    cmf_close(m);
    return double(*bytes) / best / 1e9;
}
}  // namespace

int main(int argc, char **argv) {
    std::string dir = "/tmp";
    double big_gb = 2;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--big-gb") && i + 1 < argc) big_gb = std::atof(argv[++i]);
        else dir = argv[i];
    }
    cmf_runtime_options ro;
    cmf_runtime_options_init(&ro);
    ro.n_threads = 2;
    cmf_runtime *rt = nullptr;
    die(cmf_runtime_create(&ro, &rt), "runtime");
    const std::string small = dir + "/cmf-bench-10mb.cmf", big = dir + "/cmf-bench-big.cmf";
    generate(rt, small, 10u << 20);
    generate(rt, big, uint64_t(big_gb * 1e9));
    std::printf("cmf_open 10 MB file (%s): %.3f ms (best of 50)\n", small.c_str(), open_ms(rt, small, 50));
    std::printf("cmf_open %.1f GB file: %.3f ms (best of 10)\n", big_gb, open_ms(rt, big, 10));
    uint64_t bytes = 0;
    double gbs = verify_gbs(rt, big, &bytes);
    std::printf("cmf_verify warm, 2 threads: %.2f GB/s over %.2f GB of payload\n", gbs, double(bytes) / 1e9);
    std::remove(small.c_str());
    std::remove(big.c_str());
    cmf_runtime_free(rt);
    return 0;
}
