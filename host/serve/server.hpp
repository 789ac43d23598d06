// The HTTP side of `cmfhost serve` (Boost.Beast over Asio): one network
// thread accepts connections, parses requests, checks the API key and
// writes responses and server-sent event streams; generation runs on the
// batch engine (cmf.h's cmf_batch), stepped by the thread that calls
// run_engine(). Token callbacks on the engine thread post their text to
// the network thread.
#pragma once

#include <cmf/cmf.h>

#include <cstdint>
#include <memory>
#include <string>

namespace cmfhost::serve {

struct ServerOptions {
    std::string host = "127.0.0.1";
    uint16_t port = 8080;
    std::string api_key;            // "" = no key required
    uint64_t max_body = 1u << 20;   // bytes of a request body; larger: 413
    double shutdown_grace = 10;     // seconds in-flight requests get to finish on SIGINT/SIGTERM
};

// What the server runs, once loaded. Borrowed: the caller keeps them alive
// until run_engine() returns.
struct LoadedModel {
    cmf_batch *batch = nullptr;
    const cmf_model *model = nullptr;
    const cmf_tokenizer *tokenizer = nullptr;
    std::string model_id;        // the name /v1/models reports
    int64_t created = 0;         // the model file's time, unix seconds
    const int32_t *stop_ids = nullptr;
    size_t n_stop_ids = 0;
};

class Server {
public:
    explicit Server(const ServerOptions &opts);
    ~Server();
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;

    // Binds and listens (throws with the reason when it cannot), starts the
    // network thread and the signal handling. Until set_model, requests
    // other than GET / get 503.
    void start();
    // The port actually bound (the --port 0 case).
    uint16_t port() const;
    // True once SIGINT/SIGTERM arrived.
    bool stopping() const;
    // Serve `m` from now on.
    void set_model(const LoadedModel &m);
    // Steps the batch engine until a signal arrived and every request has
    // finished (or was cancelled after the grace period); then stops the
    // network thread.
    void run_engine();
    // Stops the network thread (after a failed load).
    void stop();

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace cmfhost::serve
