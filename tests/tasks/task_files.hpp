// Shared by the task, skill and defrag tests: the work dir, errors as
// text, RAII for models and sessions, austen-tiny converted once per dtype.
#pragma once

#include <doctest/doctest.h>

#include <cmf/cmf.h>

#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <vector>
#include <filesystem>
#include <memory>
#include <string>

namespace tasks_test {

namespace fs = std::filesystem;
namespace bj = boost::json;

// Where the files go: the build's work dir, or CMF_TASKS_WORK_DIR (the CLI
// test runs this binary with its own, as both may run at once).
inline const std::string kWork = std::getenv("CMF_TASKS_WORK_DIR") ? std::getenv("CMF_TASKS_WORK_DIR") : CMF_TASKS_WORK_DIR;

inline std::string take(cmf_error *e) {
    if (e == nullptr) return "";
    std::string m = std::string(cmf_error_code_name(cmf_error_code(e))) + ": " + cmf_error_message(e);
    cmf_error_free(e);
    return m;
}
#define OK(expr) REQUIRE_MESSAGE((expr) == nullptr, #expr)

struct ModelClose {
    void operator()(cmf_model *m) const { cmf_close(m); }
};
using Model = std::unique_ptr<cmf_model, ModelClose>;
struct SessionFree {
    void operator()(cmf_session *s) const { cmf_session_free(s); }
};
using Session = std::unique_ptr<cmf_session, SessionFree>;

inline Model open(cmf_runtime *rt, const std::string &path) {
    cmf_model *m = nullptr;
    cmf_error *e = cmf_open(rt, path.c_str(), nullptr, &m);
    REQUIRE_MESSAGE(e == nullptr, take(e));
    return Model(m);
}

// austen-tiny converted once per dtype into the work dir.
inline std::string converted(cmf_runtime *rt, const std::string &quant) {
    fs::create_directories(kWork);
    const std::string out = kWork + "/austen-" + quant + ".cmf";
    if (fs::exists(out)) return out;
    cmf_convert_options o;
    cmf_convert_options_init(&o);
    const std::string dir = std::string(CMF_SOURCE_ROOT) + "/models/austen-tiny";
    o.model_dir = dir.c_str();
    o.output = out.c_str();
    o.quant = quant.c_str();
    cmf_error *e = cmf_convert(rt, &o);
    REQUIRE_MESSAGE(e == nullptr, take(e));
    return out;
}

// A copy of `src` at `out` with some tensors replaced (payload bytes),
// renamed copies added, an edited arch block and masks.
struct Variant {
    std::map<std::string, std::vector<uint8_t>> replace;
    std::map<std::string, int32_t> retype;  // replaced payloads of another dtype
    std::vector<std::pair<std::string, std::string>> copies;  // (new name, source name), appended
    bool drop_skills = false;                                 // leave out skill.* tensors and the registry
    std::function<void(bj::object &)> edit_arch;
    struct Mask {
        std::string name;
        std::vector<uint8_t> blob;
        float sparsity = 0;
    };
    std::vector<Mask> masks;
    std::string quality_json;                                        // "" = not measured
};

inline void write_variant(cmf_runtime *rt, const cmf_model *src, const std::string &out, const Variant &v) {
    cmf_model_info info;
    cmf_model_info_init(&info);
    OK(cmf_model_get_info(src, &info));
    bj::object header = bj::parse(std::string(info.header_json, info.header_json_len)).as_object();
    header.erase("section_hashes");
    if (v.drop_skills) header.erase("skills");
    if (v.edit_arch) v.edit_arch(header["arch"].as_object());
    const std::string text = bj::serialize(header);
    cmf_writer *w = nullptr;
    OK(cmf_writer_create(rt, out.c_str(), text.data(), text.size(), nullptr, &w));
    std::unique_ptr<cmf_writer, void (*)(cmf_writer *)> guard(w, cmf_writer_free);
    auto add = [&](const std::string &name, const cmf_tensor_info &t) {
        auto it = v.replace.find(name);
        const void *data = it != v.replace.end() ? it->second.data() : t.data;
        const uint64_t nbytes = it != v.replace.end() ? it->second.size() : t.nbytes;
        auto rt_it = v.retype.find(name);
        const int32_t dtype = rt_it != v.retype.end() ? rt_it->second : t.dtype;
        OK(cmf_writer_add_tensor(w, name.c_str(), dtype, t.ndim, t.shape, data, nbytes));
    };
    for (size_t i = 0; i < cmf_tensor_count(src); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        OK(cmf_tensor_at(src, i, &t));
        if (v.drop_skills && std::strncmp(t.name, "skill.", 6) == 0) continue;
        add(t.name, t);
    }
    for (const auto &[name, from] : v.copies) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        OK(cmf_tensor(src, from.c_str(), &t));
        add(name, t);
    }
    uint32_t id = 0;
    for (const auto &mk : v.masks) {
        cmf_mask_spec ms;
        cmf_mask_spec_init(&ms);
        ms.task_id = id++;
        ms.name = mk.name.c_str();
        ms.blob = mk.blob.data();
        ms.blob_len = mk.blob.size();
        ms.sparsity = mk.sparsity;
        ms.quality_json = v.quality_json.empty() ? nullptr : v.quality_json.c_str();
        OK(cmf_writer_add_mask(w, &ms));
    }
    const void *vocab = nullptr;
    uint64_t vlen = 0;
    OK(cmf_model_vocab(src, &vocab, &vlen));
    OK(cmf_writer_set_vocab(w, vocab, vlen));
    cmf_error *e = cmf_writer_finish(w);
    REQUIRE_MESSAGE(e == nullptr, take(e));
}

// What a session runs of the model (cmf_session_options' selection).
struct Pick {
    const char *task = nullptr, *skill = nullptr, *blend = nullptr;
};

inline std::vector<float> logits_all(cmf_runtime *rt, const cmf_model *m, const std::vector<int32_t> &tokens, Pick pick,
                                     std::string *error = nullptr) {
    cmf_session_options o;
    cmf_session_options_init(&o);
    o.n_ctx = 256;
    o.task = pick.task;
    o.skill = pick.skill;
    o.blend = pick.blend;
    cmf_session *s = nullptr;
    cmf_error *e = cmf_session_create_for_model(rt, m, &o, &s);
    if (error != nullptr) {
        *error = take(e);
        if (!error->empty()) return {};
    } else {
        REQUIRE_MESSAGE(e == nullptr, take(e));
    }
    Session sess(s);
    const uint64_t V = cmf_session_vocab_size(s);
    std::vector<float> out(tokens.size() * V);
    OK(cmf_session_eval(s, tokens.data(), tokens.size(), CMF_LOGITS_ALL, out.data(), out.size()));
    // Decode one token more after the prefill: the masked decode path too.
    std::vector<float> last(V);
    const int32_t next = tokens.front();
    OK(cmf_session_eval(s, &next, 1, CMF_LOGITS_LAST, last.data(), last.size()));
    out.insert(out.end(), last.begin(), last.end());
    return out;
}

inline double max_rel_diff(const std::vector<float> &a, const std::vector<float> &b) {
    REQUIRE(a.size() == b.size());
    double scale = 0, d = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        scale = std::max(scale, double(std::fabs(b[i])));
        d = std::max(d, double(std::fabs(a[i] - b[i])));
    }
    return d / std::max(scale, 1e-30);
}

inline std::vector<int32_t> prompt() {
    std::mt19937 rng(7);
    std::vector<int32_t> t(24);
    for (auto &x : t) x = int32_t(rng() % 4000);
    return t;
}

// Greedy tokens after `in`, one decode step each; with `route_stats`, the
// session's routing statistics afterwards (what run --route-stats writes).
inline std::vector<int32_t> greedy_after(cmf_runtime *rt, const cmf_model *m, const char *task, std::vector<int32_t> in, size_t n,
                                         std::string *route_stats = nullptr) {
    cmf_session_options o;
    cmf_session_options_init(&o);
    o.n_ctx = 256;
    o.task = task;
    cmf_session *s = nullptr;
    cmf_error *e = cmf_session_create_for_model(rt, m, &o, &s);
    REQUIRE_MESSAGE(e == nullptr, take(e));
    Session sess(s);
    std::vector<float> logits(cmf_session_vocab_size(s));
    std::vector<int32_t> out;
    for (size_t i = 0; i < n; ++i) {
        OK(cmf_session_eval(s, in.data(), in.size(), CMF_LOGITS_LAST, logits.data(), logits.size()));
        const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(next);
        in = {next};
    }
    if (route_stats != nullptr) {
        char *j = nullptr;
        OK(cmf_session_route_stats(s, &j));
        *route_stats = j;
        cmf_string_free(j);
    }
    return out;
}

inline bj::object header_of(const cmf_model *m) {
    cmf_model_info info;
    cmf_model_info_init(&info);
    OK(cmf_model_get_info(m, &info));
    return bj::parse(std::string(info.header_json, info.header_json_len)).as_object();
}

inline cmf_tensor_info tensor_of(const cmf_model *m, const std::string &name) {
    cmf_tensor_info t;
    cmf_tensor_info_init(&t);
    cmf_error *e = cmf_tensor(m, name.c_str(), &t);
    REQUIRE_MESSAGE(e == nullptr, name << ": " << take(e));
    return t;
}

// The shape numbers masks are made of.
struct Arch {
    uint64_t layers, heads, kv_heads, head_dim, inter, hidden, loops = 1;
};

inline Arch arch_of(const cmf_model *m) {
    cmf_model_info info;
    cmf_model_info_init(&info);
    OK(cmf_model_get_info(m, &info));
    bj::object a = bj::parse(info.arch_json).as_object();
    Arch r{};
    r.layers = a.at("num_layers").to_number<uint64_t>();
    r.heads = a.at("num_attention_heads").to_number<uint64_t>();
    r.kv_heads = a.at("num_kv_heads").to_number<uint64_t>();
    r.head_dim = a.at("head_dim").to_number<uint64_t>();
    r.inter = a.at("intermediate_size").to_number<uint64_t>();
    r.hidden = a.at("hidden_size").to_number<uint64_t>();
    return r;
}

// What a mask keeps: per visit the live neurons, per layer live heads and the gate.
struct MaskPlan {
    std::vector<std::vector<bool>> ffn;    // visits x inter
    std::vector<std::vector<bool>> heads;  // layers x heads
    std::vector<bool> alive;               // layers
};

inline std::vector<uint8_t> blob_of(const Arch &a, const MaskPlan &p) {
    auto bytes = [](uint64_t bits) { return (bits + 7) / 8; };
    std::vector<uint8_t> b;
    auto put_row = [&](const std::vector<bool> &row, uint64_t bits) {
        std::vector<uint8_t> r(bytes(bits), 0);
        for (uint64_t i = 0; i < bits; ++i)
            if (row[i]) r[i / 8] |= uint8_t(1u << (i % 8));
        b.insert(b.end(), r.begin(), r.end());
    };
    for (const auto &row : p.ffn) put_row(row, a.inter);
    for (const auto &row : p.heads) put_row(row, a.heads);
    put_row(p.alive, a.layers);
    return b;
}

inline float sparsity_of(const MaskPlan &p) {
    uint64_t on = 0, all = 0;
    for (const auto &row : p.ffn)
        for (bool x : row) on += x, ++all;
    return 1.0f - float(on) / float(all);
}

}  // namespace tasks_test
