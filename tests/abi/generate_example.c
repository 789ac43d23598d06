/* docs/c-api.md's example, compiled as a test: open a model, read a tensor,
 * tokenize, generate greedily, all through cmf.h from plain C99.
 * usage: generate_example MODEL "PROMPT" N EXPECTED_ID0 EXPECTED_ID1 ...
 * Exit 0 when the first N greedy ids equal the expected ones. */
#include <cmf/cmf.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(cmf_error *e, const char *what) {
    fprintf(stderr, "%s: %s: %s\n", what, cmf_error_code_name(cmf_error_code(e)), cmf_error_message(e));
    cmf_error_free(e);
    return 1;
}

/* Collects generated ids; the callback may return nonzero to stop early. */
struct collected { int32_t ids[256]; size_t n; };
static int32_t on_token(void *user, int32_t token) {
    struct collected *c = (struct collected *)user;
    if (c->n < 256) c->ids[c->n++] = token;
    return 0;
}

int main(int argc, char **argv) {
    cmf_runtime *rt = NULL;
    cmf_model *model = NULL;
    cmf_tokenizer *tok = NULL;
    cmf_session *session = NULL;
    cmf_error *e;
    cmf_tensor_info info;
    cmf_generate_options gen;
    cmf_model_special_ids special;
    struct collected out;
    int32_t *prompt = NULL;
    size_t n_prompt = 0, i;
    float first[4];
    int rc = 1, n;

    if (argc < 4) return 2;
    n = atoi(argv[3]);

    if ((e = cmf_runtime_create(NULL, &rt))) return fail(e, "runtime");   /* plugins from the default dir / CMF_PLUGIN_PATH */
    if ((e = cmf_open(rt, argv[1], NULL, &model))) { rc = fail(e, "open"); goto done; }

    /* A tensor: its directory entry, then its first values through its codec. */
    cmf_tensor_info_init(&info);
    if ((e = cmf_tensor(model, "model.norm.weight", &info))) { rc = fail(e, "tensor"); goto done; }
    if ((e = cmf_tensor_dequantize(model, 0, 0, 1, first, 0))) cmf_error_free(e); /* dst too small: an error, not a crash */
    printf("model.norm.weight: dtype %d, %llu values, %llu bytes\n", (int)info.dtype,
           (unsigned long long)info.shape[0], (unsigned long long)info.nbytes);

    /* Tokenize the prompt with the file's own tokenizer. */
    if ((e = cmf_model_tokenizer(model, &tok))) { rc = fail(e, "tokenizer"); goto done; }
    if ((e = cmf_tokenizer_encode(tok, argv[2], strlen(argv[2]), 0, &prompt, &n_prompt))) { rc = fail(e, "encode"); goto done; }

    /* Generate greedily, stopping on the model's eos ids. */
    if ((e = cmf_session_create_for_model(rt, model, NULL, &session))) { rc = fail(e, "session"); goto done; }
    cmf_model_special_ids_init(&special);
    if ((e = cmf_model_get_special_ids(model, &special))) { rc = fail(e, "special ids"); goto done; }
    cmf_generate_options_init(&gen);
    gen.max_tokens = (uint32_t)n;
    gen.temperature = 0.0f;          /* greedy */
    gen.repetition_penalty = 1.0f;
    gen.stop_ids = special.eos_ids;
    gen.n_stop_ids = special.n_eos_ids;
    gen.on_token = on_token;
    gen.user = &out;
    out.n = 0;
    if ((e = cmf_session_generate(session, prompt, n_prompt, &gen, NULL))) { rc = fail(e, "generate"); goto done; }

    rc = 0;
    for (i = 0; i < out.n; ++i) {
        printf("%d ", (int)out.ids[i]);
        if ((int)i + 4 >= argc || atoi(argv[4 + i]) != out.ids[i]) rc = 1;
    }
    printf("\n");
    if ((int)out.n != n || argc - 4 != n) rc = 1;

done:
    cmf_ids_free(prompt);
    cmf_session_free(session);
    cmf_tokenizer_free(tok);
    cmf_close(model);
    cmf_runtime_free(rt);
    return rc;
}
