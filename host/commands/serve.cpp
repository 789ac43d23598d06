// cmfhost serve: an OpenAI-compatible HTTP server with continuous batching
// and a chat page (docs/serve.md). The network side is host/serve/; this
// file reads the options, starts listening, loads the model and steps the
// batch engine until SIGINT/SIGTERM.
#include "serve/server.hpp"
#include "session_util.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <utility>

namespace cmfhost {
namespace {

std::string read_key_file(const std::string &path) {
    std::ifstream f(path);
    if (!f) throw Failure("--api-key-file: cannot read " + path, 2);
    std::string key;
    std::getline(f, key);
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) key.pop_back();
    if (key.empty()) throw Failure("--api-key-file: " + path + " holds no key on its first line", 2);
    return key;
}

}  // namespace

int cmd_serve(const std::vector<std::string> &args) {
    CommonOptions common;
    // The batch engine does not draft: an MTP head stays unbound (mtp=off),
    // which also lets the arch batch the slots' decode steps.
    SessionFlags session_flags("f16");
    session_flags.mtp = "off";
    std::string model, api_key, api_key_file, alias;
    serve::ServerOptions so;
    uint32_t parallel = 4, max_queue = 64, prefill_chunk = 128;
    uint64_t n_ctx = 0, max_body = so.max_body;
    int port = so.port;
    double grace = so.shutdown_grace;
    po::options_description desc("options");
    desc.add_options()
        ("model", po::value(&model), "model file (.cmf); default: <prefix>/share/cmf/models/default.cmf")
        ("host", po::value(&so.host)->default_value(so.host), "address to listen on (127.0.0.1: this machine only)")
        ("port", po::value(&port)->default_value(port), "TCP port (0: any free port, printed at start)")
        ("parallel", po::value(&parallel)->default_value(parallel), "requests decoded together (slots, each with its own KV cache)")
        ("ctx", po::value(&n_ctx)->default_value(0), "context tokens per slot (0 = min(model max, 4096))")
        ("max-queue", po::value(&max_queue)->default_value(max_queue), "requests that may wait for a slot; more get 429")
        ("prefill-chunk", po::value(&prefill_chunk)->default_value(prefill_chunk),
         "prompt tokens per step (a long prompt is prefilled in chunks between the others' tokens)")
        ("api-key", po::value(&api_key), "require 'Authorization: Bearer KEY' on /v1/* and /metrics")
        ("api-key-file", po::value(&api_key_file), "read the API key from the first line of a file")
        ("alias", po::value(&alias), "model name /v1/models reports (default: the file name without .cmf)")
        ("max-body", po::value(&max_body)->default_value(max_body), "largest request body in bytes (larger: 413)")
        ("shutdown-grace", po::value(&grace)->default_value(grace),
         "seconds in-flight requests get to finish after SIGINT/SIGTERM before they are cancelled");
    add_common_options(desc, common);
    add_session_options(desc, session_flags);
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("serve", "[MODEL] [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx N] [options]", args, desc,
                    pos, vm))
        return 0;
    if (!api_key.empty() && !api_key_file.empty()) throw Failure("give --api-key or --api-key-file, not both", 2);
    if (!api_key_file.empty()) api_key = read_key_file(api_key_file);
    if (port < 0 || port > 65535) throw Failure("--port must be 0..65535", 2);
    if (parallel == 0) throw Failure("--parallel must be at least 1", 2);
    if (prefill_chunk == 0) throw Failure("--prefill-chunk must be at least 1", 2);
    if (!(grace >= 0)) throw Failure("--shutdown-grace must be >= 0", 2);
    check_kv_cache_flag(session_flags);
    // Every request runs the one selection of the file the batch engine
    // binds (--task, --skill, --blend, --moe-mask); routing each prompt to
    // its own skill would be a model per request.
    if (session_flags.skill == "auto" || session_flags.blend == "auto")
        throw Failure("serve binds one selection of the file for every request: --skill auto and --blend auto route "
                      "each prompt (run does that); give a skill id or a blend",
                      2);
    if (session_flags.skill == "none" || session_flags.skill == "backbone") session_flags.skill.clear();
    if (session_flags.mtp != "off")
        throw Failure("serve does not decode speculatively: --mtp must be off, not '" + session_flags.mtp + "'", 2);
    so.port = static_cast<uint16_t>(port);
    so.api_key = api_key;
    so.max_body = max_body;
    so.shutdown_grace = grace;
    model = resolve_model(model);

    // Listen first, so clients see 503 (not a refused connection) while the
    // model loads.
    serve::Server server(so);
    try {
        server.start();
    } catch (const std::exception &e) {
        throw Failure(e.what());
    }
    std::cout << "cmfhost serve: listening on http://" << so.host << ":" << server.port() << "/" << std::endl;
    if (so.host != "127.0.0.1" && so.host != "::1" && api_key.empty())
        std::cerr << "cmfhost serve: warning: listening on " << so.host << " without --api-key" << std::endl;
    // A test aid: hold the loading state this long (the 503 of a loading server).
    if (const char *d = std::getenv("CMF_SERVE_LOAD_DELAY_MS"))
        std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(d)));

    ChatModel cm = open_chat_model(common, model);
    auto &m = cm.model;
    auto &tok = cm.tok;
    const cmf_model_special_ids &sp = cm.special;
    cmf_batch_options bo;
    cmf_batch_options_init(&bo);
    bo.n_slots = parallel;
    bo.n_ctx = n_ctx;
    bo.max_queue = max_queue;
    bo.prefill_chunk = prefill_chunk;
    BatchPtr batch = make_batch(cm.rt.get(), m.get(), bo, session_flags, "cannot create the batch engine");

    serve::LoadedModel lm;
    lm.batch = batch.get();
    lm.model = m.get();
    lm.tokenizer = tok.get();
    lm.model_id = alias.empty() ? std::filesystem::path(model).stem().string() : alias;
    std::error_code ec;
    auto mtime = std::filesystem::last_write_time(model, ec);
    if (!ec)
        lm.created = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::file_clock::to_sys(mtime).time_since_epoch())
                         .count();
    lm.stop_ids = sp.eos_ids;
    lm.n_stop_ids = sp.n_eos_ids;
    cmf_batch_stats st;
    cmf_batch_stats_init(&st);
    check(cmf_batch_get_stats(batch.get(), &st), "batch stats");
    std::cout << "cmfhost serve: model " << lm.model_id << " loaded: " << parallel << " slots of " << st.n_ctx
              << " tokens, " << (st.batched ? "one batched pass per step" : "one forward per request (the arch cannot batch this model)")
              << std::endl;
    server.set_model(lm);
    if (!server.stopping()) server.run_engine();
    server.stop();
    std::cout << "cmfhost serve: stopped" << std::endl;
    return 0;
}

}  // namespace cmfhost
