/* list: the plugins a runtime loaded (and refused), what they registered,
 * and the tensors of a model.
 *   list [MODEL.cmf] */
#include <cmf/cmf.h>

#include <stdio.h>

static int fail(cmf_error *e) {
    fprintf(stderr, "error: %s: %s\n", cmf_error_code_name(cmf_error_code(e)), cmf_error_message(e));
    cmf_error_free(e);
    return 1;
}

int main(int argc, char **argv) {
    static const char *const kinds[] = {"", "codec", "arch", "backend"};
    cmf_runtime *rt = NULL;
    cmf_model *model = NULL;
    cmf_error *e;
    size_t i;
    int32_t kind;
    int rc = 0;

    if ((e = cmf_runtime_create(NULL, &rt))) return fail(e);
    printf("%d threads\n", (int)cmf_runtime_threads(rt));
    for (i = 0; i < cmf_runtime_plugin_count(rt); ++i) {
        cmf_plugin_info p;
        cmf_plugin_info_init(&p);
        if ((e = cmf_runtime_plugin_info(rt, i, &p))) return fail(e);
        if (p.status == CMF_PLUGIN_STATUS_LOADED)
            printf("plugin  %s %s (ABI %u) %s\n", p.name, p.version, p.abi_version, p.path);
        else
            printf("refused %s: %s\n", p.path, p.message);
    }
    for (kind = CMF_COMPONENT_CODEC; kind <= CMF_COMPONENT_BACKEND; ++kind)
        for (i = 0; i < cmf_runtime_component_count(rt, kind); ++i) {
            cmf_component_info c;
            cmf_component_info_init(&c);
            if ((e = cmf_runtime_component_info(rt, kind, i, &c))) return fail(e);
            printf("%-8s%s\n", kinds[kind], c.name);
        }
    if (argc > 1) {
        if ((e = cmf_open(rt, argv[1], NULL, &model))) {
            rc = fail(e);
        } else {
            for (i = 0; i < cmf_tensor_count(model); ++i) {
                cmf_tensor_info t;
                uint32_t d;
                cmf_tensor_info_init(&t);
                if ((e = cmf_tensor_at(model, i, &t))) {
                    rc = fail(e);
                    break;
                }
                printf("tensor  %-48s dtype %2d [", t.name, (int)t.dtype);
                for (d = 0; d < t.ndim; ++d) printf("%s%llu", d ? "," : "", (unsigned long long)t.shape[d]);
                printf("]\n");
            }
        }
    }
    cmf_close(model);
    cmf_runtime_free(rt);
    return rc;
}
