/*
 * cmf_plugin.h — the cmf plugin ABI, version 1 (CMF_PLUGIN_ABI_VERSION).
 *
 * For authors of codecs (dtypes), architectures and compute backends. A
 * plugin is a shared module that does NOT link libcmf: everything it needs
 * from the host comes through the `cmf_host_api` table it receives.
 *
 * Entry point (C linkage, default visibility):
 *
 *   cmf_error *cmf_plugin_init_v1(const cmf_host_api *host,
 *                                 uint32_t *abi_version,
 *                                 cmf_registrar *reg,
 *                                 void **plugin_state);
 *
 * Negotiation (Vulkan-style): on entry *abi_version holds the newest plugin
 * ABI the host speaks; the plugin writes back the version it speaks (<= the
 * offered one) or returns an error. The host refuses plugins whose answer is
 * below CMF_PLUGIN_ABI_MIN or above what it offered, with a message naming
 * the file and both versions. A hard break of this ABI renames the symbol
 * (cmf_plugin_init_v2), so old plugins fail cleanly with "no entry point".
 *
 * Optional:  void cmf_plugin_fini_v1(void *plugin_state);
 *   called once, after every component it registered is released.
 *
 * Rules:
 *  - every vtable starts with struct_size and abi_version; members are only
 *    appended; the host calls a member only if it fits in struct_size and is
 *    non-NULL; `void *ctx` (given at registration) is always the first argument;
 *  - errors returned by plugins are created with host->error_create, so the
 *    host frees them: no cross-module free;
 *  - no C++ exception may leave a plugin function;
 *  - the host copies strings at registration, except where said otherwise;
 *    vtables and ctx must live until cmf_plugin_fini_v1;
 *  - parallelism goes through host->parallel_for (one thread pool per
 *    runtime); plugins create no threads of their own.
 */
#ifndef CMF_PLUGIN_H
#define CMF_PLUGIN_H

#include "cmf_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CMF_PLUGIN_ABI_VERSION 1
#define CMF_PLUGIN_ABI_MIN 1
#define CMF_PLUGIN_INIT_SYMBOL "cmf_plugin_init_v1"
#define CMF_PLUGIN_FINI_SYMBOL "cmf_plugin_fini_v1"

#if defined(__GNUC__)
#  define CMF_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#  define CMF_PLUGIN_EXPORT
#endif

typedef struct cmf_registrar cmf_registrar; /* opaque, valid only during init */
typedef struct cmf_host_api cmf_host_api;

/* ---- codecs: one CMF dtype each ----------------------------------------- */

/* cmf_codec_vt.flags */
#define CMF_CODEC_VARIABLE_SIZE 0x1u /* payload size depends on the data (vbit, q1s, q1t) */
#define CMF_CODEC_RESERVED      0x2u /* a reserved id: registered only to refuse it clearly */

/* Returned through expected_size when the size is data-dependent. */
#define CMF_SIZE_VARIABLE UINT64_MAX

/* Options for quantize(). `options` is a codec-specific "key=value,key=value"
 * string (NULL/"" = the converter defaults); act_rms is an optional per-column
 * activation RMS used by codecs that weigh outliers by activation (q1t). */
typedef struct cmf_quantize_params {
    uint32_t struct_size;
    uint32_t reserved0;
    const char *options;
    const float *act_rms;
    uint64_t act_rms_len;
} cmf_quantize_params;

typedef struct cmf_codec_vt {
    uint32_t struct_size;        /* sizeof(cmf_codec_vt) as compiled into the plugin */
    uint32_t abi_version;        /* CMF_PLUGIN_ABI_VERSION the vtable was written for */
    const char *name;            /* dtype name, e.g. "q4tp" */
    const char *version;         /* implementation version */
    int32_t dtype_id;            /* CMF dtype id (0..255) */
    uint32_t flags;              /* CMF_CODEC_* */
    uint32_t required_features;  /* envelope bits a file needs when it holds this dtype */
    uint32_t reserved0;

    /* Payload size for a shape, or CMF_SIZE_VARIABLE. Error if the shape is
     * illegal for this dtype (e.g. q4tp needs 2-D with cols % 32 == 0). Required. */
    cmf_error *(*expected_size)(void *ctx, uint32_t ndim, const uint64_t *shape, uint64_t *out_nbytes);

    /* Structural validation of a payload against its shape (overlay counts,
     * row offsets, width bytes). Must not read past t->nbytes. Optional. */
    cmf_error *(*validate)(void *ctx, const cmf_tensor_view *t);

    /* Reference dequantization of rows [row_begin, row_end) into dst
     * (row-major f32, (row_end-row_begin) * row_len floats). Rows are
     * shape[0] for ndim >= 2 (row_len = product of the rest); a 1-D or 0-D
     * tensor is one row. Reentrant: called concurrently. Required. */
    cmf_error *(*dequantize_rows)(void *ctx, const cmf_tensor_view *t, uint64_t row_begin,
                                  uint64_t row_end, float *dst);

    /* Quantize an f32 tensor (row-major, product(shape) floats) and append the
     * payload to `out`. Bit-exact with the original's encoder. Optional. */
    cmf_error *(*quantize)(void *ctx, uint32_t ndim, const uint64_t *shape, const float *src,
                           const cmf_quantize_params *params, const cmf_byte_sink *out);

    /* Fast kernel: y[b * ldy + r] = dot(row r of W, x[b * ldx .. + cols])
     * for b < n_batch and r in [row_begin, row_end). W is 2-D. Optional;
     * called concurrently on disjoint row ranges. */
    cmf_error *(*matmul_rows)(void *ctx, const cmf_tensor_view *w, const float *x, uint64_t ldx,
                              uint64_t n_batch, uint64_t row_begin, uint64_t row_end, float *y,
                              uint64_t ldy);

    /* Row-chunked encoding, so a converter can encode a large tensor a few
     * rows at a time instead of holding all of it in f32. Optional (NULL:
     * whole tensors only; added after plugin ABI 1's first release, so hosts
     * read it only when struct_size covers it).
     * It applies when, for this shape, the payload is *n_sections byte
     * sections laid end to end (q8_row: the int8 codes, then the f16 row
     * scales) and each section is the concatenation of what consecutive row
     * ranges [0,a), [a,b), ... contribute (rows = shape[0]; each row encodes
     * on its own). quantize_rows encodes rows [row_begin, row_end) -- `src`
     * holds just those rows, row-major f32 -- and appends section s's part
     * to out[s] for s < *n_sections. Concatenating every part of section 0,
     * then of section 1, ... gives exactly quantize's payload.
     * With out == NULL it only reports *n_sections: 0 means this shape (or
     * these params) cannot be encoded by rows; otherwise 1..CMF_MAX_ROW_SECTIONS.
     * Reentrant: called concurrently on disjoint row ranges. */
    cmf_error *(*quantize_rows)(void *ctx, uint32_t ndim, const uint64_t *shape, uint64_t row_begin,
                                uint64_t row_end, const float *src, const cmf_quantize_params *params,
                                const cmf_byte_sink *out, uint32_t *n_sections);

    /* Integer view of a 2-D weight, for int8 GEMMs (a backend multiplies
     * these codes with int8-quantized activations). Optional (NULL: not
     * provided; added after plugin ABI 1's first release, so hosts and
     * backends read it only when struct_size covers it).
     * Rows [row_begin, row_end) of W = [rows, cols] come out as int8 codes
     * and one f32 scale per block of CMF_INT8_BLOCK columns, with
     * nb = ceil(cols / CMF_INT8_BLOCK) blocks per row:
     *   codes [(r - row_begin) * nb * CMF_INT8_BLOCK + c]  for c < cols
     *         (the tail of the last block, c >= cols, is written as 0),
     *   scales[(r - row_begin) * nb + c / CMF_INT8_BLOCK],
     * such that codes * scale equals dequantize_rows' value exactly (in
     * f32). A dtype with one scale per row repeats it in every block; codes
     * may use all of -128..127 (q8_row) or less (q4: -8..7).
     * With codes == NULL and scales == NULL it only answers whether this
     * tensor has such a view: NULL if it has, else a CMF_ERR_UNSUPPORTED
     * error (e.g. q8_2f's column field, q4 groups straddling rows when
     * cols % 32 != 0); the caller then uses dequantize_rows.
     * Reentrant: called concurrently on disjoint row ranges. */
    cmf_error *(*int8_rows)(void *ctx, const cmf_tensor_view *t, uint64_t row_begin, uint64_t row_end,
                            int8_t *codes, float *scales);

    /* matmul_rows with an identity for the activations: the caller promises
     * that all calls passing the same nonzero x_id pass the same x contents
     * (same ldx, n_batch and cols), so a codec that converts x before its
     * dots (the standard codecs quantize it to int8 blocks, once per thread)
     * can reuse that conversion without comparing x again. The weights'
     * bytes must not change between calls under one id either: a codec may
     * keep what it checked of a weight (by its address) for the id's calls
     * (q1s: that its outlier list ascends, which its kernel relies on). A
     * caller takes a fresh id per matmul and splits the matmul into row
     * ranges; x_id 0 makes no promise. Optional (NULL: the caller uses matmul_rows; added
     * after plugin ABI 1's first release, so hosts and backends read it only
     * when struct_size covers it). Same contract as matmul_rows otherwise. */
    cmf_error *(*matmul_rows_x)(void *ctx, const cmf_tensor_view *w, const float *x, uint64_t ldx,
                                uint64_t n_batch, uint64_t row_begin, uint64_t row_end, float *y,
                                uint64_t ldy, uint64_t x_id);

    /* Column selection, for a backend that multiplies with only some
     * columns of a 2-D weight (a task mask's FFN down projection; the
     * output projection over live attention heads). Optional (NULL: not
     * provided; added after plugin ABI 1's first release, so backends read
     * it only when struct_size covers it).
     * The codec selects whole blocks of *block_cols columns: block b is
     * columns [b * block_cols, (b + 1) * block_cols). It appends to `out`
     * the payload, in its own dtype, of the [rows, n_blocks * block_cols]
     * tensor made of blocks[0 .. n_blocks) (ascending, distinct) in that
     * order, every value identical to the source's, reading only those
     * blocks' bytes and the per-row data (row scales) of the source.
     * With out == NULL it only reports *block_cols for this tensor: 1 (any
     * columns), a quant group (32: the q4 and q1 families), or 0 when it
     * cannot select columns of this tensor (then the caller multiplies
     * with the whole rows). Reentrant. */
    cmf_error *(*select_columns)(void *ctx, const cmf_tensor_view *t, const uint64_t *blocks, uint64_t n_blocks,
                                 const cmf_byte_sink *out, uint64_t *block_cols);

    /* validate, also reporting facts about the payload (bits whose meaning
     * is this codec's own; see cmf_tensor_view.facts) into *facts. A host
     * that validates a tensor once and hands out views of it afterwards
     * calls this instead of validate and puts *facts into those views; the
     * codec's other members then find them in t->facts. Every set bit must
     * hold of these bytes. Optional (NULL: validate, no facts; added after
     * plugin ABI 1's first release, so hosts read it only when struct_size
     * covers it). */
    cmf_error *(*validate_facts)(void *ctx, const cmf_tensor_view *t, uint32_t *facts);

    /* A copy of t's payload in a memory-only layout (CMF_DTYPE_MEMORY_FIRST
     * ..LAST) whose codec, registered by the same plugin, multiplies it
     * faster than this dtype's own layout when its bytes stream from memory
     * (one decode stream instead of two; masks a kernel would otherwise
     * make for every row). dst == NULL asks: *out_dtype gets the copy's
     * dtype (-1: no such layout for this tensor) and *out_bytes its size.
     * Then dst (dst_bytes == *out_bytes) receives the copy, the shape being
     * t's, written straight where the caller keeps it. Every member of the
     * copy's codec gives on the copy what this codec gives on t: the same
     * bits from dequantize_rows and int8_rows, and matmuls of the same
     * products, whose f32 sums may be added in another order (the last
     * bits of a result can differ with and without the copy). A backend
     * makes the copy when a weight is bound, if it was asked to spend the
     * memory. Optional (NULL: none; added after plugin
     * ABI 1's first release, so hosts and backends read it only when
     * struct_size covers it). Reentrant. */
    cmf_error *(*decode_copy)(void *ctx, const cmf_tensor_view *t, void *dst, uint64_t dst_bytes, uint64_t *out_bytes,
                              int32_t *out_dtype);
} cmf_codec_vt;

/* Columns per scale block of cmf_codec_vt.int8_rows. */
#define CMF_INT8_BLOCK 32

#define CMF_MAX_ROW_SECTIONS 4

/* ---- backends: where compute happens ------------------------------------ */

/* A KV cache element type that is not a file dtype (the CMF_DTYPE_* ids are
 * the spec's; this one exists only in memory, for kv_write / attention_kv /
 * attention_ring). A row of row_len elements (row_len a multiple of 32) is
 * row_len / 32 blocks of 34 bytes, in element order: the block's scale d as
 * IEEE f16 bits (little-endian), then its 32 codes q as int8; element i of
 * the block is d * q[i]. Written as d = max|x| / 127 over the block's f32
 * values (stored rounded to nearest even), q[i] = x[i] * (1 / d) rounded
 * half away from zero (all q = 0 when d = 0), the rounding of llama.cpp's
 * Q8_0. A block holding a NaN or an infinity stores d = NaN and codes 0. */
#define CMF_KV_DTYPE_Q8_32 256
#define CMF_KV_Q8_32_ROW_BYTES(row_len) (((uint64_t)(row_len) / 32u) * 34u)

/*
 * A backend executes the operations architectures need. Activations live in
 * backend buffers (`void *` the arch treats as opaque handles, except on the
 * CPU backend where they are host pointers); weights are bound once with
 * weight_bind (the CPU backend keeps them in the mapping: zero copy).
 * Operations not provided are NULL; archs check before use.
 */
typedef struct cmf_backend_weight cmf_backend_weight; /* opaque, backend-owned */

typedef struct cmf_backend_vt {
    uint32_t struct_size;
    uint32_t abi_version;
    const char *name;            /* e.g. "cpu" */
    const char *version;
    const char *description;     /* device and ISA summary, e.g. "x86-64 AVX-512, 2 threads" */

    /* Bind a stored tensor for use as a matmul/embedding weight (2-D) or a
     * norm weight / bias (1-D). The view's data must stay valid until
     * weight_free. */
    cmf_error *(*weight_bind)(void *ctx, const cmf_tensor_view *t, cmf_backend_weight **out);
    void (*weight_free)(void *ctx, cmf_backend_weight *w);

    /* Y[n_batch][rows] = X[n_batch][cols] · W^T for a 2-D weight [rows, cols]. */
    cmf_error *(*matmul)(void *ctx, const cmf_backend_weight *w, const float *x, uint64_t n_batch,
                         float *y);

    /* ---- transformer operations ----
     * Activation buffers are device addresses of f32 arrays: an arch may
     * offset them by whole floats (p + n) but never dereferences them; it
     * moves data to and from the host only with buffer_write/buffer_read.
     * `x`/`y` of matmul above are such buffers, rows contiguous (row-major),
     * and n_batch > 1 is the batched (prefill) path. Weights given to the
     * element-wise operations (norm weights, biases) are bound with
     * weight_bind like matmul weights; 1-D vectors are accepted there.
     * Operations on one backend context may be called from one thread at a
     * time per arch state; they parallelise internally. */

    /* Device memory for n_bytes, 64-byte aligned, uninitialised. */
    cmf_error *(*buffer_alloc)(void *ctx, size_t n_bytes, float **out);
    void (*buffer_free)(void *ctx, float *buf); /* NULL-safe */
    cmf_error *(*buffer_write)(void *ctx, float *dst, const void *src_host, size_t n_bytes);
    cmf_error *(*buffer_read)(void *ctx, void *dst_host, const float *src, size_t n_bytes);
    /* dst[i] = src[i] for i < n (device to device). */
    cmf_error *(*copy)(void *ctx, float *dst, const float *src, uint64_t n);

    /* RMSNorm of n_rows rows of `dim` floats (row stride `dim`); `w` is a
     * [dim] weight; style CMF_NORM_QWEN (x^*w) or CMF_NORM_GEMMA (x^*(1+w)).
     * y may equal x. Also serves the per-head q/k-norm (rows = heads). */
    cmf_error *(*rms_norm)(void *ctx, const float *x, const cmf_backend_weight *w, uint64_t n_rows,
                           uint64_t dim, float eps, int32_t style, float *y);

    /* Half-split (NeoX) RoPE in place on x = [n_tokens][ld] holding n_heads
     * heads of head_dim at the start of each row; token t has position
     * pos0 + t; the first rot_dim (even) dims of each head rotate, with
     * inv_freq_i = 1 / theta^(2i/rot_dim) computed in f32, as Hugging Face does. */
    cmf_error *(*rope)(void *ctx, float *x, uint64_t n_tokens, uint64_t ld, uint32_t n_heads,
                       uint32_t head_dim, uint32_t rot_dim, uint64_t pos0, float theta);

    /* Causal softmax attention with GQA over a KV cache.
     * q: [n_tokens][n_heads*head_dim]; k_cache, v_cache: [>= pos0+n_tokens]
     * rows of n_kv_heads*head_dim (the new tokens' K/V already stored at
     * rows pos0..); query t (position pos0+t) attends rows j <= pos0+t, and
     * j > pos0+t-window when window > 0; softcap > 0 applies
     * c*tanh(s/c) to scores. Query head h reads KV head h/(n_heads/n_kv_heads).
     * out: [n_tokens][n_heads*head_dim]. */
    cmf_error *(*attention)(void *ctx, const float *q, const float *k_cache, const float *v_cache,
                            float *out, uint64_t n_tokens, uint64_t pos0, uint32_t n_heads,
                            uint32_t n_kv_heads, uint32_t head_dim, float scale, uint32_t window,
                            float softcap);

    /* Gated FFN middle: out[i] = act(gate[i]) * up[i], i < n; act is
     * CMF_ACT_SILU or CMF_ACT_GELU_TANH. out may equal gate. */
    cmf_error *(*gated_act)(void *ctx, const float *gate, const float *up, uint64_t n, int32_t act,
                            float *out);

    /* y[i] += x[i] for i < n (residual add). */
    cmf_error *(*add)(void *ctx, float *y, const float *x, uint64_t n);

    /* y[r][j] += b[j] for r < n_rows, j < dim; b is a bound [dim] vector. */
    cmf_error *(*add_bias)(void *ctx, float *y, const cmf_backend_weight *b, uint64_t n_rows, uint64_t dim);

    /* out[t] = row tokens[t] of the 2-D weight `table` (any dtype: rows are
     * decoded with the codec's dequantize_rows), times `scale`. tokens are
     * host memory; an id outside the table's rows is CMF_ERR_BOUNDS. */
    cmf_error *(*embed)(void *ctx, const cmf_backend_weight *table, const int32_t *tokens,
                        uint64_t n_tokens, float scale, float *out);

    /* ---- a KV cache in another dtype (appended; optional) ----
     * An arch calls these only when both are non-NULL and inside the
     * backend's struct_size; otherwise its cache is f32 (copy + attention).
     * A cache of `dtype` is a buffer of rows of row_len elements: for
     * CMF_DTYPE_F16, allocate n_rows * row_len * 2 bytes with buffer_alloc.
     * The arch never offsets into such a buffer: rows are named by index.
     * CMF_DTYPE_F32 is accepted too (then the buffer is plain f32 rows).
     * CMF_KV_DTYPE_Q8_32 (above): blocks of 32 int8 codes, allocate n_rows *
     * CMF_KV_Q8_32_ROW_BYTES(row_len) bytes; row_len (attention's
     * n_kv_heads * head_dim) must be a multiple of 32, else
     * CMF_ERR_INVALID_ARGUMENT (a head may start and end mid-block).
     * Other dtypes: CMF_ERR_UNSUPPORTED. */

    /* Rows [row0, row0 + n_rows) of `cache` = src ([n_rows][row_len] f32),
     * converted to the cache's dtype (f16: rounded to nearest even). */
    cmf_error *(*kv_write)(void *ctx, float *cache, int32_t dtype, uint64_t row_len, uint64_t row0,
                           const float *src, uint64_t n_rows);
    /* attention above, over caches of `cache_dtype` (row_len n_kv_heads*head_dim). */
    cmf_error *(*attention_kv)(void *ctx, const float *q, const float *k_cache, const float *v_cache,
                               int32_t cache_dtype, float *out, uint64_t n_tokens, uint64_t pos0,
                               uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale,
                               uint32_t window, float softcap);

    /* ---- several weights over one input (appended; optional) ----
     * ys[i] = X[n_batch][cols] · W_i^T ([n_batch][rows_i]) for i < n_weights,
     * every W_i a 2-D weight with the same cols: the results n_weights matmul
     * calls give, in one call, so a backend can run them as one parallel loop
     * (decode's q/k/v and gate/up projections each read one x, and a loop per
     * weight paid its start and end once per weight). An arch calls it only
     * when non-NULL and inside the backend's struct_size; otherwise it calls
     * matmul per weight. */
    cmf_error *(*matmul_multi)(void *ctx, const cmf_backend_weight *const *ws, uint32_t n_weights, const float *x,
                               uint64_t n_batch, float *const *ys);

    /* ---- sliding-window attention over a ring (appended; optional) ----
     * attention_kv over caches of ring_rows rows in which the K/V of
     * position j is row j % ring_rows (the arch writes them with kv_write,
     * split where the ring wraps), so a sliding-window layer's cache is
     * bounded by its window instead of the context. window must be > 0 and
     * the positions the queries see, [max(0, pos0 + 1 - window),
     * pos0 + n_tokens), must fit in the ring (else CMF_ERR_BOUNDS). An arch
     * calls it only when it and kv_write are non-NULL and inside the
     * backend's struct_size; otherwise it keeps such a layer's cache as
     * long as the context. */
    cmf_error *(*attention_ring)(void *ctx, const float *q, const float *k_cache, const float *v_cache,
                                 int32_t cache_dtype, uint64_t ring_rows, float *out, uint64_t n_tokens,
                                 uint64_t pos0, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                                 float scale, uint32_t window, float softcap);

    /* ---- RoPE over a given frequency table (appended; optional) ----
     * rope above, with the rot_dim/2 inverse frequencies given in inv_freq
     * (host memory, f32) instead of computed from a base, and both cos and
     * sin multiplied by `scale`: angle_i = f32(pos) * inv_freq[i] in f32,
     * c_i = cos(angle_i) * scale, s_i = sin(angle_i) * scale. This is how
     * Hugging Face applies scaled RoPE (linear, dynamic NTK, YaRN with its
     * attention factor as `scale`, llama3): the arch computes the table.
     * An arch calls it only when non-NULL and inside the backend's
     * struct_size; an arch that needs it refuses a backend without it. */
    cmf_error *(*rope_freqs)(void *ctx, float *x, uint64_t n_tokens, uint64_t ld, uint32_t n_heads,
                             uint32_t head_dim, uint32_t rot_dim, uint64_t pos0, const float *inv_freq,
                             float scale);

    /* ---- image and diffusion operations (appended; optional) ----
     * What image models (diffusion transformers, VAE decoders) need besides
     * the transformer operations above. An image of height x width
     * positions and C channels is a buffer of [height * width][C] floats,
     * row-major by position (channels contiguous, "HWC"): a position is a
     * token, so matmul over an image is a 1x1 convolution. Vectors that
     * come from activations (adaLN scales, shifts and gates) are buffers,
     * not bound weights. An arch calls each only when non-NULL and inside
     * the backend's struct_size. */

    /* y[r][j] = x[r][j] * (1 + scale[j]) + shift[j] for r < n_rows,
     * j < dim: adaLN modulation. scale and shift are buffers of dim floats;
     * shift may be NULL (no shift). y may equal x. */
    cmf_error *(*modulate)(void *ctx, const float *x, const float *scale, const float *shift, uint64_t n_rows,
                           uint64_t dim, float *y);
    /* y[r][j] += act(gate[j]) * x[r][j] (a gated residual): gate a buffer of
     * dim floats, act CMF_ACT_TANH or CMF_ACT_IDENTITY. */
    cmf_error *(*add_gated)(void *ctx, float *y, const float *x, const float *gate, uint64_t n_rows, uint64_t dim,
                            int32_t act);
    /* y[i] = act(x[i]) for i < n: CMF_ACT_SILU, CMF_ACT_GELU_TANH,
     * CMF_ACT_TANH or CMF_ACT_IDENTITY. y may equal x. */
    cmf_error *(*activation)(void *ctx, const float *x, uint64_t n, int32_t act, float *y);
    /* LayerNorm of n_rows rows of dim: (x - mean) / sqrt(var + eps) with
     * the biased variance, then * w + b when given (bound [dim] vectors;
     * either may be NULL). y may equal x. */
    cmf_error *(*layer_norm)(void *ctx, const float *x, const cmf_backend_weight *w, const cmf_backend_weight *b,
                             uint64_t n_rows, uint64_t dim, float eps, float *y);
    /* Rotary embedding from a table of angles, in place, for positions that
     * are not one running index (several axes, images): x = [n_tokens][ld]
     * holds n_heads heads of head_dim at the start of each row; cos_sin is
     * a buffer of [n_tokens][head_dim / 2][2] floats (cos, sin) giving token
     * t's rotation of pair m, the same in every head. Pair m is elements
     * (2m, 2m+1) of a head with CMF_ROPE_INTERLEAVED (complex pairs:
     * Lumina, Flux) or (m, m + head_dim/2) with CMF_ROPE_HALF (NeoX);
     * (a, b) becomes (a cos - b sin, b cos + a sin). */
    cmf_error *(*rope_table)(void *ctx, float *x, uint64_t n_tokens, uint64_t ld, uint32_t n_heads,
                             uint32_t head_dim, const float *cos_sin, int32_t layout);
    /* Bidirectional softmax attention with GQA: q [n_q][n_heads*head_dim],
     * k and v [n_kv][n_kv_heads*head_dim], out [n_q][n_heads*head_dim];
     * query head h reads KV head h / (n_heads / n_kv_heads); scores are
     * (q . k) * scale, plus key_bias[j] for key j when key_bias (a buffer
     * of n_kv floats) is given: -INFINITY masks a key, and a query whose
     * keys are all masked gets zeros. No causal mask. */
    cmf_error *(*attention_full)(void *ctx, const float *q, const float *k, const float *v, float *out, uint64_t n_q,
                                 uint64_t n_kv, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale,
                                 const float *key_bias);
    /* 2-D convolution, stride 1, zero padding `pad` on every side, of an
     * HWC image x [height * width][c_in]: y [h_out * w_out][c_out] with
     * h_out = height + 2 pad - kh + 1 (w_out likewise) plus bias[o] when
     * given. The weight is PyTorch's [c_out][c_in][kh][kw] bound as the
     * 2-D [c_out][c_in * kh * kw] it is row-major (any dtype matmul
     * takes); bias a bound [c_out] vector or NULL. y must not overlap x. */
    cmf_error *(*conv2d)(void *ctx, const cmf_backend_weight *w, const cmf_backend_weight *bias, const float *x,
                         uint64_t height, uint64_t width, uint64_t c_in, uint32_t kh, uint32_t kw, uint32_t pad,
                         float *y);
    /* GroupNorm of an HWC image of n_pos positions: channels split into
     * `groups` runs of channels / groups consecutive channels; each group's
     * mean and biased variance over all positions and its channels, then
     * (x - mean) / sqrt(var + eps) * w[c] + b[c] (bound [channels] vectors;
     * either may be NULL). y may equal x. */
    cmf_error *(*group_norm)(void *ctx, const float *x, const cmf_backend_weight *w, const cmf_backend_weight *b,
                             uint64_t n_pos, uint64_t channels, uint32_t groups, float eps, float *y);
    /* Nearest-neighbour 2x upsampling of an HWC image: y [(2 height) *
     * (2 width)][channels], y at (2i + di, 2j + dj) = x at (i, j). */
    cmf_error *(*upsample2x)(void *ctx, const float *x, uint64_t height, uint64_t width, uint64_t channels, float *y);

    /* ---- part of a stored tensor (appended; optional) ----
     * Binds a 2-D weight restricted to some of its rows (axis 0) or
     * columns (axis 1), or a 1-D vector restricted to some of its elements
     * (axis 0): idx holds n >= 1 indices; output j is source row (element)
     * idx[j], in any order, repeats allowed; columns are ascending and
     * distinct. The bound
     * weight then stands for the selected tensor ([n, cols], [rows, n] or
     * [n]) in every operation: matmul writes n outputs per token (rows),
     * or reads n inputs per token (columns). What was left out is never
     * computed, and the backend reads as little of it as the dtype's
     * layout allows (rows: none; columns: the codec's select_columns
     * granularity). A task mask's FFN rows and attention heads run this
     * way (docs/tasks-and-skills.md). An arch calls it only when non-NULL
     * and inside the backend's struct_size. */
    cmf_error *(*weight_bind_subset)(void *ctx, const cmf_tensor_view *t, uint32_t axis, const uint32_t *idx,
                                     uint64_t n, cmf_backend_weight **out);


    /* ---- mixture-of-experts operations (appended; optional) ----
     * An arch calls these only when non-NULL and inside the backend's
     * struct_size. Row indices and weights are host memory. */

    /* ys[g] = xs[g] · W_g^T for every group g < n_groups: xs[g] holds
     * n_rows[g] rows of W_g's cols floats, ys[g] gets n_rows[g] rows of W_g's
     * rows floats (n_rows[g] == 0: nothing). The weights may differ in shape
     * and dtype. What n_groups matmul calls give, in one call, so a backend
     * can run the small groups (a decode token's experts) as one parallel
     * loop and each large group (an expert's tokens in prefill) as one GEMM.
     * Each row equals the row matmul computes for the same x row at the same
     * n_rows. */
    cmf_error *(*matmul_grouped)(void *ctx, uint32_t n_groups, const cmf_backend_weight *const *ws,
                                 const float *const *xs, const uint64_t *n_rows, float *const *ys);
    /* dst[i] = src[rows[i]] (rows of dim floats) for i < n. */
    cmf_error *(*gather_rows)(void *ctx, const float *src, uint64_t dim, const int32_t *rows, uint64_t n, float *dst);
    /* out[r] = sum over the i < n with rows[i] == r of weights[i] * x[i]
     * (rows of dim floats), added in increasing i, for r < n_out; a row no i
     * names is 0. x and out do not overlap. */
    cmf_error *(*scatter_rows)(void *ctx, const float *x, uint64_t n, uint64_t dim, const int32_t *rows,
                               const float *weights, float *out, uint64_t n_out);

    /* ---- hybrid (gated delta net) operations (appended; optional) ----
     * Backends that have these also accept CMF_ACT_SIGMOID in gated_act. */

    /* dst[r * ld_dst + j] = src[r * ld_src + j] for r < n_rows, j < row_len
     * (a strided 2-D copy; the regions do not overlap). */
    cmf_error *(*copy_rows)(void *ctx, float *dst, uint64_t ld_dst, const float *src, uint64_t ld_src,
                            uint64_t n_rows, uint64_t row_len);
    /* Causal depthwise convolution followed by SiLU, over n_tokens rows of
     * `channels` (x, out: [n_tokens][channels], distinct): with u the input
     * stream (the kernel-1 rows of `state`, oldest first, then x),
     *   out[t][c] = SiLU(sum over j < kernel of w[c * kernel + j] * u[t + j][c]),
     * w a bound vector of channels * kernel values (a [C, 1, K] conv weight
     * read flat). On return `state_out` holds the last kernel-1 rows of u,
     * and `state` the kernel-1 rows before the call's last token (for n == 1
     * it is unchanged): the state one token back, for a speculative rollback. */
    cmf_error *(*causal_conv1d_silu)(void *ctx, const float *x, uint64_t n_tokens, uint64_t channels,
                                     const cmf_backend_weight *w, uint32_t kernel, float *state, float *state_out,
                                     float *out);
    /* The gated delta rule (Qwen3-Next / Qwen3.5 linear attention) over
     * n_tokens tokens. qkv: [n_tokens][2*nk*dk + nv*dv], per token the query
     * heads (nk of dk), the key heads (nk of dk) and the value heads (nv of
     * dv); a, b: [n_tokens][nv]; a_log, dt_bias: bound vectors of nv. Value
     * head h reads key/query head h / (nv/nk). Per token and value head:
     *   q = q_g / sqrt(|q_g|^2 + 1e-6) / sqrt(dk),  k = k_g / sqrt(|k_g|^2 + 1e-6),
     *   beta = sigmoid(b_h),  decay = exp(-exp(a_log_h) * softplus(a_h + dt_bias_h)),
     *   S = decay * S;  S += k (beta (v_h - S^T k))^T;  out_h = S^T q,
     * S the head's [dk][dv] state (f32, states: [nv][dk][dv]). out:
     * [n_tokens][nv*dv]. On return `state_out` holds the state after every
     * token and `state` the state after all but the last one (for n == 1
     * unchanged): one token back, for a speculative rollback. A backend may
     * evaluate long inputs in the chunked (WY) form, equal to the recurrence
     * up to rounding. */
    cmf_error *(*gated_delta_net)(void *ctx, const float *qkv, uint64_t n_tokens, uint32_t nk, uint32_t nv,
                                  uint32_t dk, uint32_t dv, const float *a, const float *b,
                                  const cmf_backend_weight *a_log, const cmf_backend_weight *dt_bias, float *state,
                                  float *state_out, float *out);
} cmf_backend_vt;

/* cmf_backend_vt.rms_norm styles: x̂·w (qwen, llama) or x̂·(1+w) (gemma, qwen3-next) */
#define CMF_NORM_QWEN  0 /* y = x^ * w       */
#define CMF_NORM_GEMMA 1 /* y = x^ * (1 + w) */

/* cmf_backend_vt.gated_act activations: act(gate)·up */
#define CMF_ACT_SILU      0
#define CMF_ACT_GELU_TANH 1
/* cmf_backend_vt.activation and add_gated also take: */
#define CMF_ACT_IDENTITY  2
#define CMF_ACT_TANH      3
/* gated_act also takes, in backends with the hybrid operations (gated_delta_net): */
#define CMF_ACT_SIGMOID   4

/* cmf_backend_vt.rope_table pair layouts */
#define CMF_ROPE_INTERLEAVED 0 /* pair m = elements (2m, 2m+1) of a head */
#define CMF_ROPE_HALF        1 /* pair m = elements (m, m + head_dim/2) */

/* ---- architectures ------------------------------------------------------ */

/*
 * What an architecture sees of a model: the header's `arch` block, the whole
 * header, and tensor lookup. The host builds one from an opened cmf_model
 * (skill indirection and masks applied); tests and converters may build their
 * own. Views stay valid until the model source's owner releases them (for a
 * cmf_model: until cmf_close).
 */
/*
 * A task mask (spec §5) as an architecture applies it: which FFN neurons,
 * attention heads, layers and experts run. Bits are LSB-first (item i is
 * bit i % 8 of byte i / 8), 1 = active. The host decodes the file's blob
 * into this form (a legacy blob's FFN rows repeated for every visit of a
 * looped model). Arrays stay valid as long as the model source.
 */
typedef struct cmf_task_mask {
    uint32_t struct_size;
    uint32_t reserved0;
    const char *name;              /* the task */
    uint64_t layers;               /* physical layers (arch.num_layers) */
    uint64_t visits;               /* layers * max(arch.num_loops, 1): visit v runs layer v % layers */
    uint64_t ffn_bits;             /* neurons per FFN row (arch.intermediate_size) */
    uint64_t ffn_row_bytes;        /* ceil(ffn_bits / 8) */
    const uint8_t *ffn;            /* visits rows, pass-major; a MoE layer ignores its row */
    uint64_t head_bits;            /* query heads per row (arch.num_attention_heads) */
    uint64_t head_row_bytes;
    const uint8_t *heads;          /* layers rows, the same on every visit */
    const uint8_t *gates;          /* ceil(layers / 8) bytes: bit l = layer l runs (every visit) */
    uint64_t expert_bits;          /* experts per row (arch.moe.num_experts); 0 without experts */
    uint64_t expert_row_bytes;
    const uint8_t *experts;        /* layers rows: routable experts; NULL = routing unrestricted */
} cmf_task_mask;

typedef struct cmf_model_source {
    uint32_t struct_size;
    uint32_t reserved0;
    void *user;
    const char *arch_json;         /* the header's "arch" object, UTF-8 JSON */
    size_t arch_json_len;
    const char *header_json;       /* the whole header JSON */
    size_t header_json_len;
    uint64_t tensor_count;
    /* Tensor by exact name; CMF_ERR_MISSING_TENSOR (made with the host's
     * error_create) if absent. */
    cmf_error *(*tensor)(void *user, const char *name, cmf_tensor_view *out);
    /* Tensor by index in [0, tensor_count); *name is borrowed like the view. */
    cmf_error *(*tensor_at)(void *user, uint64_t index, const char **name, cmf_tensor_view *out);
    /* appended: the task mask to apply, or NULL (everything runs). An arch
     * that cannot apply a given mask refuses the model (CMF_ERR_UNSUPPORTED)
     * rather than run it unmasked. */
    const cmf_task_mask *task_mask;
} cmf_model_source;

typedef struct cmf_arch_model cmf_arch_model; /* opaque, arch-owned: bound weights */
typedef struct cmf_arch_state cmf_arch_state; /* opaque, arch-owned: KV cache / recurrent state */

typedef struct cmf_arch_model_params {
    uint32_t struct_size;
    uint32_t reserved0;
    const char *options;           /* arch-specific "key=value,..." or NULL */
} cmf_arch_model_params;

/* What a bound model tells its host. */
typedef struct cmf_arch_model_info {
    uint32_t struct_size;
    uint32_t reserved0;
    uint64_t vocab_size;           /* logits per position */
    uint64_t max_context;          /* from the header (max_position_embeddings), 0 = unknown */
    /* Appended: tokens the model's draft head proposes per step
     * (cmf_arch_vt.draft, e.g. an MTP head); 0 = no draft head. */
    uint32_t draft_tokens;
    uint32_t reserved1;
} cmf_arch_model_info;

#define CMF_LOGITS_NONE 0  /* only advance the state */
#define CMF_LOGITS_LAST 1  /* logits of the last token: vocab_size floats */
#define CMF_LOGITS_ALL  2  /* logits of every token: n_tokens * vocab_size floats */

typedef struct cmf_forward_args {
    uint32_t struct_size;
    uint32_t n_tokens;
    const int32_t *tokens;
    uint64_t pos;                  /* position of tokens[0]; the state must hold exactly pos tokens */
    int32_t logits_mode;           /* CMF_LOGITS_* */
    uint32_t reserved0;
    float *logits;                 /* host memory, sized per logits_mode */
    /* appended (read only when struct_size covers them): */
    /* Run only the first n_layers layer visits (0 = all); with fewer than
     * all, logits_mode must be CMF_LOGITS_NONE and the state holds no
     * valid positions afterwards for the later layers (truncate to 0
     * before a full forward). */
    uint64_t n_layers;
    /* Host memory for n_tokens * hidden_size floats, or NULL: the
     * residual stream after the layers that ran (before the final norm). */
    float *hidden;
} cmf_forward_args;

/*
 * Pipelines. A pipeline container (spec 12) holds the components of a model
 * that is not a text LM, e.g. text-to-image: a text encoder, a denoiser and
 * a VAE decoder under their own tensor-name prefixes. The arch that runs
 * its arch_name binds them with pipeline_create (instead of model_create;
 * an arch may offer both kinds) and runs them with the pipeline's entry
 * point. Text is the host's job: it renders the prompt through the
 * pipeline's template, tokenizes it with the file's tokenizer (with its
 * special tokens) and hands over token ids. The host calls these members
 * only when non-NULL and inside the arch's struct_size.
 */
typedef struct cmf_arch_pipeline cmf_arch_pipeline; /* opaque, arch-owned: bound components */

#define CMF_PIPELINE_TEXT_TO_IMAGE 1

typedef struct cmf_pipeline_info {
    uint32_t struct_size;
    int32_t kind;                  /* CMF_PIPELINE_* */
    const char *description;       /* one line naming the components; borrowed from the pipeline */
    /* The text a prompt becomes before tokenization: "{prompt}" stands for
     * the prompt (borrowed; "{prompt}" alone = the prompt as is). */
    const char *prompt_template;
    const char *negative_template;
    uint32_t max_text_tokens;      /* ids per text (special tokens included) beyond which it is truncated */
    uint32_t latent_channels;      /* text-to-image: the latent is [channels][height/scale][width/scale] */
    uint32_t latent_scale;         /* image pixels per latent position along each side */
    uint32_t size_multiple;        /* width and height must be multiples of this */
} cmf_pipeline_info;

/* Called after each denoising step (step counts from 1); nonzero stops the
 * run, which then returns CMF_ERR_CANCELLED. */
typedef int32_t (*cmf_step_fn)(void *user, uint32_t step, uint32_t n_steps);

typedef struct cmf_text_to_image_args {
    uint32_t struct_size;
    uint32_t width, height;        /* pixels, multiples of pipeline_info.size_multiple */
    uint32_t steps;                /* denoising steps, >= 1 */
    float guidance_scale;          /* classifier-free guidance; <= 1: none (one model pass per step) */
    float cfg_trunc_ratio;         /* step i (from 0) is guided only while (i + 1) / steps <= this */
    uint32_t cfg_normalization;    /* 1: rescale the guided prediction to the conditional one's norm */
    uint32_t n_prompt;
    const int32_t *prompt;         /* token ids of the prompt (template applied), host memory */
    const int32_t *negative;       /* token ids of the negative prompt, host memory */
    uint32_t n_negative;
    uint32_t reserved0;
    /* Host memory, [latent_channels][height/scale][width/scale] f32: the
     * initial latent (the noise the run starts from), and where the final
     * latent goes (NULL: not wanted). */
    const float *latent_in;
    float *latent_out;
    /* Host memory, [3][height][width] f32 in [0, 1] (planes R, G, B): the
     * decoded image; NULL: stop after the latent (no decode). */
    float *image;
    cmf_step_fn on_step;           /* may be NULL */
    void *user;
} cmf_text_to_image_args;

typedef struct cmf_arch_vt {
    uint32_t struct_size;
    uint32_t abi_version;
    const char *name;              /* e.g. "qwen" */
    const char *version;
    const char *arch_names;        /* comma-separated header `arch.arch_name` values it runs */
    const char *hf_model_types;    /* comma-separated HF config `model_type` values it converts */

    /* -- converter hooks (optional) -- */
    /* HF config.json bytes -> the CMF header `arch` object (JSON) appended to out. */
    cmf_error *(*import_config)(void *ctx, const char *hf_config_json, size_t len, const cmf_byte_sink *out);
    /* How one HF tensor becomes CMF tensors, as JSON appended to out, given the
     * arch block from import_config. "[]" drops it; see docs/convert.md for
     * the plan format (renames, splits of fused projections, expert unpacking). */
    cmf_error *(*import_tensor)(void *ctx, const char *arch_json, size_t arch_len, const char *hf_name,
                                uint32_t ndim, const uint64_t *shape, const cmf_byte_sink *out);

    /* -- running (optional: an arch may only convert) -- */
    cmf_error *(*model_create)(void *ctx, const cmf_model_source *src, const cmf_backend_vt *backend,
                               void *backend_ctx, const cmf_arch_model_params *params, cmf_arch_model **out);
    void (*model_free)(void *ctx, cmf_arch_model *model);
    cmf_error *(*model_info)(void *ctx, const cmf_arch_model *model, cmf_arch_model_info *out);
    cmf_error *(*state_create)(void *ctx, cmf_arch_model *model, uint64_t n_ctx, cmf_arch_state **out);
    void (*state_free)(void *ctx, cmf_arch_state *state);
    /* Keep the first n_keep positions, drop the rest (rollback, reset with 0).
     * Right after a forward call, dropping its last position (n_keep =
     * n_past - 1: a rejected speculative token) is always supported. A state
     * that cannot go further back (recurrent layers keep one step of
     * history) answers other n_keep < n_past with CMF_ERR_UNSUPPORTED; the
     * host then resets and forwards the kept tokens again. */
    cmf_error *(*state_truncate)(void *ctx, cmf_arch_state *state, uint64_t n_keep);
    cmf_error *(*forward)(void *ctx, cmf_arch_model *model, cmf_arch_state *state, const cmf_forward_args *args);

    /* -- several sequences in one pass (appended; optional) --
     * For i < n_seqs: advance states[i] by *args[i] as forward(ctx, model,
     * states[i], args[i]) would, in one pass: the matmuls and element-wise
     * operations run once over every sequence's tokens laid end to end (a
     * decode step of n sequences reads the weights once, not n times), and
     * attention (any per-sequence mixer) runs for each sequence on its own
     * state. States are distinct and made by state_create on `model`; the
     * pass uses the first state's scratch memory. Logits go to each
     * args[i]->logits per its logits_mode. The results equal separate
     * forward calls up to the backend's kernel choices (a matmul over more
     * tokens may take another kernel path; docs/runtime.md says which).
     * CMF_ERR_UNSUPPORTED when the model has a layer kind the arch does not
     * batch: call forward per sequence instead; a call with n_seqs 0 only
     * answers that question (NULL: this model can be batched). On any other
     * error the states' positions are unspecified: truncate them to 0 (or
     * free them).
     * Hosts call it only when non-NULL and inside the vtable's struct_size. */
    cmf_error *(*forward_batch)(void *ctx, cmf_arch_model *model, uint32_t n_seqs, cmf_arch_state *const *states,
                                const cmf_forward_args *const *args);
    /* -- pipelines (appended; optional): see cmf_arch_pipeline below -- */
    cmf_error *(*pipeline_create)(void *ctx, const cmf_model_source *src, const cmf_backend_vt *backend,
                                  void *backend_ctx, const cmf_arch_model_params *params, cmf_arch_pipeline **out);
    void (*pipeline_free)(void *ctx, cmf_arch_pipeline *pipeline);
    cmf_error *(*pipeline_info)(void *ctx, const cmf_arch_pipeline *pipeline, cmf_pipeline_info *out);
    cmf_error *(*text_to_image)(void *ctx, cmf_arch_pipeline *pipeline, const cmf_text_to_image_args *args);

    /* -- routing statistics (appended; optional) --
     * Mixture-of-experts routing counts of what `state` has forwarded since
     * it was created, as compact JSON {"<layer>":[c_0,...,c_{E-1}],...}: one
     * entry per MoE layer, in layer order, c_e = how many times expert e was
     * among a token's top-k ("{}" without MoE layers). A position undone by
     * the one-position rollback is not counted. Appended to `out`. */
    cmf_error *(*route_stats)(void *ctx, const cmf_arch_state *state, const cmf_byte_sink *out);

    /* -- draft head (appended; optional): speculative decoding --
     * The draft head's logits (vocab_size floats, host memory) for position
     * n_past + 1, given `next_token`, the token chosen for position n_past
     * and not yet forwarded. Only for models whose model_info says
     * draft_tokens > 0. The draft head keeps its own cache of the positions
     * drafted from; it never changes what forward computes. */
    cmf_error *(*draft)(void *ctx, cmf_arch_model *model, cmf_arch_state *state, int32_t next_token, float *logits);
} cmf_arch_vt;

/* ---- the host services table -------------------------------------------- */

typedef void (*cmf_range_fn)(void *user, uint64_t begin, uint64_t end);

struct cmf_host_api {
    uint32_t struct_size;        /* sizeof(cmf_host_api) of the host */
    uint32_t abi_version;        /* newest plugin ABI version of the host */
    void *host_ctx;              /* pass back as first argument where asked */

    /* Errors: the only way a plugin makes a cmf_error. `message` is copied. */
    cmf_error *(*error_create)(int32_t code, const char *message);
    /* Release an error the plugin received and will not return (NULL-safe). */
    void (*error_free)(cmf_error *error);
    /* Log through the runtime's log callback. */
    void (*log)(void *host_ctx, int32_t level, const char *message);

    /* Memory with the given power-of-two alignment; free with free_aligned. */
    void *(*alloc_aligned)(size_t size, size_t alignment);
    void (*free_aligned)(void *p);

    /* Run fn over [begin, end) split into chunks of at least `grain`, on the
     * runtime's thread pool; returns when all chunks are done. fn must not throw. */
    void (*parallel_for)(void *host_ctx, uint64_t begin, uint64_t end, uint64_t grain,
                         cmf_range_fn fn, void *user);
    /* Threads of the runtime's pool. */
    int32_t (*num_threads)(void *host_ctx);

    /* Registration; valid only during cmf_plugin_init_v1. */
    cmf_error *(*register_codec)(cmf_registrar *reg, const cmf_codec_vt *vt, void *ctx);
    cmf_error *(*register_backend)(cmf_registrar *reg, const cmf_backend_vt *vt, void *ctx);
    cmf_error *(*register_arch)(cmf_registrar *reg, const cmf_arch_vt *vt, void *ctx);

    /* Codec lookup by dtype id (for backends and archs): NULL if none. */
    const cmf_codec_vt *(*find_codec)(void *host_ctx, int32_t dtype_id, void **codec_ctx);

    /* A plugin that keeps a copy of bytes it was handed (a weight's payload,
     * for instance in a cmf_codec_vt.decode_copy layout) tells the host it
     * no longer reads them there. Where the host mapped them from a model
     * file it drops their whole pages from the process's memory (a later
     * read maps them again from the file); any other memory is left as it
     * is. Advice only: nothing changes what the bytes read as. Added after
     * plugin ABI 1's first release: plugins read it only when struct_size
     * covers it (it may be NULL). */
    void (*release_pages)(void *host_ctx, const void *data, uint64_t nbytes);
};

typedef cmf_error *(*cmf_plugin_init_fn)(const cmf_host_api *host, uint32_t *abi_version,
                                         cmf_registrar *reg, void **plugin_state);
typedef void (*cmf_plugin_fini_fn)(void *plugin_state);

#ifdef __cplusplus
}
#endif

#endif /* CMF_PLUGIN_H */
