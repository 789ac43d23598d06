// C entry points of cmf.h's text section: tokenizer, detokenizer, chat.
#include "common/error.hpp"
#include "common/c_api_util.hpp"
#include "text/jinja.hpp"
#include "text/sampler.hpp"
#include "text/tokenizer.hpp"

#include <cmf/cmf.h>

#include <cstdlib>
#include <algorithm>
#include <cstring>

using cmf::Error;
using cmf::guard;

struct cmf_tokenizer {
    std::unique_ptr<cmf::text::Tokenizer> tok;
};
struct cmf_sampler {
    cmf::text::Sampler s;
};
struct cmf_detokenizer {
    cmf::text::StreamDecoder dec;
};

using cmf::capi::give_string;

namespace {
void require(const void *p, const char *what) {
    if (!p) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}
}  // namespace

extern "C" {

CMF_API cmf_error *cmf_tokenizer_create(const char *json, size_t len, cmf_tokenizer **out) {
    return guard([&] {
        require(out, "out");
        if (!json && len) throw Error(CMF_ERR_INVALID_ARGUMENT, "json is NULL");
        auto t = std::make_unique<cmf_tokenizer>();
        t->tok = cmf::text::Tokenizer::from_json(std::string_view(json ? json : "", len));
        *out = t.release();
    });
}

CMF_API void cmf_tokenizer_free(cmf_tokenizer *t) { delete t; }

CMF_API cmf_error *cmf_tokenizer_encode(const cmf_tokenizer *t, const char *text, size_t len, uint32_t flags,
                                        int32_t **ids, size_t *n_ids) {
    return guard([&] {
        require(t, "tokenizer");
        require(ids, "ids");
        require(n_ids, "n_ids");
        if (!text && len) throw Error(CMF_ERR_INVALID_ARGUMENT, "text is NULL");
        auto v = t->tok->encode(std::string_view(text ? text : "", len), flags & CMF_ENCODE_ADD_SPECIAL);
        int32_t *p = nullptr;
        if (!v.empty()) {
            p = static_cast<int32_t *>(std::malloc(v.size() * sizeof(int32_t)));
            if (!p) throw std::bad_alloc();
            std::memcpy(p, v.data(), v.size() * sizeof(int32_t));
        }
        *ids = p;
        *n_ids = v.size();
    });
}

CMF_API void cmf_ids_free(int32_t *ids) { std::free(ids); }
CMF_API void cmf_string_free(char *s) { std::free(s); }

CMF_API cmf_error *cmf_tokenizer_decode(const cmf_tokenizer *t, const int32_t *ids, size_t n_ids, uint32_t flags,
                                        char **out, size_t *out_len) {
    return guard([&] {
        require(t, "tokenizer");
        require(out, "out");
        if (!ids && n_ids) throw Error(CMF_ERR_INVALID_ARGUMENT, "ids is NULL");
        give_string(t->tok->decode(std::span<const int32_t>(ids, n_ids), flags & CMF_DECODE_SKIP_SPECIAL), out, out_len);
    });
}

CMF_API size_t cmf_tokenizer_vocab_size(const cmf_tokenizer *t) { return t ? t->tok->vocab_size() : 0; }

CMF_API cmf_error *cmf_tokenizer_token_to_id(const cmf_tokenizer *t, const char *token, size_t len, int32_t *id) {
    return guard([&] {
        require(t, "tokenizer");
        require(id, "id");
        if (!token && len) throw Error(CMF_ERR_INVALID_ARGUMENT, "token is NULL");
        std::string_view s(token ? token : "", len);
        auto r = t->tok->token_to_id(s);
        if (!r) throw Error(CMF_ERR_NOT_FOUND, "token '" + std::string(s) + "' is not in the vocabulary");
        *id = *r;
    });
}

CMF_API cmf_error *cmf_tokenizer_id_to_token(const cmf_tokenizer *t, int32_t id, char **out, size_t *out_len) {
    return guard([&] {
        require(t, "tokenizer");
        require(out, "out");
        std::string s;
        if (!t->tok->id_to_token(id, s))
            throw Error(CMF_ERR_BOUNDS, "id " + std::to_string(id) + " is not in the vocabulary");
        give_string(s, out, out_len);
    });
}

CMF_API int32_t cmf_tokenizer_is_special(const cmf_tokenizer *t, int32_t id) {
    return t && t->tok->is_special(id) ? 1 : 0;
}

CMF_API cmf_error *cmf_detokenizer_create(const cmf_tokenizer *t, uint32_t flags, cmf_detokenizer **out) {
    return guard([&] {
        require(t, "tokenizer");
        require(out, "out");
        *out = new cmf_detokenizer{cmf::text::StreamDecoder(*t->tok, flags & CMF_DECODE_SKIP_SPECIAL)};
    });
}

CMF_API cmf_error *cmf_detokenizer_push(cmf_detokenizer *d, int32_t id, char **out, size_t *out_len) {
    return guard([&] {
        require(d, "detokenizer");
        require(out, "out");
        give_string(d->dec.push(id), out, out_len);
    });
}

CMF_API cmf_error *cmf_detokenizer_finish(cmf_detokenizer *d, char **out, size_t *out_len) {
    return guard([&] {
        require(d, "detokenizer");
        require(out, "out");
        give_string(d->dec.finish(), out, out_len);
    });
}

CMF_API void cmf_detokenizer_free(cmf_detokenizer *d) { delete d; }

CMF_API void cmf_chat_options_init(cmf_chat_options *o) {
    if (!o) return;
    std::memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->now_unix = -1;
}

CMF_API cmf_error *cmf_chat_render(const char *tmpl, size_t tmpl_len, const char *context_json, size_t context_len,
                                   const cmf_chat_options *options, char **out, size_t *out_len) {
    return guard([&] {
        require(out, "out");
        if (!context_json && context_len) throw Error(CMF_ERR_INVALID_ARGUMENT, "context_json is NULL");
        const cmf_chat_options o = cmf::capi::copy_in(options, cmf_chat_options_init);
        std::string_view src = (tmpl && tmpl_len) ? std::string_view(tmpl, tmpl_len) : std::string_view(cmf::text::kChatmlTemplate);
        cmf::text::ChatTemplate t(src);
        give_string(t.render(std::string_view(context_json ? context_json : "", context_len), o.now_unix), out, out_len);
    });
}

}  // extern "C"

extern "C" {

CMF_API void cmf_sampler_params_init(cmf_sampler_params *p) {
    if (!p) return;
    std::memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    cmf::text::SamplerParams d;
    p->temperature = d.temperature;
    p->top_k = d.top_k;
    p->top_p = d.top_p;
    p->min_p = d.min_p;
    p->repetition_penalty = d.repetition_penalty;
    p->presence_penalty = d.presence_penalty;
    p->seed = d.seed;
}

CMF_API cmf_error *cmf_sampler_create(const cmf_sampler_params *p, cmf_sampler **out) {
    return guard([&] {
        require(out, "out");
        const cmf_sampler_params q = cmf::capi::copy_in(p, cmf_sampler_params_init);
        cmf::text::SamplerParams sp;
        sp.temperature = q.temperature;
        sp.top_k = q.top_k;
        sp.top_p = q.top_p;
        sp.min_p = q.min_p;
        sp.repetition_penalty = q.repetition_penalty;
        sp.presence_penalty = q.presence_penalty;
        sp.seed = q.seed;
        *out = new cmf_sampler{cmf::text::Sampler(sp)};
    });
}

CMF_API void cmf_sampler_free(cmf_sampler *s) { delete s; }

CMF_API cmf_error *cmf_sampler_accept(cmf_sampler *s, const int32_t *ids, size_t n) {
    return guard([&] {
        require(s, "sampler");
        if (!ids && n) throw Error(CMF_ERR_INVALID_ARGUMENT, "ids is NULL");
        s->s.accept(std::span<const int32_t>(ids, n));
    });
}

CMF_API cmf_error *cmf_sampler_suppress(cmf_sampler *s, const int32_t *ids, size_t n) {
    return guard([&] {
        require(s, "sampler");
        if (!ids && n) throw Error(CMF_ERR_INVALID_ARGUMENT, "ids is NULL");
        s->s.suppress(std::span<const int32_t>(ids, n));
    });
}

CMF_API cmf_error *cmf_sampler_set_stop_ids(cmf_sampler *s, const int32_t *ids, size_t n) {
    return guard([&] {
        require(s, "sampler");
        if (!ids && n) throw Error(CMF_ERR_INVALID_ARGUMENT, "ids is NULL");
        s->s.set_stop_ids(std::span<const int32_t>(ids, n));
    });
}

CMF_API int32_t cmf_sampler_is_stop(const cmf_sampler *s, int32_t id) { return s && s->s.is_stop(id) ? 1 : 0; }

CMF_API cmf_error *cmf_sampler_sample(cmf_sampler *s, const float *logits, size_t n_vocab, int32_t *out_id) {
    return guard([&] {
        require(s, "sampler");
        require(logits, "logits");
        require(out_id, "out_id");
        *out_id = s->s.sample(std::span<const float>(logits, n_vocab));
    });
}

}  // extern "C"
