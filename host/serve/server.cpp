#include "serve/server.hpp"

#include "serve/chat_page.hpp"
#include "serve/openai.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace cmfhost::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// An API-key comparison whose time does not depend on where the keys
// differ (only on their length).
bool same_key(std::string_view given, std::string_view key) {
    if (given.size() != key.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
    return diff == 0;
}

void log_line(const std::string &s) {
    std::fprintf(stderr, "%s\n", s.c_str());
    std::fflush(stderr);
}

const char *status_label(http::status s) {
    static thread_local char buf[8];
    std::snprintf(buf, sizeof buf, "%u", static_cast<unsigned>(s));
    return buf;
}

}  // namespace

class Connection;

struct Server::Impl {
    ServerOptions opts;
    net::io_context ioc{1};
    tcp::acceptor acceptor{ioc};
    net::signal_set signals{ioc, SIGINT, SIGTERM};
    net::steady_timer grace{ioc};
    std::thread io_thread;
    std::atomic<bool> stopping{false};
    std::atomic<bool> loaded{false};
    std::atomic<bool> done{false};  // shutting down and nothing left in flight
    LoadedModel model;
    // Network-thread state.
    std::map<std::pair<std::string, std::string>, uint64_t> responses;  // (endpoint, status) -> count
    std::set<uint64_t> jobs;  // batch request ids in flight
    uint64_t busy = 0;        // generation responses not yet fully written

    explicit Impl(const ServerOptions &o) : opts(o) {}
    void accept();
    void on_signal();
    void cancel_all() {
        for (uint64_t id : jobs) cmf_batch_cancel(model.batch, id);
    }
    void check_done() {
        if (stopping && jobs.empty() && busy == 0 && !done.exchange(true) && loaded) cmf_batch_wake(model.batch);
    }
    std::string metrics() const;
};

// One client connection: requests in order, one response at a time.
class Connection : public std::enable_shared_from_this<Connection> {
public:
    Connection(Server::Impl &srv, tcp::socket s) : srv_(srv), stream_(std::move(s)) {}

    void start() {
        beast::error_code ec;
        stream_.socket().non_blocking(true, ec);  // the disconnect peek must never block
        read_request();
    }

    // ---- called on the network thread by a generation's posts ----
    void stream_data(std::string event) {
        queue_.push_back(std::move(event));
        pump();
    }
    // Runs after generate() returned (it is posted to this thread), so
    // job_id_ is set.
    void generation_done(std::string final_events, http::status status, std::string body) {
        srv_.jobs.erase(job_id_);
        gen_active_ = false;
        if (dead_) {
            finish_busy();
        } else if (streaming_) {
            queue_.push_back(std::move(final_events));
            stream_end_ = true;
            pump();
        } else {
            respond(status, std::move(body), "application/json");
        }
        srv_.check_done();
    }
    net::any_io_executor executor() { return stream_.get_executor(); }

private:
    void read_request() {
        parser_.emplace();
        parser_->body_limit(srv_.opts.max_body);
        stream_.expires_after(std::chrono::seconds(60));
        http::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return self->on_read(ec);
            self->read_body();
        });
    }

    // A client that sent "Expect: 100-continue" (curl does for bodies over
    // 1 KiB) waits for a 100 response before it sends the body.
    void read_body() {
        auto read = [self = shared_from_this()] {
            http::async_read(self->stream_, self->buffer_, *self->parser_,
                             [self](beast::error_code ec, size_t) { self->on_read(ec); });
        };
        const auto &req = parser_->get();
        auto it = req.find(http::field::expect);
        if (it == req.end() || !beast::iequals(it->value(), "100-continue") || parser_->is_done()) return read();
        auto res = std::make_shared<http::response<http::empty_body>>(http::status::continue_, req.version());
        http::async_write(stream_, *res, [self = shared_from_this(), res, read](beast::error_code ec, size_t) {
            if (ec) return self->close();
            read();
        });
    }

    void on_read(beast::error_code ec) {
        if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
            ec == net::error::operation_aborted || ec == net::error::connection_reset)
            return close();
        if (ec == http::error::body_limit) {
            keep_alive_ = false;
            return error(ApiError(413, "invalid_request_error",
                                  "the request body is larger than " + std::to_string(srv_.opts.max_body) + " bytes"),
                         "other");
        }
        if (ec) {
            keep_alive_ = false;
            return error(ApiError(400, "invalid_request_error", "malformed HTTP request: " + ec.message()), "other");
        }
        req_ = parser_->release();
        keep_alive_ = req_.keep_alive();
        version_ = req_.version();
        try {
            handle();
        } catch (const ApiError &e) {
            error(e, endpoint_);
        } catch (const std::exception &e) {
            error(ApiError(500, "server_error", std::string("internal error: ") + e.what()), endpoint_);
        }
    }

    void handle() {
        std::string_view target = req_.target();
        std::string path(target.substr(0, target.find('?')));
        const bool get = req_.method() == http::verb::get, post = req_.method() == http::verb::post;
        static const std::set<std::string> known = {"/", "/health", "/metrics", "/v1/models", "/v1/chat/completions",
                                                    "/v1/completions"};
        endpoint_ = known.count(path) ? path : "other";
        if (path == "/" && get) return respond(http::status::ok, std::string(kChatPage), "text/html; charset=utf-8");
        if (!srv_.loaded.load(std::memory_order_acquire))
            throw ApiError(503, "unavailable_error", "the model is loading; try again shortly");
        if (srv_.stopping) throw ApiError(503, "unavailable_error", "the server is shutting down");
        if (path == "/health" && get) return respond(http::status::ok, R"({"status":"ok"})", "application/json");
        if (!srv_.opts.api_key.empty() && path != "/") {
            auto it = req_.find(http::field::authorization);
            if (it == req_.end())
                throw ApiError(401, "authentication_error", "no API key given (send the header Authorization: Bearer KEY)",
                               "", "invalid_api_key");
            std::string_view v = it->value();
            constexpr std::string_view bearer = "Bearer ";
            if (v.substr(0, bearer.size()) != bearer || !same_key(v.substr(bearer.size()), srv_.opts.api_key))
                throw ApiError(401, "authentication_error", "incorrect API key", "", "invalid_api_key");
        }
        if (path == "/v1/models" && get)
            return respond(http::status::ok, models_json(srv_.model.model_id, srv_.model.created), "application/json");
        if (path == "/metrics" && get) return respond(http::status::ok, srv_.metrics(), "text/plain; version=0.0.4");
        if (path == "/v1/chat/completions" && post) return generate(Endpoint::Chat);
        if (path == "/v1/completions" && post) return generate(Endpoint::Completion);
        if (endpoint_ != "other")
            throw ApiError(405, "invalid_request_error",
                           "method " + std::string(req_.method_string()) + " is not allowed on " + path);
        throw ApiError(404, "not_found_error", "no such endpoint: " + std::string(req_.method_string()) + " " + path);
    }

    void generate(Endpoint endpoint);

    void respond(http::status status, std::string body, const char *content_type) {
        srv_.responses[{endpoint_, status_label(status)}]++;
        auto res = std::make_shared<http::response<http::string_body>>(status, version_);
        res->set(http::field::server, "cmfhost");
        res->set(http::field::content_type, content_type);
        res->keep_alive(keep_alive_ && !srv_.stopping);
        res->body() = std::move(body);
        res->prepare_payload();
        http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
            self->finish_busy();
            if (ec) return self->close();
            self->response_done(!res->keep_alive());
        });
    }

    void error(const ApiError &e, const std::string &endpoint) {
        endpoint_ = endpoint;
        respond(static_cast<http::status>(e.status), error_json(e), "application/json");
    }

    // Server-sent events: the header, then one chunk per event.
    void begin_stream() {
        streaming_ = true;
        srv_.responses[{endpoint_, "200"}]++;
        auto res = std::make_shared<http::response<http::empty_body>>(http::status::ok, version_);
        res->set(http::field::server, "cmfhost");
        res->set(http::field::content_type, "text/event-stream");
        res->set(http::field::cache_control, "no-cache");
        res->keep_alive(keep_alive_);
        res->chunked(true);
        auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
        writing_ = true;
        http::async_write_header(stream_, *sr, [self = shared_from_this(), res, sr](beast::error_code ec, size_t) {
            self->writing_ = false;
            if (ec) return self->client_gone();
            self->pump();
        });
    }

    void pump() {
        if (writing_ || dead_) return;
        if (!queue_.empty()) {
            auto s = std::make_shared<std::string>(std::move(queue_.front()));
            queue_.pop_front();
            writing_ = true;
            net::async_write(stream_, http::make_chunk(net::buffer(*s)),
                             [self = shared_from_this(), s](beast::error_code ec, size_t) {
                                 self->writing_ = false;
                                 if (ec) return self->client_gone();
                                 self->pump();
                             });
            return;
        }
        if (stream_end_) {
            stream_end_ = false;
            writing_ = true;
            net::async_write(stream_, http::make_chunk_last(), [self = shared_from_this()](beast::error_code ec, size_t) {
                self->writing_ = false;
                self->streaming_ = false;
                if (ec) return self->client_gone();
                self->finish_busy();
                self->response_done(!self->keep_alive_ || self->srv_.stopping);
            });
        }
    }

    void finish_busy() {
        if (busy_) {
            busy_ = false;
            --srv_.busy;
            srv_.check_done();
        }
    }

    void response_done(bool close_after) {
        if (close_after || dead_) return close();
        read_request();
    }

    // While a generation runs, a readable socket with nothing to read means
    // the client has gone: its request is cancelled at the next step.
    void watch_disconnect() {
        const uint64_t gen = ++watch_gen_;
        stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), gen](beast::error_code ec) {
            if (!self->gen_active_ || gen != self->watch_gen_ || ec == net::error::operation_aborted) return;
            if (!ec) {
                char c;
                beast::error_code peek;
                size_t n = self->stream_.socket().receive(net::buffer(&c, 1), tcp::socket::message_peek, peek);
                if (peek == net::error::would_block || (!peek && n > 0)) return;  // data (a pipelined request)
            }
            self->client_gone();
        });
    }

    void client_gone() {
        if (dead_) return;
        dead_ = true;
        if (gen_active_) cmf_batch_cancel(srv_.model.batch, job_id_);
        queue_.clear();
        if (!gen_active_) finish_busy();
        close();
    }

    void close() {
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
        stream_.socket().close(ec);
    }

    Server::Impl &srv_;
    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    http::request<http::string_body> req_;
    unsigned version_ = 11;
    bool keep_alive_ = false;
    std::string endpoint_ = "other";
    // The generation this connection answers.
    uint64_t job_id_ = 0;
    bool gen_active_ = false;
    bool busy_ = false;
    uint64_t watch_gen_ = 0;
    // Streaming state.
    bool streaming_ = false, writing_ = false, stream_end_ = false, dead_ = false;
    std::deque<std::string> queue_;
};

namespace {

// One generation: runs on the engine thread (token and done callbacks) and
// posts what the client gets to its connection on the network thread.
struct Job {
    std::shared_ptr<Connection> conn;
    Endpoint endpoint = Endpoint::Chat;
    bool stream = false, include_usage = false;
    ResponseMeta meta;
    cmf_detokenizer *detok = nullptr;
    StopScanner stops{{}};
    std::string text;  // non-streaming: the whole answer
    bool first_sent = false;
    uint64_t prompt_tokens = 0;

    ~Job() { cmf_detokenizer_free(detok); }

    void post(std::string event) {
        net::post(conn->executor(), [c = conn, e = std::move(event)]() mutable { c->stream_data(std::move(e)); });
    }
    static std::string sse(const std::string &json) { return "data: " + json + "\n\n"; }
    void emit(const std::string &out) {
        if (out.empty()) return;
        if (!stream) {
            text += out;
            return;
        }
        std::string ev;
        if (!first_sent && endpoint == Endpoint::Chat) ev += sse(chunk_json(endpoint, meta, true, "", nullptr, nullptr));
        first_sent = true;
        ev += sse(chunk_json(endpoint, meta, false, out, nullptr, nullptr));
        post(std::move(ev));
    }
};

int32_t job_on_token(void *user, int32_t token) {
    Job &j = *static_cast<Job *>(user);
    char *s = nullptr;
    size_t n = 0;
    std::string piece;
    // An id the tokenizer has no piece for (a model's padding rows past the
    // tokenizer's vocabulary) adds no text.
    if (cmf_error *e = cmf_detokenizer_push(j.detok, token, &s, &n)) {
        cmf_error_free(e);
    } else {
        piece.assign(s, n);
        cmf_string_free(s);
    }
    j.emit(j.stops.push(piece));
    return j.stops.matched() ? 1 : 0;
}

void job_on_done(void *user, const cmf_generate_stats *st, const cmf_error *err) {
    std::unique_ptr<Job> j(static_cast<Job *>(user));
    char *s = nullptr;
    size_t n = 0;
    if (cmf_error *e = cmf_detokenizer_finish(j->detok, &s, &n)) {
        cmf_error_free(e);
    } else {
        std::string rest(s, n);
        cmf_string_free(s);
        std::string out = j->stops.push(rest);
        out += j->stops.flush();
        j->emit(out);
    }
    Usage u{j->prompt_tokens, st->generated_tokens};
    const char *finish = st->stop_reason == CMF_STOP_EOS || j->stops.matched() ? "stop" : "length";
    std::string final_events, body;
    http::status status = http::status::ok;
    if (err != nullptr || st->stop_reason == CMF_STOP_CANCELLED) {
        ApiError e = err != nullptr
                         ? ApiError(500, "server_error", std::string("generation failed: ") + cmf_error_code_name(cmf_error_code(err)) +
                                                             ": " + cmf_error_message(err))
                         : ApiError(503, "unavailable_error", "the request was cancelled (the server is shutting down)");
        status = static_cast<http::status>(e.status);
        body = error_json(e);
        final_events = Job::sse(body) + "data: [DONE]\n\n";
    } else if (j->stream) {
        if (!j->first_sent && j->endpoint == Endpoint::Chat)
            final_events += Job::sse(chunk_json(j->endpoint, j->meta, true, "", nullptr, nullptr));
        final_events += Job::sse(chunk_json(j->endpoint, j->meta, false, "", finish, &u));
        if (j->include_usage) final_events += Job::sse(usage_chunk_json(j->endpoint, j->meta, u));
        final_events += "data: [DONE]\n\n";
    } else {
        body = full_response_json(j->endpoint, j->meta, j->text, finish, u);
    }
    net::post(j->conn->executor(), [c = j->conn, f = std::move(final_events), status, b = std::move(body)]() mutable {
        c->generation_done(std::move(f), status, std::move(b));
    });
}

std::vector<int32_t> encode_text(const cmf_tokenizer *t, const std::string &text, uint32_t flags) {
    int32_t *ids = nullptr;
    size_t n = 0;
    if (cmf_error *e = cmf_tokenizer_encode(t, text.data(), text.size(), flags, &ids, &n)) {
        ApiError a(400, "invalid_request_error", std::string("cannot tokenize the prompt: ") + cmf_error_message(e));
        cmf_error_free(e);
        throw a;
    }
    std::vector<int32_t> v(ids, ids + n);
    cmf_ids_free(ids);
    return v;
}

}  // namespace

void Connection::generate(Endpoint endpoint) {
    const LoadedModel &m = srv_.model;
    GenRequest g = parse_gen_request(req_.body(), endpoint);
    std::vector<int32_t> tokens;
    if (endpoint == Endpoint::Chat) {
        char *out = nullptr;
        size_t n = 0;
        if (cmf_error *e = cmf_model_render_chat(m.model, g.chat_context.data(), g.chat_context.size(), &out, &n)) {
            ApiError a(400, "invalid_request_error", std::string("the chat template refused the messages: ") + cmf_error_message(e),
                       "messages");
            cmf_error_free(e);
            throw a;
        }
        std::string prompt(out, n);
        cmf_string_free(out);
        tokens = encode_text(m.tokenizer, prompt, 0);
    } else {
        tokens = encode_text(m.tokenizer, g.prompt, CMF_ENCODE_ADD_SPECIAL);
    }
    if (tokens.empty()) throw bad_param(endpoint == Endpoint::Chat ? "messages" : "prompt", "the prompt encodes to no tokens");

    auto job = std::make_unique<Job>();
    job->conn = shared_from_this();
    job->endpoint = endpoint;
    job->stream = g.stream;
    job->include_usage = g.include_usage;
    job->meta = ResponseMeta{new_id(endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-"),
                             std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count(),
                             m.model_id};
    job->stops = StopScanner(g.stop);
    job->prompt_tokens = tokens.size();
    if (cmf_error *e = cmf_detokenizer_create(m.tokenizer, CMF_DECODE_SKIP_SPECIAL, &job->detok)) {
        std::string msg = cmf_error_message(e);
        cmf_error_free(e);
        throw ApiError(500, "server_error", "detokenizer: " + msg);
    }
    cmf_generate_options o = g.sampling;
    o.max_tokens = g.max_tokens;
    o.stop_ids = m.stop_ids;
    o.n_stop_ids = m.n_stop_ids;
    o.on_token = job_on_token;
    o.user = job.get();
    uint64_t id = 0;
    // Set before submit: the engine may call back at once.
    gen_active_ = true;
    busy_ = true;
    ++srv_.busy;
    Job *raw = job.release();
    if (cmf_error *e = cmf_batch_submit(m.batch, tokens.data(), tokens.size(), &o, job_on_done, &id)) {
        delete raw;
        gen_active_ = false;
        busy_ = false;
        --srv_.busy;
        const int32_t code = cmf_error_code(e);
        std::string msg = cmf_error_message(e);
        cmf_error_free(e);
        if (code == CMF_ERR_BUSY) throw ApiError(429, "rate_limit_error", "the server is busy: " + msg);
        if (code == CMF_ERR_BOUNDS)
            throw ApiError(400, "invalid_request_error", msg, endpoint == Endpoint::Chat ? "messages" : "prompt",
                           "context_length_exceeded");
        throw ApiError(500, "server_error", msg);
    }
    // The job may be finished and freed by now (the engine runs on another
    // thread); its done callback posts to this thread, so it is handled
    // after job_id_ is set here.
    job_id_ = id;
    srv_.jobs.insert(id);
    stream_.expires_never();
    if (g.stream) begin_stream();
    watch_disconnect();
}

// ---- the server ----------------------------------------------------------------

void Server::Impl::accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
        if (ec) {
            if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
            log_line(std::string("cmfhost serve: accept: ") + ec.message());
        } else {
            std::make_shared<Connection>(*this, std::move(s))->start();
        }
        if (!stopping) accept();
    });
}

void Server::Impl::on_signal() {
    signals.async_wait([this](beast::error_code ec, int) {
        if (ec) return;
        if (!stopping.exchange(true)) {
            beast::error_code ignore;
            acceptor.close(ignore);
            if (!loaded) {
                log_line("cmfhost serve: interrupted while loading; exiting");
                done = true;
                return;
            }
            log_line("cmfhost serve: shutting down: " + std::to_string(jobs.size()) +
                     " requests in flight get up to " + std::to_string(opts.shutdown_grace) +
                     " s to finish (signal again to cancel them now)");
            grace.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                std::chrono::duration<double>(opts.shutdown_grace)));
            grace.async_wait([this](beast::error_code e) {
                if (!e) cancel_all();
            });
        } else {
            cancel_all();
        }
        check_done();
        on_signal();
    });
}

std::string Server::Impl::metrics() const {
    std::ostringstream o;
    o << "# HELP cmf_http_responses_total HTTP responses by endpoint and status code.\n"
         "# TYPE cmf_http_responses_total counter\n";
    for (const auto &[k, v] : responses)
        o << "cmf_http_responses_total{endpoint=\"" << k.first << "\",code=\"" << k.second << "\"} " << v << "\n";
    cmf_batch_stats s;
    cmf_batch_stats_init(&s);
    if (cmf_error *e = cmf_batch_get_stats(model.batch, &s)) cmf_error_free(e);
    auto metric = [&](const char *name, const char *type, const char *help, double value) {
        o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << value << "\n";
    };
    metric("cmf_requests_total", "counter", "Generation requests accepted.", double(s.requests));
    metric("cmf_requests_finished_total", "counter", "Generation requests finished (any reason).", double(s.finished));
    metric("cmf_requests_cancelled_total", "counter", "Generation requests cancelled (client gone, shutdown).", double(s.cancelled));
    metric("cmf_requests_failed_total", "counter", "Generation requests ended by a model error.", double(s.failed));
    metric("cmf_requests_rejected_total", "counter", "Generation requests refused because the queue was full.", double(s.rejected));
    metric("cmf_prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(s.prompt_tokens));
    metric("cmf_generated_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
    metric("cmf_prefill_seconds_total", "counter", "Seconds spent in prefill passes.", s.prefill_seconds);
    metric("cmf_decode_seconds_total", "counter", "Seconds spent in decode passes.", s.decode_seconds);
    metric("cmf_queue_depth", "gauge", "Requests waiting for a slot.", double(s.waiting));
    metric("cmf_active_sequences", "gauge", "Requests in slots (prefilling or decoding).", double(s.active));
    metric("cmf_slots", "gauge", "Slots (requests decoded together at most).", double(s.n_slots));
    metric("cmf_batch_size", "gauge", "Sequences in the last decode pass.", double(s.last_batch));
    metric("cmf_prefill_tokens_per_second", "gauge", "Prompt tokens per second of the last prefill pass.", s.last_prefill_tok_s);
    metric("cmf_decode_tokens_per_second", "gauge", "Tokens per second of the last decode pass, all sequences.", s.last_decode_tok_s);
    return o.str();
}

Server::Server(const ServerOptions &opts) : impl_(std::make_unique<Impl>(opts)) {}

Server::~Server() {
    stop();
}

void Server::start() {
    Impl &s = *impl_;
    beast::error_code ec;
    auto addr = net::ip::make_address(s.opts.host, ec);
    if (ec) throw std::runtime_error("--host '" + s.opts.host + "' is not an IP address: " + ec.message());
    tcp::endpoint ep(addr, s.opts.port);
    s.acceptor.open(ep.protocol(), ec);
    if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) s.acceptor.bind(ep, ec);
    if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec)
        throw std::runtime_error("cannot listen on " + s.opts.host + ":" + std::to_string(s.opts.port) + ": " + ec.message());
    s.accept();
    s.on_signal();
    s.io_thread = std::thread([&s] { s.ioc.run(); });
}

uint16_t Server::port() const { return impl_->acceptor.is_open() ? impl_->acceptor.local_endpoint().port() : 0; }

bool Server::stopping() const { return impl_->stopping.load(); }

void Server::set_model(const LoadedModel &m) {
    impl_->model = m;
    impl_->loaded.store(true, std::memory_order_release);
}

void Server::run_engine() {
    Impl &s = *impl_;
    while (!s.done.load()) {
        uint32_t pending = 0;
        if (cmf_error *e = cmf_batch_step(s.model.batch, 200, &pending)) {
            log_line(std::string("cmfhost serve: step: ") + cmf_error_message(e));
            cmf_error_free(e);
        }
    }
    stop();
}

void Server::stop() {
    Impl &s = *impl_;
    if (!s.io_thread.joinable()) return;
    // Let the network thread finish what it is writing, then stop it.
    net::post(s.ioc, [&s] {
        beast::error_code ignore;
        s.acceptor.close(ignore);
        s.signals.cancel(ignore);
        s.grace.cancel();
        s.ioc.stop();
    });
    s.io_thread.join();
}

}  // namespace cmfhost::serve
