/*
 * cmf.h — the cmf host API, version 1 (CMF_ABI_VERSION).
 *
 * For applications, the cmfhost CLI and language bindings (sdk/bindings:
 * Rust via bindgen, Go via cgo, Python via ctypes). Plain C99.
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

/* The absolute path of the plugin whose code the library is running right
 * now to load or unload it (its static constructors at dlopen,
 * cmf_plugin_init_v1, cmf_plugin_fini_v1), or NULL. Lock-free and
 * async-signal-safe: a crash handler may call it to name a plugin that
 * crashed while loading, which no library can survive in-process (cmfhost
 * does this). The string is valid until that load or unload ends. */
CMF_API const char *cmf_plugin_in_progress(void);

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
/* Directory index of the tensor named `name` (what cmf_tensor_at and
 * cmf_tensor_dequantize take); CMF_ERR_MISSING_TENSOR if absent. */
CMF_API cmf_error *cmf_tensor_index(const cmf_model *m, const char *name, size_t *index);

/* ---- container: open, inspect, verify, sign --------------------------- */

/* Model-wide facts: the envelope of shard 1 and its parsed header. Strings are
 * borrowed from the model (valid until cmf_close); absent blocks read "". */
typedef struct cmf_model_info {
    uint32_t struct_size;
    uint32_t version;            /* envelope version (2) */
    uint32_t flags;              /* envelope flags (reserved, 0) */
    uint32_t required_features;  /* CMF_FEATURE_* bits */
    uint64_t header_off, header_len;
    uint64_t dir_off, dir_len;
    uint64_t data_off, data_len;
    uint64_t masks_off, masks_len;   /* len 0 = absent */
    uint64_t vocab_off, vocab_len;
    uint64_t index_off, index_len;
    uint64_t header_hash;        /* envelope 0x70: hash64 of the header JSON, 0 = not recorded */
    uint64_t dir_hash;           /* envelope 0x78: hash64 of the directory (the file's identity) */
    uint64_t file_size;          /* bytes of shard 1 */
    uint32_t shard_count;        /* 1 for a single file */
    uint32_t mask_count;
    uint64_t tensor_count;       /* merged over shards */
    const char *header_json;     /* shard 1's header JSON as stored, NUL-terminated */
    uint64_t header_json_len;
    const char *format;          /* header "format" ("cmf") */
    const char *arch_name;
    const char *quant_type;
    const char *arch_json;             /* minified header.arch */
    const char *tokenizer_config_json; /* minified header.tokenizer_config, "" if absent/null */
    const char *skills_json;           /* minified header.skills array, "" if absent */
    const char *provenance_json;       /* minified header.provenance, "" if absent */
    uint64_t skill_count;
} cmf_model_info;

CMF_API void cmf_model_info_init(cmf_model_info *info);
CMF_API cmf_error *cmf_model_get_info(const cmf_model *m, cmf_model_info *out);
/* Path of shard `i` (0-based) as opened; NULL when out of range. Borrowed. */
CMF_API const char *cmf_model_shard_path(const cmf_model *m, uint32_t i);

/* The vocab section: HF tokenizer.json bytes verbatim (not NUL-terminated).
 * *len = 0 (and *data = NULL) when the file has none. Borrowed. */
CMF_API cmf_error *cmf_model_vocab(const cmf_model *m, const void **data, uint64_t *len);

/* Task masks (spec §5). Blob layout (the original's), bits LSB-first, 1 = active:
 * ffn_rows x ffn_row_bytes, layers x head_row_bytes, gate_bytes,
 * then layers x expert_row_bytes when has_expert_fields. */
typedef struct cmf_mask_info {
    uint32_t struct_size;
    uint32_t task_id;
    const char *name;
    const char *description;     /* NULL when null */
    const char *parent;          /* NULL when null */
    const char *priority;        /* "Fallback" | "Normal" | "Primary" */
    const char *quality_json;    /* NULL when not measured */
    float sparsity;
    uint32_t has_hot_pack;
    uint32_t has_expert_fields;
    uint32_t reserved0;
    const uint8_t *blob;         /* inside the mapping */
    uint64_t blob_len;
    uint64_t ffn_rows;           /* layers x loops (loop layout) or layers (legacy layout) */
    uint64_t ffn_row_bytes, head_row_bytes, gate_bytes, expert_row_bytes;
    uint64_t layers;             /* physical layers */
} cmf_mask_info;

CMF_API void cmf_mask_info_init(cmf_mask_info *info);
CMF_API size_t cmf_mask_count(const cmf_model *m);
/* The masks meta "default_task"; "" without masks. Borrowed. */
CMF_API const char *cmf_mask_default_task(const cmf_model *m);
CMF_API cmf_error *cmf_mask_at(const cmf_model *m, size_t index, cmf_mask_info *out);

/* Sparse index entries (spec §7), in file order. Arrays are borrowed. */
typedef struct cmf_index_entry {
    uint32_t struct_size;
    uint32_t task_id;
    uint32_t layer;
    uint32_t n_groups;           /* active FFN groups of 32 neurons */
    uint32_t n_heads;
    uint32_t reserved0;
    const uint16_t *groups;
    const uint8_t *heads;
} cmf_index_entry;

CMF_API void cmf_index_entry_init(cmf_index_entry *e);
CMF_API size_t cmf_index_entry_count(const cmf_model *m);
CMF_API cmf_error *cmf_index_entry_at(const cmf_model *m, size_t index, cmf_index_entry *out);

/* Dequantize rows [row_begin, row_end) of tensor `index` to f32 through its
 * codec, in parallel on the runtime's pool. Rows are shape[0] for ndim >= 2
 * (row length = product of the rest); a 0-D/1-D tensor is one row. `dst`
 * holds dst_count floats; it must hold at least (row_end-row_begin)*row_len. */
CMF_API cmf_error *cmf_tensor_dequantize(const cmf_model *m, size_t index, uint64_t row_begin, uint64_t row_end,
                                         float *dst, uint64_t dst_count);

/* ---- verify and detached signatures -------------------------------------- */

/* Progress of cmf_verify in payload bytes hashed. Called from pool threads,
 * never concurrently; keep it cheap. `done` never falls from call to call, and the
 * last call of a verify that hashed every payload has done == total. */
typedef void (*cmf_progress_fn)(void *user, uint64_t done, uint64_t total);

#define CMF_VERIFY_SKIP_SIGNATURE 0x1u  /* do not look for <file>.sig */

typedef struct cmf_verify_options {
    uint32_t struct_size;
    uint32_t flags;                    /* CMF_VERIFY_* */
    cmf_progress_fn progress;          /* NULL = none */
    void *progress_user;
    /* Trusted signers: each a 64-hex Ed25519 public key or its 16-hex
     * fingerprint. With n_trusted_keys > 0, every file must carry a valid
     * .sig by one of them. */
    const char *const *trusted_keys;
    size_t n_trusted_keys;
} cmf_verify_options;

CMF_API void cmf_verify_options_init(cmf_verify_options *opts);

typedef struct cmf_verify_report cmf_verify_report;

/*
 * Check the whole hash chain of every shard (spec §8): header hash,
 * directory hash, section_hashes, every tensor's hash64 (in parallel), then,
 * when a file's hashes are clean, its detached signature `<file>.sig` if one
 * exists. Problems are collected in the report, each naming what failed; the
 * returned error is only for failures to run the check (I/O, arguments).
 */
CMF_API cmf_error *cmf_verify(const cmf_model *m, const cmf_verify_options *opts, cmf_verify_report **out);
CMF_API size_t cmf_verify_problem_count(const cmf_verify_report *r);
/* e.g. "tensor 'lm_head.weight': hash64 mismatch (directory 0123..., payload 4567...)". */
CMF_API const char *cmf_verify_problem(const cmf_verify_report *r, size_t i);
/* Signatures found and valid: one per signed shard. */
typedef struct cmf_signature_info {
    uint32_t struct_size;
    uint32_t trusted;            /* 1 if in the trusted list (or no list was given) */
    const char *file;            /* the signed file */
    const char *pubkey_hex;      /* 64 lowercase hex */
    const char *fingerprint;     /* 16 hex: first 8 bytes of SHA-256(public key) */
} cmf_signature_info;
CMF_API void cmf_signature_info_init(cmf_signature_info *info);
CMF_API size_t cmf_verify_signature_count(const cmf_verify_report *r);
CMF_API cmf_error *cmf_verify_signature_at(const cmf_verify_report *r, size_t i, cmf_signature_info *out);
CMF_API void cmf_verify_report_free(cmf_verify_report *r);  /* NULL-safe */

/* Write a new Ed25519 key: `key_path` gets the 32-byte seed as 64 hex chars
 * (no newline, mode 0600) and `key_path`.pub the public key as 64 hex.
 * Refuses to overwrite an existing key. */
CMF_API cmf_error *cmf_sign_keygen(const char *key_path);
/* Sign `file` (any file, typically one .cmf shard): writes `file`.sig (the original's
 * detached signature: pretty JSON, Ed25519 over the 32-byte SHA-256 of the file). The
 * fingerprint of the signer is copied to fingerprint_out (17 bytes) if not NULL. */
CMF_API cmf_error *cmf_sign_file(const char *file, const char *key_path, char *fingerprint_out);

/* ---- writer: the original's W1 (in memory) or W2 (streaming) layout ------ */

typedef struct cmf_writer cmf_writer;

/* cmf_writer_options.flags: write as the original's streaming writer W2
 * does: each payload goes to the (temp) file inside
 * cmf_writer_add_tensor, so `data` is only read during that call and memory
 * stays bounded whatever the model size; header and directory are written
 * into a zero gap reserved before the data at finish (7 032 832 bytes for up
 * to 4096 tensors, see expected_tensors). Without it: W1, the whole layout
 * at finish from borrowed payloads (byte-identical to the original's W1). */
#define CMF_WRITER_STREAM 0x1u

typedef struct cmf_writer_options {
    uint32_t struct_size;
    uint32_t flags;              /* CMF_WRITER_STREAM or 0 */
    /* > 0: split into shards `{stem}-NNNNN-of-NNNNN.cmf` (path must end in
     * ".cmf"), starting a new shard when the next payload would push the
     * current one past this many payload bytes (a shard holds at least one). */
    uint64_t shard_max_bytes;
    const char *default_task;    /* masks meta default_task; NULL = first mask's name */
    /* CMF_WRITER_STREAM: the source tensor count W2 sizes its gap from
     * (0 = 4096); finish fails if the directory outgrows the gap. */
    uint64_t expected_tensors;
} cmf_writer_options;

CMF_API void cmf_writer_options_init(cmf_writer_options *opts);

/* A mask to write: blob in the cmf_mask_info layout for the header's arch. */
typedef struct cmf_mask_spec {
    uint32_t struct_size;
    uint32_t task_id;
    const char *name;
    const char *description;     /* NULL = null */
    float sparsity;
    uint32_t has_hot_pack;
    const char *quality_json;    /* JSON object, NULL = null (not measured) */
    const char *parent;          /* NULL = null */
    const char *priority;        /* NULL = "Normal" */
    uint32_t has_expert_fields;
    uint32_t reserved0;
    const void *blob;
    uint64_t blob_len;
} cmf_mask_spec;

CMF_API void cmf_mask_spec_init(cmf_mask_spec *spec);

/*
 * Start writing `path`. `header_json` is the header as JSON (any spacing and
 * key order); it is re-emitted as the original's W1 writer does (docs/container.md)
 * with section_hashes set by the writer. Nothing touches `path` until
 * cmf_writer_finish, which writes a temp file in the same directory and
 * renames it over `path`: an error or a crash never replaces a good file.
 * A writer is used from one thread at a time.
 */
CMF_API cmf_error *cmf_writer_create(cmf_runtime *rt, const char *path, const char *header_json, size_t header_len,
                                     const cmf_writer_options *opts, cmf_writer **out);
/* Append a tensor in the given order. `data` is BORROWED: it must stay valid
 * until cmf_writer_finish returns (with CMF_WRITER_STREAM: until this call
 * returns). Checks ndim <= 6, the name and, through the
 * dtype's codec, the payload size and structure. */
CMF_API cmf_error *cmf_writer_add_tensor(cmf_writer *w, const char *name, int32_t dtype, uint32_t ndim,
                                         const uint64_t *shape, const void *data, uint64_t nbytes);
/* Masks (copied). The sparse index section is built from them. */
CMF_API cmf_error *cmf_writer_add_mask(cmf_writer *w, const cmf_mask_spec *spec);
/* The vocab section (copied). len 0 = present but empty (the section exists with no bytes). */
CMF_API cmf_error *cmf_writer_set_vocab(cmf_writer *w, const void *data, uint64_t len);
/* Write everything and rename into place. The writer is spent afterwards. */
CMF_API cmf_error *cmf_writer_finish(cmf_writer *w);
/* NULL-safe; an unfinished writer leaves no file behind. */
CMF_API void cmf_writer_free(cmf_writer *w);

/*
 * Append-only growth (spec §9): add tensors to an existing file
 * in place. The new payloads, directory and header go after the old end of
 * file; only then is the envelope rewritten (one 128-byte write at offset 0),
 * so the file is valid at every crash point (old or new content). Existing
 * payload bytes and offsets never change. `header_json` NULL keeps the
 * current header. Tensors are borrowed as in cmf_writer_add_tensor.
 */
CMF_API cmf_error *cmf_writer_open_append(cmf_runtime *rt, const char *path, const char *header_json,
                                          size_t header_len, cmf_writer **out);

/* Compaction: rewrite `in` (any shard name: merged) as one W1 file `out`,
 * dropping dead bytes; masks, vocab and the header are kept (minus the shard
 * block), the index is rebuilt. */
CMF_API cmf_error *cmf_compact(cmf_runtime *rt, const char *in_path, const char *out_path);

/* ---- convert: HF checkpoint -> .cmf, re-encoding ------------------------ */

/* Progress of cmf_convert / cmf_requant, called on the calling thread after
 * each output tensor: tensors done/total and input bytes done/total. */
typedef void (*cmf_convert_progress_fn)(void *user, uint64_t tensors_done, uint64_t tensors_total,
                                        uint64_t bytes_done, uint64_t bytes_total);

typedef struct cmf_convert_options {
    uint32_t struct_size;
    uint32_t flags;              /* reserved, 0 */
    const char *model_dir;       /* Hugging Face checkpoint: config.json, *.safetensors, tokenizer.json */
    const char *output;          /* the .cmf to write (shards: {stem}-NNNNN-of-NNNNN.cmf) */
    const char *quant;           /* f16|bf16|q8|q8_2f|q4|q4t|q4tp|q2tp|vbit|q1|q1s|q1t; NULL = "q8" */
    const char *quant_map;       /* "PATTERN=DTYPE,PATTERN=DTYPE" overrides, first match wins; NULL = none */
    uint64_t shard_max_bytes;    /* > 0: shard the output (cmf_writer_options.shard_max_bytes) */
    cmf_convert_progress_fn progress;  /* NULL = none */
    void *progress_user;
    /* Appended. Dense FFN defrag at convert time (spec §11): a skill
     * directory as the original's `convert --defrag` reads it. Its
     * tensors/NAME.npy (float, NAME a dense FFN weight at full shape)
     * replace the checkpoint's values; the keep set is its ffn_keep.npy
     * (bool/uint8/float [layers, intermediate_size], nonzero = kept), else the
     * neurons whose down_proj column is not all zero. Each layer's gate/up
     * rows and down_proj columns are cut to it before encoding (the dtype
     * chosen for the new width), arch.intermediate_size becomes the widest
     * layer's and provenance.defrag records the cut, source_skill = this
     * string. NULL = none. Not for cmf_imagine_pack. */
    const char *defrag_dir;
} cmf_convert_options;

CMF_API void cmf_convert_options_init(cmf_convert_options *opts);

/* Convert a checkpoint directory into a W2 .cmf (docs/convert.md). The
 * output appears only when everything succeeded (temp file + rename); on any
 * error nothing is left at `output`. Uses the runtime's arch plugins (by HF
 * model_type), codecs and thread pool. Blocks; one call per runtime at a time. */
CMF_API cmf_error *cmf_convert(cmf_runtime *rt, const cmf_convert_options *opts);

/* Pack a diffusers text-to-image pipeline directory (model_index.json;
 * today Lumina2Pipeline) into one pipeline container (spec 12): its text
 * encoder, denoiser and VAE decoder under te.*, dit.*, vae.*, each
 * component's config.json as a u8 tensor, the tokenizer in the vocab
 * section (docs/imagine.md). Streams like cmf_convert (bounded memory,
 * progress, nothing left at `output` on error). opts->quant: q8 (default),
 * q4t or f32; quant_map must be NULL; shard_max_bytes as for cmf_convert. */
CMF_API cmf_error *cmf_imagine_pack(cmf_runtime *rt, const cmf_convert_options *opts);

typedef struct cmf_requant_options {
    uint32_t struct_size;
    uint32_t flags;              /* 0, or CMF_REQUANT_IN_PLACE (declared below) */
    const char *input;           /* existing .cmf (any shard name) */
    const char *output;          /* the .cmf to write; must differ from input; NULL with CMF_REQUANT_IN_PLACE */
    const char *quant;           /* target --quant name as in cmf_convert_options */
    const char *only;            /* glob: re-encode only matching tensors; NULL = all */
    uint64_t shard_max_bytes;
    cmf_convert_progress_fn progress;
    void *progress_user;
} cmf_requant_options;

CMF_API void cmf_requant_options_init(cmf_requant_options *opts);

/* Re-encode tensors: each selected tensor is dequantized through its codec
 * and quantized to the dtype the converter's policy picks for `quant`
 * (1-D, small and keep-f16 tensors become f16; unchanged dtypes are copied
 * byte for byte). Masks, vocab and header are kept; quant_type is updated
 * (unless `only` is set), feature bits and section hashes are recomputed.
 * Atomic like cmf_convert. */
CMF_API cmf_error *cmf_requant(cmf_runtime *rt, const cmf_requant_options *opts);

/* ---- text: tokenizer, chat template, sampler ---------------------------- */

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
 * Sampler: picks the next token from logits. Chain order (the original's, as
 * docs/text.md describes it): suppressed ids -> repetition penalty (once per distinct
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

/* ---- session: running a model ------------------------------------------ */

/*
 * A session binds a model with its arch plugin on a backend, owns one state
 * (KV cache) and the tokens it holds, and generates. It sees the model as a
 * `struct cmf_model_source` (cmf_plugin.h): an opened container, a raw
 * directory or anything that lists tensors; the source and everything it
 * points to must outlive the session.
 *
 * Thread-safety: one thread at a time per session, except cmf_session_cancel
 * (any thread). Sessions on one runtime share its thread pool.
 */
struct cmf_model_source;
typedef struct cmf_session cmf_session;

typedef struct cmf_session_options {
    uint32_t struct_size;
    int32_t n_threads;         /* 0 = the runtime's pool; any other value must equal it */
    uint64_t n_ctx;            /* context tokens; 0 = min(max_position_embeddings, 4096) */
    uint32_t n_batch;          /* prefill tokens per forward pass (default 512) */
    uint32_t flags;            /* CMF_SESSION_* bits; 0 by default (was reserved, zero) */
    const char *backend;       /* backend name; NULL or "" = the default backend */
    const char *arch_options;  /* arch-specific "key=value,..." or NULL */
    /* appended: what of an opened model runs (cmf_session_create_for_model;
     * cmf_session_create takes them from its model source instead and
     * refuses them here). NULL or "" = not used. See docs/tasks-and-skills.md. */
    const char *task;          /* task mask by name (spec §5): CMF_ERR_NOT_FOUND lists the file's tasks */
    const char *skill;         /* skill id (spec §9): tensor NAME reads skill.ID.NAME when present */
    const char *blend;         /* "id:w,id:w": every tensor a listed skill replaces becomes the f32
                                * sum of w_i * (skill i's tensor, else the backbone's), weights
                                * normalised by their sum; exclusive with `skill` */
    const char *moe_mask;      /* a CMF_MOE_STATS file: each MoE layer routes only among the experts
                                * covering moe_mask_cover of its recorded selections (with a task:
                                * the experts both allow) */
    float moe_mask_cover;      /* (0, 1]; 0 = 0.9 */
    uint32_t reserved1;
} cmf_session_options;

/* cmf_session_options.flags. Other bits: CMF_ERR_INVALID_ARGUMENT. */
#define CMF_SESSION_PROFILE 1u /* time every backend operation: cmf_session_profile */

CMF_API void cmf_session_options_init(cmf_session_options *opts);

/* Called with each generated token id (stop ids are not delivered). Return 0
 * to continue, nonzero to stop after this token. */
typedef int32_t (*cmf_token_fn)(void *user, int32_t token);

/* Sampling and stopping for one cmf_session_generate call. Chain order and
 * semantics as the original's sampler (docs/text.md): penalties, temperature, softmax, min-p,
 * top-k, top-p, renormalise, SplitMix64 draw; greedy when temperature < 1e-6. */
typedef struct cmf_generate_options {
    uint32_t struct_size;
    uint32_t max_tokens;           /* default 256; 0 = until a stop id or the context is full */
    float temperature;             /* default 0.7 */
    int32_t top_k;                 /* default 40; <= 0 = off */
    float top_p;                   /* default 0.9; >= 1 = off */
    float min_p;                   /* default 0.05; <= 0 = off */
    float repetition_penalty;      /* default 1.1; 1 = off */
    float presence_penalty;        /* default 0 */
    uint64_t seed;                 /* default 0 */
    const int32_t *stop_ids;       /* borrowed for the call (eos ids); may be NULL */
    size_t n_stop_ids;
    cmf_token_fn on_token;         /* may be NULL */
    void *user;
    /* Appended. Nonzero (default): speculative decoding with the model's
     * draft head (an MTP head) when it has one -- the same tokens as plain
     * decoding when greedy, the same distribution when sampling (standard
     * speculative sampling); 0: plain decoding. */
    int32_t speculative;
    uint32_t reserved0;
} cmf_generate_options;

CMF_API void cmf_generate_options_init(cmf_generate_options *opts);

/* Why generation stopped. */
#define CMF_STOP_MAX_TOKENS   1
#define CMF_STOP_EOS          2  /* a stop id was sampled */
#define CMF_STOP_CALLBACK     3  /* on_token returned nonzero */
#define CMF_STOP_CANCELLED    4  /* cmf_session_cancel */
#define CMF_STOP_CONTEXT_FULL 5

typedef struct cmf_generate_stats {
    uint32_t struct_size;
    int32_t stop_reason;           /* CMF_STOP_* */
    uint64_t prompt_tokens;
    uint64_t generated_tokens;
    uint64_t n_past;               /* tokens in the context afterwards */
    double prefill_seconds;
    double decode_seconds;
    double prefill_tok_s;          /* prompt_tokens / prefill_seconds */
    double decode_tok_s;           /* generated_tokens / decode_seconds */
    /* Appended: speculative decoding's drafted tokens and how many of them
     * were accepted (each one a forward pass saved). */
    uint64_t draft_tokens;
    uint64_t draft_accepted;
} cmf_generate_stats;

CMF_API void cmf_generate_stats_init(cmf_generate_stats *stats);

/* Create a session: finds the arch plugin for the source's arch.arch_name,
 * binds the weights on the backend, allocates the state. `opts` may be NULL. */
CMF_API cmf_error *cmf_session_create(cmf_runtime *rt, const struct cmf_model_source *src,
                                      const cmf_session_options *opts, cmf_session **out);
CMF_API void cmf_session_free(cmf_session *s); /* NULL-safe */

/* Append the prompt to the context (prefill in n_batch chunks), then sample
 * and decode until max_tokens, a stop id, the callback, cancel, or a full
 * context. Generated tokens stay in the context, so a later call continues.
 * A cancel is not an error: stats->stop_reason says CMF_STOP_CANCELLED.
 * `opts` and `stats` may be NULL. */
CMF_API cmf_error *cmf_session_generate(cmf_session *s, const int32_t *prompt, size_t n_prompt,
                                        const cmf_generate_options *opts, cmf_generate_stats *stats);
/* Make a running cmf_session_generate return at its next token; any thread. */
CMF_API void cmf_session_cancel(cmf_session *s);
/* Empty the context (keeps the bound model). */
CMF_API cmf_error *cmf_session_reset(cmf_session *s);
/* Keep the first n_keep tokens of the context, drop the rest. */
CMF_API cmf_error *cmf_session_truncate(cmf_session *s, uint64_t n_keep);

/* Append tokens to the context and return logits: CMF_LOGITS_LAST (0 ..
 * vocab floats) or CMF_LOGITS_ALL (n * vocab floats) as in cmf_plugin.h
 * (CMF_LOGITS_NONE only advances); logits_len is the capacity of `logits` in floats. */
#ifndef CMF_LOGITS_NONE
#define CMF_LOGITS_NONE 0
#define CMF_LOGITS_LAST 1
#define CMF_LOGITS_ALL  2
#endif
CMF_API cmf_error *cmf_session_eval(cmf_session *s, const int32_t *tokens, size_t n, int32_t logits_mode,
                                    float *logits, size_t logits_len);

/* The backend-operation profile of a session created with
 * CMF_SESSION_PROFILE, as JSON (free with cmf_string_free):
 *   {"ops":[{"phase":"bind"|"prefill"|"decode", "op":"matmul", "weight":
 *            "q4_block [3072,1024]" or "", "calls":N, "seconds":S,
 *            "weight_bytes":B, "read_bytes":R}, ...]}
 * one entry per (phase, operation, weight shape and dtype: the same matrix
 * of every layer shares one), each phase's entries largest time first;
 * weight_bytes is the weight's payload, per call; read_bytes what all the
 * calls read: a matmul's weight bytes per call, attention's K and V cache
 * rows (those its queries attend). A forward of more than one token is
 * prefill, of one decode.
 * Times are the wall time of each backend call (calls are synchronous), so
 * they add up to the forward passes' time less the arch's own work.
 * Without the flag: CMF_ERR_INVALID_ARGUMENT. */
CMF_API cmf_error *cmf_session_profile(const cmf_session *s, char **out_json);
/* Zero the profile (e.g. after a warm-up). */
CMF_API cmf_error *cmf_session_profile_reset(cmf_session *s);

/* Mixture-of-experts routing statistics of everything the session has
 * forwarded, as compact JSON {"<layer>":[c_0,...,c_{E-1}],...}: one entry
 * per MoE layer in layer order, c_e = how many times expert e was among a
 * token's top-k (the original implementation's CMF_MOE_STATS format, which
 * expert pruning reads); "{}" for a model without MoE layers. Free with
 * cmf_string_free. CMF_ERR_UNSUPPORTED if the arch plugin keeps none. */
CMF_API cmf_error *cmf_session_route_stats(const cmf_session *s, char **out_json);

CMF_API uint64_t cmf_session_vocab_size(const cmf_session *s); /* logits per position */
CMF_API uint64_t cmf_session_n_ctx(const cmf_session *s);
CMF_API uint64_t cmf_session_n_past(const cmf_session *s);

/* ---- running an opened model ------------------------------------------- */

/* A session over an opened container: the model's arch JSON, header JSON and
 * tensors (views into the mapping). The model must outlive the session. */
CMF_API cmf_error *cmf_session_create_for_model(cmf_runtime *rt, const cmf_model *m, const cmf_session_options *opts,
                                                cmf_session **out);

/* The model's tokenizer, from its vocab section (tokenizer.json).
 * CMF_ERR_NOT_FOUND when the file has none. Free with cmf_tokenizer_free;
 * it does not borrow the model. */
CMF_API cmf_error *cmf_model_tokenizer(const cmf_model *m, cmf_tokenizer **out);

#define CMF_MAX_EOS_IDS 16

/* Special ids from header.tokenizer_config (docs/text.md). Without the block or
 * with an empty eos list, the ChatML fallback: the ids of "<|im_end|>" and
 * "<|endoftext|>" in the vocab section's tokenizer, when present. */
typedef struct cmf_model_special_ids {
    uint32_t struct_size;
    int32_t bos_id;                /* -1 = none */
    int32_t pad_id;                /* -1 = none */
    uint32_t n_eos_ids;            /* stop ids, <= CMF_MAX_EOS_IDS */
    int32_t eos_ids[CMF_MAX_EOS_IDS];
    uint32_t has_chat_template;    /* 1 when header.tokenizer_config.chat_template is a non-empty string */
    uint32_t reserved0;
} cmf_model_special_ids;

CMF_API void cmf_model_special_ids_init(cmf_model_special_ids *ids);
CMF_API cmf_error *cmf_model_get_special_ids(const cmf_model *m, cmf_model_special_ids *out);

/* Render a chat with the file's chat template (spec §6.1) into the prompt
 * text. `context_json`: {"messages": [{"role": str, "content": str}, ...],
 * "add_generation_prompt": bool (default false)} — HF's template context;
 * bos_token / eos_token (strings of the model's bos and first eos id) are
 * added as template variables as HF does. Files without a template get
 * ChatML (spec §6.1). The template runs through the same Jinja
 * interpreter as cmf_chat_render (HF semantics); a template that raises gives
 * CMF_ERR_TEMPLATE with its message. *out: cmf_string_free. */
CMF_API cmf_error *cmf_model_render_chat(const cmf_model *m, const char *context_json, size_t len, char **out,
                                         size_t *out_len);


/* ---- GGUF import, in-place rewrites, tensor patches ---------------------- */

typedef struct cmf_import_gguf_options {
    uint32_t struct_size;
    uint32_t flags;              /* reserved, 0 */
    const char *gguf;            /* the .gguf file (llama.cpp, GGUF v2/v3) */
    const char *output;          /* the .cmf to write (shards: {stem}-NNNNN-of-NNNNN.cmf) */
    /* NULL or "keep": each tensor gets the CMF dtype nearest to its GGUF type
     * (docs/convert.md); any cmf_convert_options.quant name: every tensor is
     * dequantized and re-encoded with the converter's policy. */
    const char *quant;
    const char *quant_map;       /* as cmf_convert_options.quant_map; NULL = none */
    uint64_t shard_max_bytes;
    cmf_convert_progress_fn progress;  /* NULL = none */
    void *progress_user;
} cmf_import_gguf_options;

CMF_API void cmf_import_gguf_options_init(cmf_import_gguf_options *opts);

/* Import a GGUF file (architectures qwen2, qwen3, qwen2moe, qwen3moe, gemma,
 * gemma2, gemma3; tensor types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q2_K..Q6_K) as the Hugging Face checkpoint it was made from, through the
 * cmf_convert pipeline: the same header, tensor names and vocab section as
 * converting that checkpoint (docs/convert.md "GGUF"). Atomic like
 * cmf_convert. Errors name the file and the key or tensor at fault:
 * CMF_ERR_INVALID_MAGIC / CMF_ERR_UNSUPPORTED_VERSION / CMF_ERR_PARSE /
 * CMF_ERR_BOUNDS for a malformed file, CMF_ERR_UNKNOWN_DTYPE for a tensor
 * type it does not decode ("unsupported GGUF type IQ2_XXS"),
 * CMF_ERR_UNSUPPORTED for an architecture or tokenizer it does not import. */
CMF_API cmf_error *cmf_import_gguf(cmf_runtime *rt, const cmf_import_gguf_options *opts);

/* cmf_requant_options.flags: rewrite the input file itself (output NULL):
 * each re-encoded payload goes into the slot of the one it replaces (it
 * must not be larger: checked for every tensor before the first write), the
 * record gets the new dtype, size and hash, the directory hash is updated;
 * the header and the file length stay. Each tensor is one journaled
 * rewrite (<file>.journal, replayed by the next cmf_open after a crash), so
 * the file is valid at every crash point. */
#define CMF_REQUANT_IN_PLACE 0x1u

/* One tensor's new values for cmf_patch_tensors. */
typedef struct cmf_patch_tensor {
    uint32_t struct_size;
    uint32_t reserved0;
    const char *name;
    const float *values;         /* row-major; count must equal the tensor's element count */
    uint64_t count;
} cmf_patch_tensor;

CMF_API void cmf_patch_tensor_init(cmf_patch_tensor *p);

typedef struct cmf_patch_options {
    uint32_t struct_size;
    uint32_t flags;              /* reserved, 0 */
    const char *model;           /* the .cmf to patch (any shard name) */
    const char *output;          /* NULL: in place, only when every new payload fits its slot; else a new file */
    const char *dtype;           /* NULL: each tensor keeps its dtype; else a cmf_convert_options.quant name */
} cmf_patch_options;

CMF_API void cmf_patch_options_init(cmf_patch_options *opts);

/* Encode new values for tensors and store them: in place (journaled as
 * CMF_REQUANT_IN_PLACE, all patches of a file in one atomic rewrite), or
 * into `output` with every other tensor, the masks, the vocab and the
 * header copied (atomic). CMF_ERR_MISSING_TENSOR for an unknown name,
 * CMF_ERR_BOUNDS for a wrong value count or a payload larger than its slot
 * in place (nothing is written then). */
CMF_API cmf_error *cmf_patch_tensors(cmf_runtime *rt, const cmf_patch_options *opts, const cmf_patch_tensor *patches,
                                     size_t n_patches);

/* ---- batch: continuous batching of many generations over one model ---- */

/*
 * A batch engine binds a model once and runs many generation requests over
 * it together: each request gets a slot (its own state: KV cache); every
 * step runs one forward pass over the next token of every decoding request
 * (the weights are read once per step for all of them: memory-bound decode
 * scales with the batch), then one over the next prompt chunks of the
 * requests still in prefill (at most prefill_chunk tokens in all, so a long
 * prompt never stalls the others for long). Requests join at the next step
 * and leave when they finish; up to max_queue wait for a free slot. With
 * an arch that cannot batch the model (cmf_arch_vt.forward_batch absent or
 * refusing its layer kinds), each request runs its own forward per step.
 *
 * Each request samples and stops as cmf_session_generate does (same
 * options, same sampler); its tokens go to its on_token callback and, last,
 * its cmf_done_fn says why it stopped. Decode passes are kept apart from
 * prefill passes, so with a q8/q4 model and fewer than 16 decoding
 * requests (q8 on a CPU with AVX-512 VNNI: fewer than 64) each request's
 * greedy tokens are those it would get alone (docs/runtime.md).
 *
 * Thread-safety: cmf_batch_submit, cmf_batch_cancel, cmf_batch_wake and
 * cmf_batch_get_stats from any thread; cmf_batch_step from one thread at a
 * time. Callbacks run inside cmf_batch_step (and cmf_batch_free) on its
 * thread; they may submit and cancel, not step or free.
 */
typedef struct cmf_batch cmf_batch;

typedef struct cmf_batch_options {
    uint32_t struct_size;
    uint32_t n_slots;          /* requests decoded together (default 4) */
    uint64_t n_ctx;            /* context tokens per slot; 0 = min(max_position_embeddings, 4096) */
    uint32_t prefill_chunk;    /* prompt tokens per step, over all prefilling requests (default 128) */
    uint32_t max_queue;        /* requests that may wait for a slot (default 64); more: CMF_ERR_BUSY */
    const char *backend;       /* backend name; NULL or "" = the default backend */
    const char *arch_options;  /* arch-specific "key=value,..." or NULL */
    /* appended: what of an opened model every request runs, as in
     * cmf_session_options (cmf_batch_create_for_model; cmf_batch_create
     * takes them from its model source instead and refuses them here).
     * NULL or "" = not used. See docs/tasks-and-skills.md. */
    const char *task;          /* task mask by name: CMF_ERR_NOT_FOUND lists the file's tasks */
    const char *skill;         /* skill id: tensor NAME reads skill.ID.NAME when present */
    const char *blend;         /* "id:w,id:w" soft blend of skills; exclusive with `skill` */
    const char *moe_mask;      /* a CMF_MOE_STATS file restricting each MoE layer's routing */
    float moe_mask_cover;      /* (0, 1]; 0 = 0.9 */
    uint32_t reserved1;
} cmf_batch_options;

CMF_API void cmf_batch_options_init(cmf_batch_options *opts);

/* Called once per accepted request, last: stats->stop_reason is a
 * CMF_STOP_* code, or 0 with `error` set when the model failed (borrowed
 * for the call). `user` is the request's cmf_generate_options.user. */
typedef void (*cmf_done_fn)(void *user, const cmf_generate_stats *stats, const cmf_error *error);

/* A batch engine over a model source / an opened container (which must
 * outlive it). The pool is the runtime's. `opts` may be NULL. */
CMF_API cmf_error *cmf_batch_create(cmf_runtime *rt, const struct cmf_model_source *src, const cmf_batch_options *opts,
                                    cmf_batch **out);
CMF_API cmf_error *cmf_batch_create_for_model(cmf_runtime *rt, const cmf_model *m, const cmf_batch_options *opts,
                                              cmf_batch **out);
/* Requests still queued or running get their done callback with
 * CMF_STOP_CANCELLED first. NULL-safe. */
CMF_API void cmf_batch_free(cmf_batch *b);

/* Queue a request: the prompt (copied), sampling and stopping as in
 * cmf_session_generate (stop ids copied; on_token and user kept), and the
 * done callback (may be NULL). *id (> 0) names it for cmf_batch_cancel.
 * Errors: CMF_ERR_BUSY when max_queue requests already wait,
 * CMF_ERR_BOUNDS when the prompt exceeds a slot's context,
 * CMF_ERR_INVALID_ARGUMENT for an empty prompt or a token outside the
 * vocabulary. Only accepted requests get callbacks. */
CMF_API cmf_error *cmf_batch_submit(cmf_batch *b, const int32_t *prompt, size_t n_prompt,
                                    const cmf_generate_options *opts, cmf_done_fn on_done, uint64_t *id);
/* The request leaves at the next step (done: CMF_STOP_CANCELLED). Unknown
 * or finished ids are ignored. Any thread. */
CMF_API void cmf_batch_cancel(cmf_batch *b, uint64_t id);
/* One step. With no work it first waits up to wait_ms for a submit (or
 * cmf_batch_wake). *n_pending (may be NULL): requests in slots or waiting
 * afterwards. A model failure is not returned here: it ends the requests
 * of that pass through their done callbacks. */
CMF_API cmf_error *cmf_batch_step(cmf_batch *b, uint32_t wait_ms, uint32_t *n_pending);
/* Make a cmf_batch_step that waits for work return now. Any thread. */
CMF_API void cmf_batch_wake(cmf_batch *b);

typedef struct cmf_batch_stats {
    uint32_t struct_size;
    uint32_t n_slots;
    uint64_t n_ctx;                /* per slot */
    uint64_t requests;             /* accepted */
    uint64_t finished;             /* done callback called, any reason */
    uint64_t cancelled;            /* of them: cancelled */
    uint64_t failed;               /* of them: a model error */
    uint64_t rejected;             /* refused by submit: queue full */
    uint32_t active;               /* in slots now */
    uint32_t waiting;              /* queued now */
    uint32_t last_batch;           /* requests in the last decode pass */
    uint32_t batched;              /* 1: one pass for all (forward_batch); 0: a forward per request */
    uint64_t steps;
    uint64_t prompt_tokens;        /* prefilled, all requests */
    uint64_t generated_tokens;
    double prefill_seconds;        /* in prefill passes */
    double decode_seconds;         /* in decode passes */
    double last_prefill_tok_s;     /* tokens / time of the last prefill pass */
    double last_decode_tok_s;      /* requests / time of the last decode pass */
} cmf_batch_stats;

CMF_API void cmf_batch_stats_init(cmf_batch_stats *stats);
CMF_API cmf_error *cmf_batch_get_stats(const cmf_batch *b, cmf_batch_stats *out);
/* ---- skills: routing a prompt (spec §9) -------------------------------- */

/*
 * Which skill of the file a prompt belongs to: recon-argmin over the
 * selection descriptors of the skill registry (docs/tasks-and-skills.md).
 * The backbone's residual stream after layer phi_layer, averaged over the
 * prompt's tokens, is compared with each skill's affine subspace; the
 * smallest normalised error E wins. With the file's routing calibration the
 * scores also get probabilities, a confidence, a margin and a novelty score
 * (out of scope when above the file's threshold); without it a prompt is
 * novel when the winner's E exceeds `novelty_tau`.
 */
typedef struct cmf_route cmf_route;

typedef struct cmf_route_options {
    uint32_t struct_size;
    float novelty_tau;           /* uncalibrated files: novel when E_min > tau; 0 = 0.30 */
} cmf_route_options;

CMF_API void cmf_route_options_init(cmf_route_options *opts);

/* Routes `tokens` (the prompt as plain text tokens, no chat template).
 * CMF_ERR_NOT_FOUND when no skill of the file can route. `opts` may be NULL. */
CMF_API cmf_error *cmf_route_prompt(cmf_runtime *rt, const cmf_model *m, const int32_t *tokens, size_t n_tokens,
                                    const cmf_route_options *opts, cmf_route **out);
CMF_API void cmf_route_free(cmf_route *r); /* NULL-safe */

typedef struct cmf_route_info {
    uint32_t struct_size;
    uint32_t calibrated;         /* 1: the file has a routing calibration */
    uint32_t is_novel;           /* 1: the prompt is out of every skill's scope */
    float confidence;            /* the winner's probability (0 uncalibrated) */
    float margin;                /* leader margin, 1/(1+e) units (0 uncalibrated) */
    float novelty;               /* novelty score (NaN uncalibrated) */
    float tau;                   /* the uncalibrated threshold used */
    uint32_t reserved0;
    uint64_t score_count;        /* skills scored */
    uint64_t skipped_count;      /* skills that cannot route (no or a malformed descriptor) */
} cmf_route_info;

CMF_API void cmf_route_info_init(cmf_route_info *info);
CMF_API cmf_error *cmf_route_get_info(const cmf_route *r, cmf_route_info *out);

typedef struct cmf_route_score {
    uint32_t struct_size;
    float error;                 /* E = e / |phi|^2, lower is closer */
    float raw_error;             /* e, the squared reconstruction error */
    float probability;           /* calibrated softmax(-e / T); 0 uncalibrated */
    const char *id;              /* skill id, borrowed from the route */
} cmf_route_score;

CMF_API void cmf_route_score_init(cmf_route_score *s);
/* Score i, best first. */
CMF_API cmf_error *cmf_route_score_at(const cmf_route *r, size_t i, cmf_route_score *out);
/* Skipped skill i: its id and why, borrowed from the route. */
CMF_API cmf_error *cmf_route_skipped_at(const cmf_route *r, size_t i, const char **id, const char **why);
/* The "auto" blend of the route: its two best skills, w proportional to
 * exp(-E / 0.4), as "id:w,id:w" for cmf_session_options.blend
 * (cmf_string_free). CMF_ERR_NOT_FOUND with fewer than two scores. */
CMF_API cmf_error *cmf_route_auto_blend(const cmf_route *r, char **out);

/* ---- skills: adding, cutting and applying (spec §9) -------------------- */

/*
 * skill add: a donor Hugging Face checkpoint of the backbone's shapes
 * becomes skill `id` of a file: its chosen tensors are stored as
 * skill.ID.<name> in each backbone tensor's dtype (vbit: vbit_ro) or
 * `skill_quant`, and a registry record is added (replacing one of the same
 * id). The file grows in place: the new payloads, directory and header are
 * appended and the envelope is rewritten last, so the old bytes never move
 * and a crash at any point leaves the old file or the new one; the old
 * directory and header become dead bytes that cmf_compact drops.
 * *report_json (may be NULL; cmf_string_free) says what was added and skipped.
 */
typedef struct cmf_skill_add_options {
    uint32_t struct_size;
    uint32_t flags;              /* reserved, 0 */
    const char *model;           /* the .cmf to grow (one file, not a shard) */
    const char *output;          /* NULL: grow `model` in place; else a new file (model's bytes + the skill) */
    const char *donor_dir;       /* Hugging Face checkpoint directory */
    const char *id;              /* [A-Za-z0-9_-]+ */
    const char *name;            /* human name; NULL = none */
    const char *layers;          /* "all" | "A-B" | "i,j,k"; NULL = all */
    const char *tensors;         /* "ffn" | "attn" | "all"; NULL = ffn */
    const char *prompts_file;    /* one prompt per line: fits the selection descriptor; NULL = none */
    int64_t phi_layer;           /* -1: 2/3 of the layers */
    uint32_t rank;               /* selection rank (<= prompts - 1, <= 8); 0 = 2 */
    float min_delta;             /* keep the backbone's tensor when the donor's relative RMS change is below this */
    const char *skill_quant;     /* --quant name for the skill's tensors; NULL = each backbone tensor's dtype */
    const char *quality_file;    /* text: backbone and skill perplexity into the record; NULL = none */
    uint64_t quality_tokens;     /* 0 = 1024 */
} cmf_skill_add_options;

CMF_API void cmf_skill_add_options_init(cmf_skill_add_options *opts);
CMF_API cmf_error *cmf_skill_add(cmf_runtime *rt, const cmf_skill_add_options *opts, char **report_json);

/* skill export: the standalone skill file of a specialist against its base:
 * the specialist's tensors absent from the base or differing from it (by
 * directory hash), its masks, and one registry record carrying the base's
 * directory hash (base_dir_hash), so apply can refuse any other base. The
 * file has feature bit 6 (SKILL_FILE) and no vocab; it does not run alone. */
CMF_API cmf_error *cmf_skill_export(cmf_runtime *rt, const char *specialist, const char *base, const char *id,
                                    const char *name, const char *output, char **report_json);
/* skill apply: base + skill file -> a complete model: the base's tensors,
 * each replaced by the skill's of the same name, the skill's masks, the
 * base's vocab, the skill's record (without base_dir_hash). A base whose
 * directory hash is not the skill's key is refused, unless `force` (then a
 * warning is logged). */
CMF_API cmf_error *cmf_skill_apply(cmf_runtime *rt, const char *base, const char *skill, const char *output,
                                   int32_t force, char **report_json);

/* ---- defrag: a model without the FFN neurons a keep set leaves out (spec §11)
 *
 * Per dense layer, the kept neurons' gate/up rows and down_proj columns are
 * written at the new width; every other tensor, the vocab and the header
 * are kept, except: arch.intermediate_size becomes the widest layer's
 * (each layer's width is its tensors'), provenance.defrag records
 * kept_per_layer, pre/post widths, pruned_ratio and the source, and the
 * masks are left out (their rows are of the old widths). Kept values are
 * copied byte for byte where the dtype allows (f32/f16/bf16 and q8_row
 * rows and columns, q8_2f columns, rows of any row-encoded dtype); else the
 * tensor is re-encoded at the new width (a 32-column quant group that no
 * longer fits: q8_2f). The keep set: `task` (the file's task mask; it must
 * leave every layer and head on, and the model must not be looped), or
 * `keep_file` (a NumPy .npy bool/uint8 array [layers, intermediate_size],
 * nonzero = kept), or with neither the neurons whose down_proj column is not
 * all zero. Atomic like cmf_convert. *report_json as for the skill tools. */
typedef struct cmf_defrag_options {
    uint32_t struct_size;
    uint32_t flags;              /* reserved, 0 */
    const char *input;           /* the .cmf to defrag */
    const char *output;          /* the file to write; must differ from input */
    const char *task;            /* keep what this task mask runs; NULL = none */
    const char *keep_file;       /* ffn_keep.npy; NULL = none */
    const char *source;          /* provenance.defrag.source_skill; NULL = the task or the keep file's folder */
} cmf_defrag_options;

CMF_API void cmf_defrag_options_init(cmf_defrag_options *opts);
CMF_API cmf_error *cmf_defrag(cmf_runtime *rt, const cmf_defrag_options *opts, char **report_json);

/* ---- MoE expert defrag and expert masks (spec §11.1, §5) -------------------
 *
 * Per MoE layer of a routing statistics file ({"<layer>": [count per expert],
 * ...}, as cmf_session_route_stats and `run --route-stats` write it), the
 * experts covering `cover` of the layer's recorded selections are kept: by
 * count descending, ties to the lower expert index, until the running sum
 * reaches cover x total (the crossing expert included). Layers the stats do
 * not list, or list with a zero total, are left as they are. Stats naming a
 * layer the model lacks, a layer without experts, or another expert count
 * are refused (CMF_ERR_INVALID_ARGUMENT) before anything is written.
 *
 * cmf_moe_defrag drops the other experts: kept ones are renumbered 0..k-1 in
 * their old order (payloads copied byte for byte), the router's rows and an
 * mlp.expert_bias are gathered in that order, arch.moe stays (nominal: the
 * runtime enumerates experts by presence), masks keep their expert rows
 * renumbered, and provenance.moe_defrag records cover, kept_per_layer,
 * num_experts_pre, the renumbered routing_counts, stats_hash64 and the tool.
 * `stats` NULL: the file's own provenance.moe_defrag.routing_counts (cut a
 * defragged file tighter).
 *
 * cmf_moe_mask writes a copy of the model with one more task mask `name`
 * (expert rows as kept, every FFN row, head and layer on, quality null) that
 * `--task name` runs: the routing of the defragged file, with no weight
 * removed. `stats` is required.
 *
 * Both are atomic like cmf_convert; *report_json as for the skill tools. */
typedef struct cmf_moe_defrag_options {
    uint32_t struct_size;
    uint32_t flags;              /* reserved, 0 */
    const char *input;           /* the .cmf (any shard name: merged) */
    const char *output;          /* the file to write; must differ from input */
    const char *stats;           /* routing statistics file; see above for NULL */
    double cover;                /* (0, 1]; 0 = 0.95 */
    const char *name;            /* cmf_moe_mask: the new task's name */
} cmf_moe_defrag_options;

CMF_API void cmf_moe_defrag_options_init(cmf_moe_defrag_options *opts);
CMF_API cmf_error *cmf_moe_defrag(cmf_runtime *rt, const cmf_moe_defrag_options *opts, char **report_json);
CMF_API cmf_error *cmf_moe_mask(cmf_runtime *rt, const cmf_moe_defrag_options *opts, char **report_json);

/* ---- images: text-to-image pipelines ------------------------------------ */

/*
 * A pipeline container (spec 12; written by cmf_imagine_pack) holds a whole
 * text-to-image model. cmf_image_pipeline_create binds it through the arch
 * plugin that runs its arch_name (docs/imagine.md); cmf_imagine renders the
 * prompt through the pipeline's text template, tokenizes it with the file's
 * tokenizer, starts from seeded noise (or a given latent), denoises and
 * decodes to RGB8.
 *
 * Thread-safety: one thread at a time per pipeline. The model must outlive
 * the pipeline.
 */
typedef struct cmf_image_pipeline cmf_image_pipeline;

typedef struct cmf_image_pipeline_options {
    uint32_t struct_size;
    uint32_t flags;            /* reserved, 0 */
    const char *backend;       /* backend name; NULL or "" = the default backend */
    const char *arch_options;  /* arch-specific "key=value,..." or NULL */
} cmf_image_pipeline_options;

CMF_API void cmf_image_pipeline_options_init(cmf_image_pipeline_options *opts);
/* CMF_ERR_UNSUPPORTED when the file is not a pipeline an arch plugin runs
 * (e.g. a text model: open those with cmf_session_create_for_model). */
CMF_API cmf_error *cmf_image_pipeline_create(cmf_runtime *rt, const cmf_model *m, const cmf_image_pipeline_options *opts,
                                             cmf_image_pipeline **out);
CMF_API void cmf_image_pipeline_free(cmf_image_pipeline *p); /* NULL-safe */

typedef struct cmf_image_pipeline_info {
    uint32_t struct_size;
    uint32_t latent_channels;  /* the latent is [latent_channels][height / latent_scale][width / latent_scale] */
    uint32_t latent_scale;
    uint32_t size_multiple;    /* width and height must be multiples of this */
    uint32_t max_text_tokens;  /* a prompt's tokens beyond this are cut */
    uint32_t reserved0;
    const char *arch;          /* the arch plugin that runs it, e.g. "lumina2" (borrowed from the pipeline) */
    const char *description;   /* its components in one line (borrowed) */
} cmf_image_pipeline_info;

CMF_API void cmf_image_pipeline_info_init(cmf_image_pipeline_info *info);
CMF_API cmf_error *cmf_image_pipeline_get_info(const cmf_image_pipeline *p, cmf_image_pipeline_info *out);

/* Called after each denoising step (step counts from 1); nonzero stops the
 * run, which then returns CMF_ERR_CANCELLED. */
typedef int32_t (*cmf_imagine_step_fn)(void *user, uint32_t step, uint32_t n_steps);

typedef struct cmf_imagine_options {
    uint32_t struct_size;
    uint32_t width, height;        /* pixels; default 512 x 512 */
    uint32_t steps;                /* default 30 */
    float guidance_scale;          /* classifier-free guidance, default 4.0; <= 1: none */
    float cfg_trunc_ratio;         /* default 1.0: step i (from 0) is guided while (i + 1) / steps <= this */
    uint32_t cfg_normalization;    /* default 1: guided prediction rescaled to the conditional one's norm */
    uint32_t reserved0;
    uint64_t seed;                 /* default 0: the initial noise (when latent_in is NULL) */
    const char *prompt;            /* UTF-8; NULL = "" */
    const char *negative_prompt;   /* UTF-8; NULL = "" */
    /* The initial latent ([latent_channels][height/scale][width/scale] f32,
     * exactly that many floats), instead of the seeded standard-normal
     * noise (SplitMix64 + Box-Muller, as the original draws it). */
    const float *latent_in;
    uint64_t latent_in_len;
    /* Receives the final latent (latent_out_len floats, exactly the
     * latent's size); NULL = not wanted. */
    float *latent_out;
    uint64_t latent_out_len;
    cmf_imagine_step_fn on_step;   /* may be NULL */
    void *user;
} cmf_imagine_options;

CMF_API void cmf_imagine_options_init(cmf_imagine_options *opts);

/* Generate one image into rgb (width * height * 3 bytes: rows top to
 * bottom, R G B per pixel; rgb_len must be exactly that), each value the
 * decoded [0, 1] intensity times 255 rounded half to even. rgb NULL (and
 * rgb_len 0): no decode, only the latent (latent_out). */
CMF_API cmf_error *cmf_imagine(cmf_image_pipeline *p, const cmf_imagine_options *opts, uint8_t *rgb, uint64_t rgb_len);

#ifdef __cplusplus
}
#endif

#endif /* CMF_H */
