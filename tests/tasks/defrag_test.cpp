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

std::vector<int32_t> greedy(cmf_runtime *rt, const cmf_model *m, const char *task, size_t n) {
    return greedy_after(rt, m, task, prompt(), n);
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

TEST_CASE("defrag: convert --defrag cuts at convert time as defrag cuts a converted file") {
    TestRuntime trt(CMF_LOG_ERROR);
    Model base = open(trt.rt, converted(trt.rt, "f32"));
    const Arch a = arch_of(base.get());
    const MaskPlan p = ffn_plan(a, 11);
    const std::string shape = "(" + std::to_string(a.layers) + ", " + std::to_string(a.inter) + ")";
    const std::string dir = kWork + "/convert-skill";
    fs::create_directories(dir);
    const std::string npy = write_npy(dir + "/ffn_keep.npy", p, shape);
    const std::string model_dir = std::string(CMF_SOURCE_ROOT) + "/models/austen-tiny";
    auto convert = [&](const std::string &out, const char *quant, const std::string &skill_dir, std::string *error = nullptr) {
        cmf_convert_options o;
        cmf_convert_options_init(&o);
        o.model_dir = model_dir.c_str();
        o.output = out.c_str();
        o.quant = quant;
        o.defrag_dir = skill_dir.c_str();
        const std::string err = take(cmf_convert(trt.rt, &o));
        if (error != nullptr) *error = err;
        else REQUIRE_MESSAGE(err.empty(), err);
    };
    // f32: every value is the checkpoint's, so the two ways give the same bytes.
    const std::string at_convert = kWork + "/convert-defrag-f32.cmf", after = kWork + "/defrag-after-convert-f32.cmf";
    convert(at_convert, "f32", dir);
    defrag(trt.rt, converted(trt.rt, "f32"), after, nullptr, npy.c_str());
    Model cm = open(trt.rt, at_convert), am = open(trt.rt, after);
    REQUIRE(cmf_tensor_count(cm.get()) == cmf_tensor_count(am.get()));
    for (size_t i = 0; i < cmf_tensor_count(am.get()); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        OK(cmf_tensor_at(am.get(), i, &t));
        CAPTURE(t.name);
        CHECK(tensor_of(cm.get(), t.name).hash == t.hash);
    }
    const bj::object h = header_of(cm.get());
    const bj::object &d = h.at("provenance").as_object().at("defrag").as_object();
    CHECK(d.at("source_skill").as_string() == dir.c_str());
    CHECK(d.at("kept_per_layer") == header_of(am.get()).at("provenance").as_object().at("defrag").as_object().at("kept_per_layer"));
    CHECK(h.at("arch").as_object().at("intermediate_size") == header_of(am.get()).at("arch").as_object().at("intermediate_size"));
    CHECK(h.at("provenance").as_object().at("source_model").as_string() == model_dir.c_str());
    // q8: the cut tensors are quantized once at their new width; the
    // same 200 greedy tokens as the task on the full file.
    Variant mv;
    mv.masks = {{"prose", blob_of(a, p), sparsity_of(p)}};
    const std::string masked = kWork + "/convert-defrag-masked-f32.cmf";
    write_variant(trt.rt, base.get(), masked, mv);
    Model mm = open(trt.rt, masked);
    CHECK(greedy(trt.rt, cm.get(), nullptr, 200) == greedy(trt.rt, mm.get(), "prose", 200));
    const std::string q8 = kWork + "/convert-defrag-q8.cmf";
    convert(q8, "q8", dir);
    Model qm = open(trt.rt, q8);
    CHECK(max_rel_diff(logits_all(trt.rt, qm.get(), prompt(), Pick{}), logits_all(trt.rt, mm.get(), prompt(), Pick{"prose"})) < 0.05);
    // Overlays: tensors/NAME.npy replace FFN weights first; without
    // ffn_keep.npy the zero down_proj columns (of the overlay) go.
    const std::string odir = kWork + "/convert-overlay";
    fs::create_directories(odir + "/tensors");
    const std::string down0 = "model.layers.0.mlp.down_proj.weight";
    const cmf_tensor_info t0 = tensor_of(base.get(), down0);
    std::vector<float> v(static_cast<const float *>(t0.data), static_cast<const float *>(t0.data) + t0.shape[0] * t0.shape[1]);
    for (uint64_t r = 0; r < t0.shape[0]; ++r)
        for (uint64_t c = 0; c < t0.shape[1]; ++c)
            if (!p.ffn[0][c]) v[r * t0.shape[1] + c] = 0.0f;
    uint64_t first = 0;
    while (!p.ffn[0][first]) ++first;
    v[first] += 1.0f;  // an overlay changes values, not only zeros
    {
        std::string hd = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(t0.shape[0]) + ", " +
                         std::to_string(t0.shape[1]) + "), }";
        hd.resize(((10 + hd.size() + 1 + 63) / 64) * 64 - 10 - 1, ' ');
        hd += '\n';
        std::ofstream f(odir + "/tensors/" + down0 + ".npy", std::ios::binary);
        f.write("\x93NUMPY\x01\x00", 8);
        f.put(char(hd.size() & 0xff));
        f.put(char(hd.size() >> 8));
        f.write(hd.data(), std::streamsize(hd.size()));
        f.write(reinterpret_cast<const char *>(v.data()), std::streamsize(v.size() * 4));
    }
    const std::string ov = kWork + "/convert-overlay-f32.cmf";
    convert(ov, "f32", odir);
    Model om = open(trt.rt, ov);
    const uint64_t k0 = uint64_t(std::count(p.ffn[0].begin(), p.ffn[0].end(), true));
    const bj::object oh = header_of(om.get());
    const bj::array &kept = oh.at("provenance").as_object().at("defrag").as_object().at("kept_per_layer").as_array();
    CHECK(kept[0].to_number<uint64_t>() == k0);
    for (uint64_t l = 1; l < a.layers; ++l) CHECK(kept[l].to_number<uint64_t>() == a.inter);
    const cmf_tensor_info d0 = tensor_of(om.get(), down0);
    REQUIRE(d0.shape[1] == k0);
    const float *got = static_cast<const float *>(d0.data);
    CHECK(got[0] == v[first]);
    // Refusals: no output left behind.
    std::string err;
    const std::string none = kWork + "/convert-refused.cmf";
    convert(none, "f32", kWork + "/no-such-skill", &err);
    CHECK(err.find("does not exist or is not a directory") != std::string::npos);
    fs::create_directories(kWork + "/bad-overlay/tensors");
    std::ofstream(kWork + "/bad-overlay/tensors/model.norm.weight.npy") << "x";
    convert(none, "f32", kWork + "/bad-overlay", &err);
    CHECK(err.find("which is not a dense FFN weight of the model") != std::string::npos);
    fs::create_directories(kWork + "/bad-keep");
    write_npy(kWork + "/bad-keep/ffn_keep.npy", p, "(" + std::to_string(a.layers) + ", 7)");
    convert(none, "f32", kWork + "/bad-keep", &err);
    CHECK(err.find("the model needs (") != std::string::npos);
    CHECK_FALSE(fs::exists(none));
}
