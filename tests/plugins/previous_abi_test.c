/* Plugins built against the previous plugin ABI header (previous_abi/: ABI 1
 * as first released, with the shorter cmf_codec_vt and cmf_backend_vt)
 * still load and work in today's host, which reads only the members their
 * struct_size covers:
 *  - both negotiate ABI 1 and register (the SDK's example codec "i8_sym",
 *    dtype 200, and example backend "example");
 *  - the old backend runs the default model and generates the PyTorch
 *    reference's greedy ids;
 *  - the default model's weights re-encoded to the old codec's dtype run
 *    on the cpu backend (which reads the old codec's vtable, without
 *    int8_rows / matmul_rows_x) and on the old backend with the same
 *    logits, close to the f16 model's.
 * usage: previous_abi_test MODEL OLD_CODEC.so OLD_BACKEND.so ID0 ID1 ... */
#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"

#define I8_SYM 200


static void ok(cmf_error *e, const char *what) {
    if (!e) return;
    fprintf(stderr, "%s: %s: %s\n", what, cmf_error_code_name(cmf_error_code(e)), cmf_error_message(e));
    cmf_error_free(e);
    exit(1);
}

struct ids { int32_t v[64]; size_t n; };
static int32_t collect(void *user, int32_t token) {
    struct ids *c = (struct ids *)user;
    if (c->n < 64) c->v[c->n++] = token;
    return 0;
}

static cmf_session *session_on(cmf_runtime *rt, cmf_model *m, const char *backend) {
    cmf_session_options so;
    cmf_session *s = NULL;
    cmf_session_options_init(&so);
    so.backend = backend;
    ok(cmf_session_create_for_model(rt, m, &so, &s), backend);
    return s;
}

/* The example codec's encoding, written out here: int8 codes of the whole
 * tensor at scale max|w| / 127 (ties to even), then the f32 scale. */
static unsigned char *encode_i8(const float *w, uint64_t n, float *scale_out) {
    unsigned char *out = (unsigned char *)malloc(n + 4);
    float amax = 0.0f, scale;
    uint64_t i;
    for (i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(w[i]));
    scale = amax > 0.0f ? amax / 127.0f : 1.0f;
    for (i = 0; i < n; ++i) {
        float q = nearbyintf(w[i] / scale);
        q = fminf(127.0f, fmaxf(-127.0f, q));
        out[i] = (unsigned char)(signed char)q;
    }
    memcpy(out + n, &scale, 4);
    *scale_out = scale;
    return out;
}

/* A model source over the opened model, its 2-D weights replaced by
 * i8_sym payloads. A missing name is the container's own MissingTensor
 * error (a cmf_error the host can free). */
struct i8_source {
    cmf_model *model;
    unsigned char **payloads; /* per directory index; NULL = the stored tensor */
};

static cmf_error *source_view(struct i8_source *src, size_t index, const char **name, cmf_tensor_view *out) {
    cmf_tensor_info t;
    cmf_error *e;
    cmf_tensor_info_init(&t);
    if ((e = cmf_tensor_at(src->model, index, &t)) != NULL) return e;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->ndim = t.ndim;
    memcpy(out->shape, t.shape, sizeof t.shape);
    if (src->payloads[index] != NULL) {
        out->dtype = I8_SYM;
        out->data = src->payloads[index];
        out->nbytes = t.shape[0] * t.shape[1] + 4;
    } else {
        out->dtype = t.dtype;
        out->data = t.data;
        out->nbytes = t.nbytes;
    }
    if (name) *name = t.name;
    return NULL;
}

static cmf_error *source_tensor(void *user, const char *name, cmf_tensor_view *out) {
    struct i8_source *src = (struct i8_source *)user;
    size_t index;
    cmf_error *e = cmf_tensor_index(src->model, name, &index);
    return e ? e : source_view(src, index, NULL, out);
}

static cmf_error *source_tensor_at(void *user, uint64_t index, const char **name, cmf_tensor_view *out) {
    return source_view((struct i8_source *)user, (size_t)index, name, out);
}

static cmf_session *source_session(cmf_runtime *rt, const cmf_model_source *src, const char *backend) {
    cmf_session_options so;
    cmf_session *s = NULL;
    cmf_session_options_init(&so);
    so.backend = backend;
    ok(cmf_session_create(rt, src, &so, &s), backend);
    return s;
}

int main(int argc, char **argv) {
    cmf_runtime_options ro;
    cmf_runtime *rt = NULL;
    cmf_model *model = NULL;
    cmf_session *s = NULL;
    cmf_generate_options g;
    struct ids got;
    char plugin_path[4096];
    size_t i, n_tensors;
    int n_expected = argc - 4, found_codec = 0, found_backend = 0;
    int32_t prompt[11] = {1413, 363, 258, 1908, 469, 105, 1177, 551, 2736, 44, 332};

    if (argc < 5) {
        fprintf(stderr, "usage: previous_abi_test MODEL OLD_CODEC.so OLD_BACKEND.so ID0 ID1 ...\n");
        return 2;
    }
    snprintf(plugin_path, sizeof plugin_path, "%s:%s", argv[2], argv[3]);

    cmf_runtime_options_init(&ro);
    ro.plugin_path = plugin_path; /* before CMF_PLUGIN_PATH: qwen arch, standard codecs, cpu backend */
    ok(cmf_runtime_create(&ro, &rt), "runtime");

    /* Both negotiated plugin ABI 1 and registered. */
    for (i = 0; i < cmf_runtime_plugin_count(rt); ++i) {
        cmf_plugin_info p;
        cmf_plugin_info_init(&p);
        ok(cmf_runtime_plugin_info(rt, i, &p), "plugin info");
        if (strcmp(p.path, argv[2]) == 0 || strcmp(p.path, argv[3]) == 0) {
            EXPECT(p.status == CMF_PLUGIN_STATUS_LOADED);
            EXPECT(p.abi_version == 1);
            if (p.status != CMF_PLUGIN_STATUS_LOADED) fprintf(stderr, "refused: %s\n", p.message);
        }
    }
    for (i = 0; i < cmf_runtime_component_count(rt, CMF_COMPONENT_CODEC); ++i) {
        cmf_component_info c;
        cmf_component_info_init(&c);
        ok(cmf_runtime_component_info(rt, CMF_COMPONENT_CODEC, i, &c), "codec info");
        if (c.dtype_id == I8_SYM) found_codec = strcmp(c.name, "i8_sym") == 0 && c.abi_version == 1;
    }
    for (i = 0; i < cmf_runtime_component_count(rt, CMF_COMPONENT_BACKEND); ++i) {
        cmf_component_info c;
        cmf_component_info_init(&c);
        ok(cmf_runtime_component_info(rt, CMF_COMPONENT_BACKEND, i, &c), "backend info");
        if (strcmp(c.name, "example") == 0) found_backend = c.abi_version == 1;
    }
    EXPECT(found_codec);
    EXPECT(found_backend);

    /* The old backend generates the reference's greedy ids. */
    ok(cmf_open(rt, argv[1], NULL, &model), "open");
    s = session_on(rt, model, "example");
    cmf_generate_options_init(&g);
    g.max_tokens = (uint32_t)n_expected;
    g.temperature = 0.0f;
    g.repetition_penalty = 1.0f;
    g.on_token = collect;
    g.user = &got;
    got.n = 0;
    ok(cmf_session_generate(s, prompt, 11, &g, NULL), "generate on the old backend");
    EXPECT((int)got.n == n_expected);
    for (i = 0; i < got.n && (int)i < n_expected; ++i) EXPECT(got.v[i] == atoi(argv[4 + i]));
    cmf_session_free(s);

    /* The model with every 2-D weight re-encoded to the old codec's dtype,
     * seen through a model source of our own (CMF files hold only the
     * format's dtype ids; a session takes any source). */
    {
        struct i8_source src;
        cmf_model_source ms;
        cmf_model_info info;
        cmf_session *cpu, *old, *ref;
        size_t vocab, best = 0;
        float *a, *b, *r, max_abs = 0.0f, max_diff = 0.0f;
        double dot = 0.0, na = 0.0, nr = 0.0;
        src.model = model;
        n_tensors = cmf_tensor_count(model);
        src.payloads = (unsigned char **)calloc(n_tensors, sizeof *src.payloads);
        for (i = 0; i < n_tensors; ++i) {
            cmf_tensor_info t;
            cmf_tensor_info_init(&t);
            ok(cmf_tensor_at(model, i, &t), "tensor");
            if (t.ndim == 2) {
                uint64_t n = t.shape[0] * t.shape[1];
                float *f = (float *)malloc(n * sizeof(float)), scale;
                ok(cmf_tensor_dequantize(model, i, 0, t.shape[0], f, n), "dequantize f16");
                src.payloads[i] = encode_i8(f, n, &scale);
                free(f);
            }
        }
        cmf_model_info_init(&info);
        ok(cmf_model_get_info(model, &info), "info");
        memset(&ms, 0, sizeof ms);
        ms.struct_size = sizeof ms;
        ms.user = &src;
        ms.arch_json = info.arch_json;
        ms.arch_json_len = strlen(info.arch_json);
        ms.header_json = info.header_json;
        ms.header_json_len = (size_t)info.header_json_len;
        ms.tensor_count = n_tensors;
        ms.tensor = source_tensor;
        ms.tensor_at = source_tensor_at;

        cpu = source_session(rt, &ms, "cpu");
        old = source_session(rt, &ms, "example");
        ref = session_on(rt, model, "cpu");
        vocab = (size_t)cmf_session_vocab_size(cpu);
        a = (float *)malloc(vocab * sizeof(float));
        b = (float *)malloc(vocab * sizeof(float));
        r = (float *)malloc(vocab * sizeof(float));
        ok(cmf_session_eval(cpu, prompt, 11, CMF_LOGITS_LAST, a, vocab), "eval on cpu");
        ok(cmf_session_eval(old, prompt, 11, CMF_LOGITS_LAST, b, vocab), "eval on the old backend");
        ok(cmf_session_eval(ref, prompt, 11, CMF_LOGITS_LAST, r, vocab), "eval of the f16 model");
        for (i = 0; i < vocab; ++i) {
            max_abs = fmaxf(max_abs, fabsf(a[i]));
            max_diff = fmaxf(max_diff, fabsf(a[i] - b[i]));
            if (a[i] > a[best]) best = i;
            dot += (double)a[i] * r[i];
            na += (double)a[i] * a[i];
            nr += (double)r[i] * r[i];
        }
        printf("i8_sym weights: cpu vs old backend logits differ by at most %g (max |logit| %g); "
               "cosine to the f16 model's logits %.5f\n", (double)max_diff, (double)max_abs, dot / sqrt(na * nr));
        /* Both backends decode the old codec's weights alike ... */
        EXPECT(max_abs > 1.0f);
        EXPECT(max_diff <= 1e-4f * max_abs);
        /* ... and the weights are the model's, up to int8 rounding. */
        EXPECT(dot / sqrt(na * nr) > 0.99);
        free(a);
        free(b);
        free(r);
        cmf_session_free(cpu);
        cmf_session_free(old);
        cmf_session_free(ref);
        for (i = 0; i < n_tensors; ++i) free(src.payloads[i]);
        free(src.payloads);
    }
    cmf_close(model);
    cmf_runtime_free(rt);
    if (failures == 0) printf("plugins built against the previous plugin ABI header load and run\n");
    return failures == 0 ? 0 : 1;
}
