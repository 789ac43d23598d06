// Generation core and decoder arch (qwen, gemma) tests.
//  - sampler: SplitMix64 stream, greedy ties, the filter chain;
//  - parity: the qwen and gemma archs on the CPU backend against the PyTorch
//    reference written by make_reference.py (dir in CMF_PARITY_DIR): logits
//    at every position, greedy continuation, KV-cache decode vs full
//    recompute, batched prefill chunking, and f16/bf16 weights;
//  - quantized parity: the reference's HF checkpoint converted with
//    cmf_convert (--quant f32/q8/q4/q4t/q4tp) into a .cmf, opened and run
//    through the C API; per-position cosine and top-1 agreement against the
//    PyTorch f32 logits.
#include <doctest/doctest.h>
#include "support/test_runtime.hpp"
#include "parity_case.hpp"

#include "common/error.hpp"
#include "half.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/memory_source.hpp"
#include "text/sampler.hpp"
#include "runtime/session.hpp"

#include "common/decoder.hpp"
#include "gemma/choices.hpp"
#include "gemm_bf16.hpp"

#include <cmf/cmf.h>

#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

using cmf::runtime::GenerateConfig;
using cmf::runtime::MemoryModel;
using cmf::runtime::Session;
using cmf::runtime::SessionConfig;

// ---- parity -------------------------------------------------------------------

namespace {

using namespace parity;

void run_case(const std::string &name) {
    Case c = load_case(parity_dir(name));
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    SessionConfig cfg;
    cfg.n_ctx = 128;
    Session s(*t.rt, *model->source(), cfg);
    REQUIRE(s.vocab_size() == c.vocab);
    const auto seq = sequence_of(c);

    // 1. Logits at every position (one batched prefill: the GEMM path).
    auto got = all_logits(s, seq);
    double worst = 0;
    for (uint64_t p = 0; p < c.positions; ++p)
        worst = std::max(worst, rel_err(got.data() + p * c.vocab, c.logits.data() + p * c.vocab, c.vocab));
    MESSAGE(name << " f32: max |logit diff| / max |ref logit| over " << c.positions << " positions = " << worst);
    CHECK(worst < 1e-4);

    // 2. Greedy continuation through generate(): batched prefill, then
    //    token-by-token decode on the KV cache.
    s.truncate(0);
    auto [produced, st] = greedy_ids(s, c);
    CHECK(st.stop_reason == CMF_STOP_MAX_TOKENS);
    CHECK(st.prompt_tokens == c.prompt.size());
    CHECK(st.generated_tokens == c.greedy.size());
    CHECK(produced == c.greedy);
    CHECK(s.n_past() == c.prompt.size() + c.greedy.size());

    // 3. KV-cache decode (one token per forward) equals the full recompute,
    //    and so does prefill in odd-sized chunks.
    const double kv_worst = kv_decode_error(s, seq, seq.size(), got);
    MESSAGE(name << " KV decode vs full recompute: " << kv_worst);
    CHECK(kv_worst < 1e-5);
    SessionConfig chunked = cfg;
    chunked.n_batch = 7;
    Session s7(*t.rt, *model->source(), chunked);
    auto got7 = all_logits(s7, seq);
    CHECK(rel_err(got7.data(), got.data(), got.size()) < 1e-5);
    // Rollback: truncate to the prompt and recompute the first generated step.
    std::vector<float> step(c.vocab);
    s.truncate(c.prompt.size() - 1);
    s.eval(std::span<const int32_t>(&c.prompt.back(), 1), CMF_LOGITS_LAST, step.data());
    CHECK(rel_err(step.data(), got.data() + (c.prompt.size() - 1) * c.vocab, c.vocab) < 1e-5);

    // 4. f16 / bf16 weights stay close to the f32 reference.
    for (int32_t dtype : {CMF_DTYPE_F16, CMF_DTYPE_BF16}) {
        auto mh = model_of(c, dtype);
        Session sh(*t.rt, *mh->source(), cfg);
        auto gh = all_logits(sh, seq);
        double e = 0;
        for (uint64_t p = 0; p < c.positions; ++p)
            e = std::max(e, rel_err(gh.data() + p * c.vocab, c.logits.data() + p * c.vocab, c.vocab));
        size_t agree = 0;
        for (uint64_t p = 0; p < c.positions; ++p)
            agree += cmf::text::argmax({gh.data() + p * c.vocab, c.vocab}) ==
                     cmf::text::argmax({c.logits.data() + p * c.vocab, c.vocab});
        std::string dn = dtype == CMF_DTYPE_F16 ? "f16" : "bf16";
        MESSAGE(name << " " << dn << " weights: max rel logit diff " << e << ", argmax agrees at " << agree << "/"
                     << c.positions << " positions");
        CHECK(e < (dtype == CMF_DTYPE_F16 ? 5e-3 : 5e-2));
        // The KV path must agree with the batched path in any dtype; with bf16
        // weights on a CPU with AVX-512 BF16 the batched path's GEMM rounds the
        // activations to bf16 (docs/runtime.md, "bf16 prefill") and decode
        // does not, so the two differ by that rounding.
        const double kv_err = kv_decode_error(sh, seq, 8, gh);
        const bool bf16_gemm = dtype == CMF_DTYPE_BF16 && cmf::cpu::bf16::gemm() != nullptr;
        MESSAGE(name << " " << dn << " weights: KV decode vs batched " << kv_err
                     << std::string(bf16_gemm ? " (bf16 GEMM)" : ""));
        CHECK(kv_err < (bf16_gemm ? 2e-2 : 1e-5));  // measured up to 9.3e-3 (gemma3)
    }

    // 5. The f16 KV cache (f32 weights): close to the reference, the same
    //    greedy continuation, and its KV decode agrees with its own batched
    //    prefill. Not to 1e-5 as in f32: the two paths' K/V differ by f32
    //    rounding (~1e-7), which now and then lands a value on the other
    //    side of an f16 rounding boundary (a 2^-11 relative step); measured
    //    4e-5 to 9e-5 on these cases.
    SessionConfig half = cfg;
    half.arch_options = "kv_cache=f16";
    Session sk(*t.rt, *model->source(), half);
    auto gk = all_logits(sk, seq);
    // The largest relative logit error over the positions, and at how many
    // the argmax is the reference's.
    auto against_reference = [&](const std::vector<float> &g, const std::string &what) {
        double e = 0;
        size_t agree = 0;
        for (uint64_t p = 0; p < c.positions; ++p) {
            e = std::max(e, rel_err(g.data() + p * c.vocab, c.logits.data() + p * c.vocab, c.vocab));
            agree += cmf::text::argmax({g.data() + p * c.vocab, c.vocab}) ==
                     cmf::text::argmax({c.logits.data() + p * c.vocab, c.vocab});
        }
        MESSAGE(name << " " << what << ": max rel logit diff " << e << ", argmax agrees at " << agree << "/"
                     << c.positions << " positions");
        return std::pair{e, agree};
    };
    const double ek = against_reference(gk, "f16 KV cache").first;
    CHECK(ek < 2e-3);
    CHECK(ek > 0);  // the cache really is f16
    sk.truncate(0);
    CHECK(greedy_ids(sk, c).first == c.greedy);
    const double kvk = kv_decode_error(sk, seq, seq.size(), gk);
    MESSAGE(name << " f16 KV cache, KV decode vs full recompute: " << kvk);
    CHECK(kvk < 5e-4);

    // 6. The q8 KV cache (blocks of 32 int8 values, f16 scale): close to the
    //    reference where the K/V rows are whole blocks, refused by name
    //    where they are not.
    uint64_t kv_dim = 0;
    for (const Case::T &tt : c.tensors)
        if (tt.name == "model.layers.0.self_attn.k_proj.weight") kv_dim = tt.shape[0];
    REQUIRE(kv_dim > 0);
    SessionConfig q8 = cfg;
    q8.arch_options = "kv_cache=q8";
    if (kv_dim % 32 != 0) {
        CHECK_THROWS_WITH_AS(Session(*t.rt, *model->source(), q8), doctest::Contains("kv_cache=q8 stores blocks of 32 values"),
                             cmf::Error);
        return;
    }
    Session s8(*t.rt, *model->source(), q8);
    auto g8 = all_logits(s8, seq);
    const auto [e8, agree] = against_reference(g8, "q8 KV cache");
    CHECK(e8 < 3e-2);
    CHECK(e8 > 0);  // the cache really is q8
    CHECK(agree >= c.positions * 9 / 10);
    const double kv8 = kv_decode_error(s8, seq, seq.size(), g8);
    MESSAGE(name << " q8 KV cache, KV decode vs full recompute: " << kv8);
    CHECK(kv8 < 3e-2);
}

}  // namespace

TEST_CASE("parity: qwen2 with q/k/v biases and a tied head") { run_case("qwen2_tied"); }
TEST_CASE("parity: qwen3 with q/k-norm, head_dim != hidden/heads, untied head") { run_case("qwen3_untied"); }
TEST_CASE("parity: qwen2 untied, MQA, head rows < vocab_size") { run_case("qwen2_short_head"); }
TEST_CASE("parity: gemma, MQA, embedding x sqrt(96), GeGLU, tied head") { run_case("gemma"); }
TEST_CASE("parity: gemma2, sandwich norms, soft-caps, window 4 on even layers (pattern rule), 95 positions") {
    run_case("gemma2");
}
TEST_CASE("parity: gemma3 text, q/k-norm, window 28 from layer_types, local/global RoPE bases, 95 positions") {
    run_case("gemma3");
}

// ---- quantized parity -------------------------------------------------------------

namespace {

// Thresholds per --quant name, set from the figures measured on these
// fixtures (docs/performance.md, "Quantized parity (tiny fixtures)"), worst
// fixture in brackets. The models are seeded random weights: no structure
// for the group scales to follow and nothing redundant, so 4-bit noise
// (~10% RMS per weight; q8 ~0.6%) reaches the logits far more directly than
// in a trained model. q8 meets the issue's cosine >= 0.99 at every position
// with room to spare (floors ~3x under 1 - cosine measured); the q4 formats
// do NOT (min cosine ~0.90, mean ~0.965): their floors sit under the
// measured worst with about 1.5x margin on 1 - cosine. A one-off PyTorch
// fake-quant of the same weights (group-32 absmax/7, f16 scale) gives the
// same q4 figures to 6 digits, so the gap is the format's on these weights,
// not the runtime's. The same floors apply to the sequence fed one token at a
// time (the decode path: codec matmul_rows with int8 activations); measured
// there: q8 min cosine 0.99946, top-1 93-95/95; q4 0.9009, q4tp 0.9067.
struct QuantCase {
    const char *quant;
    double min_cosine;   // at every position
    double mean_cosine;  // over all positions
    double min_top1;     // fraction of positions whose argmax equals the reference's
    // Max relative logit difference of the batched (prefill) run against the
    // file's weights decoded to f32 and run through the f32 path. 1e-4 where
    // prefill is exact over the decoded weights; where the CPU backend's int8
    // prefill GEMM runs (dtypes with cmf_codec_vt.int8_rows: q8_row, q4_block,
    // q4_tiled, q4tp, q2tp) the activations are rounded to int8 blocks as in decode, and
    // the difference is that rounding's: 2.1e-2..2.9e-2 measured here, the
    // same as decode's "vs batched" figure before the int8 GEMM.
    double max_kernel_err;
};
const QuantCase kQuantCases[] = {
    // f32 checks the path itself (HF checkpoint -> converter -> .cmf -> session).
    {"f32", 0.999999, 0.999999, 1.0, 1e-4},
    {"q8", 0.999, 0.9995, 0.95, 5e-2},   // [0.99966, 0.99986, 94/95]
    {"q4", 0.85, 0.95, 0.60, 5e-2},      // [0.8968, 0.9645, 65/95]
    {"q4t", 0.85, 0.95, 0.60, 5e-2},     // q4's groups and scales, tiled layout: same figures
    {"q4tp", 0.85, 0.95, 0.60, 5e-2},    // [0.9037, 0.9641, 63/95]
};
// The sliding-window fixtures (gemma2: window 4, soft-caps 1 and 2;
// gemma3: six layers, window 28). Their rings make a forward run in chunks
// of the window's length, and chunks under 16 tokens go through the
// codecs' int8-activation row kernels even for q4tp (hence its kernel error
// here); soft-capped logits within [-2, 2] and six sandwich-normed layers of
// random weights pass 4-bit noise on more directly than the two-layer qwen
// fixtures. Measured (worst of the two): q8 [0.99844, 0.99944, 93/95,
// 7.3e-2]; q4/q4t [0.7364, 0.8980, 51/95, 4.7e-2]; q4tp [0.7612, 0.8978,
// 52/95, 4.6e-2]. Floors: about 1.5x the measured 1 - cosine.
const QuantCase kWindowedQuantCases[] = {
    {"f32", 0.999999, 0.999999, 1.0, 1e-4},
    {"q8", 0.997, 0.999, 0.90, 0.15},
    {"q4", 0.60, 0.84, 0.40, 0.15},
    {"q4t", 0.60, 0.84, 0.40, 0.15},
    {"q4tp", 0.60, 0.84, 0.40, 0.15},
};

struct QuantFigures {
    double min_cos = 1, mean_cos = 0;
    size_t agree = 0;
    double matrix_bits = 0;  // bits per weight of the quantized 2-D tensors
    double model_bits = 0;   // bits per weight over every tensor in the file
    std::string dtypes;      // "q8_row x14, f16 x9"
    double kernel_err = 0;   // max rel logit diff, file vs its weights decoded to f32
    // The same sequence fed one token at a time: the decode path, where the
    // codecs' matmul_rows run (int8 activations for q8/q4 dtypes) instead of
    // the batched f32 GEMM over dequantized panels.
    double dec_min_cos = 1, dec_mean_cos = 0;
    size_t dec_agree = 0;
    double dec_vs_batch = 0;  // max rel logit diff, one-token decode vs the batched eval
};

double cosine(const float *a, const float *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; ++i) {
        ab += double(a[i]) * b[i];
        aa += double(a[i]) * a[i];
        bb += double(b[i]) * b[i];
    }
    return ab / std::sqrt(std::max(aa * bb, 1e-300));
}

std::string dtype_label(int32_t dtype) {
    switch (dtype) {
    case CMF_DTYPE_F32: return "f32";
    case CMF_DTYPE_F16: return "f16";
    case CMF_DTYPE_BF16: return "bf16";
    case CMF_DTYPE_Q8_ROW: return "q8_row";
    case CMF_DTYPE_Q8_2F: return "q8_2f";
    case CMF_DTYPE_Q4_BLOCK: return "q4_block";
    case CMF_DTYPE_Q4_TILED: return "q4_tiled";
    case CMF_DTYPE_Q4TP: return "q4tp";
    default: return "dtype " + std::to_string(dtype);
    }
}

void require_ok(cmf_error *e, const std::string &what) {
    std::string msg = e ? cmf_error_message(e) : "";
    cmf_error_free(e);
    REQUIRE_MESSAGE(msg.empty(), what << ": " << msg);
}

// Converts <case>/hf with `quant`, runs the sequence through the file and
// measures its logits against the reference.
QuantFigures run_converted(const TestRuntime &t, const Case &c, const std::string &case_dir, const std::string &quant) {
    const std::string out = case_dir + "/" + quant + ".cmf";
    const std::string hf = case_dir + "/hf";
    cmf_convert_options co;
    cmf_convert_options_init(&co);
    co.model_dir = hf.c_str();
    co.output = out.c_str();
    co.quant = quant.c_str();
    require_ok(cmf_convert(t.rt, &co), "cmf_convert " + hf + " --quant " + quant);

    cmf_model *opened = nullptr;
    require_ok(cmf_open(t.rt, out.c_str(), nullptr, &opened), "cmf_open " + out);
    const std::unique_ptr<cmf_model, decltype(&cmf_close)> model(opened, cmf_close);
    const cmf_model *m = model.get();
    QuantFigures f;
    // The file's weights decoded to f32 by their codecs: running these
    // through the f32 path separates the kernels' error from the
    // quantization's (the quantized matmuls must compute what the decoded
    // weights give).
    MemoryModel decoded;
    {
        cmf_model_info mi;
        cmf_model_info_init(&mi);
        require_ok(cmf_model_get_info(m, &mi), "cmf_model_get_info");
        decoded.set_arch_json(mi.arch_json);
    }
    std::map<std::string, int> count;
    uint64_t all_bytes = 0, all_elems = 0, q_bytes = 0, q_elems = 0;
    for (size_t i = 0; i < cmf_tensor_count(m); ++i) {
        cmf_tensor_info ti;
        cmf_tensor_info_init(&ti);
        require_ok(cmf_tensor_at(m, i, &ti), "cmf_tensor_at");
        uint64_t n = 1;
        for (uint32_t d = 0; d < ti.ndim; ++d) n *= ti.shape[d];
        ++count[dtype_label(ti.dtype)];
        all_bytes += ti.nbytes;
        all_elems += n;
        if (ti.ndim == 2) {
            q_bytes += ti.nbytes;
            q_elems += n;
        }
        std::vector<uint8_t> f32(n * 4);
        require_ok(cmf_tensor_dequantize(m, i, 0, ti.ndim >= 2 ? ti.shape[0] : 1, reinterpret_cast<float *>(f32.data()), n),
                   std::string("cmf_tensor_dequantize ") + ti.name);
        decoded.add(ti.name, CMF_DTYPE_F32, std::vector<uint64_t>(ti.shape, ti.shape + ti.ndim), std::move(f32));
    }
    for (const auto &[name, k] : count) f.dtypes += (f.dtypes.empty() ? "" : ", ") + name + " x" + std::to_string(k);
    f.matrix_bits = 8.0 * double(q_bytes) / double(q_elems);
    f.model_bits = 8.0 * double(all_bytes) / double(all_elems);

    cmf_session_options so;
    cmf_session_options_init(&so);
    so.n_ctx = 128;
    cmf_session *created = nullptr;
    require_ok(cmf_session_create_for_model(t.rt, m, &so, &created), "cmf_session_create_for_model " + out);
    const std::unique_ptr<cmf_session, decltype(&cmf_session_free)> s(created, cmf_session_free);
    const auto seq = sequence_of(c);
    std::vector<float> got(seq.size() * c.vocab);
    require_ok(cmf_session_eval(s.get(), seq.data(), seq.size(), CMF_LOGITS_ALL, got.data(), got.size()),
               "cmf_session_eval " + out);
    std::vector<float> dec(seq.size() * c.vocab);
    {
        cmf_session *one = nullptr;
        require_ok(cmf_session_create_for_model(t.rt, m, &so, &one), "cmf_session_create_for_model " + out);
        const std::unique_ptr<cmf_session, decltype(&cmf_session_free)> sd1(one, cmf_session_free);
        for (size_t p = 0; p < seq.size(); ++p)
            require_ok(cmf_session_eval(sd1.get(), &seq[p], 1, CMF_LOGITS_LAST, dec.data() + p * c.vocab, c.vocab),
                       "cmf_session_eval (one token) " + out);
    }
    std::filesystem::remove(out);  // the mapping stays valid until cmf_close

    SessionConfig cfg;
    cfg.n_ctx = 128;
    Session sd(*t.rt, *decoded.source(), cfg);
    auto want = all_logits(sd, seq);
    for (uint64_t p = 0; p < c.positions; ++p)
        f.kernel_err = std::max(f.kernel_err, rel_err(got.data() + p * c.vocab, want.data() + p * c.vocab, c.vocab));

    for (uint64_t p = 0; p < c.positions; ++p) {
        const float *a = got.data() + p * c.vocab, *r = c.logits.data() + p * c.vocab;
        double cs = cosine(a, r, c.vocab);
        f.min_cos = std::min(f.min_cos, cs);
        f.mean_cos += cs / double(c.positions);
        f.agree += cmf::text::argmax({a, c.vocab}) == cmf::text::argmax({r, c.vocab});
        const float *d = dec.data() + p * c.vocab;
        double ds = cosine(d, r, c.vocab);
        f.dec_min_cos = std::min(f.dec_min_cos, ds);
        f.dec_mean_cos += ds / double(c.positions);
        f.dec_agree += cmf::text::argmax({d, c.vocab}) == cmf::text::argmax({r, c.vocab});
        f.dec_vs_batch = std::max(f.dec_vs_batch, rel_err(d, a, c.vocab));
    }
    return f;
}

void run_quant_case(const std::string &name, std::span<const QuantCase> cases = kQuantCases) {
    const std::string dir = parity_dir(name);
    Case c = load_case(dir);
    TestRuntime t;
    for (const QuantCase &q : cases) {
        const std::string quant = q.quant;
        CAPTURE(quant);
        QuantFigures f = run_converted(t, c, dir, q.quant);
        std::ostringstream line;
        line.precision(6);
        line << std::fixed << name << " --quant " << q.quant << " [" << f.dtypes << "]: matrices "
             << std::setprecision(2) << f.matrix_bits << " bits/weight (file " << f.model_bits << "), cosine min "
             << std::setprecision(6) << f.min_cos << " mean " << f.mean_cos << ", top-1 " << f.agree << "/"
             << c.positions << "; vs its decoded weights in f32: " << std::scientific << std::setprecision(2)
             << f.kernel_err << "; one token at a time: cosine min " << std::fixed << std::setprecision(6)
             << f.dec_min_cos << " mean " << f.dec_mean_cos << ", top-1 " << f.dec_agree << "/" << c.positions
             << ", vs batched " << std::scientific << std::setprecision(2) << f.dec_vs_batch;
        MESSAGE(line.str());
        CHECK(f.kernel_err < q.max_kernel_err);
        CHECK(f.min_cos >= q.min_cosine);
        CHECK(f.mean_cos >= q.mean_cosine);
        CHECK(double(f.agree) >= q.min_top1 * double(c.positions));
        CHECK(f.dec_min_cos >= q.min_cosine);
        CHECK(f.dec_mean_cos >= q.mean_cosine);
        CHECK(double(f.dec_agree) >= q.min_top1 * double(c.positions));
    }
}

// RoPE scaling: the arch block's record (as the reference writes it) run
// against HF's tables; then the reference's HF checkpoint converted at f32,
// so the converter's record of the config's scaling is checked too.
void run_rope_case(const std::string &name) {
    run_case(name);
    const std::string dir = parity_dir(name);
    Case c = load_case(dir);
    TestRuntime t;
    QuantFigures f = run_converted(t, c, dir, "f32");
    MESSAGE(name << " converted at f32: cosine min " << f.min_cos << ", top-1 " << f.agree << "/" << c.positions);
    CHECK(f.min_cos >= 0.999999);
    CHECK(f.agree == c.positions);
}

}  // namespace

TEST_CASE("parity: yarn RoPE (rope_scaling, Qwen's long-context recipe), qwen3") { run_rope_case("qwen3_yarn"); }
TEST_CASE("parity: yarn RoPE (v5 rope_parameters, mscale ratio, beta_fast/slow, truncate false), qwen2") {
    run_rope_case("qwen2_yarn_v5");
}
TEST_CASE("parity: linear RoPE (old 'type' spelling), qwen2") { run_rope_case("qwen2_linear"); }
TEST_CASE("parity: llama3 RoPE, qwen3") { run_rope_case("qwen3_llama3"); }
TEST_CASE("parity: qwen3 attention_bias (q/k/v and o_proj biases)") { run_rope_case("qwen3_attn_bias"); }

// Dynamic NTK: HF recomputes the table when a forward call's last position
// + 1 exceeds the largest seen, and resets it for a call under
// max_position_embeddings; keys already cached keep their rotation. So the
// result depends on how the sequence is split into calls, and each split
// the reference ran is checked against the same split here.
TEST_CASE("parity: dynamic NTK RoPE follows HF's rotary state call by call, qwen3") {
    const std::string dir = parity_dir("qwen3_dynamic");
    Case c = load_case(dir);
    const auto cached = read_f32(dir + "/cached.f32"), short_ref = read_f32(dir + "/short.f32");
    REQUIRE(cached.size() == c.logits.size());
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    SessionConfig cfg;
    cfg.n_ctx = 128;
    const auto seq = sequence_of(c);
    const uint64_t V = c.vocab;
    auto worst_vs = [&](const std::vector<float> &got, const std::vector<float> &ref, size_t rows) {
        double w = 0;
        for (size_t p = 0; p < rows; ++p) w = std::max(w, rel_err(got.data() + p * V, ref.data() + p * V, V));
        return w;
    };
    // The two splits give different logits past max_position_embeddings (48):
    // a runtime that ignored the call history could not match both.
    CHECK(rel_err(cached.data() + (seq.size() - 1) * V, c.logits.data() + (seq.size() - 1) * V, V) > 1e-3);

    // 1. The whole sequence in one call: the table for seq_len 95 everywhere.
    {
        Session s(*t.rt, *model->source(), cfg);
        const double w = worst_vs(all_logits(s, seq), c.logits, seq.size());
        MESSAGE("qwen3_dynamic, one call: " << w);
        CHECK(w < 1e-3);
    }
    // 2. The prompt in one call, then one token per call (HF's generate()).
    Session s(*t.rt, *model->source(), cfg);
    std::vector<float> got(seq.size() * V);
    s.eval(std::span<const int32_t>(c.prompt), CMF_LOGITS_ALL, got.data());
    for (size_t p = c.prompt.size(); p < seq.size(); ++p)
        s.eval(std::span<const int32_t>(&seq[p], 1), CMF_LOGITS_LAST, got.data() + p * V);
    const double w2 = worst_vs(got, cached, seq.size());
    MESSAGE("qwen3_dynamic, prompt then one token per call: " << w2);
    CHECK(w2 < 1e-3);
    // 3. A new short sequence on that state: HF goes back to the original table.
    s.truncate(0);
    std::vector<float> short_got(20 * V);
    s.eval(std::span<const int32_t>(seq.data(), 20), CMF_LOGITS_ALL, short_got.data());
    const double w3 = worst_vs(short_got, short_ref, 20);
    MESSAGE("qwen3_dynamic, short sequence after growth (reset): " << w3);
    CHECK(w3 < 1e-3);
    // 4. generate() on a fresh state: greedy ids as HF's.
    Session g(*t.rt, *model->source(), cfg);
    CHECK(greedy_ids(g, c).first == c.greedy);
}

// A file from the original converter carries `yarn` (its spelling of
// rope_parameters yarn, attention_factor written out) instead of our
// rope_scaling record: it runs as HF's yarn with those values.
TEST_CASE("parity: the original converter's arch.yarn block runs as HF's yarn") {
    Case c = load_case(parity_dir("qwen3_yarn"));
    const std::string record = R"("rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32,)"
                               R"("beta_fast":32.0,"beta_slow":1.0,"truncate":true})";
    const size_t at = c.arch_json.find(record);
    REQUIRE(at != std::string::npos);
    c.arch_json.replace(at, record.size(),
                        R"("yarn":{"factor":4.0,"original_max_position_embeddings":32,"beta_fast":32.0,"beta_slow":1.0,)"
                        R"("attention_factor":1.1386294361119891})");
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    SessionConfig cfg;
    cfg.n_ctx = 128;
    Session s(*t.rt, *model->source(), cfg);
    auto got = all_logits(s, sequence_of(c));
    double worst = 0;
    for (uint64_t p = 0; p < c.positions; ++p)
        worst = std::max(worst, rel_err(got.data() + p * c.vocab, c.logits.data() + p * c.vocab, c.vocab));
    CHECK(worst < 1e-3);
}

TEST_CASE("parity: quantized files, qwen2 tied head") { run_quant_case("qwen2_tied"); }
TEST_CASE("parity: quantized files, qwen3 untied head") { run_quant_case("qwen3_untied"); }
TEST_CASE("parity: quantized files, qwen2 head rows < vocab_size") { run_quant_case("qwen2_short_head"); }
TEST_CASE("parity: quantized files, gemma") { run_quant_case("gemma"); }
TEST_CASE("parity: quantized files, gemma2") { run_quant_case("gemma2", kWindowedQuantCases); }
TEST_CASE("parity: quantized files, gemma3 text") { run_quant_case("gemma3", kWindowedQuantCases); }

TEST_CASE("parity: the decoder hands back the hidden states after n layers (hidden_states[-2] of gemma2)") {
    // What a text encoder built on the decoder reads (a Gemma-2 encoder
    // takes the output of all layers but the last), against the reference.
    Case c = load_case(parity_dir("gemma2"));
    const std::vector<float> want = read_f32(parity_dir("gemma2") + "/hidden_m2.f32");
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    const cmf::BackendEntry *be = t.rt->backend("cpu");
    REQUIRE(be != nullptr);
    const cmf_model_source *src = model->source();
    const cmf::archs::ArchConfig cfg = cmf::archs::parse_arch_config(src->arch_json, src->arch_json_len);
    auto m = cmf::archs::create_decoder(t.rt->host_api(), src, &be->vt, be->ctx, nullptr, cfg,
                                        cmf::archs::gemma::choices(cfg));
    auto state = cmf::archs::create_decoder_state(*m, 128);
    const auto seq = sequence_of(c);
    const uint64_t H = cfg.hidden_size;
    REQUIRE(want.size() == seq.size() * H);
    std::vector<float> got(seq.size() * H);
    cmf::archs::DecoderStep step;
    step.tokens = seq.data();
    step.n_tokens = seq.size();
    step.n_layers = cfg.num_layers - 1;
    step.hidden = got.data();
    cmf::archs::decoder_forward(*m, *state, step);
    const double err = rel_err(got.data(), want.data(), got.size());
    MESSAGE("gemma2 hidden_states[-2]: max |diff| / max |ref| = " << err);
    CHECK(err < 1e-4);
    // Logits need every layer.
    cmf::archs::truncate_decoder_state(*state, 0);
    std::vector<float> logits(c.vocab);
    step.logits_mode = CMF_LOGITS_LAST;
    step.logits = logits.data();
    CHECK_THROWS_WITH(cmf::archs::decoder_forward(*m, *state, step), doctest::Contains("logits need every layer"));
}

TEST_CASE("parity: a Gemma 1 file whose hidden_act says \"gelu\" runs the tanh GELU it was trained with") {
    Case c = load_case(parity_dir("gemma"));
    TestRuntime t;
    auto plain = model_of(c, CMF_DTYPE_F32);
    const std::string from = R"("hidden_act":"gelu_tanh")";
    REQUIRE(c.arch_json.find(from) != std::string::npos);
    c.arch_json.replace(c.arch_json.find(from), from.size(), R"("hidden_act":"gelu")");
    auto legacy = model_of(c, CMF_DTYPE_F32);
    SessionConfig cfg;
    cfg.n_ctx = 128;
    Session a(*t.rt, *plain->source(), cfg), b(*t.rt, *legacy->source(), cfg);
    const auto seq = sequence_of(c);
    CHECK(all_logits(a, seq) == all_logits(b, seq));
}

TEST_CASE("parity: a Gemma file stops on <eos> and <end_of_turn> even when only <eos> is its eos id") {
    // The gemma case's checkpoint with a small tokenizer.json that has
    // Gemma's turn markers; config.json says eos_token_id 1 only.
    const std::string dir = parity_dir("gemma");
    const std::string ckpt = dir + "/hf_turns";
    std::filesystem::create_directories(ckpt);
    for (const char *f : {"config.json", "model.safetensors"})
        std::filesystem::copy_file(dir + "/hf/" + f, ckpt + "/" + f, std::filesystem::copy_options::overwrite_existing);
    std::ofstream(ckpt + "/tokenizer.json") << R"({"version":"1.0","added_tokens":[
        {"id":0,"content":"<pad>","special":true},{"id":1,"content":"<eos>","special":true},
        {"id":2,"content":"<bos>","special":true},{"id":5,"content":"<start_of_turn>","special":true},
        {"id":6,"content":"<end_of_turn>","special":true}],
      "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
      "model":{"type":"BPE","vocab":{"<pad>":0,"<eos>":1,"<bos>":2,"a":3,"b":4,"<start_of_turn>":5,"<end_of_turn>":6},
               "merges":[]}})";
    TestRuntime t;
    const std::string out = dir + "/turns.cmf";
    cmf_convert_options co;
    cmf_convert_options_init(&co);
    co.model_dir = ckpt.c_str();
    co.output = out.c_str();
    co.quant = "f32";
    require_ok(cmf_convert(t.rt, &co), "cmf_convert " + ckpt);
    cmf_model *opened = nullptr;
    require_ok(cmf_open(t.rt, out.c_str(), nullptr, &opened), "cmf_open " + out);
    const std::unique_ptr<cmf_model, decltype(&cmf_close)> model(opened, cmf_close);
    cmf_model_special_ids sp;
    cmf_model_special_ids_init(&sp);
    require_ok(cmf_model_get_special_ids(model.get(), &sp), "cmf_model_get_special_ids");
    CHECK(sp.bos_id == 2);
    REQUIRE(sp.n_eos_ids == 2);
    CHECK(sp.eos_ids[0] == 1);
    CHECK(sp.eos_ids[1] == 6);
    std::filesystem::remove(out);
}

TEST_CASE("session: errors are specific") {
    TestRuntime t;
    MemoryModel m;
    m.set_arch_json(R"({"arch_name":"nope"})");
    CHECK_THROWS_WITH_AS(Session(*t.rt, *m.source(), SessionConfig{}), "no arch plugin runs arch_name \"nope\"",
                         cmf::Error);
    MemoryModel q;
    q.set_arch_json(R"({"arch_name":"qwen3","hidden_size":8})");
    CHECK_THROWS_WITH_AS(Session(*t.rt, *q.source(), SessionConfig{}),
                         doctest::Contains("arch.intermediate_size: required key is missing"), cmf::Error);
    MemoryModel e;
    e.set_arch_json(R"({"arch_name":"qwen3","hidden_size":8,"intermediate_size":8,"num_layers":1,
        "num_attention_heads":2,"num_kv_heads":1,"head_dim":4,"vocab_size":4,"layer_types":["FullAttention"],
        "rms_norm_eps":1e-6,"max_position_embeddings":16})");
    CHECK_THROWS_WITH_AS(Session(*t.rt, *e.source(), SessionConfig{}),
                         doctest::Contains("missing tensor model.embed_tokens.weight"), cmf::Error);
    // Model options are checked before any tensor: a bad KV cache type or an
    // unknown key is refused by name, never ignored.
    MemoryModel act;  // an activation the qwen arch does not run is named
    act.set_arch_json(R"({"arch_name":"qwen3","hidden_size":8,"intermediate_size":8,"num_layers":1,
        "num_attention_heads":2,"num_kv_heads":1,"head_dim":4,"vocab_size":4,"layer_types":["FullAttention"],
        "rms_norm_eps":1e-6,"max_position_embeddings":16,"hidden_act":"gelu"})");
    CHECK_THROWS_WITH_AS(Session(*t.rt, *act.source(), SessionConfig{}),
                         doctest::Contains("arch.hidden_act \"gelu\" is not an activation the qwen arch runs"), cmf::Error);
    SessionConfig bad_kv;
    bad_kv.arch_options = "kv_cache=q4";
    CHECK_THROWS_WITH_AS(Session(*t.rt, *e.source(), bad_kv),
                         doctest::Contains("kv_cache must be f32, f16 or q8, not \"q4\""), cmf::Error);
    // A RoPE scaling the runtime does not implement is refused by name.
    for (const char *rs : {R"("rope_scaling":{"rope_type":"longrope","factor":2.0,"short_factor":[1.0],"long_factor":[1.0]},)",
                           R"("rope_scaling":{"rope_type":"su"},)"}) {
        std::string arch = R"({"arch_name":"qwen3","hidden_size":8,"intermediate_size":8,"num_layers":1,
            "num_attention_heads":2,"num_kv_heads":1,"head_dim":4,"vocab_size":4,"layer_types":["FullAttention"],)";
        arch += rs;
        arch += R"("rms_norm_eps":1e-6,"max_position_embeddings":16})";
        MemoryModel r;
        r.set_arch_json(arch);
        CHECK_THROWS_WITH_AS(Session(*t.rt, *r.source(), SessionConfig{}),
                             doctest::Contains("arch: rope_scaling.rope_type \""), cmf::Error);
        CHECK_THROWS_WITH_AS(Session(*t.rt, *r.source(), SessionConfig{}),
                             doctest::Contains("this RoPE scaling is not implemented"), cmf::Error);
    }
    SessionConfig bad_key;
    bad_key.arch_options = "kv_cache=f16,flash=1";
    CHECK_THROWS_WITH_AS(Session(*t.rt, *e.source(), bad_key), doctest::Contains("unknown model option \"flash\""),
                         cmf::Error);
}

TEST_CASE("parity: the C API drives a session (generate, callback stop, stop ids, cancel, eval, errors)") {
    Case c = load_case(parity_dir("qwen2_tied"));
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);

    cmf_session_options so;
    cmf_session_options_init(&so);
    so.n_threads = 3;  // the runtime has 2
    cmf_session *s = nullptr;
    cmf_error *e = cmf_session_create(t.rt, model->source(), &so, &s);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_UNSUPPORTED);
    cmf_error_free(e);
    so.n_threads = 0;
    so.n_ctx = 100;
    REQUIRE(cmf_session_create(t.rt, model->source(), &so, &s) == nullptr);
    CHECK(cmf_session_vocab_size(s) == c.vocab);
    CHECK(cmf_session_n_ctx(s) == 100);

    struct Sink {
        std::vector<int32_t> got;
        size_t stop_after = 0;
        cmf_session *cancel = nullptr;
    } sink;
    auto on_token = [](void *user, int32_t tok) -> int32_t {
        auto *k = static_cast<Sink *>(user);
        k->got.push_back(tok);
        if (k->cancel) cmf_session_cancel(k->cancel);
        return k->stop_after != 0 && k->got.size() >= k->stop_after;
    };
    cmf_generate_options go;
    cmf_generate_options_init(&go);
    go.temperature = 0;
    go.repetition_penalty = 1.0f;
    go.max_tokens = 8;
    go.on_token = on_token;
    go.user = &sink;
    cmf_generate_stats st;
    cmf_generate_stats_init(&st);
    REQUIRE(cmf_session_generate(s, c.prompt.data(), c.prompt.size(), &go, &st) == nullptr);
    CHECK(st.stop_reason == CMF_STOP_MAX_TOKENS);
    CHECK(st.generated_tokens == 8);
    CHECK(st.n_past == c.prompt.size() + 8);
    CHECK(st.prefill_tok_s > 0);
    CHECK(sink.got == std::vector<int32_t>(c.greedy.begin(), c.greedy.begin() + 8));

    // Callback stop after 3 tokens.
    REQUIRE(cmf_session_reset(s) == nullptr);
    sink.got.clear();
    sink.stop_after = 3;
    REQUIRE(cmf_session_generate(s, c.prompt.data(), c.prompt.size(), &go, &st) == nullptr);
    CHECK(st.stop_reason == CMF_STOP_CALLBACK);
    CHECK(sink.got.size() == 3);

    // A stop id: generation ends before delivering it.
    REQUIRE(cmf_session_reset(s) == nullptr);
    sink.got.clear();
    sink.stop_after = 0;
    int32_t stop = c.greedy[2];
    go.stop_ids = &stop;
    go.n_stop_ids = 1;
    REQUIRE(cmf_session_generate(s, c.prompt.data(), c.prompt.size(), &go, &st) == nullptr);
    size_t first = size_t(std::find(c.greedy.begin(), c.greedy.end(), stop) - c.greedy.begin());
    CHECK(st.stop_reason == CMF_STOP_EOS);
    CHECK(sink.got.size() == first);
    go.stop_ids = nullptr;
    go.n_stop_ids = 0;

    // Cancel (here from the callback; any thread may call it).
    REQUIRE(cmf_session_reset(s) == nullptr);
    sink.got.clear();
    sink.cancel = s;
    REQUIRE(cmf_session_generate(s, c.prompt.data(), c.prompt.size(), &go, &st) == nullptr);
    CHECK(st.stop_reason == CMF_STOP_CANCELLED);
    CHECK(sink.got.size() == 1);
    sink.cancel = nullptr;

    // Context full: 64 prompt + at most 36 generated in a 100-token context.
    REQUIRE(cmf_session_reset(s) == nullptr);
    go.max_tokens = 0;
    go.on_token = nullptr;
    REQUIRE(cmf_session_generate(s, c.prompt.data(), c.prompt.size(), &go, &st) == nullptr);
    CHECK(st.stop_reason == CMF_STOP_CONTEXT_FULL);
    CHECK(cmf_session_n_past(s) == 100);

    // eval: logits of the prompt's last position equal the reference; a
    // short logits buffer is a Bounds error.
    REQUIRE(cmf_session_reset(s) == nullptr);
    std::vector<float> last(c.vocab);
    e = cmf_session_eval(s, c.prompt.data(), c.prompt.size(), CMF_LOGITS_LAST, last.data(), c.vocab - 1);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_BOUNDS);
    cmf_error_free(e);
    REQUIRE(cmf_session_eval(s, c.prompt.data(), c.prompt.size(), CMF_LOGITS_LAST, last.data(), c.vocab) == nullptr);
    CHECK(rel_err(last.data(), c.logits.data() + (c.prompt.size() - 1) * c.vocab, c.vocab) < 1e-3);
    // An out-of-vocabulary prompt token is refused.
    int32_t bad = int32_t(c.vocab);
    e = cmf_session_generate(s, &bad, 1, &go, &st);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_BOUNDS);
    cmf_error_free(e);
    cmf_session_free(s);
}

TEST_CASE("parity: CMF_SESSION_PROFILE times every backend call and leaves the results unchanged") {
    Case c = load_case(parity_dir("qwen2_tied"));
    TestRuntime t;
    auto model = model_of(c, CMF_DTYPE_F32);
    uint64_t layers = 0;
    // The profile's label of every layer's fused q/k/v call, "f32 [q]+[k]+[v]".
    std::string qkv_label;
    uint64_t qkv_bytes = 0;
    for (const char *proj : {"q_proj", "k_proj", "v_proj"})
        for (const auto &tt : c.tensors)
            if (tt.name == std::string("model.layers.0.self_attn.") + proj + ".weight") {
                qkv_label += (qkv_label.empty() ? "f32 [" : "+[") + std::to_string(tt.shape[0]) + "," +
                             std::to_string(tt.shape[1]) + "]";
                qkv_bytes += tt.count * sizeof(float);
            }
    uint64_t kv_dim = 0;  // a K or V cache row: n_kv_heads * head_dim
    for (const auto &tt : c.tensors) {
        if (tt.name.find(".mlp.down_proj.weight") != std::string::npos) ++layers;
        if (tt.name == "model.layers.0.self_attn.k_proj.weight") kv_dim = tt.shape[0];
    }
    REQUIRE(layers > 0);
    REQUIRE(kv_dim > 0);
    REQUIRE(qkv_label.find("]+[") != std::string::npos);

    cmf_session_options so;
    cmf_session_options_init(&so);
    so.n_ctx = 100;
    so.flags = 2;  // not a flag
    cmf_session *s = nullptr;
    cmf_error *e = cmf_session_create(t.rt, model->source(), &so, &s);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    CHECK(std::string(cmf_error_message(e)).find("unknown flags 0x2") != std::string::npos);
    cmf_error_free(e);
    so.flags = 0;
    cmf_session *plain = nullptr;
    REQUIRE(cmf_session_create(t.rt, model->source(), &so, &plain) == nullptr);
    char *json = nullptr;
    e = cmf_session_profile(plain, &json);
    REQUIRE(e != nullptr);
    CHECK(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    CHECK(std::string(cmf_error_message(e)).find("CMF_SESSION_PROFILE") != std::string::npos);
    CHECK(json == nullptr);
    cmf_error_free(e);
    so.flags = CMF_SESSION_PROFILE;
    REQUIRE(cmf_session_create(t.rt, model->source(), &so, &s) == nullptr);

    // The same logits with and without the profile in between: prefill, then three decode steps.
    const uint64_t V = c.vocab;
    std::vector<float> a(V), b(V);
    REQUIRE(cmf_session_eval(plain, c.prompt.data(), c.prompt.size(), CMF_LOGITS_LAST, a.data(), V) == nullptr);
    REQUIRE(cmf_session_eval(s, c.prompt.data(), c.prompt.size(), CMF_LOGITS_LAST, b.data(), V) == nullptr);
    CHECK(std::memcmp(a.data(), b.data(), V * sizeof(float)) == 0);
    double decode_wall = 0;
    for (int i = 0; i < 3; ++i) {
        REQUIRE(cmf_session_eval(plain, &c.greedy[i], 1, CMF_LOGITS_LAST, a.data(), V) == nullptr);
        const auto t0 = std::chrono::steady_clock::now();
        REQUIRE(cmf_session_eval(s, &c.greedy[i], 1, CMF_LOGITS_LAST, b.data(), V) == nullptr);
        decode_wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(std::memcmp(a.data(), b.data(), V * sizeof(float)) == 0);
    }

    REQUIRE(cmf_session_profile(s, &json) == nullptr);
    REQUIRE(json != nullptr);
    std::string text(json);
    cmf_string_free(json);
    simdjson::dom::parser parser;
    simdjson::dom::element doc = parser.parse(text);
    std::map<std::string, uint64_t> matmul_calls, multi_calls, binds, attention_bytes;
    double decode_seconds = 0;
    bool qkv_seen = false;
    for (simdjson::dom::element op : doc["ops"].get_array()) {
        const std::string phase{std::string_view(op["phase"])}, name{std::string_view(op["op"])},
            weight{std::string_view(op["weight"])};
        const uint64_t calls = uint64_t(op["calls"]);
        const double seconds = double(op["seconds"]);
        CHECK(calls > 0);
        CHECK(seconds >= 0);
        if (name == "matmul") matmul_calls[phase] += calls;
        if (name == "matmul_multi") multi_calls[phase] += calls;
        if (name == "weight_bind") binds[phase] += calls;
        if (name == "attention") attention_bytes[phase] += uint64_t(op["read_bytes"]);
        if (phase == "decode") decode_seconds += seconds;
        if (name == "matmul_multi" && weight == qkv_label) {
            qkv_seen = true;
            CHECK(uint64_t(op["weight_bytes"]) == qkv_bytes);
        }
    }
    CHECK(qkv_seen);
    // Per layer o and down, and the head, once per forward; q/k/v and
    // gate/up go fused (the CPU backend has matmul_multi).
    CHECK(matmul_calls["prefill"] == 2 * layers + 1);
    CHECK(matmul_calls["decode"] == 3 * (2 * layers + 1));
    CHECK(multi_calls["prefill"] == 2 * layers);
    CHECK(multi_calls["decode"] == 3 * (2 * layers));
    CHECK(binds["bind"] > 7 * layers);  // every weight the arch bound, norms included
    // Attention (f32 caches, this session's default) reads the K and V rows
    // its queries attend: the prompt's P rows in prefill, P + i + 1 at decode
    // step i.
    const uint64_t P = c.prompt.size(), row = 4 * kv_dim;
    CHECK(attention_bytes["prefill"] == layers * 2 * P * row);
    CHECK(attention_bytes["decode"] == layers * 2 * ((P + 1) + (P + 2) + (P + 3)) * row);
    CHECK(decode_seconds > 0);
    CHECK(decode_seconds <= decode_wall);  // wall time of calls inside the measured evals

    REQUIRE(cmf_session_profile_reset(s) == nullptr);
    REQUIRE(cmf_session_profile(s, &json) == nullptr);
    CHECK(std::string(json) == R"({"ops":[]})");
    cmf_string_free(json);
    cmf_session_free(s);
    cmf_session_free(plain);
}
