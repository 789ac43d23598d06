// cmfhost run: one prompt (chat template or raw) or an interactive chat,
// streamed through the detokenizer, with a stats line on stderr.
#include "session_util.hpp"

#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

namespace cmfhost {
namespace {

// Set by SIGINT; the token callback turns it into cmf_session_cancel (a
// signal handler may only touch a sig_atomic_t).
volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) { g_interrupted = 1; }

struct Streamer {
    cmf_session *session;
    cmf_detokenizer *detok;
    std::vector<int32_t> *generated;
    std::string text;        // what was printed this turn
    cmf_error *error = nullptr;
};

void emit(Streamer &st, char *s, size_t n) {
    if (n) {
        std::fwrite(s, 1, n, stdout);
        std::fflush(stdout);
        st.text.append(s, n);
    }
    cmf_string_free(s);
}

int32_t on_token(void *user, int32_t token) {
    auto &st = *static_cast<Streamer *>(user);
    if (g_interrupted) {
        cmf_session_cancel(st.session);
        return 0;
    }
    st.generated->push_back(token);
    char *s = nullptr;
    size_t n = 0;
    if (cmf_error *e = cmf_detokenizer_push(st.detok, token, &s, &n)) {
        st.error = e;
        return 1;
    }
    emit(st, s, n);
    return 0;
}

void print_stats(const cmf_generate_stats &s) {
    std::fprintf(stderr, "\n[prompt %llu tok, generated %llu tok, prefill %.2f tok/s, decode %.2f tok/s, stop: %s]\n",
                 static_cast<unsigned long long>(s.prompt_tokens), static_cast<unsigned long long>(s.generated_tokens),
                 s.prefill_tok_s, s.decode_tok_s, stop_reason_name(s.stop_reason));
}

struct Turn {
    cmf_generate_stats stats;
    std::string text;
};

// Bring the session's context to `tokens[0..keep)` + the rest as prompt and
// generate. `context` mirrors what the session holds.
Turn generate(cmf_session *s, cmf_detokenizer *d, std::vector<int32_t> &context, const std::vector<int32_t> &tokens,
              cmf_generate_options go) {
    size_t keep = 0;
    while (keep < context.size() && keep < tokens.size() && context[keep] == tokens[keep]) ++keep;
    if (keep == tokens.size() && keep > 0) --keep;  // at least one prompt token gives the first logits
    check(cmf_session_truncate(s, keep), "session");
    context.assign(tokens.begin(), tokens.end());
    Streamer st{s, d, &context, {}, nullptr};
    go.on_token = on_token;
    go.user = &st;
    Turn t;
    cmf_generate_stats_init(&t.stats);
    g_interrupted = 0;
    cmf_error *e = cmf_session_generate(s, tokens.data() + keep, tokens.size() - keep, &go, &t.stats);
    if (st.error) {
        cmf_error_free(e);
        check(st.error, "detokenize");
    }
    check(e, "generate");
    char *rest = nullptr;
    size_t n = 0;
    check(cmf_detokenizer_finish(d, &rest, &n), "detokenize");
    emit(st, rest, n);
    // The context may hold a sampled stop id the callback never saw: drop it
    // so `context` stays exact.
    if (cmf_session_n_past(s) != context.size()) check(cmf_session_truncate(s, context.size()), "session");
    t.text = std::move(st.text);
    return t;
}

}  // namespace

int cmd_run(const std::vector<std::string> &args) {
    CommonOptions common;
    SessionFlags session_flags{"f16"};
    std::string model, prompt, system;
    bool raw = false, greedy = false;
    uint32_t n_predict = 256;
    uint64_t n_ctx = 0, seed = 0;
    cmf_generate_options go;
    cmf_generate_options_init(&go);
    float temp = go.temperature, top_p = go.top_p, min_p = go.min_p, rep = go.repetition_penalty;
    int32_t top_k = go.top_k;
    po::options_description desc("options");
    desc.add_options()
        ("model", po::value(&model), "model file (.cmf); default: <prefix>/share/cmf/models/default.cmf")
        ("prompt,p", po::value(&prompt), "one prompt, answered and exit; without it: interactive chat")
        ("raw", po::bool_switch(&raw), "plain completion of the prompt (no chat template)")
        ("system", po::value(&system), "system message for the chat")
        ("n-predict,n", po::value(&n_predict)->default_value(256), "maximum tokens to generate per answer (0 = until eos / full context)")
        ("temp", po::value(&temp)->default_value(temp), "sampling temperature (< 1e-6 = greedy)")
        ("top-k", po::value(&top_k)->default_value(top_k), "top-k (<= 0 = off)")
        ("top-p", po::value(&top_p)->default_value(top_p), "top-p (>= 1 = off)")
        ("min-p", po::value(&min_p)->default_value(min_p), "min-p (<= 0 = off)")
        ("repeat-penalty", po::value(&rep)->default_value(rep), "repetition penalty (1 = off)")
        ("seed", po::value(&seed)->default_value(0), "sampling seed")
        ("greedy", po::bool_switch(&greedy), "greedy decoding (temperature 0, no penalties)")
        ("ctx", po::value(&n_ctx)->default_value(0), "context tokens (0 = min(model max, 4096))");
    add_common_options(desc, common);
    add_session_options(desc, session_flags);
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("run", "[MODEL] [-p PROMPT] [--raw] [options]", args, desc, pos, vm)) return 0;
    if (raw && !vm.count("prompt")) throw Failure("--raw needs a prompt (-p)", 2);
    if (raw && vm.count("system")) throw Failure("--system applies to chat, not --raw", 2);

    model = resolve_model(model);
    ChatModel cm = open_chat_model(common, model);
    auto &m = cm.model;
    auto &tok = cm.tok;
    const cmf_model_special_ids &sp = cm.special;
    auto sess = make_session(cm.rt.get(), m.get(), n_ctx, session_flags);
    cmf_detokenizer *d = nullptr;
    check(cmf_detokenizer_create(tok.get(), CMF_DECODE_SKIP_SPECIAL, &d), "detokenizer");
    DetokenizerPtr detok(d);

    go.max_tokens = n_predict;
    go.temperature = greedy ? 0.0f : temp;
    go.top_k = top_k;
    go.top_p = top_p;
    go.min_p = min_p;
    go.repetition_penalty = greedy ? 1.0f : rep;
    go.seed = seed;
    go.stop_ids = sp.eos_ids;
    go.n_stop_ids = sp.n_eos_ids;

    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: Ctrl-C at the prompt interrupts the read
    sigaction(SIGINT, &sa, nullptr);

    std::vector<int32_t> context;
    std::vector<std::pair<std::string, std::string>> history;
    if (!system.empty()) history.emplace_back("system", system);

    if (vm.count("prompt")) {
        std::vector<int32_t> ids;
        if (raw) {
            ids = encode(tok.get(), prompt, CMF_ENCODE_ADD_SPECIAL);
        } else {
            history.emplace_back("user", prompt);
            ids = encode(tok.get(), render_chat(m.get(), history), 0);
        }
        if (ids.empty()) throw Failure("the prompt encodes to no tokens", 2);
        if (raw) std::fwrite(prompt.data(), 1, prompt.size(), stdout);
        Turn t = generate(sess.get(), detok.get(), context, ids, go);
        std::fputc('\n', stdout);
        std::fflush(stdout);
        print_stats(t.stats);
        return 0;
    }

    const bool tty = isatty(0);
    if (tty)
        std::fprintf(stderr, "chat with %s — Ctrl-C stops an answer, Ctrl-D exits\n", model.c_str());
    for (;;) {
        if (tty) {
            std::fputs("> ", stdout);
            std::fflush(stdout);
        }
        g_interrupted = 0;
        std::string line;
        if (!std::getline(std::cin, line)) {
            if (g_interrupted && !std::cin.eof()) {  // Ctrl-C at the prompt: a fresh line
                std::cin.clear();
                std::fputc('\n', stdout);
                continue;
            }
            break;  // Ctrl-D / end of input
        }
        if (line.empty()) continue;
        history.emplace_back("user", line);
        auto ids = encode(tok.get(), render_chat(m.get(), history), 0);
        if (ids.size() >= cmf_session_n_ctx(sess.get())) {
            std::fprintf(stderr, "the conversation no longer fits the context (%zu of %llu tokens); starting over\n",
                         ids.size(), static_cast<unsigned long long>(cmf_session_n_ctx(sess.get())));
            history.erase(history.begin() + (system.empty() ? 0 : 1), history.end() - 1);
            ids = encode(tok.get(), render_chat(m.get(), history), 0);
            if (ids.size() >= cmf_session_n_ctx(sess.get())) {
                history.pop_back();
                std::fprintf(stderr, "that message alone does not fit the context\n");
                continue;
            }
        }
        Turn t = generate(sess.get(), detok.get(), context, ids, go);
        std::fputc('\n', stdout);
        std::fflush(stdout);
        print_stats(t.stats);
        history.emplace_back("assistant", t.text);
    }
    if (tty) std::fputc('\n', stdout);
    return 0;
}

}  // namespace cmfhost
