/* open: open a model (any shard of a sharded one) and print what it is;
 * with a public key, also verify every hash and the file's signature.
 *   open MODEL.cmf [TRUSTED_PUBKEY_HEX] */
#include <cmf/cmf.h>

#include <stdio.h>

static int fail(cmf_error *e) {
    fprintf(stderr, "error: %s: %s\n", cmf_error_code_name(cmf_error_code(e)), cmf_error_message(e));
    cmf_error_free(e);
    return 1;
}

int main(int argc, char **argv) {
    cmf_runtime *rt = NULL;
    cmf_model *model = NULL;
    cmf_model_info info;
    cmf_error *e;
    uint32_t i;
    int rc = 0;

    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: open MODEL.cmf [TRUSTED_PUBKEY_HEX]\n");
        return 2;
    }
    if ((e = cmf_runtime_create(NULL, &rt))) return fail(e);
    if ((e = cmf_open(rt, argv[1], NULL, &model))) {
        rc = fail(e);
        goto done;
    }
    cmf_model_info_init(&info);
    if ((e = cmf_model_get_info(model, &info))) {
        rc = fail(e);
        goto done;
    }
    printf("arch %s, quant %s, %llu tensors, %u shard(s)\n", info.arch_name, info.quant_type,
           (unsigned long long)info.tensor_count, info.shard_count);
    for (i = 0; i < info.shard_count; ++i) printf("  shard %u: %s\n", i + 1, cmf_model_shard_path(model, i));
    if (argc == 3) {
        cmf_verify_options vo;
        cmf_verify_report *report = NULL;
        const char *keys[1];
        size_t k, problems;
        keys[0] = argv[2];
        cmf_verify_options_init(&vo);
        vo.trusted_keys = keys;
        vo.n_trusted_keys = 1;
        if ((e = cmf_verify(model, &vo, &report))) {
            rc = fail(e);
            goto done;
        }
        problems = cmf_verify_problem_count(report);
        for (k = 0; k < problems; ++k) printf("problem: %s\n", cmf_verify_problem(report, k));
        printf("verify: %s\n", problems == 0 ? "ok, signed by the trusted key" : "FAILED");
        rc = problems == 0 ? 0 : 1;
        cmf_verify_report_free(report);
    }
done:
    cmf_close(model);
    cmf_runtime_free(rt);
    return rc;
}
