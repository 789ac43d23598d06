/* A plain C program that opens the runtime and lists plugins through cmf.h
 * only. Fails unless the standard codecs and the CPU backend are loaded. */
#include <cmf/cmf.h>

#include <stdio.h>
#include <string.h>

int main(void) {
    cmf_runtime_options opts;
    cmf_runtime *rt = NULL;
    cmf_error *err;
    size_t i;
    int have_f16 = 0, have_cpu = 0;

    if (cmf_abi_version() < CMF_ABI_VERSION) {
        fprintf(stderr, "library ABI %u older than header ABI %u\n", (unsigned)cmf_abi_version(), CMF_ABI_VERSION);
        return 1;
    }
    cmf_runtime_options_init(&opts);
    err = cmf_runtime_create(&opts, &rt);
    if (err) {
        fprintf(stderr, "%s: %s\n", cmf_error_code_name(cmf_error_code(err)), cmf_error_message(err));
        cmf_error_free(err);
        return 1;
    }
    for (i = 0; i < cmf_runtime_plugin_count(rt); ++i) {
        cmf_plugin_info p;
        cmf_plugin_info_init(&p);
        err = cmf_runtime_plugin_info(rt, i, &p);
        if (err) { cmf_error_free(err); return 1; }
        printf("plugin %s: %s %s\n", p.path, p.status == CMF_PLUGIN_STATUS_LOADED ? "loaded" : "refused", p.message);
    }
    for (i = 0; i < cmf_runtime_component_count(rt, CMF_COMPONENT_CODEC); ++i) {
        cmf_component_info c;
        cmf_component_info_init(&c);
        err = cmf_runtime_component_info(rt, CMF_COMPONENT_CODEC, i, &c);
        if (err) { cmf_error_free(err); return 1; }
        printf("codec %d %s\n", (int)c.dtype_id, c.name);
        if (c.dtype_id == CMF_DTYPE_F16 && strcmp(c.name, "f16") == 0) have_f16 = 1;
    }
    for (i = 0; i < cmf_runtime_component_count(rt, CMF_COMPONENT_BACKEND); ++i) {
        cmf_component_info c;
        cmf_component_info_init(&c);
        err = cmf_runtime_component_info(rt, CMF_COMPONENT_BACKEND, i, &c);
        if (err) { cmf_error_free(err); return 1; }
        printf("backend %s (%s)\n", c.name, c.detail);
        if (strcmp(c.name, "cpu") == 0) have_cpu = 1;
    }
    /* Errors are objects: an out-of-range query returns one, never crashes. */
    {
        cmf_component_info c;
        cmf_component_info_init(&c);
        err = cmf_runtime_component_info(rt, CMF_COMPONENT_CODEC, 100000, &c);
        if (!err || cmf_error_code(err) != CMF_ERR_INVALID_ARGUMENT) return 1;
        cmf_error_free(err);
    }
    cmf_runtime_free(rt);
    if (!have_f16 || !have_cpu) {
        fprintf(stderr, "missing f16 codec or cpu backend\n");
        return 1;
    }
    return 0;
}
