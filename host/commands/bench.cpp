// cmfhost bench: prompt processing (pp: one batch of N tokens) and text
// generation (tg: N single-token steps) from an empty context (or after -d tokens of context), as llama-bench
// measures them; median and spread over repetitions, peak RSS.
#include "session_util.hpp"

#include <boost/json.hpp>
#include <cmf/argmax.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <random>
#include <sys/resource.h>

namespace cmfhost {
namespace {

struct Summary {
    double median = 0, mean = 0, stddev = 0, min = 0, max = 0;
};
Summary summarize(std::vector<double> v) {
    Summary s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    for (double x : v) s.mean += x;
    s.mean /= double(n);
    for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
    s.stddev = n > 1 ? std::sqrt(s.stddev / double(n - 1)) : 0;
    s.min = v.front();
    s.max = v.back();
    return s;
}

// A "Key:  N kB" line of a /proc file, in bytes; 0 when the file or the
// line is not there.
uint64_t proc_kib_field(const char *file, const std::string &key) {
    std::ifstream f(file);
    std::string line;
    while (std::getline(f, line))
        if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size())) * 1024;
    return 0;
}

// Peak resident set in bytes: VmHWM, else getrusage's maxrss.
uint64_t peak_rss_bytes() {
    if (uint64_t b = proc_kib_field("/proc/self/status", "VmHWM:")) return b;
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// Current resident set in bytes (VmRSS).
uint64_t current_rss_bytes() { return proc_kib_field("/proc/self/status", "VmRSS:"); }

// Bytes of file mappings held in 2 MiB pages (smaps_rollup FilePmdMapped).
// The weights stream fastest in 2 MiB pages; whether a file gets them
// depends on how its page cache was filled (docs/performance.md, "Page
// size"), so bench shows it next to the speed.
uint64_t file_pmd_mapped_bytes() { return proc_kib_field("/proc/self/smaps_rollup", "FilePmdMapped:"); }

// A session's backend profile (cmf_session_profile), keyed by (phase, op,
// weight), so that the work between timed tests can be subtracted out.
struct Profile {
    struct Entry {
        uint64_t calls = 0;
        double seconds = 0;
        uint64_t weight_bytes = 0;
        uint64_t read_bytes = 0;  // over the calls: weights, or the KV cache rows attention reads
    };
    std::map<std::tuple<std::string, std::string, std::string>, Entry> ops;

    static Profile read(const cmf_session *s) {
        char *text = nullptr;
        check(cmf_session_profile(s, &text), "profile");
        std::string copy(text);
        cmf_string_free(text);
        Profile p;
        const boost::json::value doc = boost::json::parse(copy);  // named: the loop below holds references into it
        for (const auto &v : doc.as_object().at("ops").as_array()) {
            const auto &o = v.as_object();
            Entry &e = p.ops[{std::string(o.at("phase").as_string()), std::string(o.at("op").as_string()),
                              std::string(o.at("weight").as_string())}];
            e.calls = o.at("calls").to_number<uint64_t>();
            e.seconds = o.at("seconds").to_number<double>();
            e.weight_bytes = o.at("weight_bytes").to_number<uint64_t>();
            e.read_bytes = o.at("read_bytes").to_number<uint64_t>();
        }
        return p;
    }
    Profile operator-(const Profile &b) const {
        Profile d = *this;
        for (const auto &[k, e] : b.ops) {
            Entry &x = d.ops[k];
            x.calls -= e.calls;
            x.seconds -= e.seconds;
            x.read_bytes -= e.read_bytes;
        }
        return d;
    }
    Profile &operator+=(const Profile &b) {
        for (const auto &[k, e] : b.ops) {
            Entry &x = ops[k];
            x.calls += e.calls;
            x.seconds += e.seconds;
            x.weight_bytes = e.weight_bytes;
            x.read_bytes += e.read_bytes;
        }
        return *this;
    }
    // One phase's rows, largest time first (rows without calls dropped).
    std::vector<std::pair<std::tuple<std::string, std::string, std::string>, Entry>> phase(const std::string &name) const {
        std::vector<std::pair<std::tuple<std::string, std::string, std::string>, Entry>> rows;
        for (const auto &[k, e] : ops)
            if (std::get<0>(k) == name && e.calls > 0) rows.emplace_back(k, e);
        std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) { return a.second.seconds > b.second.seconds; });
        return rows;
    }
};

// Profile rows that stream a weight whole per decode call, and those that
// read the KV cache.
bool is_matmul_op(const std::string &op) { return op == "matmul" || op == "matmul_multi"; }
bool is_attention_op(const std::string &op) { return op == "attention" || op == "attention_kv"; }

// The text table of one phase: per token, per call and share of the phase's
// backend time; in decode, matmul rows also the weight bytes they streamed
// per second (a decode matmul reads its whole weight once per call, a
// matmul_multi all of its weights) and attention rows the KV cache bytes
// (the rows each query attends, K and V).
void print_profile(const Profile &p, const char *phase, uint64_t tokens, double measured_seconds) {
    const auto rows = p.phase(phase);
    const bool decode = std::string(phase) == "decode";
    if (rows.empty() || tokens == 0) return;
    double total = 0;
    for (const auto &r : rows) total += r.second.seconds;
    std::printf("\nprofile, %s: %llu tokens; backend calls %.3f ms per token, %.1f %% of the measured time\n", phase,
                static_cast<unsigned long long>(tokens), 1e3 * total / double(tokens),
                measured_seconds > 0 ? 100.0 * total / measured_seconds : 0.0);
    std::printf("  %-13s %-44s %10s %11s %10s %7s %8s\n", "op", "weight", "calls/tok", "us/call", "ms/tok", "share",
                decode ? "GB/s" : "");
    for (const auto &[k, e] : rows) {
        // A decode matmul reads its whole weight (a prefill matmul is compute-bound:
        // no rate shown); embed reads one row of it, a norm a small vector.
        const double streamed = is_matmul_op(std::get<1>(k))      ? double(e.weight_bytes) * double(e.calls)
                                : is_attention_op(std::get<1>(k)) ? double(e.read_bytes)
                                                                  : 0.0;
        const double gbs = decode && e.seconds > 0 ? streamed / e.seconds / 1e9 : 0.0;
        std::printf("  %-13s %-44s %10.2f %11.2f %10.3f %6.1f%% ", std::get<1>(k).c_str(), std::get<2>(k).c_str(),
                    double(e.calls) / double(tokens), 1e6 * e.seconds / double(e.calls), 1e3 * e.seconds / double(tokens),
                    100.0 * e.seconds / total);
        if (gbs > 0)
            std::printf("%8.2f\n", gbs);
        else
            std::printf("%8s\n", "");
    }
    if (!decode) return;
    // What decode reads per token: every matmul's weight bytes per call (a
    // task mask's subsets count their selected share), and attention's KV
    // cache rows.
    double bytes = 0, kv = 0, kv_seconds = 0;
    for (const auto &[k, e] : rows) {
        if (is_matmul_op(std::get<1>(k))) bytes += double(e.weight_bytes) * double(e.calls);
        if (is_attention_op(std::get<1>(k))) kv += double(e.read_bytes), kv_seconds += e.seconds;
    }
    std::printf("  decode reads %.1f MiB of weights per token (matmuls; embedding rows aside)", bytes / double(tokens) / (1024.0 * 1024.0));
    if (kv > 0)
        std::printf(" and %.2f MiB of KV cache (attention: %.1f %% of the backend time)", kv / double(tokens) / (1024.0 * 1024.0),
                    100.0 * kv_seconds / total);
    std::printf("\n");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "model.layers.<L>.mlp.experts.<E>.<rest>" -> L (else -1).
long expert_layer(const std::string &name) {
    static const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) != 0) return -1;
    size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos || name.compare(dot, 13, ".mlp.experts.") != 0) return -1;
    return std::stol(name.substr(prefix.size(), dot - prefix.size()));
}

// The weight bytes one decode step reads: every tensor once, except the
// embedding table (one row; all of it when it is also the head), the MTP
// head (not run by plain decoding) and the experts, of which each MoE layer
// reads the top_k a token picks (top_k / E of its experts' bytes, experts of
// a layer being the same size).
uint64_t decode_read_bytes(const cmf_model *m, uint64_t &expert_bytes_read, uint64_t &expert_bytes_all) {
    cmf_model_info mi;
    cmf_model_info_init(&mi);
    check(cmf_model_get_info(m, &mi), "model");
    uint64_t top_k = 0;
    bool tied = false;
    if (mi.arch_json != nullptr) {
        const boost::json::value arch = boost::json::parse(mi.arch_json);
        if (const auto *moe = arch.as_object().if_contains("moe"); moe && moe->is_object())
            if (const auto *k = moe->as_object().if_contains("top_k")) top_k = k->to_number<uint64_t>();
        if (const auto *t = arch.as_object().if_contains("tie_word_embeddings"); t && t->is_bool()) tied = t->as_bool();
    }
    std::map<long, std::pair<uint64_t, std::map<std::string, bool>>> experts;  // layer -> (bytes, expert ids)
    uint64_t total = 0;
    bool has_head = false;
    uint64_t embed = 0;
    for (size_t i = 0; i < cmf_tensor_count(m); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        check(cmf_tensor_at(m, i, &t), "model");
        const std::string name = t.name;
        if (name.rfind("model.mtp.", 0) == 0) continue;
        if (name == "lm_head.weight") has_head = true;
        if (name == "model.embed_tokens.weight") {
            embed = t.nbytes;
            continue;
        }
        if (long layer = expert_layer(name); layer >= 0) {
            auto &[bytes, ids] = experts[layer];
            bytes += t.nbytes;
            const size_t at = name.find(".mlp.experts.") + 13;
            ids[name.substr(at, name.find('.', at) - at)] = true;
            continue;
        }
        total += t.nbytes;
    }
    if (!has_head && tied) total += embed;
    expert_bytes_read = expert_bytes_all = 0;
    for (const auto &[layer, e] : experts) {
        const uint64_t n = e.second.size();
        expert_bytes_all += e.first;
        expert_bytes_read += n ? e.first * std::min<uint64_t>(top_k, n) / n : 0;
    }
    return total + expert_bytes_read;
}

}  // namespace

int cmd_bench(const std::vector<std::string> &args) {
    CommonOptions common;
    SessionFlags session_flags("f16");
    std::string model;
    uint32_t n_prompt = 512, n_gen = 128, reps = 5, depth = 0, parallel = 0;
    bool json = false, no_warmup = false;
    po::options_description desc("options");
    desc.add_options()
        ("model", po::value(&model), "model file (.cmf); default: <prefix>/share/cmf/models/default.cmf")
        ("n-prompt,p", po::value(&n_prompt)->default_value(512), "pp test: prompt tokens in one batch (0 = skip)")
        ("n-gen,n", po::value(&n_gen)->default_value(128), "tg test: generated tokens, one per step (0 = skip)")
        ("reps,r", po::value(&reps)->default_value(5), "repetitions of each test")
        ("depth,d", po::value(&depth)->default_value(0),
         "run both tests after this many context tokens (prefilled, not timed), as llama-bench -d")
        ("parallel", po::value(&parallel)->default_value(0),
         "tg test of K sequences decoding together (as `cmfhost serve --parallel K` runs them, through the "
         "batch engine: one pass per step for all): each given a prompt of its own (the -d context, else 8 "
         "tokens; untimed), then -n greedy tokens; prints the aggregate tok/s of the decode passes (0 = skip)")
        ("profile", po::bool_switch(&session_flags.profile),
         "time every backend operation of the timed tests and print where prefill's and decode's time went "
         "(JSON: \"profile\"); the clock reads add ~50 ns per call")
        ("no-warmup", po::bool_switch(&no_warmup),
         "skip the untimed warm-up run (one pp and one decode step) before the timed tests, as llama-bench "
         "--no-warmup")
        ("json", po::bool_switch(&json), "print the results as JSON on stdout");
    add_common_options(desc, common);
    add_session_options(desc, session_flags);
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("bench", "[MODEL] [-p 512] [-n 128] [-r 5] [-d 0] [--parallel K] [--no-warmup] [--profile] [--json]", args, desc, pos,
                    vm))
        return 0;
    if (reps == 0) throw Failure("-r must be at least 1", 2);
    if (n_prompt == 0 && n_gen == 0) throw Failure("nothing to measure: -p and -n are both 0", 2);
    if (parallel > 0 && n_gen < 2) throw Failure("--parallel times decode passes: -n must be at least 2", 2);
    if (parallel > 256) throw Failure("--parallel: at most 256 sequences", 2);

    model = resolve_model(model);
    auto rt = make_runtime(common);
    auto m = open_model(rt.get(), model);
    uint64_t n_ctx = uint64_t(depth) + std::max<uint64_t>({n_prompt, n_gen, 1});
    auto s = make_session(rt.get(), m.get(), n_ctx, session_flags);
    if (cmf_session_n_ctx(s.get()) < n_ctx)
        throw Failure("the session context (" + std::to_string(cmf_session_n_ctx(s.get())) + ") is smaller than the test", 2);
    // Weights stay in the file mapping and load lazily: what opening and
    // binding cost in memory, before any forward pass touches a page.
    const uint64_t rss_loaded = current_rss_bytes();
    uint64_t weight_bytes = 0;  // every payload: what one decode step streams (embedding row aside)
    for (size_t i = 0; i < cmf_tensor_count(m.get()); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        check(cmf_tensor_at(m.get(), i, &t), "model");
        weight_bytes += t.nbytes;
    }
    uint64_t expert_read = 0, expert_all = 0;
    const uint64_t read_bytes = decode_read_bytes(m.get(), expert_read, expert_all);
    // Speculative decoding with the MTP head: timed as its own test.
    const bool mtp = session_flags.mtp == "on" && model_has_mtp(m.get());
    const uint64_t vocab = cmf_session_vocab_size(s.get());
    std::vector<float> logits(vocab);
    // The session's prefill batch is n_batch (512 by default): pp up to that
    // is one forward pass, as llama-bench's default.
    std::mt19937_64 rng(1234);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
    std::vector<int32_t> prompt(n_prompt), context(depth);
    for (auto &t : prompt) t = pick(rng);
    for (auto &t : context) t = pick(rng);
    // Every test starts from `depth` tokens of context: reset, then prefill
    // them (untimed; the session cuts them into batches of n_batch).
    auto start = [&] {
        check(cmf_session_reset(s.get()), "session");
        if (depth) check(cmf_session_eval(s.get(), context.data(), context.size(), CMF_LOGITS_LAST, logits.data(), logits.size()), "depth");
    };

    // The profile covers the timed work only: what start() prefilled is
    // taken out by reading the profile before and after each test.
    Profile profile;
    auto timed = [&](auto &&test) {
        if (!session_flags.profile) return test();
        const Profile before = Profile::read(s.get());
        test();
        profile += Profile::read(s.get()) - before;
    };
    // Warm-up, untimed and outside the profile (as llama-bench's): the first
    // pass over the weights maps the file's pages into this process and
    // wakes the thread pool, which a first timed repetition would otherwise
    // pay for. With the 0.6B q4 file in the page cache the first repetition
    // measured no slower (pp16 and tg16, -r 1, 4 alternating runs each way),
    // but a script that runs -r 1 per process (bench/qwen06b.sh) should not
    // depend on that.
    if (!no_warmup) {
        if (n_prompt) {
            start();
            check(cmf_session_eval(s.get(), prompt.data(), prompt.size(), CMF_LOGITS_LAST, logits.data(), logits.size()), "warm-up");
        }
        if (n_gen) {
            start();
            const int32_t tok = pick(rng);
            check(cmf_session_eval(s.get(), &tok, 1, CMF_LOGITS_LAST, logits.data(), logits.size()), "warm-up");
        }
    }
    std::vector<double> pp, tg, tg_mtp, tg_plain_gen;
    uint64_t drafted = 0, accepted = 0;
    for (uint32_t r = 0; r < reps; ++r) {
        if (n_prompt) {
            start();
            timed([&] {
            auto t0 = std::chrono::steady_clock::now();
            check(cmf_session_eval(s.get(), prompt.data(), prompt.size(), CMF_LOGITS_LAST, logits.data(), logits.size()), "pp");
            pp.push_back(double(n_prompt) / seconds_since(t0));
            });
        }
        if (n_gen) {
            start();
            timed([&] {
            int32_t tok = pick(rng);
            auto t0 = std::chrono::steady_clock::now();
            for (uint32_t i = 0; i < n_gen; ++i) {
                check(cmf_session_eval(s.get(), &tok, 1, CMF_LOGITS_LAST, logits.data(), logits.size()), "tg");
                tok = static_cast<int32_t>(cmf::argmax(logits.data(), logits.size()));
            }
            tg.push_back(double(n_gen) / seconds_since(t0));
            });
        }
        if (n_gen && mtp) {
            // The same greedy decoding through generate(), the MTP head
            // drafting: the same tokens, fewer forward passes when drafts
            // are accepted; and generate() from the same token without
            // drafting, the baseline of the speed-up (the same code path,
            // so the ratio is the drafting's alone, not the tg loop's
            // per-token library call and argmax). Decode times exclude the
            // one-token prompt.
            const int32_t first = pick(rng);
            cmf_generate_options go;
            cmf_generate_options_init(&go);
            go.max_tokens = n_gen;
            go.temperature = 0;
            go.repetition_penalty = 1.0f;
            for (int32_t speculative : {1, 0}) {
                start();
                go.speculative = speculative;
                cmf_generate_stats gs;
                cmf_generate_stats_init(&gs);
                timed([&] { check(cmf_session_generate(s.get(), &first, 1, &go, &gs), "tg (MTP)"); });
                (speculative ? tg_mtp : tg_plain_gen).push_back(gs.decode_tok_s);
                drafted += gs.draft_tokens;
                accepted += gs.draft_accepted;
            }
        }
    }
    // K sequences through a batch engine of K slots, as `serve` runs them:
    // every decode pass one forward_batch over all K. Each rep's rate is the
    // engine's own count: the tokens of its decode passes over their time
    // (prompts are prefilled in passes of their own, untimed; each
    // request's first token comes from its prefill pass, so not counted).
    std::vector<double> tg_par;
    bool par_batched = false;
    if (parallel > 0) {
        cmf_batch_options bo;
        cmf_batch_options_init(&bo);
        bo.n_slots = parallel;
        const uint64_t prompt_len = depth ? depth : 8;
        bo.n_ctx = prompt_len + n_gen;
        bo.prefill_chunk = uint32_t(std::min<uint64_t>(prompt_len * parallel, 4096));
        BatchPtr batch = make_batch(rt.get(), m.get(), bo, session_flags, "--parallel: cannot create the batch engine");
        cmf_generate_options go;
        cmf_generate_options_init(&go);
        go.max_tokens = n_gen;
        go.temperature = 0;
        go.repetition_penalty = 1.0f;
        std::vector<std::vector<int32_t>> prompts(parallel, std::vector<int32_t>(prompt_len));
        for (auto &p : prompts)
            for (auto &t : p) t = pick(rng);
        auto run_all = [&] {
            for (const auto &p : prompts) check(cmf_batch_submit(batch.get(), p.data(), p.size(), &go, nullptr, nullptr), "--parallel");
            uint32_t pending = 1;
            while (pending > 0) check(cmf_batch_step(batch.get(), 0, &pending), "--parallel");
        };
        auto stats = [&] {
            cmf_batch_stats st;
            cmf_batch_stats_init(&st);
            check(cmf_batch_get_stats(batch.get(), &st), "--parallel");
            return st;
        };
        if (!no_warmup) run_all();
        for (uint32_t r = 0; r < reps; ++r) {
            const cmf_batch_stats a = stats();
            run_all();
            const cmf_batch_stats b = stats();
            if (b.failed != a.failed) throw Failure("--parallel: a request failed (the model's error went to its callback)");
            tg_par.push_back(double(b.generated_tokens - a.generated_tokens - parallel) / (b.decode_seconds - a.decode_seconds));
            par_batched = b.batched != 0;
        }
    }
    const uint64_t rss = peak_rss_bytes();
    const uint64_t pmd_mapped = file_pmd_mapped_bytes();
    const int threads = cmf_runtime_threads(rt.get());
    // As llama-bench names them: "tg128", "tg128 @ d2048".
    // The MTP test: "tg128-mtp".
    auto label = [&](const char *name, uint32_t n) {
        std::string base = name, suffix;
        if (const size_t dash = base.find('-'); dash != std::string::npos) suffix = base.substr(dash), base.resize(dash);
        return base + std::to_string(n) + suffix + (depth ? " @ d" + std::to_string(depth) : std::string());
    };
    auto row = [&](const char *name, uint32_t n, const std::vector<double> &v) {
        Summary su = summarize(v);
        if (!json)
            std::printf("%-12s  %10.2f tok/s  ± %.2f (median of %zu; min %.2f, max %.2f)\n", label(name, n).c_str(), su.median,
                        su.stddev, v.size(), su.min, su.max);
        boost::json::array samples;
        for (double x : v) samples.push_back(x);
        return boost::json::object{{"test", label(name, n)}, {"n_tokens", n}, {"n_depth", depth},
                                   {"median_tok_s", su.median}, {"mean_tok_s", su.mean}, {"stddev_tok_s", su.stddev},
                                   {"min_tok_s", su.min}, {"max_tok_s", su.max}, {"samples_tok_s", samples}};
    };
    if (!json)
        std::printf("model %s, %d threads, %u reps, %.1f MiB of weights, KV cache %s, RSS after open+bind %.1f MiB\n",
                    model.c_str(), threads, reps, double(weight_bytes) / (1024.0 * 1024.0), session_flags.kv_cache.c_str(),
                    double(rss_loaded) / (1024.0 * 1024.0));
    boost::json::array tests;
    if (n_prompt) tests.push_back(row("pp", n_prompt, pp));
    if (n_gen) tests.push_back(row("tg", n_gen, tg));
    if (!tg_par.empty()) {
        const std::string name = "tg-x" + std::to_string(parallel);
        boost::json::object o = row(name.c_str(), n_gen, tg_par);
        o["sequences"] = parallel;
        o["batched"] = par_batched;
        o["per_sequence_median_tok_s"] = summarize(tg_par).median / parallel;
        if (!json)
            std::printf("  %u sequences decoding together%s: %.2f tok/s each\n", parallel,
                        par_batched ? " (one pass per step)" : " (one forward per sequence: the model does not batch)",
                        summarize(tg_par).median / parallel);
        tests.push_back(std::move(o));
    }
    const double acceptance = drafted ? double(accepted) / double(drafted) : 0.0;
    const double speedup = tg_plain_gen.empty() || tg_mtp.empty() ? 0.0 : summarize(tg_mtp).median / summarize(tg_plain_gen).median;
    if (!tg_mtp.empty()) {
        boost::json::object o = row("tg-mtp", n_gen, tg_mtp);
        o["drafted"] = drafted;
        o["accepted"] = accepted;
        o["acceptance"] = acceptance;
        o["speedup"] = speedup;
        o["plain_median_tok_s"] = summarize(tg_plain_gen).median;
        if (!json)
            std::printf("MTP: %llu of %llu drafts accepted (%.1f %%), decode %.2fx plain greedy generate (%.2f tok/s)\n",
                        static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(drafted),
                        100.0 * acceptance, speedup, summarize(tg_plain_gen).median);
        tests.push_back(std::move(o));
    }
    // Time of the timed tests, to set the profile's backend time against.
    double pp_seconds = 0, tg_seconds = 0;
    for (double v : pp) pp_seconds += double(n_prompt) / v;
    for (double v : tg) tg_seconds += double(n_gen) / v;
    if (json) {
        boost::json::object o{{"model", model},          {"threads", threads}, {"kv_cache", session_flags.kv_cache},
                              {"reps", reps},            {"warmup", !no_warmup}, {"tests", tests},
                              {"weight_bytes", weight_bytes}, {"decode_read_bytes", read_bytes},
                              {"rss_after_load_bytes", rss_loaded},
                              {"peak_rss_bytes", rss},   {"file_pmd_mapped_bytes", pmd_mapped}};
        if (session_flags.profile) {
            boost::json::array rows;
            for (const char *ph : {"prefill", "decode"})
                for (const auto &[k, e] : profile.phase(ph))
                    rows.push_back(boost::json::object{{"phase", ph}, {"op", std::get<1>(k)}, {"weight", std::get<2>(k)},
                                                       {"calls", e.calls}, {"seconds", e.seconds},
                                                       {"weight_bytes", e.weight_bytes}, {"read_bytes", e.read_bytes}});
            o["profile"] = boost::json::object{{"prefill_tokens", uint64_t(n_prompt) * (n_prompt ? reps : 0)},
                                               {"prefill_seconds", pp_seconds},
                                               {"decode_tokens", uint64_t(n_gen) * (n_gen ? reps : 0)},
                                               {"decode_seconds", tg_seconds},
                                               {"ops", std::move(rows)}};
        }
        std::cout << boost::json::serialize(o) << "\n";
    } else {
        if (n_gen)
            std::printf("tg streams %.2f GB/s of weights (median tok/s x weight bytes)\n",
                        summarize(tg).median * double(weight_bytes) / 1e9);
        if (n_gen && (expert_all > 0 || mtp)) {
            std::printf("tg reads %.1f MiB of weights per token", double(read_bytes) / (1024.0 * 1024.0));
            if (expert_all > 0)
                std::printf(" (experts: %.1f of %.1f MiB, the top_k each MoE layer picks)",
                            double(expert_read) / (1024.0 * 1024.0), double(expert_all) / (1024.0 * 1024.0));
            std::printf(": %.2f GB/s at the median\n", summarize(tg).median * double(read_bytes) / 1e9);
        }
        std::printf("peak RSS %.1f MiB; file pages mapped as 2 MiB pages: %.1f MiB\n", double(rss) / (1024.0 * 1024.0),
                    double(pmd_mapped) / (1024.0 * 1024.0));
        if (session_flags.profile) {
            print_profile(profile, "prefill", uint64_t(n_prompt) * reps, pp_seconds);
            print_profile(profile, "decode", uint64_t(n_gen) * reps, tg_seconds);
        }
    }
    return 0;
}

}  // namespace cmfhost
