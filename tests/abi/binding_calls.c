/* The calls the language bindings (sdk/bindings/) build on, from plain C99:
 * cmf_tensor_index agrees with the directory order, a row range dequantizes
 * to the same floats as the whole tensor, and cmf_session_cancel called from
 * another thread stops a running generation at its next token.
 * usage: binding_calls MODEL */
#define _POSIX_C_SOURCE 200809L
#include <cmf/cmf.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"


static int die(cmf_error *e, const char *what) {
    fprintf(stderr, "%s: %s: %s\n", what, cmf_error_code_name(cmf_error_code(e)), cmf_error_message(e));
    cmf_error_free(e);
    exit(1);
}
#define OK(call, what) do { cmf_error *e_ = (call); if (e_) die(e_, what); } while (0)

/* The generating thread parks in its token callback after the first token
 * until the other thread has called cmf_session_cancel: the cancel then
 * arrives while generation is running, never before or after it. */
struct handoff {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int first_token_seen;
    int cancel_sent;
    size_t tokens;
    cmf_session *session;
};

static int32_t on_token(void *user, int32_t token) {
    struct handoff *h = (struct handoff *)user;
    (void)token;
    pthread_mutex_lock(&h->mu);
    ++h->tokens;
    h->first_token_seen = 1;
    pthread_cond_broadcast(&h->cv);
    while (!h->cancel_sent) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

static void *canceller(void *arg) {
    struct handoff *h = (struct handoff *)arg;
    pthread_mutex_lock(&h->mu);
    while (!h->first_token_seen) pthread_cond_wait(&h->cv, &h->mu);
    cmf_session_cancel(h->session);
    h->cancel_sent = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

int main(int argc, char **argv) {
    cmf_runtime *rt = NULL;
    cmf_model *model = NULL;
    cmf_session *session = NULL;
    cmf_error *e;
    size_t i, n, index = 0;
    int32_t prompt[4] = {1413, 363, 258, 1908};
    cmf_generate_options gen;
    cmf_generate_stats stats;
    struct handoff h;
    pthread_t thread;

    if (argc != 2) {
        fprintf(stderr, "usage: binding_calls MODEL\n");
        return 2;
    }
    OK(cmf_runtime_create(NULL, &rt), "runtime");
    OK(cmf_open(rt, argv[1], NULL, &model), "open");

    /* cmf_tensor_index: every name maps back to its directory slot. */
    n = cmf_tensor_count(model);
    EXPECT(n > 0);
    for (i = 0; i < n; ++i) {
        cmf_tensor_info info;
        cmf_tensor_info_init(&info);
        OK(cmf_tensor_at(model, i, &info), "tensor_at");
        OK(cmf_tensor_index(model, info.name, &index), "tensor_index");
        EXPECT(index == i);
    }
    index = 12345;
    e = cmf_tensor_index(model, "no.such.tensor", &index);
    EXPECT(cmf_error_code(e) == CMF_ERR_MISSING_TENSOR);
    EXPECT(strstr(cmf_error_message(e), "no.such.tensor") != NULL);
    EXPECT(index == 12345); /* out-parameter untouched on error */
    cmf_error_free(e);
    e = cmf_tensor_index(model, NULL, &index);
    EXPECT(cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT);
    cmf_error_free(e);

    /* A row range of a 2-D tensor equals the same rows of the whole. */
    {
        cmf_tensor_info info;
        float *all, *part;
        uint64_t rows, cols;
        cmf_tensor_info_init(&info);
        OK(cmf_tensor_index(model, "model.embed_tokens.weight", &index), "embed index");
        OK(cmf_tensor_at(model, index, &info), "embed info");
        rows = info.shape[0];
        cols = info.shape[1];
        all = (float *)malloc(rows * cols * sizeof(float));
        part = (float *)malloc(3 * cols * sizeof(float));
        OK(cmf_tensor_dequantize(model, index, 0, rows, all, rows * cols), "dequantize all");
        OK(cmf_tensor_dequantize(model, index, 5, 8, part, 3 * cols), "dequantize rows");
        EXPECT(memcmp(part, all + 5 * cols, 3 * cols * sizeof(float)) == 0);
        e = cmf_tensor_dequantize(model, index, 5, 8, part, 3 * cols - 1);
        EXPECT(cmf_error_code(e) != 0); /* a short destination is an error */
        cmf_error_free(e);
        e = cmf_tensor_dequantize(model, index, 8, rows + 1, part, 3 * cols);
        EXPECT(cmf_error_code(e) != 0);
        cmf_error_free(e);
        free(all);
        free(part);
    }

    /* Cancel from another thread. */
    OK(cmf_session_create_for_model(rt, model, NULL, &session), "session");
    memset(&h, 0, sizeof h);
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    h.session = session;
    if (pthread_create(&thread, NULL, canceller, &h) != 0) return 1;
    cmf_generate_options_init(&gen);
    gen.max_tokens = 32;
    gen.temperature = 0.0f;
    gen.on_token = on_token;
    gen.user = &h;
    cmf_generate_stats_init(&stats);
    OK(cmf_session_generate(session, prompt, 4, &gen, &stats), "generate");
    pthread_join(thread, NULL);
    EXPECT(stats.stop_reason == CMF_STOP_CANCELLED);
    EXPECT(h.tokens == 1);
    EXPECT(stats.generated_tokens == 1);
    /* The cancel is spent: the next call runs to max_tokens. */
    gen.max_tokens = 3;
    gen.on_token = NULL;
    OK(cmf_session_generate(session, prompt, 4, &gen, &stats), "generate again");
    EXPECT(stats.stop_reason == CMF_STOP_MAX_TOKENS);
    pthread_mutex_destroy(&h.mu);
    pthread_cond_destroy(&h.cv);

    cmf_session_free(session);
    cmf_close(model);
    cmf_runtime_free(rt);
    if (failures == 0) printf("binding calls: all checks passed\n");
    return failures == 0 ? 0 : 1;
}
