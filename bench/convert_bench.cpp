// Converter throughput and memory: writes a synthetic qwen3 (or gemma3) checkpoint
// (BF16 safetensors, random weights) once, then converts it — into a real
// .cmf through the W2 streaming writer with --output, else into a sink that
// only counts bytes. Reports wall time, source MB/s and peak RSS next to
// the largest tensor's f32 size (what the pipeline would hold if it
// converted that tensor whole).
//
//   convert_bench [--shape small|0.6b|gemma3-1b] [--hidden 1024] [--layers 8] [--threads N] [--quant f16]
//                 [--dir /tmp/...] [--output F.cmf] [--checkpoint-only 1]
//                 [--chunk-elements N] [--budget-mib M]
// --chunk-elements / --budget-mib: ConvertOptions.chunk_elements and
// memory_budget (0 = the converter's defaults; a huge chunk, e.g. 1e12,
// converts every tensor whole as before row chunking).
// --shape 0.6b: Qwen3-0.6B (hidden 1024, 28 layers, 16/8 heads of 128,
// FFN 3072, vocab 151936, tied head): a 1.19 GB BF16 checkpoint (--layers
// changes the depth, e.g. 56 for a 2.1 GB one with the same largest tensor).
// --shape gemma3-1b: Gemma3-1B (gemma3_text: hidden 1152, 26 layers, 4/1
// heads of 256, FFN 6912, vocab 262144, tied head, sandwich norms, q/k-norm,
// window 512 on 5 of every 6 layers): a 2.0 GB BF16 checkpoint.
#include "convert/container_sink.hpp"
#include "convert/convert.hpp"
#include "plugin_host/runtime.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>

namespace fs = std::filesystem;

namespace {

struct NullSink : cmf::convert::TensorSink {
    uint64_t bytes = 0, n = 0;
    void begin(const std::string &, uint64_t, uint64_t) override {}
    void add(const std::string &, int32_t, const std::vector<uint64_t> &, const uint8_t *, uint64_t nb) override {
        bytes += nb;
        ++n;
    }
    void finish(const std::string &) override {}
};

struct Shape {
    uint64_t H, L, V, I, heads, kv_heads, head_dim;
    bool tied;
    bool gemma3 = false;
};

void write_checkpoint(const fs::path &dir, const Shape &sh) {
    const uint64_t H = sh.H, L = sh.L, V = sh.V, I = sh.I, D = sh.head_dim;
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << "{\"model_type\":\"" << (sh.gemma3 ? "gemma3_text" : "qwen3") << "\",\"hidden_size\":" << H
                                       << ",\"intermediate_size\":" << I << ",\"num_hidden_layers\":" << L
                                       << ",\"num_attention_heads\":" << sh.heads << ",\"num_key_value_heads\":" << sh.kv_heads
                                       << ",\"head_dim\":" << D << ",\"vocab_size\":" << V
                                       << (sh.gemma3 ? ",\"max_position_embeddings\":32768" : ",\"max_position_embeddings\":4096")
                                       << ",\"rms_norm_eps\":1e-6,\"rope_theta\":1000000,"
                                       << (sh.gemma3 ? "\"query_pre_attn_scalar\":256,\"sliding_window\":512,\"sliding_window_pattern\":6,"
                                                       "\"rope_local_base_freq\":10000,\"hidden_activation\":\"gelu_pytorch_tanh\","
                                                     : "")
                                       << "\"tie_word_embeddings\":" << (sh.tied ? "true" : "false") << "}";
    std::vector<std::pair<std::string, std::vector<uint64_t>>> ts = {{"model.embed_tokens.weight", {V, H}}, {"model.norm.weight", {H}}};
    if (!sh.tied) ts.push_back({"lm_head.weight", {V, H}});
    for (uint64_t l = 0; l < L; ++l) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        ts.push_back({p + "input_layernorm.weight", {H}});
        ts.push_back({p + "post_attention_layernorm.weight", {H}});
        if (sh.gemma3) {
            ts.push_back({p + "pre_feedforward_layernorm.weight", {H}});
            ts.push_back({p + "post_feedforward_layernorm.weight", {H}});
        }
        ts.push_back({p + "self_attn.q_proj.weight", {sh.heads * D, H}});
        ts.push_back({p + "self_attn.k_proj.weight", {sh.kv_heads * D, H}});
        ts.push_back({p + "self_attn.v_proj.weight", {sh.kv_heads * D, H}});
        ts.push_back({p + "self_attn.o_proj.weight", {H, sh.heads * D}});
        ts.push_back({p + "self_attn.q_norm.weight", {D}});
        ts.push_back({p + "self_attn.k_norm.weight", {D}});
        ts.push_back({p + "mlp.gate_proj.weight", {I, H}});
        ts.push_back({p + "mlp.up_proj.weight", {I, H}});
        ts.push_back({p + "mlp.down_proj.weight", {H, I}});
    }
    std::string header = "{";
    uint64_t off = 0;
    for (size_t i = 0; i < ts.size(); ++i) {
        uint64_t n = 1;
        for (auto d : ts[i].second) n *= d;
        header += (i ? "," : "") + std::string("\"") + ts[i].first + "\":{\"dtype\":\"BF16\",\"shape\":[";
        for (size_t k = 0; k < ts[i].second.size(); ++k) header += (k ? "," : "") + std::to_string(ts[i].second[k]);
        header += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + 2 * n) + "]}";
        off += 2 * n;
    }
    header += "}";
    std::ofstream f(dir / "model.safetensors", std::ios::binary);
    uint64_t hl = header.size();
    f.write(reinterpret_cast<const char *>(&hl), 8);
    f << header;
    // BF16 values of magnitude 2^-7 .. 2^-6 with random mantissa and sign:
    // weight-like scale, no structure.
    std::mt19937 rng(1);
    std::vector<uint16_t> buf(1 << 20);
    for (uint64_t left = off / 2; left;) {
        uint64_t k = std::min<uint64_t>(left, buf.size());
        for (uint64_t i = 0; i < k; ++i) {
            uint32_t r = rng();
            buf[i] = static_cast<uint16_t>(0x3C00 + (r & 0x7F) + ((r >> 7) & 1) * 0x80) ^ static_cast<uint16_t>(((r >> 8) & 1) << 15);
        }
        f.write(reinterpret_cast<const char *>(buf.data()), static_cast<std::streamsize>(2 * k));
        left -= k;
    }
}

}  // namespace

int main(int argc, char **argv) {
    uint64_t H = 1024, L = 8, layers_flag = 0;
    int threads = 0;
    bool checkpoint_only = false;
    uint64_t chunk_elements = 0, budget_mib = 0;
    if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
        std::printf("convert_bench [--shape small|0.6b|gemma3-1b] [--hidden H] [--layers L] [--threads N] [--quant Q]\n"
                    "              [--dir DIR] [--output F.cmf] [--checkpoint-only 1] [--chunk-elements N] [--budget-mib M]\n"
                    "Converts a synthetic BF16 qwen3 or gemma3 checkpoint (written once to --dir); see bench/convert_bench.cpp.\n");
        return 0;
    }
    std::string quant = "f16", dir = (fs::temp_directory_path() / "cmf_convert_bench").string(), output, shape = "small";
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        if (k == "--hidden") H = std::stoull(argv[i + 1]);
        else if (k == "--layers") L = layers_flag = std::stoull(argv[i + 1]);
        else if (k == "--threads") threads = std::stoi(argv[i + 1]);
        else if (k == "--quant") quant = argv[i + 1];
        else if (k == "--dir") dir = argv[i + 1];
        else if (k == "--output") output = argv[i + 1];
        else if (k == "--shape") shape = argv[i + 1];
        else if (k == "--checkpoint-only") checkpoint_only = std::string(argv[i + 1]) == "1";
        else if (k == "--chunk-elements") chunk_elements = static_cast<uint64_t>(std::stod(argv[i + 1]));
        else if (k == "--budget-mib") budget_mib = std::stoull(argv[i + 1]);
        else {
            std::fprintf(stderr, "convert_bench: unknown option %s (see the comment at the top of bench/convert_bench.cpp)\n", k.c_str());
            return 2;
        }
    }
    Shape sh{H, L, 32000, 3 * H, H / 64, H / 256, 64, false};
    if (shape == "0.6b") sh = Shape{1024, layers_flag ? layers_flag : 28, 151936, 3072, 16, 8, 128, true};
    else if (shape == "gemma3-1b") sh = Shape{1152, layers_flag ? layers_flag : 26, 262144, 6912, 4, 1, 256, true, true};
    else if (shape != "small") {
        std::fprintf(stderr, "convert_bench: --shape small|0.6b|gemma3-1b\n");
        return 2;
    }
    const uint64_t V = sh.V;
    H = sh.H;
    if (!fs::exists(fs::path(dir) / "model.safetensors")) {
        auto t0 = std::chrono::steady_clock::now();
        write_checkpoint(dir, sh);
        std::printf("wrote %s in %.1f s\n", dir.c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (checkpoint_only) return 0;
    cmf_runtime_options o;
    cmf_runtime_options_init(&o);
    o.plugin_path = CMF_BENCH_PLUGIN_PATH;
    o.flags = CMF_RUNTIME_IGNORE_ENV | CMF_RUNTIME_NO_DEFAULT_PLUGINS;
    o.n_threads = threads;
    cmf::Runtime rt(o);
    rt.load_configured_plugins();
    cmf::convert::ConvertOptions co;
    co.model_dir = dir;
    co.quant = quant;
    co.chunk_elements = chunk_elements;
    co.memory_budget = budget_mib << 20;
    NullSink null_sink;
    cmf::convert::ContainerSink file_sink(rt, output, 0);
    cmf::convert::TensorSink &sink = output.empty() ? static_cast<cmf::convert::TensorSink &>(null_sink) : file_sink;
    cmf::convert::ConvertStats st;
    try {
        st = cmf::convert::convert_checkpoint(rt, co, sink);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "convert_bench: %s\n", e.what());
        return 1;
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("threads %d  quant %s  tensors %llu  source %.1f MiB (bf16)  output %.1f MiB  %.2f s  %.0f MiB/s source  "
                "peak RSS %.0f MiB  largest tensor f32 %.0f MiB\n",
                rt.pool().threads(), quant.c_str(), static_cast<unsigned long long>(st.tensors), st.source_bytes / 1048576.0,
                st.output_bytes / 1048576.0, st.seconds, st.source_bytes / 1048576.0 / st.seconds, ru.ru_maxrss / 1024.0,
                V * H * 4 / 1048576.0);
    return 0;
}
