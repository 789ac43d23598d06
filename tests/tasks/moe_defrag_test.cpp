// MoE expert defrag and expert masks on a real file (the tiny qwen3_moe
// checkpoint of tests/models/gen_tiny_models.py, converted here: 4 layers,
// 8 experts, top 2, norm_topk_prob, layer 2 dense):
//  - routing stats recorded by a session (what run --route-stats writes);
//  - the expert mask run with --task and the defragged file give the same
//    200 greedy tokens and logits equal to rounding, in f32 and q8, and
//    both differ from the whole model;
//  - the kept sets follow the rule (by count descending, ties to the lower
//    index, the crossing expert included), computed here independently;
//  - the defragged file: kept experts renumbered with their payloads
//    byte for byte, router rows gathered, arch.moe unchanged,
//    provenance.moe_defrag; cut tighter again from its own provenance;
//  - every bad input is refused with a reason and leaves no output.
#include <doctest/doctest.h>
#include "support/test_runtime.hpp"
#include "task_files.hpp"

#include <cmf/cmf.h>

#include <fstream>
#include <numeric>
#include <sstream>

using namespace tasks_test;

namespace {

std::string tiny_moe(cmf_runtime *rt, const std::string &quant) {
    fs::create_directories(kWork);
    const std::string out = kWork + "/qwen3-moe-" + quant + ".cmf";
    if (fs::exists(out)) return out;
    cmf_convert_options o;
    cmf_convert_options_init(&o);
    const std::string dir = std::string(CMF_TEST_MODELS_DIR) + "/qwen3_moe";
    o.model_dir = dir.c_str();
    o.output = out.c_str();
    o.quant = quant.c_str();
    OK(cmf_convert(rt, &o));
    return out;
}

std::vector<int32_t> moe_prompt() {
    std::mt19937 rng(3);
    std::vector<int32_t> t(20);
    for (auto &x : t) x = int32_t(rng() % 120);
    return t;
}

std::vector<int32_t> greedy(cmf_runtime *rt, const cmf_model *m, const char *task, size_t n, std::string *stats = nullptr) {
    return greedy_after(rt, m, task, moe_prompt(), n, stats);
}

std::string write_text(const std::string &path, const std::string &text) {
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

std::string run_tool(cmf_runtime *rt, bool mask, const std::string &in, const std::string &out, const char *stats,
                     double cover, const char *name, std::string *error = nullptr) {
    cmf_moe_defrag_options o;
    cmf_moe_defrag_options_init(&o);
    o.input = in.c_str();
    o.output = out.c_str();
    o.stats = stats;
    o.cover = cover;
    o.name = name;
    char *report = nullptr;
    cmf_error *e = mask ? cmf_moe_mask(rt, &o, &report) : cmf_moe_defrag(rt, &o, &report);
    const std::string err = take(e);
    if (error != nullptr) *error = err;
    else REQUIRE_MESSAGE(err.empty(), err);
    if (!err.empty()) return "";
    std::string r = report;
    cmf_string_free(report);
    return r;
}

// The kept experts of one layer, written from the rule's words.
std::vector<uint32_t> covering(const std::vector<uint64_t> &c, double cover) {
    std::vector<uint32_t> idx(c.size());
    std::iota(idx.begin(), idx.end(), 0u);
    std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return c[a] != c[b] ? c[a] > c[b] : a < b; });
    const uint64_t total = std::accumulate(c.begin(), c.end(), uint64_t(0));
    std::vector<uint32_t> kept;
    uint64_t sum = 0;
    for (uint32_t e : idx) {
        if (double(sum) >= cover * double(total)) break;
        kept.push_back(e);
        sum += c[e];
    }
    std::sort(kept.begin(), kept.end());
    return kept;
}

bool has_tensor(const cmf_model *m, const std::string &name) {
    size_t i = 0;
    cmf_error *e = cmf_tensor_index(m, name.c_str(), &i);
    cmf_error_free(e);
    return e == nullptr;
}

}  // namespace

TEST_CASE("moe defrag: the expert mask and the defragged file run alike") {
    TestRuntime trt(CMF_LOG_ERROR);
    for (const char *quant : {"f32", "q8"}) {
        CAPTURE(quant);
        const std::string src = tiny_moe(trt.rt, quant), q = quant;
        Model base = open(trt.rt, src);
        std::string stats_text;
        const auto whole = greedy(trt.rt, base.get(), nullptr, 64, &stats_text);
        const std::string stats = write_text(kWork + "/moe-stats-" + q + ".json", stats_text);
        const bj::object counts = bj::parse(stats_text).as_object();
        REQUIRE(counts.size() == 3);  // layers 0, 1, 3 route; layer 2 is dense
        const double cover = 0.6;
        const std::string masked = kWork + "/moe-masked-" + q + ".cmf", cut = kWork + "/moe-defragged-" + q + ".cmf";
        const bj::object mrep = bj::parse(run_tool(trt.rt, true, src, masked, stats.c_str(), cover, "code")).as_object();
        const bj::object drep = bj::parse(run_tool(trt.rt, false, src, cut, stats.c_str(), cover, nullptr)).as_object();
        Model mm = open(trt.rt, masked), dm = open(trt.rt, cut);
        // The same computation.
        const auto tokens = greedy(trt.rt, mm.get(), "code", 200);
        CHECK(greedy(trt.rt, dm.get(), nullptr, 200) == tokens);
        CHECK(greedy(trt.rt, base.get(), nullptr, 200) != tokens);  // the cut matters
        const auto want = logits_all(trt.rt, mm.get(), moe_prompt(), Pick{"code"});
        CHECK(max_rel_diff(logits_all(trt.rt, dm.get(), moe_prompt(), Pick{}), want) < 1e-5);
        CHECK(max_rel_diff(logits_all(trt.rt, base.get(), moe_prompt(), Pick{}), want) > 1e-3);
        // The kept sets, layer by layer.
        bj::array kept_per_layer;
        const bj::object prov = header_of(dm.get()).at("provenance").as_object().at("moe_defrag").as_object();
        for (const auto &[key, arr] : counts) {
            const uint64_t layer = std::stoull(std::string(key));
            std::vector<uint64_t> c;
            for (const auto &v : arr.as_array()) c.push_back(v.to_number<uint64_t>());
            const auto kept = covering(c, cover);
            CAPTURE(layer);
            kept_per_layer.push_back(kept.size());
            const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
            // Renumbered experts carry the kept ones' bytes; no more of them.
            for (size_t i = 0; i < kept.size(); ++i)
                for (const char *w : {"gate_proj", "up_proj", "down_proj"})
                    CHECK(tensor_of(dm.get(), p + "experts." + std::to_string(i) + "." + w + ".weight").hash ==
                          tensor_of(base.get(), p + "experts." + std::to_string(kept[i]) + "." + w + ".weight").hash);
            CHECK_FALSE(has_tensor(dm.get(), p + "experts." + std::to_string(kept.size()) + ".gate_proj.weight"));
            // Router rows gathered in the kept order.
            const cmf_tensor_info r0 = tensor_of(base.get(), p + "gate.weight"), r1 = tensor_of(dm.get(), p + "gate.weight");
            REQUIRE(r1.shape[0] == kept.size());
            const uint64_t row = r0.nbytes / r0.shape[0];
            for (size_t i = 0; i < kept.size(); ++i)
                CHECK(std::memcmp(static_cast<const uint8_t *>(r1.data) + i * row, static_cast<const uint8_t *>(r0.data) + kept[i] * row,
                                  row) == 0);
            bj::array remapped;
            for (uint32_t e : kept) remapped.push_back(c[e]);
            CHECK(prov.at("routing_counts").as_object().at(key) == remapped);
        }
        // Mask: one more task, expert sparsity, description as the original's.
        CHECK(mrep.at("task_id").to_number<int>() == 1);
        cmf_mask_info mi;
        cmf_mask_info_init(&mi);
        OK(cmf_mask_at(mm.get(), 0, &mi));
        CHECK(std::string(mi.name) == "code");
        CHECK(std::string(mi.description) == "MoE expert mask (cover 60%, 3 layers)");
        CHECK(mi.has_expert_fields != 0);
        CHECK(drep.at("kept_per_layer") == kept_per_layer);
        CHECK(prov.at("kept_per_layer") == kept_per_layer);
        CHECK(prov.at("cover").to_number<double>() == cover);
        CHECK(prov.at("num_experts_pre").to_number<uint64_t>() == 8);
        CHECK(prov.at("stats_hash64").as_string().size() == 16);
        CHECK(header_of(dm.get()).at("arch").as_object().at("moe") == header_of(base.get()).at("arch").as_object().at("moe"));
        // Cut tighter from the file's own routing counts; at cover 1 of
        // those counts nothing is left to drop.
        const std::string tighter = kWork + "/moe-tighter-" + q + ".cmf";
        const bj::object trep = bj::parse(run_tool(trt.rt, false, cut, tighter, nullptr, 0.3, nullptr)).as_object();
        CHECK(trep.at("experts_dropped").to_number<uint64_t>() > 0);
        Model tm = open(trt.rt, tighter);
        CHECK(greedy(trt.rt, tm.get(), nullptr, 8).size() == 8);
        std::string err;
        run_tool(trt.rt, false, cut, kWork + "/moe-none.cmf", nullptr, 1.0, nullptr, &err);
        CHECK(err.find("every expert is kept; nothing to drop") != std::string::npos);
        CHECK_FALSE(fs::exists(kWork + "/moe-none.cmf"));
    }
}

TEST_CASE("moe defrag: an expert mask in the file follows the renumbering") {
    TestRuntime trt(CMF_LOG_ERROR);
    const std::string src = tiny_moe(trt.rt, "f32");
    Model base = open(trt.rt, src);
    std::string stats_text;
    greedy(trt.rt, base.get(), nullptr, 64, &stats_text);
    const std::string stats = write_text(kWork + "/moe-stats-renumber.json", stats_text);
    // A mask at cover 0.5 inside a file cut at cover 0.8: its experts are
    // all kept, renumbered, and it runs as before.
    const std::string masked = kWork + "/moe-masked-half.cmf", cut = kWork + "/moe-masked-half-cut.cmf";
    run_tool(trt.rt, true, src, masked, stats.c_str(), 0.5, "half");
    run_tool(trt.rt, false, masked, cut, stats.c_str(), 0.8, nullptr);
    Model mm = open(trt.rt, masked), dm = open(trt.rt, cut);
    CHECK(greedy(trt.rt, dm.get(), "half", 100) == greedy(trt.rt, mm.get(), "half", 100));
}

TEST_CASE("moe defrag: bad inputs are refused and leave no output") {
    TestRuntime trt(CMF_LOG_ERROR);
    const std::string src = tiny_moe(trt.rt, "f32");
    const std::string out = kWork + "/moe-refused.cmf";
    fs::remove(out);
    const std::string good = R"({"0":[5,1,0,0,0,0,2,0],"1":[1,1,1,1,1,1,1,1]})";
    auto refused = [&](bool mask, const std::string &in, const char *stats, double cover, const char *name) {
        std::string err;
        run_tool(trt.rt, mask, in, out, stats, cover, name, &err);
        CHECK_FALSE(fs::exists(out));
        return err;
    };
    const std::string ok = write_text(kWork + "/moe-ok.json", good);
    CHECK(refused(false, src, (kWork + "/no-such.json").c_str(), 0.9, nullptr).find("FileNotFound: cannot read MoE stats") == 0);
    CHECK(refused(true, src, nullptr, 0.9, "x").find("a stats file is required") != std::string::npos);
    CHECK(refused(false, src, nullptr, 0.9, nullptr).find("carries no routing counts") != std::string::npos);
    for (double c : {-0.5, 1.5, std::nan("")})
        CHECK(refused(false, src, ok.c_str(), c, nullptr).find("cover must be in (0, 1]") != std::string::npos);
    CHECK(refused(true, src, ok.c_str(), 2.0, "x").find("cover must be in (0, 1]") != std::string::npos);
    const std::string far = write_text(kWork + "/moe-far.json", R"({"0":[1,1,1,1,1,1,1,1],"7":[1,1,1,1,1,1,1,1]})");
    CHECK(refused(false, src, far.c_str(), 0.9, nullptr).find("layer 7, but the model has 4 layers") != std::string::npos);
    CHECK(refused(true, src, far.c_str(), 0.9, "x").find("layer 7, but the model has 4 layers") != std::string::npos);
    const std::string dense = write_text(kWork + "/moe-dense.json", R"({"2":[1,1,1,1,1,1,1,1]})");
    CHECK(refused(false, src, dense.c_str(), 0.9, nullptr).find("layer 2 has no experts") != std::string::npos);
    const std::string wide = write_text(kWork + "/moe-wide.json", R"({"0":[1,1,1,1,1,1,1,1,1,1]})");
    CHECK(refused(false, src, wide.c_str(), 0.9, nullptr).find("layer 0 has 10 counts, but the layer holds 8 experts") !=
          std::string::npos);
    const std::string zero = write_text(kWork + "/moe-zero.json", R"({"0":[0,0,0,0,0,0,0,0]})");
    CHECK(refused(false, src, zero.c_str(), 0.9, nullptr).find("no layer has a nonzero count") != std::string::npos);
    const std::string junk = write_text(kWork + "/moe-junk.json", R"([1,2,3])");
    CHECK(refused(false, src, junk.c_str(), 0.9, nullptr).find("Parse: ") == 0);
    CHECK(refused(false, converted(trt.rt, "f32"), ok.c_str(), 0.9, nullptr).find("not a mixture-of-experts model") !=
          std::string::npos);
    CHECK(refused(true, src, ok.c_str(), 0.9, "").find("the new task needs a name") != std::string::npos);
    // A name the file has already.
    const std::string once = kWork + "/moe-once.cmf";
    run_tool(trt.rt, true, src, once, ok.c_str(), 0.9, "code");
    CHECK(refused(true, once, ok.c_str(), 0.9, "code").find("task 'code' exists") != std::string::npos);
    // The output over the input.
    std::string err;
    run_tool(trt.rt, false, once, once, ok.c_str(), 0.9, nullptr, &err);
    CHECK(err.find("the output must differ from the input") != std::string::npos);
}

TEST_CASE("moe defrag: equal counts go to the lower expert index, the crossing expert is kept") {
    TestRuntime trt(CMF_LOG_ERROR);
    const std::string src = tiny_moe(trt.rt, "f32");
    // Layer 0: 5 + 3 = 8 of 11 reaches 0.7; experts 1 and 2 tie at 3.
    // Layer 1: 4 of 8 is short of 0.55, the crossing expert (2, lower than 3) makes 6.
    const std::string stats = write_text(kWork + "/moe-ties.json", R"({"0":[5,3,3,0,0,0,0,0],"1":[4,0,2,2,0,0,0,0]})");
    const std::string out = kWork + "/moe-ties.cmf";
    const bj::object rep = bj::parse(run_tool(trt.rt, false, src, out, stats.c_str(), 0.7, nullptr)).as_object();
    CHECK(rep.at("kept_per_layer") == bj::array{2, 2});
    Model base = open(trt.rt, src), dm = open(trt.rt, out);
    auto same = [&](int layer, int new_e, int old_e) {
        const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
        return tensor_of(dm.get(), p + std::to_string(new_e) + ".up_proj.weight").hash ==
               tensor_of(base.get(), p + std::to_string(old_e) + ".up_proj.weight").hash;
    };
    CHECK(same(0, 0, 0));
    CHECK(same(0, 1, 1));
    CHECK(same(1, 0, 0));
    CHECK(same(1, 1, 2));
}
