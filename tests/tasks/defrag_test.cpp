// Dense FFN defrag on real files (austen-tiny converted):
//  - a task mask's file defragged runs as the task does: the same logits
//    and the same 200 greedy tokens, in f32 and q8 (kept values copied);
//  - the header says what was kept (widths, provenance.defrag, no masks);
//  - ffn_keep.npy and all-zero down_proj columns give the same keep set;
//  - a dtype that keeps columns only by 32-wide groups (q4) is re-encoded
//    at the new width and still runs;
//  - what cannot be defragged is refused with a reason.
#include <doctest/doctest.h>
#include "support/test_runtime.hpp"
#include "task_files.hpp"

#include <cmf/cmf.h>

#include <fstream>

using namespace tasks_test;

namespace {

// Random FFN rows (about half of each layer kept), every head and layer on.
MaskPlan ffn_plan(const Arch &a, uint32_t seed) {
    std::mt19937 rng(seed);
    MaskPlan p;
    p.ffn.assign(a.layers, std::vector<bool>(a.inter));
    for (auto &row : p.ffn)
        for (size_t i = 0; i < row.size(); ++i) row[i] = rng() % 2 == 0;
    p.heads.assign(a.layers, std::vector<bool>(a.heads, true));
    p.alive.assign(a.layers, true);
    return p;
}

std::string defrag(cmf_runtime *rt, const std::string &in, const std::string &out, const char *task, const char *keep,
                   std::string *error = nullptr) {
    cmf_defrag_options o;
    cmf_defrag_options_init(&o);
    o.input = in.c_str();
    o.output = out.c_str();
    o.task = task;
    o.keep_file = keep;
    char *report = nullptr;
    cmf_error *e = cmf_defrag(rt, &o, &report);
    if (error != nullptr) {
        *error = take(e);
        if (!error->empty()) return "";
    } else {
        REQUIRE_MESSAGE(e == nullptr, take(e));
    }
    std::string r = report;
    cmf_string_free(report);
    return r;
}

// Greedy tokens after the prompt.
std::vector<int32_t> greedy(cmf_runtime *rt, const cmf_model *m, const char *task, size_t n) {
    cmf_session_options o;
    cmf_session_options_init(&o);
    o.n_ctx = 256;
    o.task = task;
    cmf_session *s = nullptr;
    cmf_error *e = cmf_session_create_for_model(rt, m, &o, &s);
    REQUIRE_MESSAGE(e == nullptr, take(e));
    Session sess(s);
    const uint64_t V = cmf_session_vocab_size(s);
    std::vector<float> logits(V);
    std::vector<int32_t> in = prompt(), out;
    for (size_t i = 0; i < n; ++i) {
        OK(cmf_session_eval(s, in.data(), in.size(), CMF_LOGITS_LAST, logits.data(), logits.size()));
        const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(next);
        in = {next};
    }
    return out;
}

bj::object header_of(const cmf_model *m) {
    cmf_model_info info;
    cmf_model_info_init(&info);
    OK(cmf_model_get_info(m, &info));
    return bj::parse(std::string(info.header_json, info.header_json_len)).as_object();
}

cmf_tensor_info tensor_of(const cmf_model *m, const std::string &name) {
    cmf_tensor_info t;
    cmf_tensor_info_init(&t);
    OK(cmf_tensor(m, name.c_str(), &t));
    return t;
}

// ffn_keep.npy (NumPy format 1.0, bool, C order) of a plan.
std::string write_npy(const std::string &path, const MaskPlan &p, const std::string &shape_text) {
    std::string h = "{'descr': '|b1', 'fortran_order': False, 'shape': " + shape_text + ", }";
    h.resize(((10 + h.size() + 1 + 63) / 64) * 64 - 10 - 1, ' ');
    h += '\n';
    std::ofstream f(path, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    const uint16_t n = uint16_t(h.size());
    f.put(char(n & 0xff));
    f.put(char(n >> 8));
    f.write(h.data(), std::streamsize(h.size()));
    for (const auto &row : p.ffn)
        for (bool b : row) f.put(b ? 1 : 0);
    return path;
}

}  // namespace

TEST_CASE("defrag: a task mask defragged runs as the task does") {
    TestRuntime trt(CMF_LOG_ERROR);
    for (const char *quant : {"f32", "q8"}) {
        CAPTURE(quant);
        Model base = open(trt.rt, converted(trt.rt, quant));
        const Arch a = arch_of(base.get());
        const MaskPlan p = ffn_plan(a, 11);
        Variant mv;
        mv.masks = {{"prose", blob_of(a, p), sparsity_of(p)}};
        mv.quality_json = R"({"metric":"ppl","backbone":10.0,"masked":11.0})";
        const std::string masked = kWork + "/defrag-src-" + std::string(quant) + ".cmf",
                          out = kWork + "/defragged-" + std::string(quant) + ".cmf";
        write_variant(trt.rt, base.get(), masked, mv);
        const bj::object rep = bj::parse(defrag(trt.rt, masked, out, "prose", nullptr)).as_object();
        CHECK(rep.at("reencoded").to_number<int>() == 0);
        Model mm = open(trt.rt, masked), dm = open(trt.rt, out);
        // The same computation: identical logits, identical greedy text.
        const auto want = logits_all(trt.rt, mm.get(), prompt(), Pick{"prose"});
        CHECK(max_rel_diff(logits_all(trt.rt, dm.get(), prompt(), Pick{}), want) < 1e-6);
        CHECK(max_rel_diff(logits_all(trt.rt, base.get(), prompt(), Pick{}), want) > 0.05);  // the mask matters
        const auto tokens = greedy(trt.rt, mm.get(), "prose", 200);
        CHECK(greedy(trt.rt, dm.get(), nullptr, 200) == tokens);
        CHECK(greedy(trt.rt, base.get(), nullptr, 200) != tokens);
        // What the header says.
        const bj::object h = header_of(dm.get());
        uint64_t widest = 0, total = 0;
        bj::array kept;
        for (uint64_t l = 0; l < a.layers; ++l) {
            const uint64_t k = uint64_t(std::count(p.ffn[l].begin(), p.ffn[l].end(), true));
            kept.push_back(k);
            widest = std::max(widest, k);
            total += k;
            const std::string pre = "model.layers." + std::to_string(l) + ".mlp.";
            CHECK(tensor_of(dm.get(), pre + "gate_proj.weight").shape[0] == k);
            CHECK(tensor_of(dm.get(), pre + "up_proj.weight").shape[0] == k);
            CHECK(tensor_of(dm.get(), pre + "down_proj.weight").shape[1] == k);
        }
        CHECK(h.at("arch").as_object().at("intermediate_size").to_number<uint64_t>() == widest);
        const bj::object &d = h.at("provenance").as_object().at("defrag").as_object();
        CHECK(d.at("kept_per_layer") == kept);
        CHECK(d.at("pre_intermediate").to_number<uint64_t>() == a.inter);
        CHECK(d.at("post_intermediate_max").to_number<uint64_t>() == widest);
        CHECK(d.at("pruned_ratio").to_number<double>() ==
              doctest::Approx(std::round(10000.0 * (1.0 - double(total) / double(a.layers * a.inter))) / 10000.0));
        CHECK(d.at("source_skill") == "task:prose");
        cmf_model_info info;
        cmf_model_info_init(&info);
        OK(cmf_model_get_info(dm.get(), &info));
        CHECK(info.mask_count == 0);
        // Every other tensor is the source's, byte for byte.
        for (size_t i = 0; i < cmf_tensor_count(mm.get()); ++i) {
            cmf_tensor_info t;
            cmf_tensor_info_init(&t);
            OK(cmf_tensor_at(mm.get(), i, &t));
            if (std::string(t.name).find(".mlp.") == std::string::npos) CHECK(tensor_of(dm.get(), t.name).hash == t.hash);
        }
    }
}

TEST_CASE("defrag: ffn_keep.npy and all-zero down_proj columns give the task's keep set") {
    TestRuntime trt(CMF_LOG_ERROR);
    Model base = open(trt.rt, converted(trt.rt, "f32"));
    const Arch a = arch_of(base.get());
    const MaskPlan p = ffn_plan(a, 11);
    const std::string src = converted(trt.rt, "f32");
    const std::string shape = "(" + std::to_string(a.layers) + ", " + std::to_string(a.inter) + ")";
    fs::create_directories(kWork + "/prose-skill");
    const std::string npy = write_npy(kWork + "/prose-skill/ffn_keep.npy", p, shape);
    const std::string by_npy = kWork + "/defrag-npy.cmf", by_zero = kWork + "/defrag-zero.cmf";
    defrag(trt.rt, src, by_npy, nullptr, npy.c_str());
    // The left-out neurons' down columns zeroed: found and dropped.
    Variant zv;
    for (uint64_t l = 0; l < a.layers; ++l) {
        const std::string name = "model.layers." + std::to_string(l) + ".mlp.down_proj.weight";
        const cmf_tensor_info t = tensor_of(base.get(), name);
        std::vector<uint8_t> bytes(static_cast<const uint8_t *>(t.data), static_cast<const uint8_t *>(t.data) + t.nbytes);
        float *v = reinterpret_cast<float *>(bytes.data());
        for (uint64_t r = 0; r < t.shape[0]; ++r)
            for (uint64_t c = 0; c < t.shape[1]; ++c)
                if (!p.ffn[l][c]) v[r * t.shape[1] + c] = 0.0f;
        zv.replace[name] = std::move(bytes);
    }
    const std::string zeroed = kWork + "/zero-columns.cmf";
    write_variant(trt.rt, base.get(), zeroed, zv);
    defrag(trt.rt, zeroed, by_zero, nullptr, nullptr);
    Model nm = open(trt.rt, by_npy), zm = open(trt.rt, by_zero);
    for (size_t i = 0; i < cmf_tensor_count(nm.get()); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        OK(cmf_tensor_at(nm.get(), i, &t));
        CAPTURE(t.name);
        CHECK(tensor_of(zm.get(), t.name).hash == t.hash);  // the zeroed columns are the dropped ones
    }
    CHECK(header_of(nm.get()).at("provenance").as_object().at("defrag").as_object().at("source_skill") == "prose-skill");
    // A keep file of another shape, and not a .npy at all.
    std::string err;
    const std::string bad_npy = write_npy(kWork + "/bad_keep.npy", p, "(" + std::to_string(a.layers) + ", 7)");
    defrag(trt.rt, src, by_npy, nullptr, bad_npy.c_str(), &err);
    CHECK(err.find("the model needs (" + std::to_string(a.layers) + ", " + std::to_string(a.inter) + ")") != std::string::npos);
    defrag(trt.rt, src, by_npy, nullptr, src.c_str(), &err);
    CHECK(err.find("Parse") == 0);
    CHECK(err.find("not a .npy file") != std::string::npos);
}

TEST_CASE("defrag: q4 groups are re-encoded at the new width; what cannot be defragged is refused") {
    TestRuntime trt(CMF_LOG_ERROR);
    Model base = open(trt.rt, converted(trt.rt, "q4"));
    const Arch a = arch_of(base.get());
    MaskPlan p = ffn_plan(a, 5);
    Variant mv;
    mv.masks = {{"prose", blob_of(a, p), sparsity_of(p)}};
    const std::string masked = kWork + "/defrag-src-q4.cmf", out = kWork + "/defragged-q4.cmf";
    write_variant(trt.rt, base.get(), masked, mv);
    const bj::object rep = bj::parse(defrag(trt.rt, masked, out, "prose", nullptr)).as_object();
    CHECK(rep.at("reencoded").to_number<uint64_t>() > 0);
    Model dm = open(trt.rt, out), mm = open(trt.rt, masked);
    // Close to the task (q4 re-rounded at the new width or q8_2f), not equal.
    CHECK(max_rel_diff(logits_all(trt.rt, dm.get(), prompt(), Pick{}), logits_all(trt.rt, mm.get(), prompt(), Pick{"prose"})) <
          0.1);
    std::string err;
    // A mask that turns a head off is more than FFN neurons.
    p.heads[1][2] = false;
    Variant hv;
    hv.masks = {{"heads", blob_of(a, p), sparsity_of(p)}};
    const std::string with_heads = kWork + "/defrag-heads.cmf";
    write_variant(trt.rt, base.get(), with_heads, hv);
    defrag(trt.rt, with_heads, out, "heads", nullptr, &err);
    CHECK(err.find("turns attention head 2 of layer 1 off") != std::string::npos);
    defrag(trt.rt, with_heads, out, "poetry", nullptr, &err);
    CHECK(err.find("NotFound: task 'poetry' is not in the file (its tasks: heads)") == 0);
    // A file defragged already.
    defrag(trt.rt, out, kWork + "/again.cmf", nullptr, nullptr, &err);
    CHECK(err.find("the file is defragged already") != std::string::npos);
    // A layer left without neurons.
    p.heads[1][2] = true;
    p.ffn[2].assign(a.inter, false);
    Variant ev;
    ev.masks = {{"empty", blob_of(a, p), sparsity_of(p)}};
    const std::string empty = kWork + "/defrag-empty.cmf";
    write_variant(trt.rt, base.get(), empty, ev);
    defrag(trt.rt, empty, out, "empty", nullptr, &err);
    CHECK(err.find("layer 2 keeps no FFN neuron") != std::string::npos);
}
