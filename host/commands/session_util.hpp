// Helpers shared by the commands that run a model (run, bench, ppl, logits):
// the default-model hook, sessions, tokenizers and token text.
#pragma once

#include "model_util.hpp"

#include <boost/program_options.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cmfhost {

struct SessionDeleter {
    void operator()(cmf_session *s) const { cmf_session_free(s); }
};
using SessionPtr = std::unique_ptr<cmf_session, SessionDeleter>;
struct BatchDeleter {
    void operator()(cmf_batch *b) const { cmf_batch_free(b); }
};
using BatchPtr = std::unique_ptr<cmf_batch, BatchDeleter>;
struct TokenizerDeleter {
    void operator()(cmf_tokenizer *t) const { cmf_tokenizer_free(t); }
};
using TokenizerPtr = std::unique_ptr<cmf_tokenizer, TokenizerDeleter>;
struct DetokenizerDeleter {
    void operator()(cmf_detokenizer *d) const { cmf_detokenizer_free(d); }
};
using DetokenizerPtr = std::unique_ptr<cmf_detokenizer, DetokenizerDeleter>;

// `<dir of cmfhost>/../share/cmf/models/default.cmf`: the model used when
// the MODEL argument is left out (installed by packaging).
std::string default_model_path();
// MODEL if given; else the default model, announced on stderr, or a Failure
// telling the user to pass one.
std::string resolve_model(const std::string &given);

// Session flags of the commands that run a model (run, bench, ppl, logits).
// --kv-cache defaults to f16 for run and bench (half the cache memory, and
// at depth faster: the 0.6B q8 file decodes 13.3 -> 17.6-19.0 tok/s after
// 2048 tokens; logits stay within 4e-4 of the f32 reference), and to f32
// for logits and ppl, which measure the model's numbers exactly.
// --mtp defaults to on for run and bench (the model's MTP head drafts: the
// same greedy tokens, fewer forward passes) and to off for logits and ppl,
// which never generate.
struct SessionFlags {
    explicit SessionFlags(std::string kv) : kv_cache(std::move(kv)) {}
    std::string kv_cache;  // --kv-cache: the KV cache's element type, f32, f16 or q8
    bool profile = false;  // bench --profile: CMF_SESSION_PROFILE
    std::string backend = "";  // --backend: a backend by name; "" = the first one loaded
    // What of the model runs (docs/tasks-and-skills.md): --task, --skill,
    // --blend, --moe-mask, --moe-mask-cover. "auto" for a skill or a blend
    // is resolved by the command (it needs the prompt) before make_session.
    std::string task, skill, blend, moe_mask;
    float moe_cover = 0.9f;
    std::string mtp = "on";     // --mtp: the MTP draft head, on or off (on: when the model has one)
    std::string route_stats;    // --route-stats FILE (run, ppl): routing statistics written there
};
void add_session_options(boost::program_options::options_description &desc, SessionFlags &flags);
// --route-stats FILE (run and ppl).
void add_route_stats_option(boost::program_options::options_description &desc, SessionFlags &flags);
// --kv-cache is f32, f16 or q8 (a usage error, exit status 2, otherwise).
void check_kv_cache_flag(const SessionFlags &flags);
SessionPtr make_session(cmf_runtime *rt, const cmf_model *m, uint64_t n_ctx, const SessionFlags &flags);
// The model has an MTP head (model.mtp.* tensors).
bool model_has_mtp(const cmf_model *m);
// A batch engine over m (`serve`, `bench --parallel`) with `bo`'s sizes,
// the session flags' selection (task, skill, blend, MoE mask) and arch
// options: the KV cache type unless f32, and mtp=off when the file has an
// MTP head (the engine does not draft; an unbound head lets the slots
// batch). Throws Failure starting with `what` when it cannot be made.
BatchPtr make_batch(cmf_runtime *rt, const cmf_model *m, cmf_batch_options bo, const SessionFlags &flags,
                    const std::string &what);
// With --route-stats: the session's routing statistics (CMF_MOE_STATS
// format) written to the file, replacing it only when complete.
void write_route_stats(cmf_session *s, const SessionFlags &flags);
TokenizerPtr model_tokenizer(const cmf_model *m);
// A runtime, a model opened on it, its tokenizer and special ids: what the
// commands that chat with a model (run, serve) start from.
struct ChatModel {
    RuntimePtr rt;
    ModelPtr model;
    TokenizerPtr tok;
    cmf_model_special_ids special{};
};
ChatModel open_chat_model(const CommonOptions &common, const std::string &path);
std::vector<int32_t> encode(const cmf_tokenizer *t, const std::string &text, uint32_t flags);
// "1,2,3" -> ids (Failure on anything else).
std::vector<int32_t> parse_ids(const std::string &s);
struct RouteDeleter {
    void operator()(cmf_route *r) const { cmf_route_free(r); }
};
using RoutePtr = std::unique_ptr<cmf_route, RouteDeleter>;
// Routes `text` (plain text, its first max_tokens tokens; 0 = all) over the
// file's skills.
RoutePtr route_text(cmf_runtime *rt, const cmf_model *m, const cmf_tokenizer *t, const std::string &text,
                    size_t max_tokens = 0);
// Whether some skill of the file can route (has a selection descriptor).
bool file_routes(const cmf_model *m);
// --skill auto / --blend auto for `text`: the routed skill, or the top-2
// blend, written into flags (and said on stderr). --skill none (or
// backbone) selects the backbone. With route_by_default, a file whose
// skills route picks its skill without --skill, as the original does.
void resolve_routing(cmf_runtime *rt, const cmf_model *m, const cmf_tokenizer *t, const std::string &text,
                     SessionFlags &flags, bool route_by_default, size_t max_tokens = 0);

// Renders one user turn (with an optional system message) through the
// model's chat template, generation prompt added.
std::string render_chat(const cmf_model *m, const std::vector<std::pair<std::string, std::string>> &messages);
const char *stop_reason_name(int32_t r);

}  // namespace cmfhost
