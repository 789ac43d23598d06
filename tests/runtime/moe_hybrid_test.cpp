// The mixture-of-experts and hybrid Qwen families against the PyTorch
// reference of make_reference_moe_hybrid.py (dir in CMF_PARITY_DIR):
//  - logits at every position of prompt + greedy continuation (one batched
//    prefill: the chunked delta rule, the experts' GEMMs) within 1e-4 of the
//    reference's logit scale;
//  - generate(): the 32 greedy tokens;
//  - decode one token at a time (the recurrence, each expert's row loop)
//    equal to the batched prefill, and so is prefill in 7-token chunks;
//  - a two-token forward equals two one-token forwards bit for bit, and the
//    one-position rollback restores the state exactly (what speculative
//    decoding relies on); truncating further back replays;
//  - routing statistics count top_k picks per MoE layer and position;
//  - several sequences in one batched pass (forward_batch, as `cmfhost
//    serve` runs them) get the logits and routing counts each gets alone,
//    bit for bit, and the batch engine their greedy tokens;
//  - the HF checkpoint converted with cmf_convert (f32) runs to the same
//    logits: the converter's fused-GDN split, wrappers and expert names.
#include <doctest/doctest.h>
#include "support/batch_helpers.hpp"
#include "support/test_runtime.hpp"
#include "parity_case.hpp"

#include "common/error.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/bound_model.hpp"
#include "runtime/session.hpp"

#include <cmf/cmf.h>

#include <simdjson.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace parity;
using cmf::runtime::GenerateConfig;
using cmf::runtime::SessionConfig;

namespace {

void require_ok(cmf_error *e, const std::string &what) {
    std::string msg = e ? cmf_error_message(e) : "";
    cmf_error_free(e);
    REQUIRE_MESSAGE(msg.empty(), what << ": " << msg);
}

bool same_bits(const float *a, const float *b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Routing counts of the arch block's MoE layers from the session's JSON:
// total picks per layer.
std::vector<uint64_t> route_totals(const std::string &json, size_t &layers) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc = parser.parse(json);
    std::vector<uint64_t> totals;
    layers = 0;
    for (auto [key, value] : doc.get_object()) {
        (void)key;
        ++layers;
        uint64_t sum = 0;
        for (simdjson::dom::element c : value.get_array()) sum += uint64_t(c);
        totals.push_back(sum);
    }
    return totals;
}

void run_case(const std::string &name) {
    const std::string dir = parity_dir(name);
    Case c = load_case(dir);
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    SessionConfig cfg;
    cfg.n_ctx = 128;
    Session s(*t.rt, *model->source(), cfg);
    REQUIRE(s.vocab_size() == c.vocab);
    const auto seq = sequence_of(c);
    const uint64_t V = c.vocab;

    // 1. Logits at every position.
    auto got = all_logits(s, seq);
    double worst = 0;
    for (uint64_t p = 0; p < c.positions; ++p)
        worst = std::max(worst, rel_err(got.data() + p * V, c.logits.data() + p * V, V));
    MESSAGE(name << " f32: max |logit diff| / max |ref logit| over " << c.positions << " positions = " << worst);
    CHECK(worst < 1e-4);

    // 2. Greedy continuation through generate().
    s.truncate(0);
    auto [produced, st] = greedy_ids(s, c);
    CHECK(st.stop_reason == CMF_STOP_MAX_TOKENS);
    CHECK(produced == c.greedy);

    // 3. One token at a time (the recurrence) equals the batched prefill
    //    (the chunked form), and so does prefill in 7-token chunks.
    const double kv_worst = kv_decode_error(s, seq, seq.size(), got);
    MESSAGE(name << " decode one token at a time vs batched prefill: " << kv_worst);
    CHECK(kv_worst < 1e-5);
    SessionConfig chunked = cfg;
    chunked.n_batch = 7;
    Session s7(*t.rt, *model->source(), chunked);
    auto got7 = all_logits(s7, seq);
    CHECK(rel_err(got7.data(), got.data(), got.size()) < 1e-5);

    // 4. A two-token forward equals two one-token forwards, bit for bit, and
    //    undoing its last position restores the state exactly.
    const size_t P = c.prompt.size();
    std::vector<float> one(V), two(2 * V), after(V), undo(V);
    s.truncate(0);
    s.eval(std::span<const int32_t>(c.prompt.data(), P - 1), CMF_LOGITS_NONE, nullptr);
    s.eval(std::span<const int32_t>(&c.prompt[P - 1], 1), CMF_LOGITS_LAST, one.data());
    s.eval(std::span<const int32_t>(&c.greedy[0], 1), CMF_LOGITS_LAST, after.data());
    s.truncate(P - 1);
    const int32_t pair[2] = {c.prompt[P - 1], c.greedy[0]};
    s.eval(pair, CMF_LOGITS_ALL, two.data());
    CHECK(same_bits(two.data(), one.data(), V));
    CHECK(same_bits(two.data() + V, after.data(), V));
    // Undo the second position (a rejected draft), forward another token:
    // the same bits as forwarding that token straight after the first.
    const int32_t other = (c.greedy[0] + 1) % int32_t(V);
    s.truncate(P);
    s.eval(std::span<const int32_t>(&other, 1), CMF_LOGITS_LAST, undo.data());
    Session fresh(*t.rt, *model->source(), cfg);
    std::vector<float> direct(V);
    fresh.eval(std::span<const int32_t>(c.prompt.data(), P - 1), CMF_LOGITS_NONE, nullptr);
    fresh.eval(std::span<const int32_t>(&c.prompt[P - 1], 1), CMF_LOGITS_NONE, nullptr);
    fresh.eval(std::span<const int32_t>(&other, 1), CMF_LOGITS_LAST, direct.data());
    CHECK(same_bits(undo.data(), direct.data(), V));
    // Further back: hybrids replay the kept tokens (the session does it).
    s.truncate(P / 2);
    s.eval(std::span<const int32_t>(c.prompt.data() + P / 2, P - P / 2), CMF_LOGITS_LAST, undo.data());
    CHECK(rel_err(undo.data(), got.data() + (P - 1) * V, V) < 1e-5);
}

void run_route_stats(const std::string &name, size_t moe_layers, uint64_t top_k) {
    Case c = load_case(parity_dir(name));
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    cmf_session_options so;
    cmf_session_options_init(&so);
    so.n_ctx = 128;
    cmf_session *raw = nullptr;
    require_ok(cmf_session_create(t.rt, model->source(), &so, &raw), "cmf_session_create");
    std::unique_ptr<cmf_session, decltype(&cmf_session_free)> s(raw, cmf_session_free);
    char *json = nullptr;
    require_ok(cmf_session_route_stats(s.get(), &json), "cmf_session_route_stats");
    size_t layers = 0;
    for (uint64_t total : route_totals(json, layers)) CHECK(total == 0);
    cmf_string_free(json);
    CHECK(layers == moe_layers);
    // 64 prompt positions, then one forward of two positions whose last is
    // undone: 65 positions counted.
    std::vector<float> logits(c.vocab * 2);
    require_ok(cmf_session_eval(s.get(), c.prompt.data(), c.prompt.size(), CMF_LOGITS_NONE, nullptr, 0), "eval");
    const int32_t pair[2] = {c.greedy[0], c.greedy[1]};
    require_ok(cmf_session_eval(s.get(), pair, 2, CMF_LOGITS_ALL, logits.data(), logits.size()), "eval pair");
    require_ok(cmf_session_truncate(s.get(), c.prompt.size() + 1), "truncate");
    require_ok(cmf_session_route_stats(s.get(), &json), "cmf_session_route_stats");
    const std::string text = json;
    cmf_string_free(json);
    MESSAGE(name << " routing counts: " << text);
    for (uint64_t total : route_totals(text, layers)) CHECK(total == (c.prompt.size() + 1) * top_k);
    CHECK(layers == moe_layers);
    CHECK(text.find(' ') == std::string::npos);  // compact
}

// The HF checkpoint of the case (in dir/`hf`) converted at f32 and run from the file.
void run_converted(const std::string &name, const std::string &checkpoint = "hf") {
    const std::string dir = parity_dir(name);
    Case c = load_case(dir);
    TestRuntime t;
    const std::string out = dir + "/f32.cmf", hf = dir + "/" + checkpoint;
    cmf_convert_options co;
    cmf_convert_options_init(&co);
    co.model_dir = hf.c_str();
    co.output = out.c_str();
    co.quant = "f32";
    require_ok(cmf_convert(t.rt, &co), "cmf_convert " + hf);
    cmf_model *opened = nullptr;
    require_ok(cmf_open(t.rt, out.c_str(), nullptr, &opened), "cmf_open " + out);
    std::unique_ptr<cmf_model, decltype(&cmf_close)> m(opened, cmf_close);
    cmf_session_options so;
    cmf_session_options_init(&so);
    so.n_ctx = 128;
    cmf_session *raw = nullptr;
    require_ok(cmf_session_create_for_model(t.rt, m.get(), &so, &raw), "cmf_session_create_for_model");
    std::unique_ptr<cmf_session, decltype(&cmf_session_free)> s(raw, cmf_session_free);
    const auto seq = sequence_of(c);
    std::vector<float> got(seq.size() * c.vocab);
    require_ok(cmf_session_eval(s.get(), seq.data(), seq.size(), CMF_LOGITS_ALL, got.data(), got.size()), "eval");
    double worst = 0;
    for (uint64_t p = 0; p < c.positions; ++p)
        worst = std::max(worst, rel_err(got.data() + p * c.vocab, c.logits.data() + p * c.vocab, c.vocab));
    MESSAGE(name << " converted from the HF checkpoint " << checkpoint << " (f32): " << worst);
    CHECK(worst < 1e-4);
    s.reset();
    m.reset();
    std::remove(out.c_str());
}

}  // namespace

TEST_CASE("parity: qwen2_moe (shared expert, sparse every other layer, no renormalisation)") { run_case("qwen2_moe"); }
TEST_CASE("parity: qwen3_moe (renormalised top-k, a dense layer)") { run_case("qwen3_moe"); }
TEST_CASE("parity: qwen3_next (gated delta net, output-gated attention, MoE + shared)") { run_case("qwen3_next"); }
TEST_CASE("parity: qwen3_5 (gated delta net, output-gated attention, dense)") { run_case("qwen3_5"); }
TEST_CASE("parity: qwen3_5_moe (gated delta net, output-gated attention, MoE + shared)") { run_case("qwen3_5_moe"); }
TEST_CASE("parity: qwen3_5 with an MTP head (the trunk as without it)") { run_case("qwen3_5_mtp"); }
TEST_CASE("parity: qwen3 with an MTP head (the trunk as without it)") { run_case("qwen3_mtp"); }

TEST_CASE("parity: routing statistics count top_k picks per MoE layer, a rolled-back position uncounted") {
    run_route_stats("qwen2_moe", 2, 2);
    run_route_stats("qwen3_moe", 3, 2);
    run_route_stats("qwen3_next", 4, 2);
    run_route_stats("qwen3_5", 0, 2);
}

TEST_CASE("parity: MoE and hybrid HF checkpoints (qwen3_5/qwen3_5_moe also text-only) convert and run to the reference logits") {
    for (const char *name : {"qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_mtp", "qwen3_mtp"}) {
        CAPTURE(name);
        run_converted(name);
    }
    // Text-only checkpoints: model_type qwen3_5_text / qwen3_5_moe_text.
    run_converted("qwen3_5", "hf_text");
    run_converted("qwen3_5_moe", "hf_text");
}

// ---- batched passes over several sequences ---------------------------------------

namespace {

cmf_forward_args step_args(const int32_t *tokens, uint32_t n, uint64_t pos, float *logits) {
    return forward_args(tokens, n, pos, CMF_LOGITS_LAST, logits);
}

// k sequences (prompts cut from the case's, of different lengths): each
// alone (its prompt, then `steps` greedy tokens, one forward each), then
// all of them again with every decode step one forward_batch over all k.
// The gated delta net runs each sequence's recurrence on its own state, the
// experts' matmuls take every sequence's tokens together: below 4 rows the
// f32 weights stay on the row kernels one token uses, so the same bits;
// from 4 the f32 GEMM sums in another order (within 1e-5 of the logit scale).
// Routing counts are exact either way.
void run_batched(const std::string &name, size_t k, size_t steps) {
    Case c = load_case(parity_dir(name));
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    cmf::runtime::BoundModel bm(*t.rt, *model->source(), cmf::runtime::BindConfig{});
    REQUIRE(bm.forward_batch(0, nullptr, nullptr) == nullptr);  // the probe: this model batches
    const uint64_t V = bm.vocab_size();
    std::vector<std::vector<int32_t>> ps;
    for (size_t i = 0; i < k; ++i)
        ps.emplace_back(c.prompt.begin() + i, c.prompt.begin() + std::min(c.prompt.size(), 9 + 5 * i));
    std::vector<std::vector<int32_t>> toks(k);
    std::vector<std::vector<std::vector<float>>> ref(k);
    std::vector<std::string> ref_routes(k);
    for (size_t i = 0; i < k; ++i) {
        cmf_arch_state *s = bm.state_create(128);
        std::vector<float> l(V);
        bm.forward(s, step_args(ps[i].data(), uint32_t(ps[i].size()), 0, l.data()));
        ref[i].push_back(l);
        for (size_t j = 0; j < steps; ++j) {
            toks[i].push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
            bm.forward(s, step_args(&toks[i].back(), 1, ps[i].size() + j, l.data()));
            ref[i].push_back(l);
        }
        ref_routes[i] = bm.route_stats(s);
        bm.state_free(s);
    }
    std::vector<cmf_arch_state *> st(k);
    std::vector<std::vector<float>> l(k, std::vector<float>(V));
    bool exact = true;
    double worst = 0;
    auto compare = [&](size_t i, size_t j) {
        exact = exact && same_bits(l[i].data(), ref[i][j].data(), V);
        worst = std::max(worst, rel_err(l[i].data(), ref[i][j].data(), V));
    };
    for (size_t i = 0; i < k; ++i) {
        st[i] = bm.state_create(128);
        cmf_forward_args a = step_args(ps[i].data(), uint32_t(ps[i].size()), 0, l[i].data());
        const cmf_forward_args *ap = &a;
        cmf::throw_if_error(bm.forward_batch(1, &st[i], &ap));
        compare(i, 0);
    }
    for (size_t j = 0; j < steps; ++j) {
        std::vector<cmf_forward_args> a(k);
        std::vector<const cmf_forward_args *> ap(k);
        for (size_t i = 0; i < k; ++i) {
            a[i] = step_args(&toks[i][j], 1, ps[i].size() + j, l[i].data());
            ap[i] = &a[i];
        }
        cmf::throw_if_error(bm.forward_batch(uint32_t(k), st.data(), ap.data()));
        for (size_t i = 0; i < k; ++i) compare(i, j + 1);
    }
    MESSAGE(name << ", " << k << " sequences batched: largest difference " << worst << " of the logit scale, bit-identical: " << exact);
    if (k < 4)
        CHECK(exact);
    else
        CHECK(worst < 1e-5);
    for (size_t i = 0; i < k; ++i) {
        CAPTURE(i);
        CHECK(bm.route_stats(st[i]) == ref_routes[i]);
        bm.state_free(st[i]);
    }
}

// The batch engine (as `cmfhost serve` drives it): 5 requests over 3 slots,
// prompts prefilled in 8-token chunks between decode passes, give the
// greedy tokens each gets from a session alone (within the chunked delta
// rule's rounding: the test's prompts lead to clear argmaxes).
void run_engine(const std::string &name) {
    Case c = load_case(parity_dir(name));
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    std::vector<std::vector<int32_t>> ps;
    for (size_t i = 0; i < 5; ++i) ps.emplace_back(c.prompt.begin() + 3 * i, c.prompt.begin() + 20 + 7 * i);
    std::vector<std::vector<int32_t>> alone;
    SessionConfig sc;
    sc.n_ctx = 128;
    cmf::runtime::Session sess(*t.rt, *model->source(), sc);
    for (const auto &p : ps) alone.push_back(greedy_session_tokens(sess, p, 10));
    cmf::runtime::BatchConfig cfg;
    cfg.n_slots = 3;
    cfg.n_ctx = 128;
    cfg.prefill_chunk = 8;
    cmf::runtime::BatchEngine eng(*t.rt, *model->source(), cfg);
    CHECK(eng.batched());
    std::vector<std::vector<int32_t>> got(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) eng.submit(greedy_batch_request(ps[i], 10, got[i]));
    run_until_idle(eng);
    for (size_t i = 0; i < ps.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i] == alone[i]);
    }
}

}  // namespace

TEST_CASE("parity: batched passes over several sequences give each its logits and routing counts alone") {
    for (const char *name : {"qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"}) {
        CAPTURE(name);
        run_batched(name, 3, 6);
        run_batched(name, 6, 4);
    }
}

TEST_CASE("parity: the batch engine gives MoE and hybrid requests the tokens each gets alone") {
    for (const char *name : {"qwen3_moe", "qwen3_5_moe"}) {
        CAPTURE(name);
        run_engine(name);
    }
}

// ---- MTP: the draft head and speculative decoding ------------------------------

namespace {

// The draft head's logits after the prompt and after each greedy token
// against the reference's (entry p reads the token at p + 1).
void run_mtp_parity(const std::string &name) {
    const std::string dir = parity_dir(name);
    Case c = load_case(dir);
    const std::vector<float> ref = read_f32(dir + "/mtp_logits.f32");
    REQUIRE(ref.size() == (c.positions - 1) * c.vocab);
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    SessionConfig cfg;
    cfg.n_ctx = 128;
    Session s(*t.rt, *model->source(), cfg);
    REQUIRE(s.has_draft());
    const auto seq = sequence_of(c);
    const size_t P = c.prompt.size();
    std::vector<float> d(c.vocab);
    s.eval(std::span<const int32_t>(seq.data(), P), CMF_LOGITS_NONE, nullptr);
    double worst = 0;
    for (size_t p = P; p < seq.size(); ++p) {
        s.draft(seq[p], d.data());  // entry p - 1 (the first call catches up entries 0..P-1)
        worst = std::max(worst, rel_err(d.data(), ref.data() + (p - 1) * c.vocab, c.vocab));
        s.eval(std::span<const int32_t>(&seq[p], 1), CMF_LOGITS_NONE, nullptr);
    }
    MESSAGE(name << " MTP draft logits vs reference: " << worst);
    CHECK(worst < 1e-4);
    // Drafting again for the same position with another token redoes the entry.
    s.truncate(seq.size() - 1);
    s.draft(seq[P], d.data());
    s.draft(seq.back(), d.data());
    CHECK(rel_err(d.data(), ref.data() + (seq.size() - 2) * c.vocab, c.vocab) < 1e-4);
    // mtp=off: no draft head, the same trunk logits.
    SessionConfig off = cfg;
    off.arch_options = "mtp=off";
    Session so(*t.rt, *model->source(), off);
    CHECK_FALSE(so.has_draft());
    std::vector<float> a(c.vocab), b(c.vocab);
    s.truncate(0);
    s.eval(std::span<const int32_t>(seq.data(), P), CMF_LOGITS_LAST, a.data());
    so.eval(std::span<const int32_t>(seq.data(), P), CMF_LOGITS_LAST, b.data());
    CHECK(same_bits(a.data(), b.data(), c.vocab));
    CHECK_THROWS_AS(so.draft(seq[P], d.data()), cmf::Error);
}

// Greedy speculative decoding gives plain greedy decoding's tokens, and
// leaves the state exactly as plain decoding does: the logits of one more
// token are the same bits.
void run_speculative_greedy(const std::string &name, const std::string &options) {
    Case c = load_case(parity_dir(name));
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    SessionConfig cfg;
    cfg.n_ctx = 1024;
    cfg.arch_options = options;
    Session spec(*t.rt, *model->source(), cfg), plain(*t.rt, *model->source(), cfg);
    GenerateConfig g;
    g.max_tokens = 600;
    g.sampler.temperature = 0;
    g.sampler.repetition_penalty = 1.0f;
    std::vector<int32_t> a, b;
    g.on_token = [&](int32_t tok) {
        a.push_back(tok);
        return true;
    };
    auto st = spec.generate(c.prompt, g);
    g.speculative = false;
    g.on_token = [&](int32_t tok) {
        b.push_back(tok);
        return true;
    };
    auto sp = plain.generate(c.prompt, g);
    MESSAGE(name << " (" << options << "): " << st.draft_accepted << " of " << st.draft_tokens
                 << " drafts accepted over " << st.generated_tokens << " tokens");
    CHECK(a.size() == 600);
    CHECK(a == b);
    CHECK(sp.draft_tokens == 0);
    CHECK(st.draft_tokens > 100);
    CHECK(st.draft_accepted > 50);                       // the accept path ran
    CHECK(st.draft_tokens - st.draft_accepted > 50);     // and the rollback path
    CHECK(spec.tokens() == plain.tokens());
    std::vector<float> la(c.vocab), lb(c.vocab);
    const int32_t next = 5;
    spec.eval(std::span<const int32_t>(&next, 1), CMF_LOGITS_LAST, la.data());
    plain.eval(std::span<const int32_t>(&next, 1), CMF_LOGITS_LAST, lb.data());
    CHECK(same_bits(la.data(), lb.data(), c.vocab));
}

// Speculative sampling keeps the sampler's distribution: the first two
// generated tokens of many seeded runs against their exact probabilities
// (the second one is the speculatively sampled token), chi-square. The
// head's eh_proj is replaced by a random matrix first, so that its drafts
// follow a distribution unlike the trunk's: keeping a draft when it should
// be rejected, or resampling from anything but max(0, p - q), then shows.
void run_speculative_sampling(const std::string &name) {
    Case c = load_case(parity_dir(name));
    for (const auto &tensor : c.tensors)
        if (tensor.name == "model.mtp.eh_proj.weight") {
            std::mt19937 gen(7);
            std::normal_distribution<float> nd(0.0f, 0.3f);
            for (uint64_t i = 0; i < tensor.count; ++i) c.weights[tensor.offset + i] = nd(gen);
        }
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    SessionConfig cfg;
    cfg.n_ctx = 64;
    Session s(*t.rt, *model->source(), cfg);
    const uint64_t V = c.vocab;
    const std::vector<int32_t> prompt(c.prompt.begin(), c.prompt.begin() + 8);
    GenerateConfig g;
    g.max_tokens = 2;
    g.sampler.temperature = 0.7f;
    g.sampler.top_k = 0;
    g.sampler.top_p = 1.0f;
    g.sampler.min_p = 0.0f;
    g.sampler.repetition_penalty = 1.0f;
    // Exact probabilities: p(t1) after the prompt, p(t2 | t1) after t1.
    auto softmax = [&](const std::vector<float> &l) {
        std::vector<double> p(V);
        const float mx = *std::max_element(l.begin(), l.end());
        double z = 0;
        for (uint64_t i = 0; i < V; ++i) z += p[i] = std::exp((double(l[i]) - mx) / 0.7);
        for (double &x : p) x /= z;
        return p;
    };
    std::vector<float> l(V);
    s.truncate(0);
    s.eval(prompt, CMF_LOGITS_LAST, l.data());
    const std::vector<double> p1 = softmax(l);
    std::vector<std::vector<double>> p2(V);
    const int runs = 20000;
    std::vector<uint64_t> count(V * V, 0);
    uint64_t drafted = 0, accepted = 0;
    for (int r = 0; r < runs; ++r) {
        s.truncate(0);
        std::vector<int32_t> got;
        g.sampler.seed = uint64_t(r);
        g.on_token = [&](int32_t tok) {
            got.push_back(tok);
            return true;
        };
        auto st = s.generate(prompt, g);
        drafted += st.draft_tokens;
        accepted += st.draft_accepted;
        REQUIRE(got.size() == 2);
        ++count[uint64_t(got[0]) * V + uint64_t(got[1])];
    }
    // Cells with an expected count >= 5; the rest pooled.
    double chi2 = 0, pooled_obs = 0, pooled_exp = 0;
    int cells = 0;
    for (uint64_t t1 = 0; t1 < V; ++t1) {
        if (p1[t1] * runs < 5) {
            for (uint64_t t2 = 0; t2 < V; ++t2) pooled_obs += double(count[t1 * V + t2]);
            pooled_exp += p1[t1] * runs;
            continue;
        }
        if (p2[t1].empty()) {
            s.truncate(0);
            std::vector<int32_t> ctx = prompt;
            ctx.push_back(int32_t(t1));
            s.eval(ctx, CMF_LOGITS_LAST, l.data());
            p2[t1] = softmax(l);
        }
        for (uint64_t t2 = 0; t2 < V; ++t2) {
            const double e = p1[t1] * p2[t1][t2] * runs, o = double(count[t1 * V + t2]);
            if (e >= 5) {
                chi2 += (o - e) * (o - e) / e;
                ++cells;
            } else {
                pooled_obs += o;
                pooled_exp += e;
            }
        }
    }
    if (pooled_exp > 0) {
        chi2 += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
        ++cells;
    }
    // The chi-square quantile at 1 - 1e-6 (Wilson-Hilferty), df = cells - 1.
    const double df = cells - 1, z = 4.753;
    const double limit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
    MESSAGE(name << " speculative sampling: " << accepted << " of " << drafted << " drafts accepted; chi-square "
                 << chi2 << " over " << cells << " cells (limit " << limit << ")");
    CHECK(drafted == uint64_t(runs));
    CHECK(accepted > uint64_t(runs) / 10);
    CHECK(drafted - accepted > uint64_t(runs) / 10);
    CHECK(chi2 < limit);
}

}  // namespace

TEST_CASE("parity: MTP draft heads (hybrid and dense) match the reference's draft logits") {
    run_mtp_parity("qwen3_5_mtp");
    run_mtp_parity("qwen3_mtp");
}

TEST_CASE("parity: speculative greedy decoding with the MTP head gives plain greedy's 600 tokens and state") {
    run_speculative_greedy("qwen3_5_mtp", "");
    run_speculative_greedy("qwen3_mtp", "");
    run_speculative_greedy("qwen3_5_mtp", "kv_cache=f16");
}

TEST_CASE("parity: speculative sampling with the MTP head keeps the sampling distribution") {
    run_speculative_sampling("qwen3_5_mtp");
}
