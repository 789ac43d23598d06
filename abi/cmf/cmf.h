/*
 * cmf.h — the cmf host API, version 1 (CMF_ABI_VERSION).
 *
 * For applications, the cmfhost CLI and language bindings (C, Rust via
 * bindgen, Go via cgo). Plain C99.
 *
 * Stability rules (see docs/architecture.md):
 *  - a shipped function signature never changes; new behaviour gets a new name;
 *  - every options/info struct starts with `uint32_t struct_size`, gets its
 *    defaults from a `*_init()` function, and only ever grows at the end;
 *    the library reads/writes only the fields that fit in `struct_size`;
 *  - fallible calls return `cmf_error *` (NULL = success, caller frees);
 *    on error, out-parameters are untouched;
 *  - `*_free` / `cmf_close` accept NULL;
 *  - no exception, longjmp or signal ever crosses this boundary.
 *
 * Thread-safety:
 *  - cmf_runtime: create/free/load_plugin are serialised internally; queries
 *    may run concurrently from any thread.
 *  - cmf_model: immutable after cmf_open; every query on it is safe from any
 *    number of threads. Strings and views it hands out are borrowed and valid
 *    until cmf_close.
 *  - cmf_error: owned by whoever received it; not shared.
 */
#ifndef CMF_H
#define CMF_H

#include "cmf_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CMF_ABI_VERSION 1

/* ---- versions and errors ------------------------------------------------ */

/* The host ABI version the library implements; bindings assert >= compiled. */
CMF_API uint32_t cmf_abi_version(void);
/* The plugin ABI version range the library accepts from plugins. */
CMF_API uint32_t cmf_plugin_abi_version(void);
CMF_API uint32_t cmf_plugin_abi_min_version(void);
/* Semantic version of this build, e.g. "0.1.0". Static storage. */
CMF_API const char *cmf_version_string(void);

CMF_API int32_t cmf_error_code(const cmf_error *e);        /* 0 for NULL */
CMF_API const char *cmf_error_message(const cmf_error *e); /* "" for NULL; valid until free */
CMF_API void cmf_error_free(cmf_error *e);                 /* NULL-safe */
/* Stable spelling of a code, e.g. "Bounds", "InvalidMagic". Static storage. */
CMF_API const char *cmf_error_code_name(int32_t code);

/* ---- runtime: plugins, registry, thread pool ---------------------------- */

typedef struct cmf_runtime cmf_runtime;

typedef void (*cmf_log_fn)(void *user, int32_t level, const char *message);

/* Flags for cmf_runtime_options.flags */
#define CMF_RUNTIME_NO_DEFAULT_PLUGINS 0x1u /* do not scan the default plugin dir */
#define CMF_RUNTIME_IGNORE_ENV         0x2u /* ignore CMF_PLUGIN_PATH / CMF_THREADS */

typedef struct cmf_runtime_options {
    uint32_t struct_size;
    int32_t n_threads;        /* 0 = choose from the machine (physical cores) */
    uint32_t flags;           /* CMF_RUNTIME_* */
    uint32_t reserved0;
    const char *plugin_path;  /* extra ':'-separated dirs or .so files, scanned first; NULL = none */
    cmf_log_fn log_fn;        /* NULL = warnings and errors to stderr */
    void *log_user;
    int32_t log_level;        /* highest CMF_LOG_* level delivered (default CMF_LOG_WARN) */
    uint32_t reserved1;
} cmf_runtime_options;

CMF_API void cmf_runtime_options_init(cmf_runtime_options *opts);

/*
 * Create a runtime: scans plugin_path, then CMF_PLUGIN_PATH (':'-separated,
 * unless CMF_RUNTIME_IGNORE_ENV), then the default plugin directory installed
 * next to libcmf. A plugin that cannot be loaded is not fatal: it is recorded
 * as refused (see cmf_runtime_plugin_info) and logged.
 */
CMF_API cmf_error *cmf_runtime_create(const cmf_runtime_options *opts, cmf_runtime **out);
/* Frees the runtime. Models opened on it must be closed first. NULL-safe. */
CMF_API void cmf_runtime_free(cmf_runtime *rt);
/* Load one more plugin file explicitly (absolute or relative path). */
CMF_API cmf_error *cmf_runtime_load_plugin(cmf_runtime *rt, const char *path);
/* Number of worker threads of the runtime's pool. */
CMF_API int32_t cmf_runtime_threads(const cmf_runtime *rt);

/* Plugin files seen by the runtime, loaded or refused. */
#define CMF_PLUGIN_STATUS_LOADED  1
#define CMF_PLUGIN_STATUS_REFUSED 2

typedef struct cmf_plugin_info {
    uint32_t struct_size;
    int32_t status;            /* CMF_PLUGIN_STATUS_* */
    const char *path;          /* absolute path of the file */
    const char *name;          /* plugin name, or "" when refused before init */
    const char *version;       /* plugin's own version string, or "" */
    uint32_t abi_version;      /* negotiated plugin ABI version (0 when refused early) */
    uint32_t reserved0;
    const char *message;       /* why it was refused; "" when loaded */
} cmf_plugin_info;

CMF_API void cmf_plugin_info_init(cmf_plugin_info *info);
CMF_API size_t cmf_runtime_plugin_count(const cmf_runtime *rt);
/* Strings are borrowed from the runtime. */
CMF_API cmf_error *cmf_runtime_plugin_info(const cmf_runtime *rt, size_t index, cmf_plugin_info *out);

/* Components (codecs, archs, backends) registered by the loaded plugins. */
typedef struct cmf_component_info {
    uint32_t struct_size;
    int32_t kind;              /* CMF_COMPONENT_* */
    const char *name;          /* e.g. "q4tp", "qwen", "cpu" */
    const char *version;       /* component version string */
    int32_t dtype_id;          /* codecs: the CMF dtype id; others: -1 */
    uint32_t abi_version;      /* vtable ABI version the component speaks */
    const char *detail;        /* archs: comma-separated arch_name values; backends: device/ISA summary; codecs: "" */
    const char *plugin_path;   /* file that registered it */
} cmf_component_info;

CMF_API void cmf_component_info_init(cmf_component_info *info);
CMF_API size_t cmf_runtime_component_count(const cmf_runtime *rt, int32_t kind);
CMF_API cmf_error *cmf_runtime_component_info(const cmf_runtime *rt, int32_t kind, size_t index,
                                              cmf_component_info *out);

/* ---- models: opening a container, reading tensors ----------------------- */

typedef struct cmf_model cmf_model;

#define CMF_OPEN_NO_MMAP        0x1u  /* read the file into memory instead of mapping it */
#define CMF_OPEN_NO_SHARD_MERGE 0x2u  /* open one shard alone, do not map its siblings */

typedef struct cmf_open_options {
    uint32_t struct_size;
    uint32_t flags;            /* CMF_OPEN_* */
} cmf_open_options;

CMF_API void cmf_open_options_init(cmf_open_options *opts);

/*
 * Open a CMF v2 file (or any shard of a sharded model): maps it, validates the
 * envelope, required_features, every section's bounds, the header JSON, the
 * directory and every tensor's bounds and size, in the original's order.
 * Tensor pages are not touched (no hashing: see cmf_verify). `opts` may be
 * NULL for defaults. The runtime must outlive the model.
 */
CMF_API cmf_error *cmf_open(cmf_runtime *rt, const char *path, const cmf_open_options *opts,
                            cmf_model **out);
/* NULL-safe. Invalidates every pointer the model handed out. */
CMF_API void cmf_close(cmf_model *m);

typedef struct cmf_tensor_info {
    uint32_t struct_size;
    int32_t dtype;             /* CMF_DTYPE_* */
    const char *name;          /* NUL-terminated UTF-8, borrowed from the model */
    uint32_t ndim;
    uint32_t shard;            /* 0-based shard index the payload lives in */
    uint64_t shape[CMF_MAX_DIMS];
    const void *data;          /* payload inside the mapping */
    uint64_t nbytes;
    uint64_t hash;             /* hash64 of the payload as stored in the directory */
    uint64_t offset;           /* offset of the payload relative to its shard's data section */
} cmf_tensor_info;

CMF_API void cmf_tensor_info_init(cmf_tensor_info *info);
CMF_API size_t cmf_tensor_count(const cmf_model *m);
/* Tensor by directory index (merged across shards). */
CMF_API cmf_error *cmf_tensor_at(const cmf_model *m, size_t index, cmf_tensor_info *out);
/* Tensor by exact name; CMF_ERR_MISSING_TENSOR if absent. */
CMF_API cmf_error *cmf_tensor(const cmf_model *m, const char *name, cmf_tensor_info *out);

/* ---- container (issue 3 grows this section) ----------------------------- */

/* ---- text (issue 5 grows this section) ---------------------------------- */

/*
 * Tokenizer: a Hugging Face tokenizer.json (BPE models: byte-level like Qwen,
 * SentencePiece-style with byte_fallback like Gemma). See docs/text.md.
 *
 * Thread-safety: a cmf_tokenizer is immutable after creation (its internal
 * word cache is locked); encode/decode/lookups may run concurrently from any
 * number of threads. A cmf_detokenizer is used by one thread at a time.
 * Strings returned through `char **out` are NUL-terminated, heap-allocated
 * by the library and freed with cmf_string_free; id arrays with cmf_ids_free.
 */
typedef struct cmf_tokenizer cmf_tokenizer;
typedef struct cmf_detokenizer cmf_detokenizer;

/* Parses tokenizer.json bytes (`json` need not be NUL-terminated; it is
 * copied). Unsupported model/normalizer/pre-tokenizer/post-processor/decoder
 * types give CMF_ERR_UNSUPPORTED naming the component; malformed JSON or
 * fields give CMF_ERR_PARSE. */
CMF_API cmf_error *cmf_tokenizer_create(const char *json, size_t len, cmf_tokenizer **out);
CMF_API void cmf_tokenizer_free(cmf_tokenizer *t);

/* Flags for cmf_tokenizer_encode */
#define CMF_ENCODE_ADD_SPECIAL 0x1u /* run the post-processor (HF add_special_tokens=True): e.g. Gemma's <bos> */
/* Flags for cmf_tokenizer_decode / cmf_detokenizer_create */
#define CMF_DECODE_SKIP_SPECIAL 0x1u /* drop special added tokens (HF skip_special_tokens=True) */

/* Encodes UTF-8 `text` (CMF_ERR_INVALID_ARGUMENT if ill-formed). Added
 * tokens (special or not) in the text always map to their ids. *ids is
 * freed with cmf_ids_free (NULL when *n_ids is 0). */
CMF_API cmf_error *cmf_tokenizer_encode(const cmf_tokenizer *t, const char *text, size_t len, uint32_t flags,
                                        int32_t **ids, size_t *n_ids);
CMF_API void cmf_ids_free(int32_t *ids);
/* Decodes ids to UTF-8 (ill-formed byte sequences become U+FFFD); an id
 * outside the vocabulary is CMF_ERR_BOUNDS. */
CMF_API cmf_error *cmf_tokenizer_decode(const cmf_tokenizer *t, const int32_t *ids, size_t n_ids, uint32_t flags,
                                        char **out, size_t *out_len);
CMF_API void cmf_string_free(char *s); /* NULL-safe */

/* One past the largest token id (model vocabulary and added tokens). */
CMF_API size_t cmf_tokenizer_vocab_size(const cmf_tokenizer *t);
/* Id of an exact token string (added tokens first); CMF_ERR_NOT_FOUND. */
CMF_API cmf_error *cmf_tokenizer_token_to_id(const cmf_tokenizer *t, const char *token, size_t len, int32_t *id);
/* The token string (piece) of an id, as stored in the vocabulary (byte-level
 * pieces are in GPT-2's byte alphabet); CMF_ERR_BOUNDS if absent. */
CMF_API cmf_error *cmf_tokenizer_id_to_token(const cmf_tokenizer *t, int32_t id, char **out, size_t *out_len);
/* 1 when `id` is a special added token, else 0. */
CMF_API int32_t cmf_tokenizer_is_special(const cmf_tokenizer *t, int32_t id);

/* Streaming detokenizer: push ids as they are generated, receive the text
 * they complete. Never returns part of a UTF-8 character: bytes of an
 * unfinished character are held until a later id completes it. The
 * detokenizer borrows `t`, which must outlive it. */
CMF_API cmf_error *cmf_detokenizer_create(const cmf_tokenizer *t, uint32_t flags, cmf_detokenizer **out);
/* *out may be "" (held bytes); always free it with cmf_string_free. */
CMF_API cmf_error *cmf_detokenizer_push(cmf_detokenizer *d, int32_t id, char **out, size_t *out_len);
/* Everything still held (ill-formed bytes as U+FFFD); resets the stream. */
CMF_API cmf_error *cmf_detokenizer_finish(cmf_detokenizer *d, char **out, size_t *out_len);
CMF_API void cmf_detokenizer_free(cmf_detokenizer *d);

/*
 * Chat templates: render a Hugging Face chat template (Jinja) with jinja2's
 * semantics and HF's environment (trim_blocks, lstrip_blocks, tojson,
 * raise_exception, strftime_now). See docs/text.md for what is covered.
 *
 * `context_json` is a JSON object holding the template variables: messages,
 * tools, add_generation_prompt, enable_thinking, bos_token, eos_token, ...
 * (a variable left out is undefined for the template, as in HF).
 * `tmpl` NULL or `tmpl_len` 0 selects the ChatML fallback (spec 6.1).
 * Errors: CMF_ERR_TEMPLATE (syntax error or raise_exception; the message
 * names the template line or carries the raised text), CMF_ERR_PARSE (bad
 * context JSON). Thread-safe (no shared state).
 */
typedef struct cmf_chat_options {
    uint32_t struct_size;
    uint32_t flags;   /* reserved, 0 */
    int64_t now_unix; /* the time strftime_now formats (local time); -1 (default) = now */
} cmf_chat_options;

CMF_API void cmf_chat_options_init(cmf_chat_options *opts);
/* *out (NUL-terminated) is freed with cmf_string_free. `options` may be NULL. */
CMF_API cmf_error *cmf_chat_render(const char *tmpl, size_t tmpl_len, const char *context_json, size_t context_len,
                                   const cmf_chat_options *options, char **out, size_t *out_len);

/*
 * Sampler: picks the next token from logits. Chain order (ARCHS.md 6.1,
 * docs/text.md): suppressed ids -> repetition penalty (once per distinct
 * token of the history: logit > 0 divided, else multiplied) -> presence
 * penalty -> greedy if temperature < 1e-6 (lowest index among equal maxima)
 * else: / temperature -> softmax -> min-p -> top-k (ties survive) -> top-p
 * (shortest prefix reaching top_p) -> renormalise -> inverse-CDF draw with
 * SplitMix64(seed). Same seed, same history, same logits: same ids.
 * A cmf_sampler is used by one thread at a time.
 */
typedef struct cmf_sampler cmf_sampler;

typedef struct cmf_sampler_params {
    uint32_t struct_size;
    float temperature;        /* default 0.7; < 1e-6 = greedy */
    int32_t top_k;            /* default 40; <= 0 = off */
    float top_p;              /* default 0.9; >= 1 = off */
    float min_p;              /* default 0.05; 0 = off */
    float repetition_penalty; /* default 1.1; 1 = off */
    float presence_penalty;   /* default 0 = off */
    uint32_t reserved0;
    uint64_t seed;            /* default 0 */
} cmf_sampler_params;

CMF_API void cmf_sampler_params_init(cmf_sampler_params *p);
CMF_API cmf_error *cmf_sampler_create(const cmf_sampler_params *p, cmf_sampler **out);
CMF_API void cmf_sampler_free(cmf_sampler *s);
/* Appends ids to the history the penalties see (the prompt, or tokens
 * generated elsewhere); cmf_sampler_sample appends its own picks. */
CMF_API cmf_error *cmf_sampler_accept(cmf_sampler *s, const int32_t *ids, size_t n);
/* Ids that are never sampled (logit forced to -inf). */
CMF_API cmf_error *cmf_sampler_suppress(cmf_sampler *s, const int32_t *ids, size_t n);
/* Replaces the stop set (eos ids: any of them ends generation). */
CMF_API cmf_error *cmf_sampler_set_stop_ids(cmf_sampler *s, const int32_t *ids, size_t n);
/* 1 when `id` is in the stop set. */
CMF_API int32_t cmf_sampler_is_stop(const cmf_sampler *s, int32_t id);
CMF_API cmf_error *cmf_sampler_sample(cmf_sampler *s, const float *logits, size_t n_vocab, int32_t *out_id);

#ifdef __cplusplus
}
#endif

#endif /* CMF_H */
