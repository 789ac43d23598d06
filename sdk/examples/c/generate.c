/* generate: one chat turn (or, with --raw, a plain completion) generated
 * greedily and streamed as it comes, through the file's tokenizer and chat
 * template.
 *   generate MODEL.cmf PROMPT [N] [--raw] */
#include <cmf/cmf.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(cmf_error *e) {
    fprintf(stderr, "error: %s: %s\n", cmf_error_code_name(cmf_error_code(e)), cmf_error_message(e));
    cmf_error_free(e);
    return 1;
}

/* Each generated id goes through the streaming detokenizer, which never
 * splits a UTF-8 character. */
static int32_t print_token(void *user, int32_t token) {
    char *text = NULL;
    size_t len = 0;
    cmf_error *e = cmf_detokenizer_push((cmf_detokenizer *)user, token, &text, &len);
    if (e) {
        cmf_error_free(e);
        return 1; /* stop */
    }
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    cmf_string_free(text);
    return 0;
}

/* {"messages":[{"role":"user","content":PROMPT}],"add_generation_prompt":true},
 * PROMPT escaped as a JSON string. */
static char *chat_context(const char *prompt) {
    size_t n = strlen(prompt), i, o = 0;
    char *out = (char *)malloc(6 * n + 96);
    if (!out) return NULL;
    o += (size_t)sprintf(out, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (i = 0; i < n; ++i) {
        unsigned char c = (unsigned char)prompt[i];
        if (c == '"' || c == '\\') o += (size_t)sprintf(out + o, "\\%c", c);
        else if (c < 0x20) o += (size_t)sprintf(out + o, "\\u%04x", c);
        else out[o++] = (char)c;
    }
    sprintf(out + o, "\"}],\"add_generation_prompt\":true}");
    return out;
}

int main(int argc, char **argv) {
    cmf_runtime *rt = NULL;
    cmf_model *model = NULL;
    cmf_tokenizer *tok = NULL;
    cmf_detokenizer *detok = NULL;
    cmf_session *session = NULL;
    cmf_model_special_ids special;
    cmf_generate_options gen;
    cmf_error *e;
    char *ctx = NULL, *text = NULL, *tail = NULL;
    size_t text_len = 0, tail_len = 0, n_prompt = 0;
    int32_t *prompt = NULL;
    int raw = argc > 3 && strcmp(argv[argc - 1], "--raw") == 0, n_args = argc - raw, rc = 0;

    if (n_args < 3 || n_args > 4) {
        fprintf(stderr, "usage: generate MODEL.cmf PROMPT [N] [--raw]\n");
        return 2;
    }
    if ((e = cmf_runtime_create(NULL, &rt))) return fail(e);
    if ((e = cmf_open(rt, argv[1], NULL, &model))) goto error;
    if (raw) {
        text = argv[2];
        text_len = strlen(text);
    } else {
        if (!(ctx = chat_context(argv[2]))) goto done;
        if ((e = cmf_model_render_chat(model, ctx, strlen(ctx), &text, &text_len))) goto error;
    }
    if ((e = cmf_model_tokenizer(model, &tok))) goto error;
    if ((e = cmf_tokenizer_encode(tok, text, text_len, 0, &prompt, &n_prompt))) goto error;
    if ((e = cmf_detokenizer_create(tok, CMF_DECODE_SKIP_SPECIAL, &detok))) goto error;
    if ((e = cmf_session_create_for_model(rt, model, NULL, &session))) goto error;
    cmf_model_special_ids_init(&special);
    if ((e = cmf_model_get_special_ids(model, &special))) goto error;
    cmf_generate_options_init(&gen);
    gen.max_tokens = n_args == 4 ? (uint32_t)atoi(argv[3]) : 64;
    gen.temperature = 0.0f; /* greedy */
    gen.repetition_penalty = 1.0f;
    gen.stop_ids = special.eos_ids;
    gen.n_stop_ids = special.n_eos_ids;
    gen.on_token = print_token;
    gen.user = detok;
    if ((e = cmf_session_generate(session, prompt, n_prompt, &gen, NULL))) goto error;
    if ((e = cmf_detokenizer_finish(detok, &tail, &tail_len))) goto error;
    fwrite(tail, 1, tail_len, stdout);
    printf("\n");
    goto done;
error:
    rc = fail(e);
done:
    cmf_string_free(tail);
    if (!raw) cmf_string_free(text);
    free(ctx);
    cmf_ids_free(prompt);
    cmf_session_free(session);
    cmf_detokenizer_free(detok);
    cmf_tokenizer_free(tok);
    cmf_close(model);
    cmf_runtime_free(rt);
    return rc;
}
