// Task masks at run time, through the C API on real files: the project's
// austen-tiny Qwen3 converted (f32 and q8), masks written with the writer.
//  - a mask runs the same model as its dense twin with the masked work
//    zeroed in the weights (masked neurons' gate rows and down columns,
//    masked heads' o_proj columns, a gated-off layer's o_proj and down):
//    an independent formulation of what the mask means;
//  - a looped model (arch.num_loops = 2) runs as the same layers written
//    out twice, and its per-visit FFN rows (LOOP_MASKS) act per visit;
//  - the selection errors: unknown task (the message lists the file's),
//    a file without masks, a skill file;
//  - the rows a mask leaves out are never read: after a long generation
//    from a cold page cache, mincore finds none of their pages in memory.
#include <doctest/doctest.h>
#include "support/test_runtime.hpp"
#include "task_files.hpp"

#include <cmf/cmf.h>

#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace fs = std::filesystem;
namespace bj = boost::json;

using namespace tasks_test;

namespace {

// The payload of tensor `name` with element (r, c) set to zero for every
// (r, c) `zero` picks: f32 values, q8_row and q4_block codes (scales stay).
std::vector<uint8_t> zeroed(const cmf_model *m, const std::string &name, const std::function<bool(uint64_t, uint64_t)> &zero,
                            const std::map<std::string, std::vector<uint8_t>> &already) {
    cmf_tensor_info t;
    cmf_tensor_info_init(&t);
    OK(cmf_tensor(m, name.c_str(), &t));
    REQUIRE(t.ndim == 2);
    auto it = already.find(name);
    std::vector<uint8_t> bytes = it != already.end() ? it->second
                                                      : std::vector<uint8_t>(static_cast<const uint8_t *>(t.data),
                                                                             static_cast<const uint8_t *>(t.data) + t.nbytes);
    const uint64_t rows = t.shape[0], cols = t.shape[1];
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t c = 0; c < cols; ++c) {
            if (!zero(r, c)) continue;
            const uint64_t i = r * cols + c;
            if (t.dtype == CMF_DTYPE_F32) {
                std::memset(bytes.data() + 4 * i, 0, 4);
            } else if (t.dtype == CMF_DTYPE_Q8_ROW) {
                bytes[i] = 0;
            } else if (t.dtype == CMF_DTYPE_Q4_BLOCK) {  // nibble 8 is the value 0
                uint8_t &nib = bytes[16 * (i / 32) + (i % 32) / 2];
                nib = (i % 2) ? uint8_t((nib & 0x0f) | 0x80) : uint8_t((nib & 0xf0) | 0x08);
            } else {
                FAIL("zeroed: dtype " << t.dtype << " not handled");
            }
        }
    return bytes;
}

std::string layer(uint64_t l, const char *rest) { return "model.layers." + std::to_string(l) + "." + rest; }

// The dense twin of a mask: the masked work zeroed in the weights of
// `src`, for out_layers layers (a looped plan written out: layer v runs
// the weights of layer v % layers).
void zero_plan(const cmf_model *src, const Arch &a, const MaskPlan &p, uint64_t out_layers,
               std::map<std::string, std::vector<uint8_t>> &out) {
    for (uint64_t v = 0; v < out_layers; ++v) {
        const uint64_t l = v % a.layers;
        const std::string gate = layer(v, "mlp.gate_proj.weight"), down = layer(v, "mlp.down_proj.weight"),
                          o = layer(v, "self_attn.o_proj.weight");
        if (!p.alive[l]) {
            out[o] = zeroed(src, layer(l, "self_attn.o_proj.weight"), [](uint64_t, uint64_t) { return true; }, {});
            out[down] = zeroed(src, layer(l, "mlp.down_proj.weight"), [](uint64_t, uint64_t) { return true; }, {});
            continue;
        }
        const auto &ffn = p.ffn[v];
        out[gate] = zeroed(src, layer(l, "mlp.gate_proj.weight"), [&](uint64_t r, uint64_t) { return !ffn[r]; }, {});
        out[down] = zeroed(src, layer(l, "mlp.down_proj.weight"), [&](uint64_t, uint64_t c) { return !ffn[c]; }, {});
        const auto &heads = p.heads[l];
        out[o] = zeroed(src, layer(l, "self_attn.o_proj.weight"),
                        [&](uint64_t, uint64_t c) { return !heads[c / a.head_dim]; }, {});
    }
}

// A plan exercising every kind of skip on austen-tiny (4 layers, 4 heads in
// 2 KV groups): random FFN rows; all heads, one head per group (GQA on the
// live groups), heads 0,1,3 (uneven groups) and a gated-off layer.
MaskPlan mixed_plan(const Arch &a, uint64_t visits, uint32_t seed) {
    std::mt19937 rng(seed);
    MaskPlan p;
    for (uint64_t v = 0; v < visits; ++v) {
        std::vector<bool> row(a.inter);
        const uint32_t keep_pct = v % 2 ? 25 : 50;
        for (uint64_t i = 0; i < a.inter; ++i) row[i] = rng() % 100 < keep_pct;
        p.ffn.push_back(row);
    }
    p.heads = {{true, true, true, true}, {true, false, true, false}, {true, true, false, true}, {true, true, true, true}};
    p.alive = {true, true, true, false};
    return p;
}

}  // namespace

TEST_CASE("tasks: a mask runs as its dense twin with the masked work zeroed") {
    TestRuntime trt;
    for (const char *quant : {"f32", "q8", "q4"}) {
        CAPTURE(quant);
        Model base = open(trt.rt, converted(trt.rt, quant));
        const Arch a = arch_of(base.get());
        REQUIRE(a.layers == 4);
        REQUIRE(a.heads == 4);
        MaskPlan plan = mixed_plan(a, a.layers, 11);
        // Second mask: no head of layer 1 (its attention adds nothing) and
        // no neuron of layer 2 (its FFN adds nothing).
        MaskPlan empty = mixed_plan(a, a.layers, 12);
        empty.heads[1] = {false, false, false, false};
        empty.ffn[2].assign(a.inter, false);
        empty.alive = {true, true, true, true};
        const std::string masked = kWork + "/masked-" + quant + ".cmf";
        Variant mv;
        mv.masks = {{"mixed", blob_of(a, plan), sparsity_of(plan)}, {"empty-parts", blob_of(a, empty), sparsity_of(empty)}};
        write_variant(trt.rt, base.get(), masked, mv);
        for (auto [task, p] : {std::pair{"mixed", &plan}, std::pair{"empty-parts", &empty}}) {
            CAPTURE(task);
            Variant zv;
            zero_plan(base.get(), a, *p, a.layers, zv.replace);
            const std::string twin = kWork + "/twin-" + task + "-" + quant + ".cmf";
            write_variant(trt.rt, base.get(), twin, zv);
            Model mm = open(trt.rt, masked), tm = open(trt.rt, twin);
            const auto got = logits_all(trt.rt, mm.get(), prompt(), Pick{task});
            const auto want = logits_all(trt.rt, tm.get(), prompt(), Pick{});
            const auto dense = logits_all(trt.rt, base.get(), prompt(), Pick{});
            // The mask changes the model (so this comparison can fail)...
            CHECK(max_rel_diff(dense, want) > 0.05);
            // ... exactly as zeroing the masked work does. f32: summation
            // order only; q8, q4: the compacted inputs are quantized to int8
            // in other blocks of 32 than the zero-filled ones (q4 selects
            // whole groups: a head's 48 columns share groups with the next).
            CHECK(max_rel_diff(got, want) < (std::string(quant) == "f32" ? 2e-5 : 2e-2));
        }
    }
}

TEST_CASE("tasks: a looped model runs its layers again, with per-visit FFN rows") {
    TestRuntime trt;
    Model base = open(trt.rt, converted(trt.rt, "f32"));
    const Arch a = arch_of(base.get());
    const uint64_t loops = 2, visits = a.layers * loops;
    MaskPlan plan = mixed_plan(a, visits, 21);
    // The looped file: num_loops 2 and a mask with one FFN row per visit.
    Variant lv;
    lv.edit_arch = [](bj::object &arch) { arch["num_loops"] = 2; };
    lv.masks = {{"loop", blob_of(a, plan), sparsity_of(plan)}};
    const std::string looped = kWork + "/looped.cmf";
    write_variant(trt.rt, base.get(), looped, lv);
    // Its twin: 8 layers written out (layer 4 + l = layer l), each visit's
    // masked work zeroed in its own copy; no mask.
    Variant tv;
    tv.edit_arch = [&](bj::object &arch) {
        arch["num_layers"] = visits;
        bj::array types;
        for (uint64_t v = 0; v < visits; ++v) types.push_back("FullAttention");
        arch["layer_types"] = types;
    };
    for (uint64_t v = a.layers; v < visits; ++v)
        for (size_t i = 0; i < cmf_tensor_count(base.get()); ++i) {
            cmf_tensor_info t;
            cmf_tensor_info_init(&t);
            OK(cmf_tensor_at(base.get(), i, &t));
            const std::string n = t.name, pre = "model.layers." + std::to_string(v - a.layers) + ".";
            if (n.compare(0, pre.size(), pre) == 0) tv.copies.emplace_back("model.layers." + std::to_string(v) + "." + n.substr(pre.size()), n);
        }
    zero_plan(base.get(), a, plan, visits, tv.replace);
    const std::string twin = kWork + "/looped-twin.cmf";
    write_variant(trt.rt, base.get(), twin, tv);
    Model lm = open(trt.rt, looped), tm = open(trt.rt, twin);
    cmf_model_info info;
    cmf_model_info_init(&info);
    OK(cmf_model_get_info(lm.get(), &info));
    CHECK((info.required_features & CMF_FEATURE_LOOP_MASKS) != 0);
    const auto got = logits_all(trt.rt, lm.get(), prompt(), Pick{"loop"});
    const auto want = logits_all(trt.rt, tm.get(), prompt(), Pick{});
    CHECK(max_rel_diff(got, want) < 2e-5);
    // Unmasked, the looped file is the written-out one without zeros.
    Variant dv = tv;
    dv.replace.clear();
    const std::string dense_twin = kWork + "/looped-dense-twin.cmf";
    write_variant(trt.rt, base.get(), dense_twin, dv);
    Model dm = open(trt.rt, dense_twin);
    CHECK(max_rel_diff(logits_all(trt.rt, lm.get(), prompt(), Pick{}), logits_all(trt.rt, dm.get(), prompt(), Pick{})) <
          2e-5);
}

// The base with two task masks, "code" and "prose" (the same mixed plan),
// written to `path` and opened.
static Model write_two_tasks(cmf_runtime *rt, const cmf_model *base, const Arch &a, const std::string &path) {
    Variant mv;
    MaskPlan p = mixed_plan(a, a.layers, 5);
    mv.masks = {{"code", blob_of(a, p), sparsity_of(p)}, {"prose", blob_of(a, p), sparsity_of(p)}};
    write_variant(rt, base, path, mv);
    return open(rt, path);
}

TEST_CASE("tasks: selection errors name what the file has") {
    TestRuntime trt(CMF_LOG_ERROR);
    Model base = open(trt.rt, converted(trt.rt, "q8"));
    const Arch a = arch_of(base.get());
    std::string err;
    logits_all(trt.rt, base.get(), prompt(), Pick{"general"}, &err);
    CHECK(err.find("InvalidArgument") == 0);
    CHECK(err.find("has no task masks") != std::string::npos);
    Model m = write_two_tasks(trt.rt, base.get(), a, kWork + "/two-tasks.cmf");
    logits_all(trt.rt, m.get(), prompt(), Pick{"poetry"}, &err);
    CHECK(err.find("NotFound") == 0);
    CHECK(err.find("code, prose") != std::string::npos);
    // The C API refuses a selection on a plain model source.
    cmf_session_options o;
    cmf_session_options_init(&o);
    o.task = "code";
    cmf_model_source src{};
    src.struct_size = sizeof src;
    cmf_session *s = nullptr;
    err = take(cmf_session_create(trt.rt, &src, &o, &s));
    CHECK(err.find("InvalidArgument") == 0);
}

TEST_CASE("tasks: rows a mask leaves out are never read into memory") {
    TestRuntime trt(CMF_LOG_ERROR);
    Model base = open(trt.rt, converted(trt.rt, "q8"));
    const Arch a = arch_of(base.get());
    // Half the neurons in runs of 64 (a gate/up row is 192 q8 codes, so a
    // dropped run spans two whole 4 KiB pages at least).
    MaskPlan p;
    std::vector<bool> row(a.inter);
    for (uint64_t i = 0; i < a.inter; ++i) row[i] = (i / 64) % 2 == 0;
    p.ffn.assign(a.layers, row);
    p.heads.assign(a.layers, std::vector<bool>(a.heads, true));
    p.alive.assign(a.layers, true);
    const std::string path = kWork + "/paged.cmf";
    fs::remove(path);
    Variant v;
    v.masks = {{"half", blob_of(a, p), 0.5f}};
    v.quality_json = R"({"metric":"heldout_ppl_ratio","value":1.1})";
    write_variant(trt.rt, base.get(), path, v);
    Model m = open(trt.rt, path);
    // The session binds the mask (the left-out rows' pages are advised
    // against read-around and 2 MiB pages from here on).
    cmf_session_options o;
    cmf_session_options_init(&o);
    o.n_ctx = 512;
    o.task = "half";
    cmf_session *s = nullptr;
    OK(cmf_session_create_for_model(trt.rt, m.get(), &o, &s));
    Session sess(s);
    // Now out of memory: this process's mapping of the file dropped (opening
    // it read the header through a 2 MiB page, which on this 2.6 MB file
    // holds tensors too) and the page cache emptied (the writer synced the
    // file). From here on a page is in memory only if something reads it.
    {
        cmf_model_info info;
        cmf_model_info_init(&info);
        OK(cmf_model_get_info(m.get(), &info));
        cmf_tensor_info t0;
        cmf_tensor_info_init(&t0);
        OK(cmf_tensor_at(m.get(), 0, &t0));
        const uintptr_t file = reinterpret_cast<uintptr_t>(t0.data) - t0.offset - info.data_off;
        REQUIRE(file % ::sysconf(_SC_PAGESIZE) == 0);
        REQUIRE(::madvise(reinterpret_cast<void *>(file), info.file_size, MADV_DONTNEED) == 0);
        const int fd = ::open(path.c_str(), O_RDONLY);
        REQUIRE(fd >= 0);
        REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
        ::close(fd);
    }
    const long page = ::sysconf(_SC_PAGESIZE);
    // Pages wholly inside the code bytes of rows [r0, r1) of a q8_row tensor.
    auto pages_of = [&](const cmf_tensor_info &t, uint64_t r0, uint64_t r1) {
        const uintptr_t b = reinterpret_cast<uintptr_t>(t.data) + r0 * t.shape[1];
        const uintptr_t e = reinterpret_cast<uintptr_t>(t.data) + r1 * t.shape[1];
        const uintptr_t first = (b + page - 1) / page * page, last = e / page * page;
        return std::pair{first, last > first ? (last - first) / page : 0};
    };
    // Resident pages among those, and how many there were.
    auto resident = [&](const cmf_tensor_info &t, uint64_t r0, uint64_t r1) {
        auto [addr, n] = pages_of(t, r0, r1);
        std::vector<unsigned char> vec(n + 1);
        if (n == 0) return std::pair<uint64_t, uint64_t>{0, 0};
        REQUIRE(::mincore(reinterpret_cast<void *>(addr), n * page, vec.data()) == 0);
        uint64_t in = 0;
        for (uint64_t i = 0; i < n; ++i) in += vec[i] & 1;
        return std::pair<uint64_t, uint64_t>{in, n};
    };
    auto tensor = [&](const std::string &name) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        OK(cmf_tensor(m.get(), name.c_str(), &t));
        REQUIRE(t.dtype == CMF_DTYPE_Q8_ROW);
        return t;
    };
    uint64_t before = 0;
    for (uint64_t l = 0; l < a.layers; ++l) before += resident(tensor(layer(l, "mlp.gate_proj.weight")), 0, a.inter).first;
    if (before != 0) {
        MESSAGE("skipped: the file's pages stay in memory after POSIX_FADV_DONTNEED on this file system");
        return;
    }
    // A long generation with the task.
    cmf_generate_options go;
    cmf_generate_options_init(&go);
    go.max_tokens = 300;
    go.temperature = 0;
    const std::vector<int32_t> pr = prompt();
    cmf_generate_stats st;
    cmf_generate_stats_init(&st);
    OK(cmf_session_generate(s, pr.data(), pr.size(), &go, &st));
    CHECK(st.generated_tokens == 300);
    uint64_t kept_in = 0, kept_pages = 0;
    for (uint64_t l = 0; l < a.layers; ++l)
        for (const char *proj : {"mlp.gate_proj.weight", "mlp.up_proj.weight"}) {
            const cmf_tensor_info t = tensor(layer(l, proj));
            for (uint64_t r0 = 0; r0 < a.inter; r0 += 64) {
                auto [in, n] = resident(t, r0, r0 + 64);
                if (row[r0]) {
                    kept_in += in;
                    kept_pages += n;
                } else {
                    CAPTURE(proj);
                    CAPTURE(r0);
                    CHECK(n >= 2);
                    CHECK(in == 0);  // a dropped run: never read
                }
            }
        }
    // The kept rows were read (so the check above can see residency).
    CHECK(kept_pages > 0);
    CHECK(kept_in == kept_pages);
}

TEST_CASE("tasks: a batch engine runs the selection it is created with, each request as a session with it") {
    TestRuntime trt(CMF_LOG_ERROR);
    Model base = open(trt.rt, converted(trt.rt, "q8"));
    const Arch a = arch_of(base.get());
    Model m = write_two_tasks(trt.rt, base.get(), a, kWork + "/two-tasks-batch.cmf");
    const std::vector<int32_t> in = prompt();
    constexpr size_t kTokens = 8;
    const std::vector<int32_t> alone = greedy_after(trt.rt, m.get(), "code", in, kTokens);
    REQUIRE(alone != greedy_after(trt.rt, m.get(), nullptr, in, kTokens));  // the mask changes the answer

    struct Batch {
        void operator()(cmf_batch *b) const { cmf_batch_free(b); }
    };
    cmf_batch_options bo;
    cmf_batch_options_init(&bo);
    bo.n_slots = 3;
    bo.n_ctx = 256;
    bo.task = "code";
    cmf_batch *raw = nullptr;
    OK(cmf_batch_create_for_model(trt.rt, m.get(), &bo, &raw));
    std::unique_ptr<cmf_batch, Batch> b(raw);
    struct Got {
        std::vector<int32_t> tokens;
        int32_t stop = -1;
    };
    std::vector<Got> got(3);
    for (Got &g : got) {
        cmf_generate_options go;
        cmf_generate_options_init(&go);
        go.max_tokens = kTokens;
        go.temperature = 0;
        go.repetition_penalty = 1;
        go.user = &g;
        go.on_token = [](void *u, int32_t t) -> int32_t {
            static_cast<Got *>(u)->tokens.push_back(t);
            return 0;
        };
        uint64_t id = 0;
        OK(cmf_batch_submit(b.get(), in.data(), in.size(), &go,
                            [](void *u, const cmf_generate_stats *st, const cmf_error *) {
                                static_cast<Got *>(u)->stop = st->stop_reason;
                            },
                            &id));
    }
    uint32_t pending = 1;
    for (int steps = 0; pending > 0 && steps < 100; ++steps) OK(cmf_batch_step(b.get(), 0, &pending));
    for (const Got &g : got) {
        CHECK(g.stop == CMF_STOP_MAX_TOKENS);
        CHECK(g.tokens == alone);
    }
    b.reset();

    // An unknown task lists the file's; a plain model source carries its own
    // selection, so cmf_batch_create refuses one.
    bo.task = "poetry";
    std::string err = take(cmf_batch_create_for_model(trt.rt, m.get(), &bo, &raw));
    CHECK(err.find("NotFound") == 0);
    CHECK(err.find("code, prose") != std::string::npos);
    bo.task = "code";
    cmf_model_source src{};
    src.struct_size = sizeof src;
    err = take(cmf_batch_create(trt.rt, &src, &bo, &raw));
    CHECK(err.find("InvalidArgument") == 0);
}
