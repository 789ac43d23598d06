// The parity fixtures of tests/runtime: a case directory written by
// make_reference.py / make_reference_moe_hybrid.py (index.json, weights.f32,
// logits.f32, hf/) loaded as a model source, and the comparisons the
// parity tests share.
#pragma once

#include <doctest/doctest.h>

#include "half.hpp"
#include "runtime/memory_source.hpp"
#include "runtime/session.hpp"

#include <cmf/cmf.h>

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace parity {

using cmf::runtime::MemoryModel;
using cmf::runtime::Session;


inline std::vector<float> read_f32(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f.good(), "cannot read " << path);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
    return v;
}

struct Case {
    std::string arch_json;
    std::vector<float> weights, logits;
    struct T {
        std::string name;
        std::vector<uint64_t> shape;
        uint64_t offset, count;
    };
    std::vector<T> tensors;
    std::vector<int32_t> prompt, greedy;
    uint64_t positions = 0, vocab = 0;
};

inline Case load_case(const std::string &dir) {
    Case c;
    simdjson::dom::parser parser;
    simdjson::padded_string json;
    REQUIRE(simdjson::padded_string::load(dir + "/index.json").get(json) == simdjson::SUCCESS);
    simdjson::dom::element root = parser.parse(json);
    c.arch_json = simdjson::minify(root["arch"]);
    for (simdjson::dom::element t : root["tensors"].get_array()) {
        Case::T e;
        e.name = std::string(std::string_view(t["name"]));
        e.count = 1;
        for (simdjson::dom::element d : t["shape"].get_array()) {
            e.shape.push_back(uint64_t(d));
            e.count *= uint64_t(d);
        }
        e.offset = uint64_t(t["offset"]);
        c.tensors.push_back(e);
    }
    for (simdjson::dom::element x : root["prompt"].get_array()) c.prompt.push_back(int32_t(int64_t(x)));
    for (simdjson::dom::element x : root["greedy"].get_array()) c.greedy.push_back(int32_t(int64_t(x)));
    c.positions = uint64_t(root["positions"]);
    c.vocab = uint64_t(root["vocab"]);
    c.weights = read_f32(dir + "/weights.f32");
    c.logits = read_f32(dir + "/logits.f32");
    REQUIRE(c.logits.size() == c.positions * c.vocab);
    return c;
}

// The case's weights as a model source, every tensor stored as `dtype`.
inline std::unique_ptr<MemoryModel> model_of(const Case &c, int32_t dtype) {
    auto m = std::make_unique<MemoryModel>();
    m->set_arch_json(c.arch_json);
    for (const auto &t : c.tensors) {
        const float *src = c.weights.data() + t.offset;
        REQUIRE(t.offset + t.count <= c.weights.size());
        if (dtype == CMF_DTYPE_F32) {
            m->add_borrowed(t.name, dtype, t.shape, src, t.count * 4);
            continue;
        }
        std::vector<uint8_t> bytes(t.count * 2);
        for (uint64_t i = 0; i < t.count; ++i) {
            uint16_t h = dtype == CMF_DTYPE_F16 ? cmf::codecs::f32_to_f16(src[i]) : cmf::codecs::f32_to_bf16(src[i]);
            std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
        m->add(t.name, dtype, t.shape, std::move(bytes));
    }
    return m;
}

// max |a - b| / max |ref|: the error relative to the logit scale.
inline double rel_err(const float *a, const float *ref, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; ++i) {
        d = std::max(d, double(std::fabs(a[i] - ref[i])));
        s = std::max(s, double(std::fabs(ref[i])));
    }
    return d / std::max(s, 1e-30);
}

inline std::vector<int32_t> sequence_of(const Case &c) {
    std::vector<int32_t> seq = c.prompt;
    seq.insert(seq.end(), c.greedy.begin(), c.greedy.end() - 1);
    return seq;
}

inline std::vector<float> all_logits(Session &s, const std::vector<int32_t> &seq) {
    std::vector<float> out(seq.size() * s.vocab_size());
    s.truncate(0);
    s.eval(seq, CMF_LOGITS_ALL, out.data());
    return out;
}

// Token-by-token decode of seq[0..n) from an empty cache: the worst
// rel_err of a step's logits against `full`, the batched logits of seq.
inline double kv_decode_error(Session &s, const std::vector<int32_t> &seq, size_t n, const std::vector<float> &full) {
    const uint64_t vocab = s.vocab_size();
    std::vector<float> step(vocab);
    s.truncate(0);
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
        s.eval(std::span<const int32_t>(&seq[i], 1), CMF_LOGITS_LAST, step.data());
        worst = std::max(worst, rel_err(step.data(), full.data() + i * vocab, vocab));
    }
    return worst;
}

// The directory of one reference case under CMF_PARITY_DIR.
inline std::string parity_dir(const std::string &name) {
    const char *root = std::getenv("CMF_PARITY_DIR");
    REQUIRE_MESSAGE(root != nullptr, "CMF_PARITY_DIR is not set (run through meson test)");
    return std::string(root) + "/" + name;
}

// The case's prompt continued greedily by generate(): the ids and the stats.
inline std::pair<std::vector<int32_t>, cmf::runtime::GenerateStats> greedy_ids(Session &s, const Case &c) {
    cmf::runtime::GenerateConfig g;
    g.max_tokens = uint32_t(c.greedy.size());
    g.sampler.temperature = 0;
    g.sampler.repetition_penalty = 1.0f;
    std::vector<int32_t> produced;
    g.on_token = [&](int32_t tok) {
        produced.push_back(tok);
        return true;
    };
    auto st = s.generate(c.prompt, g);
    return {produced, st};
}

}  // namespace parity
