/* dequantize: decode rows [BEGIN, END) of a tensor to f32 through its codec
 * and print them, one row per line.
 *   dequantize MODEL.cmf TENSOR [BEGIN END] */
#include <cmf/cmf.h>

#include <stdio.h>
#include <stdlib.h>

static int fail(cmf_error *e) {
    fprintf(stderr, "error: %s: %s\n", cmf_error_code_name(cmf_error_code(e)), cmf_error_message(e));
    cmf_error_free(e);
    return 1;
}

int main(int argc, char **argv) {
    cmf_runtime *rt = NULL;
    cmf_model *model = NULL;
    cmf_tensor_info t;
    cmf_error *e;
    size_t index;
    uint64_t rows, row_len = 1, begin, end, r, j;
    uint32_t d;
    float *values = NULL;
    int rc = 0;

    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: dequantize MODEL.cmf TENSOR [BEGIN END]\n");
        return 2;
    }
    if ((e = cmf_runtime_create(NULL, &rt))) return fail(e);
    if ((e = cmf_open(rt, argv[1], NULL, &model)) || (e = cmf_tensor_index(model, argv[2], &index))) {
        rc = fail(e);
        goto done;
    }
    cmf_tensor_info_init(&t);
    if ((e = cmf_tensor_at(model, index, &t))) {
        rc = fail(e);
        goto done;
    }
    /* Rows are shape[0] for 2-D and up; a vector is one row. */
    rows = t.ndim >= 2 ? t.shape[0] : 1;
    for (d = t.ndim >= 2 ? 1 : 0; d < t.ndim; ++d) row_len *= t.shape[d];
    begin = argc == 5 ? strtoull(argv[3], NULL, 10) : 0;
    end = argc == 5 ? strtoull(argv[4], NULL, 10) : rows;
    values = (float *)malloc((end > begin ? end - begin : 1) * row_len * sizeof(float));
    if (values == NULL) {
        rc = 1;
        goto done;
    }
    /* Out-of-range rows are the library's error, not ours to check. */
    if ((e = cmf_tensor_dequantize(model, index, begin, end, values, (end > begin ? end - begin : 0) * row_len))) {
        rc = fail(e);
        goto done;
    }
    for (r = 0; r < end - begin; ++r) {
        for (j = 0; j < row_len; ++j) printf("%s%.9g", j ? " " : "", (double)values[r * row_len + j]);
        printf("\n");
    }
done:
    free(values);
    cmf_close(model);
    cmf_runtime_free(rt);
    return rc;
}
