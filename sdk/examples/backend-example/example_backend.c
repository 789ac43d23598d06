/*
 * An out-of-tree compute backend in plain C99: "example", the simplest
 * backend that runs a transformer arch correctly. Every weight is decoded to
 * f32 once at bind time (through the codec the host has for its dtype), the
 * operations are straightforward loops, and the matmul shows how a plugin
 * parallelises: through host->parallel_for on the runtime's thread pool (a
 * plugin never creates threads).
 *
 * It fills only the members of cmf_backend_vt that every plugin ABI 1 host
 * knows (up to embed); the optional ones appended later (kv_write,
 * attention_kv, matmul_multi) are left out, and archs fall back to what is
 * here (an f32 KV cache, one matmul per weight).
 *
 * Build (against an installed cmf): meson setup build && meson compile -C build
 * Use: CMF_PLUGIN_PATH=$PWD/build cmfhost run --backend example MODEL.cmf
 */
#include <cmf/cmf_plugin.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A bound weight: its view and its values in f32, rows x cols (a vector is
 * one row). */
struct cmf_backend_weight {
    cmf_tensor_view view;
    uint64_t rows, cols;
    float *values;
};

typedef struct {
    const cmf_host_api *host;
    cmf_backend_vt vt;
} backend;

static cmf_error *fail(const backend *be, int32_t code, const char *what) {
    return be->host->error_create(code, what);
}

/* ---- weights ---------------------------------------------------------------- */

static cmf_error *weight_bind(void *ctx, const cmf_tensor_view *t, cmf_backend_weight **out) {
    backend *be = (backend *)ctx;
    cmf_backend_weight *w;
    cmf_error *e = NULL;
    if (t == NULL || out == NULL) return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: NULL argument");
    if (t->ndim < 1 || t->ndim > 2)
        return fail(be, CMF_ERR_UNSUPPORTED, "example backend: a weight must be 1-D or 2-D");
    w = (cmf_backend_weight *)calloc(1, sizeof *w);
    if (w == NULL) return fail(be, CMF_ERR_OUT_OF_MEMORY, "example backend: out of memory");
    w->view = *t;
    w->rows = t->ndim == 2 ? t->shape[0] : 1;
    w->cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    w->values = (float *)be->host->alloc_aligned(w->rows * w->cols * sizeof(float), 64);
    if (w->values == NULL) {
        free(w);
        return fail(be, CMF_ERR_OUT_OF_MEMORY, "example backend: out of memory");
    }
    if (t->dtype == CMF_DTYPE_F32) {
        if (t->nbytes != w->rows * w->cols * sizeof(float))
            e = fail(be, CMF_ERR_BOUNDS, "example backend: f32 payload size does not match its shape");
        else
            memcpy(w->values, t->data, t->nbytes);
    } else {
        void *codec_ctx = NULL;
        const cmf_codec_vt *codec = be->host->find_codec(be->host->host_ctx, t->dtype, &codec_ctx);
        if (codec == NULL)
            e = fail(be, CMF_ERR_UNKNOWN_DTYPE, "example backend: no codec for the weight's dtype");
        else
            e = codec->dequantize_rows(codec_ctx, t, 0, t->ndim == 2 ? w->rows : 1, w->values);
    }
    if (e != NULL) {
        be->host->free_aligned(w->values);
        free(w);
        return e;
    }
    *out = w;
    return NULL;
}

static void weight_free(void *ctx, cmf_backend_weight *w) {
    backend *be = (backend *)ctx;
    if (w == NULL) return;
    be->host->free_aligned(w->values);
    free(w);
}

/* ---- matmul: rows split over the runtime's pool ----------------------------- */

typedef struct {
    const cmf_backend_weight *w;
    const float *x;
    uint64_t n_batch;
    float *y;
} matmul_job;

static void matmul_rows(void *user, uint64_t r0, uint64_t r1) {
    const matmul_job *j = (const matmul_job *)user;
    uint64_t b, r, c, cols = j->w->cols;
    for (b = 0; b < j->n_batch; ++b)
        for (r = r0; r < r1; ++r) {
            const float *wr = j->w->values + r * cols, *xb = j->x + b * cols;
            float acc = 0.0f;
            for (c = 0; c < cols; ++c) acc += wr[c] * xb[c];
            j->y[b * j->w->rows + r] = acc;
        }
}

static cmf_error *matmul(void *ctx, const cmf_backend_weight *w, const float *x, uint64_t n_batch, float *y) {
    backend *be = (backend *)ctx;
    matmul_job job;
    if (w == NULL || w->view.ndim != 2) return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: matmul needs a 2-D weight");
    job.w = w;
    job.x = x;
    job.n_batch = n_batch;
    job.y = y;
    be->host->parallel_for(be->host->host_ctx, 0, w->rows, 16, matmul_rows, &job);
    return NULL;
}

/* ---- buffers: host memory ------------------------------------------------------ */

static cmf_error *buffer_alloc(void *ctx, size_t n_bytes, float **out) {
    backend *be = (backend *)ctx;
    *out = (float *)be->host->alloc_aligned(n_bytes ? n_bytes : 64, 64);
    return *out ? NULL : fail(be, CMF_ERR_OUT_OF_MEMORY, "example backend: out of memory");
}

static void buffer_free(void *ctx, float *buf) {
    backend *be = (backend *)ctx;
    if (buf != NULL) be->host->free_aligned(buf);
}

static cmf_error *buffer_write(void *ctx, float *dst, const void *src, size_t n_bytes) {
    (void)ctx;
    if (n_bytes) memmove(dst, src, n_bytes);
    return NULL;
}

static cmf_error *buffer_read(void *ctx, void *dst, const float *src, size_t n_bytes) {
    (void)ctx;
    if (n_bytes) memmove(dst, src, n_bytes);
    return NULL;
}

static cmf_error *copy(void *ctx, float *dst, const float *src, uint64_t n) {
    return buffer_write(ctx, dst, src, n * sizeof(float));
}

/* ---- transformer operations -------------------------------------------------- */

static cmf_error *rms_norm(void *ctx, const float *x, const cmf_backend_weight *w, uint64_t n_rows, uint64_t dim,
                           float eps, int32_t style, float *y) {
    backend *be = (backend *)ctx;
    uint64_t r, j;
    if (w == NULL || w->view.ndim != 1 || w->cols != dim)
        return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: rms_norm weight is not a vector of dim");
    if (style != CMF_NORM_QWEN && style != CMF_NORM_GEMMA)
        return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: unknown norm style");
    for (r = 0; r < n_rows; ++r) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        double ss = 0.0;
        float inv;
        for (j = 0; j < dim; ++j) ss += (double)xr[j] * (double)xr[j];
        inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
        for (j = 0; j < dim; ++j)
            yr[j] = (xr[j] * inv) * (style == CMF_NORM_GEMMA ? 1.0f + w->values[j] : w->values[j]);
    }
    return NULL;
}

static cmf_error *rope(void *ctx, float *x, uint64_t n_tokens, uint64_t ld, uint32_t n_heads, uint32_t head_dim,
                       uint32_t rot_dim, uint64_t pos0, float theta) {
    backend *be = (backend *)ctx;
    uint64_t t;
    uint32_t h, i, half = rot_dim / 2;
    if (rot_dim % 2 != 0 || rot_dim > head_dim || (uint64_t)n_heads * head_dim > ld)
        return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: rope arguments out of range");
    for (t = 0; t < n_tokens; ++t)
        for (i = 0; i < half; ++i) {
            /* As Hugging Face computes it: inv_freq = 1 / theta^(2i/d) and
             * the angle in f32. */
            float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)rot_dim);
            float a = (float)(pos0 + t) * inv_freq, c = cosf(a), s = sinf(a);
            for (h = 0; h < n_heads; ++h) {
                float *v = x + t * ld + (uint64_t)h * head_dim;
                float p = v[i], q = v[i + half];
                v[i] = p * c - q * s;
                v[i + half] = q * c + p * s;
            }
        }
    return NULL;
}

static cmf_error *attention(void *ctx, const float *q, const float *k_cache, const float *v_cache, float *out,
                            uint64_t n_tokens, uint64_t pos0, uint32_t n_heads, uint32_t n_kv_heads,
                            uint32_t head_dim, float scale, uint32_t window, float softcap) {
    backend *be = (backend *)ctx;
    uint64_t t, j, kv_ld = (uint64_t)n_kv_heads * head_dim, q_ld = (uint64_t)n_heads * head_dim;
    uint32_t h, d;
    float *scores;
    if (n_kv_heads == 0 || n_heads % n_kv_heads != 0)
        return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: n_heads must be a multiple of n_kv_heads");
    scores = (float *)malloc((pos0 + n_tokens) * sizeof(float));
    if (scores == NULL) return fail(be, CMF_ERR_OUT_OF_MEMORY, "example backend: out of memory");
    for (t = 0; t < n_tokens; ++t) {
        uint64_t pos = pos0 + t, first = window > 0 && pos + 1 > window ? pos + 1 - window : 0;
        for (h = 0; h < n_heads; ++h) {
            const float *qh = q + t * q_ld + (uint64_t)h * head_dim;
            uint64_t kv_off = (uint64_t)(h / (n_heads / n_kv_heads)) * head_dim;
            float *o = out + t * q_ld + (uint64_t)h * head_dim;
            float max = -INFINITY, z = 0.0f;
            for (j = first; j <= pos; ++j) {
                const float *k = k_cache + j * kv_ld + kv_off;
                float s = 0.0f;
                for (d = 0; d < head_dim; ++d) s += qh[d] * k[d];
                s *= scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                scores[j] = s;
                if (s > max) max = s;
            }
            for (d = 0; d < head_dim; ++d) o[d] = 0.0f;
            for (j = first; j <= pos; ++j) {
                const float *v = v_cache + j * kv_ld + kv_off;
                float p = expf(scores[j] - max);
                z += p;
                for (d = 0; d < head_dim; ++d) o[d] += p * v[d];
            }
            for (d = 0; d < head_dim; ++d) o[d] /= z;
        }
    }
    free(scores);
    return NULL;
}

static cmf_error *gated_act(void *ctx, const float *gate, const float *up, uint64_t n, int32_t act, float *out) {
    backend *be = (backend *)ctx;
    uint64_t i;
    if (act != CMF_ACT_SILU && act != CMF_ACT_GELU_TANH)
        return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: unknown activation");
    for (i = 0; i < n; ++i) {
        float g = gate[i];
        float a = act == CMF_ACT_SILU ? g / (1.0f + expf(-g))
                                      : 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
        out[i] = a * up[i];
    }
    return NULL;
}

static cmf_error *add(void *ctx, float *y, const float *x, uint64_t n) {
    uint64_t i;
    (void)ctx;
    for (i = 0; i < n; ++i) y[i] += x[i];
    return NULL;
}

static cmf_error *add_bias(void *ctx, float *y, const cmf_backend_weight *b, uint64_t n_rows, uint64_t dim) {
    backend *be = (backend *)ctx;
    uint64_t r, j;
    if (b == NULL || b->view.ndim != 1 || b->cols != dim)
        return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: bias is not a vector of dim");
    for (r = 0; r < n_rows; ++r)
        for (j = 0; j < dim; ++j) y[r * dim + j] += b->values[j];
    return NULL;
}

static cmf_error *embed(void *ctx, const cmf_backend_weight *table, const int32_t *tokens, uint64_t n_tokens,
                        float scale, float *out) {
    backend *be = (backend *)ctx;
    uint64_t t, j;
    if (table == NULL || table->view.ndim != 2) return fail(be, CMF_ERR_INVALID_ARGUMENT, "example backend: embed table is not 2-D");
    for (t = 0; t < n_tokens; ++t) {
        const float *row;
        if (tokens[t] < 0 || (uint64_t)tokens[t] >= table->rows)
            return fail(be, CMF_ERR_BOUNDS, "example backend: token id outside the embedding table");
        row = table->values + (uint64_t)tokens[t] * table->cols;
        for (j = 0; j < table->cols; ++j) out[t * table->cols + j] = row[j] * scale;
    }
    return NULL;
}

/* ---- registration ------------------------------------------------------------ */

CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version, cmf_registrar *reg,
                                                void **plugin_state) {
    backend *be;
    cmf_error *e;
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "example backend needs plugin ABI >= 1");
    *abi_version = 1; /* everything used here exists since plugin ABI 1 */
    be = (backend *)calloc(1, sizeof *be);
    if (be == NULL) return host->error_create(CMF_ERR_OUT_OF_MEMORY, "example backend: out of memory");
    be->host = host;
    be->vt.struct_size = sizeof be->vt; /* as this header knows it: the host reads no further */
    be->vt.abi_version = 1;
    be->vt.name = "example";
    be->vt.version = "1.0";
    be->vt.description = "plain C loops, weights decoded to f32 at bind time";
    be->vt.weight_bind = weight_bind;
    be->vt.weight_free = weight_free;
    be->vt.matmul = matmul;
    be->vt.buffer_alloc = buffer_alloc;
    be->vt.buffer_free = buffer_free;
    be->vt.buffer_write = buffer_write;
    be->vt.buffer_read = buffer_read;
    be->vt.copy = copy;
    be->vt.rms_norm = rms_norm;
    be->vt.rope = rope;
    be->vt.attention = attention;
    be->vt.gated_act = gated_act;
    be->vt.add = add;
    be->vt.add_bias = add_bias;
    be->vt.embed = embed;
    if ((e = host->register_backend(reg, &be->vt, be)) != NULL) {
        free(be);
        return e;
    }
    *plugin_state = be;
    return NULL;
}

CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) { free(plugin_state); }
