// The whole conversion on every tiny fixture into an in-memory sink: names,
// dtypes, shapes, order, header, chat bundle, and every payload decoded by
// its codec against the source values (exact for f32, within the dtype's
// rounding bound otherwise); plus bad inputs.
#include <doctest/doctest.h>

#include "common/byte_views.hpp"
#include "common/error.hpp"
#include "convert/container_sink.hpp"
#include "convert/convert.hpp"
#include "convert/safetensors.hpp"
#include "plugin_host/runtime.hpp"

#include <cmf/json_read.hpp>

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unistd.h>

using namespace cmf::convert;
namespace fs = std::filesystem;

namespace {

std::string models(const std::string &m) { return std::string(CMF_TEST_MODELS_DIR) + "/" + m; }

cmf::Runtime &runtime() {
    static cmf::Runtime *rt = [] {
        cmf_runtime_options o;
        cmf_runtime_options_init(&o);
        o.plugin_path = CMF_TEST_PLUGIN_PATH;
        o.flags = CMF_RUNTIME_IGNORE_ENV | CMF_RUNTIME_NO_DEFAULT_PLUGINS;
        o.n_threads = 2;
        auto *r = new cmf::Runtime(o);
        r->load_configured_plugins();
        return r;
    }();
    return *rt;
}

struct Stored {
    std::string name;
    int32_t dtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> bytes;
};

struct MemorySink : TensorSink {
    std::string header;
    uint64_t source_count = 0, planned = 0;
    std::vector<Stored> tensors;
    std::vector<std::string> marks;
    std::string vocab;
    bool finished = false, aborted = false;
    uint64_t piecewise = 0, pieces = 0;  // tensors that came in pieces, and their pieces
    void begin_tensor(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, uint64_t nbytes) override {
        ++piecewise;
        TensorSink::begin_tensor(name, dtype, shape, nbytes);
    }
    void append(const uint8_t *d, uint64_t n) override {
        ++pieces;
        TensorSink::append(d, n);
    }
    void begin(const std::string &h, uint64_t src, uint64_t n) override {
        header = h;
        source_count = src;
        planned = n;
    }
    void add(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, const uint8_t *d, uint64_t n) override {
        tensors.push_back({name, dtype, shape, std::vector<uint8_t>(d, d + n)});
    }
    void mark(const std::string &f) override { marks.push_back(f); }
    void finish(const std::string &v) override {
        vocab = v;
        finished = true;
    }
    void abort() noexcept override { aborted = true; }
    const Stored *find(const std::string &n) const {
        for (const auto &t : tensors)
            if (t.name == n) return &t;
        return nullptr;
    }
};

std::vector<float> decode(const Stored &t) {
    const cmf::CodecEntry *c = runtime().codec(t.dtype);
    REQUIRE(c);
    cmf_tensor_view v = cmf::tensor_view(t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    uint64_t rows = v.ndim >= 2 ? v.shape[0] : 1;
    std::vector<float> out(n);
    cmf::throw_if_error(c->vt.dequantize_rows(c->ctx, &v, 0, rows, out.data()), t.name);
    return out;
}

std::vector<float> source_values(const Checkpoint &ck, const std::string &name) {
    const SourceTensor *s = ck.find(name);
    REQUIRE_MESSAGE(s, "no source tensor " << name);
    std::vector<float> v(s->elements);
    read_f32(*s, 0, s->elements, v.data());
    return v;
}

std::string slurp(const std::string &p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The expected f32 values of an output tensor, computed here from the
// source independently of the converter's plan machinery.
std::vector<float> expected_values(const Checkpoint &ck, const std::string &model, const std::string &out_name, const std::string &src_name) {
    std::vector<float> src = source_values(ck, src_name);
    const SourceTensor *s = ck.find(src_name);
    auto ends = [](const std::string &a, const std::string &suf) { return a.size() >= suf.size() && a.compare(a.size() - suf.size(), suf.size(), suf) == 0; };
    if (ends(src_name, "in_proj_qkvz.weight") || ends(src_name, "in_proj_ba.weight")) {
        simdjson::dom::parser p;
        simdjson::padded_string txt(slurp(models(model) + "/expected_rows.json"));
        simdjson::dom::element rows_doc = p.parse(txt);
        std::string key = out_name.substr(out_name.rfind("in_proj_"));
        key = key.substr(0, key.find(".weight"));
        const uint64_t cols = s->shape[1];
        std::vector<float> out;
        for (auto r : rows_doc[key].get_array()) {
            uint64_t row = r.get_uint64();
            out.insert(out.end(), src.begin() + static_cast<long>(row * cols), src.begin() + static_cast<long>((row + 1) * cols));
        }
        return out;
    }
    if (ends(src_name, "mlp.experts.gate_up_proj") || ends(src_name, "mlp.experts.down_proj")) {
        // expert e, role from the output name; bank [E, a, b]
        size_t p0 = out_name.find("mlp.experts.") + 12;
        uint64_t e = std::stoull(out_name.substr(p0));
        const uint64_t A = s->shape[1], B = s->shape[2];
        const bool up = out_name.find("up_proj") != std::string::npos, down = out_name.find("down_proj") != std::string::npos;
        const uint64_t H = 64, I = 48;  // the qwen3_moe fixture
        std::vector<float> out;
        auto at = [&](uint64_t i, uint64_t j) { return src[e * A * B + i * B + j]; };
        if (down) {
            // want [H, I]
            for (uint64_t i = 0; i < H; ++i)
                for (uint64_t j = 0; j < I; ++j) out.push_back(A == H ? at(i, j) : at(j, i));
        } else {
            const uint64_t off = up ? I : 0;
            for (uint64_t i = 0; i < I; ++i)
                for (uint64_t j = 0; j < H; ++j) out.push_back(A == 2 * I ? at(off + i, j) : at(j, off + i));
        }
        return out;
    }
    return src;
}

// Exact dtypes: an element-wise bound (f32 exact, f16/bf16 half an ulp).
bool elementwise(int32_t dtype) {
    return dtype == CMF_DTYPE_F32 || dtype == CMF_DTYPE_F16 || dtype == CMF_DTYPE_BF16;
}
double bound(int32_t dtype, float x) {
    switch (dtype) {
    case CMF_DTYPE_F32: return 0.0;
    case CMF_DTYPE_F16: return std::fabs(x) * std::ldexp(1.0, -11) + std::ldexp(1.0, -24);
    default: return std::fabs(x) * std::ldexp(1.0, -8);  // bf16
    }
}
// Quantized dtypes: relative RMS error of the whole tensor, with bounds a
// few times what each dtype gives on Gaussian weights (q1-family sign codes
// keep ~0.6 of a Gaussian's variance unexplained: sqrt(1 - 2/pi)).
double rel_rms_bound(int32_t dtype) {
    switch (dtype) {
    case CMF_DTYPE_Q8_ROW:
    case CMF_DTYPE_Q8_2F: return 0.02;
    case CMF_DTYPE_Q4_BLOCK:
    case CMF_DTYPE_Q4_TILED:
    case CMF_DTYPE_Q4TP:
    case CMF_DTYPE_VBIT:
    case CMF_DTYPE_VBIT_RO: return 0.2;
    case CMF_DTYPE_Q2TP: return 0.5;
    default: return 0.75;  // q1, q1s, q1t
    }
}

struct Result {
    ConvertPlan plan;
    MemorySink sink;
    ConvertStats stats;
};

Result run(const std::string &model, const std::string &quant, const std::string &quant_map = {}, uint64_t chunk_elements = 0) {
    ConvertOptions o;
    o.chunk_elements = chunk_elements;
    o.model_dir = models(model);
    o.quant = quant;
    o.quant_map = quant_map;
    o.source_name = "tiny/" + model;
    o.memory_budget = 64 * 1024;  // several batches even for tiny models
    Result r;
    r.plan = plan_conversion(runtime(), o);
    r.stats = convert_checkpoint(runtime(), o, r.sink);
    return r;
}

void check_roundtrip(const std::string &model, const Result &r) {
    Checkpoint ck(models(model));
    REQUIRE(r.sink.tensors.size() == r.plan.tensors.size());
    for (size_t i = 0; i < r.plan.tensors.size(); ++i) {
        const auto &p = r.plan.tensors[i];
        const Stored &t = r.sink.tensors[i];
        INFO(model << ": " << t.name << " from " << p.source);
        REQUIRE(t.name == p.name);
        CHECK(t.dtype == p.dtype);
        CHECK(t.shape == p.shape);
        std::vector<float> got = decode(t);
        std::vector<float> want = expected_values(ck, model, t.name, p.source);
        REQUIRE(got.size() == want.size());
        if (elementwise(t.dtype)) {
            size_t bad = 0;
            for (size_t k = 0; k < got.size(); ++k)
                if (!(std::fabs(static_cast<double>(got[k]) - want[k]) <= bound(t.dtype, want[k]))) ++bad;
            CHECK(bad == 0);
        } else {
            double err = 0, ref = 0;
            for (size_t k = 0; k < got.size(); ++k) {
                double d = static_cast<double>(got[k]) - want[k];
                err += d * d;
                ref += static_cast<double>(want[k]) * want[k];
            }
            double rel = ref > 0 ? std::sqrt(err / ref) : std::sqrt(err);
            INFO("dtype " << t.dtype << " relative RMS error " << rel);
            CHECK(rel <= rel_rms_bound(t.dtype));
        }
    }
}

std::vector<std::string> names_of(const MemorySink &s) {
    std::vector<std::string> v;
    for (const auto &t : s.tensors) v.push_back(t.name);
    return v;
}

bool has(const MemorySink &s, const std::string &n) { return s.find(n) != nullptr; }

}  // namespace

TEST_CASE("convert: every fixture converts and decodes back exactly at f32") {
    for (const char *m : {"qwen2", "qwen3", "qwen3_tied", "qwen3_moe", "qwen2_moe", "qwen3_next", "qwen3_5", "gemma", "gemma2", "gemma3"}) {
        CAPTURE(m);
        Result r = run(m, "f32");
        CHECK(r.sink.finished);
        CHECK_FALSE(r.sink.aborted);
        CHECK(r.sink.planned == r.sink.tensors.size());
        CHECK(r.stats.tensors == r.sink.tensors.size());
        CHECK(r.sink.vocab == slurp(models(m) + "/tokenizer.json"));
        for (const auto &t : r.sink.tensors) CHECK(t.dtype == CMF_DTYPE_F32);
        check_roundtrip(m, r);
        // Canonical order: embed first; layers by numeric index.
        CHECK(r.sink.tensors.front().name == "model.embed_tokens.weight");
        const std::vector<std::string> names = names_of(r.sink);
        std::set<std::string> unique(names.begin(), names.end());
        CHECK(unique.size() == r.sink.tensors.size());
        for (const auto &t : r.sink.tensors) {
            CHECK(t.name.find("language_model") == std::string::npos);
            CHECK(t.name.find("visual") == std::string::npos);
            CHECK(t.name.find("vision") == std::string::npos);
        }
    }
}

TEST_CASE("convert: tensor sets per family") {
    SUBCASE("qwen2: biases, tied head absent, 26 tensors") {
        Result r = run("qwen2", "f32");
        CHECK(r.sink.tensors.size() == 26);
        CHECK(has(r.sink, "model.layers.1.self_attn.v_proj.bias"));
        CHECK_FALSE(has(r.sink, "lm_head.weight"));
        CHECK(r.sink.source_count == 26);
    }
    SUBCASE("qwen3 untied keeps lm_head, third") {
        Result r = run("qwen3", "f32");
        CHECK(r.sink.tensors.size() == 1 + 1 + 1 + 2 * 11);
        CHECK(r.sink.tensors[1].name == "model.norm.weight");
        CHECK(r.sink.tensors[2].name == "lm_head.weight");
    }
    SUBCASE("qwen3_moe: two shards, fused and transposed banks unpacked, experts role-contiguous") {
        Result r = run("qwen3_moe", "f32");
        CHECK(r.sink.marks.size() == 2);
        for (int layer : {0, 1, 3}) {
            std::vector<size_t> gate, up, down;
            const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
            for (size_t i = 0; i < r.sink.tensors.size(); ++i)
                for (int e = 0; e < 8; ++e) {
                    const auto &n = r.sink.tensors[i].name;
                    if (n == p + std::to_string(e) + ".gate_proj.weight") gate.push_back(i);
                    if (n == p + std::to_string(e) + ".up_proj.weight") up.push_back(i);
                    if (n == p + std::to_string(e) + ".down_proj.weight") down.push_back(i);
                }
            REQUIRE(gate.size() == 8);
            REQUIRE(up.size() == 8);
            REQUIRE(down.size() == 8);
            // consecutive runs: 8 gates, then 8 ups, then 8 downs, experts in order
            for (int e = 0; e < 8; ++e) {
                CHECK(gate[e] == gate[0] + e);
                CHECK(up[e] == gate[0] + 8 + e);
                CHECK(down[e] == gate[0] + 16 + e);
            }
        }
        CHECK_FALSE(has(r.sink, "model.layers.3.mlp.experts.gate_up_proj"));
        CHECK(has(r.sink, "model.layers.2.mlp.gate_proj.weight"));
        CHECK_FALSE(has(r.sink, "model.layers.2.mlp.gate.weight"));
    }
    SUBCASE("qwen2_moe: shared expert and its gate on odd layers") {
        Result r = run("qwen2_moe", "f32");
        CHECK(has(r.sink, "model.layers.1.mlp.shared_expert_gate.weight"));
        CHECK(has(r.sink, "model.layers.3.mlp.shared_expert.down_proj.weight"));
        CHECK(has(r.sink, "model.layers.0.mlp.down_proj.weight"));
        CHECK_FALSE(has(r.sink, "model.layers.0.mlp.gate.weight"));
    }
    SUBCASE("qwen3_next: fused projections replaced by the split layout") {
        Result r = run("qwen3_next", "f32");
        for (const char *n : {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"})
            CHECK(has(r.sink, std::string("model.layers.2.linear_attn.") + n + ".weight"));
        CHECK_FALSE(has(r.sink, "model.layers.0.linear_attn.in_proj_qkvz.weight"));
        CHECK(r.sink.find("model.layers.0.linear_attn.in_proj_qkv.weight")->shape == std::vector<uint64_t>{112, 64});
    }
    SUBCASE("qwen3_5: wrapper renamed, MTP kept under model.mtp, vision dropped, MTP last") {
        Result r = run("qwen3_5", "f32");
        for (const char *n : {"model.mtp.eh_proj.weight", "model.mtp.enorm.weight", "model.mtp.hnorm.weight", "model.mtp.norm.weight",
                              "model.mtp.layers.0.self_attn.q_proj.weight", "model.layers.0.linear_attn.conv1d.weight"})
            CHECK_MESSAGE(has(r.sink, n), n);
        CHECK(r.sink.tensors.back().name.rfind("model.mtp.", 0) == 0);
    }
    SUBCASE("gemma3 wrapper: language_model.* renamed, tied head, sandwich norms") {
        Result r = run("gemma3", "f32");
        CHECK(has(r.sink, "model.layers.5.post_feedforward_layernorm.weight"));
        CHECK(has(r.sink, "model.layers.0.self_attn.q_norm.weight"));
        CHECK_FALSE(has(r.sink, "lm_head.weight"));
    }
}

TEST_CASE("convert: header, provenance and chat bundle") {
    SUBCASE("qwen2: generation_config eos list wins, bos/pad from config") {
        Result r = run("qwen2", "f16");
        simdjson::dom::parser p;
        simdjson::dom::element h = p.parse(r.sink.header);
        CHECK(std::string_view(h["format"]) == "cmf");
        CHECK(uint64_t(h["version"]) == 2);
        CHECK(std::string_view(h["quant_type"]) == "F16");
        CHECK(std::string_view(h["arch"]["arch_name"]) == "qwen2");
        CHECK(std::string_view(h["provenance"]["source_model"]) == "tiny/qwen2");
        CHECK(std::string_view(h["provenance"]["tool"]) == "cmfhost convert");
        auto tc = h["tokenizer_config"];
        CHECK(std::string_view(tc["chat_template"]).find("<|im_start|>") != std::string_view::npos);
        std::vector<uint64_t> eos;
        for (auto e : tc["eos_token_ids"].get_array()) eos.push_back(uint64_t(e));
        CHECK(eos == std::vector<uint64_t>{126, 127});
        CHECK(uint64_t(tc["bos_token_id"]) == 126);
        CHECK(tc["pad_token_id"].is_null());
        CHECK(r.sink.header.find("section_hashes") == std::string::npos);
        CHECK(r.sink.header.rfind(R"({"format":"cmf","version":2,"arch":{"arch_name":"qwen2",)", 0) == 0);
    }
    SUBCASE("qwen3_tied: chat_template.jinja wins, eos from config") {
        Result r = run("qwen3_tied", "f16");
        CHECK(r.sink.header.find(R"("tokenizer_config":{"chat_template":"{{ messages[0].content }}","eos_token_ids":[126],"bos_token_id":null,"pad_token_id":null}})") !=
              std::string::npos);
    }
    SUBCASE("gemma3: ids from the wrapper's top level") {
        Result r = run("gemma3", "bf16");
        CHECK(r.sink.header.find(R"("eos_token_ids":[1,106],"bos_token_id":2,"pad_token_id":0)") != std::string::npos);
        CHECK(r.sink.header.find(R"("quant_type":"BF16")") != std::string::npos);
    }
}

TEST_CASE("convert: dtype policy and decoding bounds for f16/bf16") {
    SUBCASE("f16: everything f16, decodes within half-precision rounding") {
        Result r = run("qwen3_next", "f16");
        for (const auto &t : r.sink.tensors) CHECK(t.dtype == CMF_DTYPE_F16);
        check_roundtrip("qwen3_next", r);
    }
    SUBCASE("bf16: 2-D bf16 except routers/gates; 1-D and 3-D f16") {
        Result r = run("qwen2_moe", "bf16");
        CHECK(r.sink.find("model.layers.0.self_attn.q_proj.weight")->dtype == CMF_DTYPE_BF16);
        CHECK(r.sink.find("model.layers.0.self_attn.q_proj.bias")->dtype == CMF_DTYPE_F16);
        CHECK(r.sink.find("model.layers.1.mlp.gate.weight")->dtype == CMF_DTYPE_F16);
        CHECK(r.sink.find("model.layers.1.mlp.shared_expert_gate.weight")->dtype == CMF_DTYPE_F16);
        CHECK(r.sink.find("model.norm.weight")->dtype == CMF_DTYPE_F16);
        check_roundtrip("qwen2_moe", r);
        Result g = run("qwen3_5", "bf16");
        CHECK(g.sink.find("model.layers.0.linear_attn.conv1d.weight")->dtype == CMF_DTYPE_F16);
        CHECK(g.sink.find("model.layers.0.linear_attn.in_proj_a.weight")->dtype == CMF_DTYPE_F16);
        CHECK(g.sink.find("model.layers.0.linear_attn.in_proj_qkv.weight")->dtype == CMF_DTYPE_BF16);
        check_roundtrip("qwen3_5", g);
    }
    SUBCASE("--quant-map overrides by pattern") {
        Result r = run("gemma2", "f16", "mlp.*=bf16,*.o_proj.weight=f32");
        CHECK(r.sink.find("model.layers.0.mlp.up_proj.weight")->dtype == CMF_DTYPE_BF16);
        CHECK(r.sink.find("model.layers.0.self_attn.o_proj.weight")->dtype == CMF_DTYPE_F32);
        CHECK(r.sink.find("model.layers.0.self_attn.q_proj.weight")->dtype == CMF_DTYPE_F16);
        check_roundtrip("gemma2", r);
    }
    SUBCASE("quantized dtypes: converted if a codec can encode them, else a clear error before any output") {
        for (const char *q : {"q8", "q4tp"}) {
            CAPTURE(q);
            const int32_t id = quant_dtype_from_name(q);
            const cmf::CodecEntry *c = runtime().codec(id);
            if (c && c->vt.quantize) {
                Result r = run("qwen3", q);
                CHECK(r.sink.find("model.layers.0.mlp.up_proj.weight")->dtype == id);
                CHECK(r.sink.find("model.norm.weight")->dtype == CMF_DTYPE_F16);
                check_roundtrip("qwen3", r);
            } else {
                ConvertOptions o;
                o.model_dir = models("qwen3");
                o.quant = q;
                MemorySink s;
                CHECK_THROWS_WITH_AS(convert_checkpoint(runtime(), o, s), doctest::Contains("no loaded codec plugin can encode it"), cmf::Error);
                CHECK(s.aborted);
                CHECK(s.tensors.empty());
            }
        }
    }
    SUBCASE("policy details (the original converter's)") {
        using V = std::vector<uint64_t>;
        QuantPolicy p("q4tp");
        CHECK(p.choose("model.layers.0.mlp.up_proj.weight", {64, 64}).dtype == CMF_DTYPE_Q4TP);
        CHECK(p.choose("model.layers.0.mlp.up_proj.weight", {64, 48}).dtype == CMF_DTYPE_Q8_2F);  // cols % 32
        CHECK(p.choose("x.weight", {1, 16}).dtype == CMF_DTYPE_F16);                            // < 32 elements
        CHECK(p.choose("conv.taps", {4, 32, 3}).dtype == CMF_DTYPE_F16);                        // 3-D
        CHECK(p.choose("model.norm.weight", {4096}).dtype == CMF_DTYPE_F16);                    // 1-D
        CHECK(p.choose("model.layers.0.mlp.gate.weight", {8, 64}).dtype == CMF_DTYPE_F16);      // router
        CHECK(p.choose("model.layers.0.linear_attn.in_proj_a.weight", {32, 4096}).dtype == CMF_DTYPE_F16);
        CHECK(p.choose("model.layers.0.mlp.gate_proj.weight", {8, 64}).dtype == CMF_DTYPE_Q4TP);
        CHECK(p.choose("model.layers.0.mlp.tid2eid", {8, 64}).dtype == CMF_DTYPE_F32);
        CHECK(QuantPolicy("q4").choose("a.weight", {64, 48}).dtype == CMF_DTYPE_Q4_BLOCK);
        CHECK(QuantPolicy("q8").choose("a.weight", {64, 100}).dtype == CMF_DTYPE_Q8_ROW);
        CHECK(QuantPolicy("vbit").choose("a.weight", {64, 64}).dtype == CMF_DTYPE_VBIT_RO);
        CHECK(QuantPolicy("vbit").choose("a.weight", {64, 100}).dtype == CMF_DTYPE_Q8_2F);
        // q2tp: every expert's gate/up (the shared expert's too) when the model has experts, else the dense
        // FFN's gate/up (not a draft layer's); q4tp elsewhere.
        QuantPolicy q2("q2tp");
        CHECK(q2.choose("model.layers.0.mlp.gate_proj.weight", V{64, 128}).dtype == CMF_DTYPE_Q2TP);
        CHECK(q2.choose("model.layers.0.mlp.up_proj.weight", V{64, 128}).dtype == CMF_DTYPE_Q2TP);
        CHECK(q2.choose("model.layers.0.mlp.down_proj.weight", V{64, 128}).dtype == CMF_DTYPE_Q4TP);
        CHECK(q2.choose("model.layers.0.self_attn.q_proj.weight", V{64, 128}).dtype == CMF_DTYPE_Q4TP);
        CHECK(q2.choose("model.layers.0.mlp.experts.3.gate_proj.weight", V{64, 128}, true).dtype == CMF_DTYPE_Q2TP);
        CHECK(q2.choose("model.layers.0.mlp.shared_expert.gate_proj.weight", V{64, 128}, true).dtype == CMF_DTYPE_Q2TP);
        CHECK(q2.choose("model.layers.0.mlp.shared_expert.down_proj.weight", V{64, 128}, true).dtype == CMF_DTYPE_Q4TP);
        CHECK(q2.choose("model.mtp.0.ffn.shared_experts.w3.weight", V{64, 128}, true).dtype == CMF_DTYPE_Q2TP);
        CHECK(q2.choose("model.mtp.0.ffn.experts.4.w1.weight", V{64, 128}, true).dtype == CMF_DTYPE_Q2TP);
        CHECK(q2.choose("model.mtp.0.ffn.experts.4.w2.weight", V{64, 128}, true).dtype == CMF_DTYPE_Q4TP);
        CHECK(q2.choose("model.layers.0.mlp.gate_proj.weight", V{64, 128}, true).dtype == CMF_DTYPE_Q4TP);
        CHECK(q2.choose("model.mtp.layers.0.mlp.gate_proj.weight", V{64, 128}).dtype == CMF_DTYPE_Q4TP);
        CHECK(q2.choose("model.layers.0.mlp.gate_proj.bias_like_weight", V{64, 128}).dtype == CMF_DTYPE_Q4TP);
        CHECK(q2.choose("model.layers.0.mlp.up_proj.weight", V{64, 100}).dtype == CMF_DTYPE_Q8_2F);
        CHECK(is_routed_expert("model.layers.1.mlp.experts.0.down_proj.weight"));
        CHECK_FALSE(is_routed_expert("model.layers.1.mlp.shared_expert.down_proj.weight"));
        // q1p: q1 with error diffusion, through the encoder options
        const DtypeChoice q1p = QuantPolicy("q1p").choose("model.layers.0.mlp.up_proj.weight", V{64, 128});
        CHECK(q1p.dtype == CMF_DTYPE_Q1);
        CHECK(q1p.options == "error_diffusion=1");
        CHECK(QuantPolicy("q4", "mlp.*=q1p").choose("model.layers.0.mlp.up_proj.weight", V{64, 128}).options == "error_diffusion=1");
        CHECK(std::string(header_quant_type(quant_dtype_from_name("q4tp"))) == "Q4_BLOCK");
        CHECK(std::string(header_quant_type(quant_dtype_from_name("q1t"))) == "VBIT");
        CHECK(std::string(header_quant_type(quant_dtype_from_name("q1p"))) == "VBIT");
        CHECK_THROWS_WITH_AS(QuantPolicy("q5"), doctest::Contains("unknown quantization \"q5\""), cmf::Error);
        CHECK_THROWS_WITH_AS(QuantPolicy("f16", "mlp.*"), doctest::Contains("pattern=quant"), cmf::Error);
    }
    SUBCASE("q2tp on a MoE checkpoint: expert gate/up only; q1p encodes with error diffusion") {
        Result r = run("qwen3_moe", "q2tp");
        int q2 = 0;
        for (const auto &t : r.sink.tensors) {
            CAPTURE(t.name);
            const bool expert_gate_up = t.name.find(".mlp.experts.") != std::string::npos &&
                                        (t.name.find("gate_proj") != std::string::npos || t.name.find("up_proj") != std::string::npos);
            if (t.dtype == CMF_DTYPE_Q2TP) ++q2;
            if (t.dtype == CMF_DTYPE_Q2TP) CHECK(expert_gate_up);
        }
        CHECK(q2 > 0);
        Result plain = run("qwen3", "q1"), diffused = run("qwen3", "q1p");
        const Stored *a = plain.sink.find("model.layers.0.mlp.up_proj.weight"), *b = diffused.sink.find("model.layers.0.mlp.up_proj.weight");
        REQUIRE(a);
        REQUIRE(b);
        CHECK(a->dtype == CMF_DTYPE_Q1);
        CHECK(b->dtype == CMF_DTYPE_Q1);
        CHECK(a->bytes.size() == b->bytes.size());
        CHECK(a->bytes != b->bytes);  // the options reached the encoder
    }
}

TEST_CASE("convert: bad inputs name the file or tensor, and the sink is aborted") {
    const fs::path tmp = fs::temp_directory_path() / ("cmf_convert_test_" + std::to_string(::getpid()));
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    auto copy_model = [&](const std::string &m) {
        fs::path d = tmp / m;
        fs::remove_all(d);
        fs::copy(models(m), d);
        return d;
    };
    auto expect = [&](const fs::path &dir, int32_t code, std::vector<std::string> parts) {
        ConvertOptions o;
        o.model_dir = dir.string();
        o.quant = "f16";
        MemorySink s;
        try {
            convert_checkpoint(runtime(), o, s);
            FAIL("converted a bad checkpoint");
        } catch (const cmf::Error &e) {
            INFO(e.message());
            CHECK(e.code() == code);
            for (const auto &p : parts) CHECK(e.message().find(p) != std::string::npos);
            CHECK(e.message().find(": :") == std::string::npos);
        }
        CHECK(s.aborted);
        CHECK_FALSE(s.finished);
    };
    SUBCASE("missing directory / config") {
        expect(tmp / "absent", CMF_ERR_FILE_NOT_FOUND, {"config.json", "not found"});
    }
    SUBCASE("unknown model_type") {
        fs::path d = copy_model("qwen2");
        std::ofstream(d / "config.json") << R"({"model_type":"llama4","hidden_size":64})";
        expect(d, CMF_ERR_UNSUPPORTED, {"config.json", "\"llama4\"", "no"});
    }
    SUBCASE("tensor contradicting the config") {
        fs::path d = copy_model("qwen3");
        std::string c = slurp((d / "config.json").string());
        c.replace(c.find("\"intermediate_size\": 128"), 24, "\"intermediate_size\": 128, \"num_key_value_heads\": 4");
        c.replace(c.find("\"num_key_value_heads\": 2"), 24, "\"vocab_size_unused\": 2");
        std::ofstream(d / "config.json") << c;
        expect(d, CMF_ERR_BOUNDS, {"model.safetensors", "self_attn.k_proj.weight", "[128, 64]"});
    }
    SUBCASE("truncated safetensors") {
        fs::path d = copy_model("gemma");
        fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 100);
        expect(d, CMF_ERR_BOUNDS, {"model.safetensors", "truncated"});
    }
    SUBCASE("unsupported source dtype") {
        fs::path d = copy_model("qwen2");
        std::ofstream f(d / "model.safetensors", std::ios::binary);
        const std::string h = R"({"model.norm.weight":{"dtype":"F64","shape":[64],"data_offsets":[0,512]}})";
        std::string len(8, '\0');
        len[0] = static_cast<char>(h.size());
        f << len << h << std::string(512, '\0');
        f.close();
        expect(d, CMF_ERR_UNKNOWN_DTYPE, {"model.safetensors", "model.norm.weight", "F64"});
    }
    fs::remove_all(tmp);
}

// The real configuration files of tests/fixtures/hf_configs (SOURCES.md
// there says where each comes from), read by the converter as a user's
// checkpoint directory would be: config.json through the arch plugin's
// import, tokenizer_config.json and generation_config.json into the chat
// bundle. The directories hold no weights, so a conversion that accepted
// all three stops at the checkpoint ("neither model.safetensors ...");
// a model_type no plugin converts is refused naming it.
std::string model_type_of(const std::string &config_json) {
    simdjson::dom::parser p;
    return cmf::json::parse_object(p, config_json, "config.json").str("model_type").value_or("");
}

TEST_CASE("convert: real config.json / tokenizer_config.json / generation_config.json files") {
    size_t accepted = 0, refused = 0;
    for (const auto &family : fs::directory_iterator(CMF_TEST_HF_CONFIGS)) {
        if (!family.is_directory()) continue;
        for (const auto &model : fs::directory_iterator(family.path())) {
            const std::string dir = model.path().string();
            CAPTURE(dir);
            const std::string mt = model_type_of(slurp(dir + "/config.json"));
            const bool supported = runtime().arch_for_hf_model_type(mt) != nullptr;
            ConvertOptions o;
            o.model_dir = dir;
            // A file as broken in its repository as here (Python refuses it too).
            const bool broken = model.path().filename() == "Qwen1.5-moe-8x0.5B-Chat";
            try {
                plan_conversion(runtime(), o);
                FAIL("planned a conversion without weights");
            } catch (const cmf::Error &e) {
                INFO(e.message());
                if (broken) {
                    CHECK(e.code() == CMF_ERR_PARSE);
                    CHECK(e.message().find("Qwen1.5-moe-8x0.5B-Chat/generation_config.json: not valid JSON") != std::string::npos);
                } else if (supported) {
                    CHECK(e.code() == CMF_ERR_FILE_NOT_FOUND);
                    CHECK(e.message().find("neither model.safetensors nor model.safetensors.index.json") != std::string::npos);
                    ++accepted;
                } else {
                    CHECK(e.code() == CMF_ERR_UNSUPPORTED);
                    CHECK(e.message().find("model_type \"" + mt + "\" is not converted by any loaded arch plugin") != std::string::npos);
                    ++refused;
                }
            }
        }
    }
    MESSAGE(accepted << " real configurations accepted, " << refused << " refused as unsupported architectures");
    CHECK(accepted >= 5);
    CHECK(refused >= 3);
    // What a few of them become (the arch plugin's import, as convert calls it).
    auto arch_of = [&](const std::string &rel) {
        const std::string text = slurp(std::string(CMF_TEST_HF_CONFIGS) + "/" + rel + "/config.json");
        const cmf::ArchEntry *a = runtime().arch_for_hf_model_type(model_type_of(text));
        REQUIRE(a);
        std::vector<uint8_t> out;
        cmf_byte_sink sink = cmf::vector_sink(out);
        cmf::throw_if_error(a->vt.import_config(a->ctx, text.data(), text.size(), &sink));
        return std::string(out.begin(), out.end());
    };
    const std::string q3 = arch_of("qwen3/Qwen3-4B-Instruct-2507");
    for (const char *k : {R"("head_dim":128)", R"("rope_theta":5000000.0)", R"("max_position_embeddings":262144)", R"("tie_word_embeddings":true)"})
        CHECK_MESSAGE(q3.find(k) != std::string::npos, k);
    const std::string g2 = arch_of("gemma2/gemma-2-2b-it-poem");
    for (const char *k : {R"("attn_logit_softcapping":50.0)", R"("final_logit_softcapping":30.0)", R"("sliding_window":4096)",
                          R"("query_pre_attn_scalar":256.0)", R"("hidden_act":"gelu_tanh")"})
        CHECK_MESSAGE(g2.find(k) != std::string::npos, k);
}

TEST_CASE("convert: canonical order") {
    CHECK(canonical_less("model.embed_tokens.weight", "model.norm.weight"));
    CHECK(canonical_less("model.norm.weight", "lm_head.weight"));
    CHECK(canonical_less("lm_head.weight", "model.layers.0.input_layernorm.weight"));
    CHECK(canonical_less("model.layers.2.mlp.up_proj.weight", "model.layers.10.input_layernorm.weight"));
    CHECK(canonical_less("model.layers.0.mlp.experts.9.gate_proj.weight", "model.layers.0.mlp.experts.0.up_proj.weight"));
    CHECK(canonical_less("model.layers.0.mlp.experts.2.gate_proj.weight", "model.layers.0.mlp.experts.10.gate_proj.weight"));
    CHECK(canonical_less("model.layers.0.mlp.experts.7.up_proj.weight", "model.layers.0.mlp.experts.0.down_proj.weight"));
    CHECK(canonical_less("model.layers.31.self_attn.v_proj.weight", "model.mtp.eh_proj.weight"));
    CHECK_FALSE(canonical_less("model.layers.1.x", "model.layers.1.x"));
}

TEST_CASE("convert: row-chunked encoding gives the payloads of whole-tensor encoding") {
    // chunk_elements 300: every 2-D tensor of the fixtures goes in chunks of
    // a few rows (ragged last chunk) where its dtype encodes by rows.
    for (const char *quant : {"f16", "q8", "q4", "q4t", "q4tp", "q2tp", "q8_2f"}) {
        CAPTURE(quant);
        Result whole = run("qwen3", quant, {}, uint64_t(1) << 40);
        Result chunked = run("qwen3", quant, {}, 300);
        CHECK(whole.sink.piecewise == 0);
        REQUIRE(whole.sink.tensors.size() == chunked.sink.tensors.size());
        for (size_t i = 0; i < whole.sink.tensors.size(); ++i) {
            CAPTURE(whole.sink.tensors[i].name);
            CHECK(whole.sink.tensors[i].name == chunked.sink.tensors[i].name);
            CHECK(whole.sink.tensors[i].dtype == chunked.sink.tensors[i].dtype);
            CHECK(whole.sink.tensors[i].bytes == chunked.sink.tensors[i].bytes);
        }
        CHECK(whole.stats.output_bytes == chunked.stats.output_bytes);
        // q8_2f's column field needs every row: it never goes in pieces.
        if (std::string(quant) == "q8_2f") {
            CHECK(chunked.sink.piecewise == 0);
        } else {
            CHECK(chunked.sink.piecewise > 4);
            CHECK(chunked.sink.pieces > 2 * chunked.sink.piecewise);
        }
    }
}

TEST_CASE("convert: the container sink streams chunked tensors into the same file") {
    const fs::path dir = fs::temp_directory_path() / ("cmf-chunk-test-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::string files[2];
    const uint64_t chunks[2] = {uint64_t(1) << 40, 300};
    for (int k = 0; k < 2; ++k) {
        ConvertOptions o;
        o.model_dir = models("qwen3");
        o.quant = "q4tp";
        o.chunk_elements = chunks[k];
        const std::string path = (dir / ("out" + std::to_string(k) + ".cmf")).string();
        ContainerSink sink(runtime(), path, 0);
        convert_checkpoint(runtime(), o, sink);
        files[k] = slurp(path);
    }
    REQUIRE(files[0].size() > 4096);
    CHECK(files[0] == files[1]);  // byte for byte: hashes, offsets and payloads
    fs::remove_all(dir);
}
