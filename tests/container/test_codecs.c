/* Test-only codecs, so the container tests do not depend on the real
 * codecs plugin: q4_tiled (11, fixed size, with a reference
 * decoder) and q1s (13, variable size, validate() requires >= 4 bytes).
 * Loaded explicitly by the tests; if the real codecs plugin already
 * registered these ids, this plugin is refused and the real ones are used. */
#include <cmf/cmf_plugin.h>

#include <math.h>
#include <stddef.h>
#include <string.h>

static const cmf_host_api *g_host;

static uint64_t elems(uint32_t ndim, const uint64_t *shape) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndim; ++i) n *= shape[i];
    return n;
}
static float f16_to_f32(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

static cmf_error *q4t_size(void *ctx, uint32_t ndim, const uint64_t *shape, uint64_t *out) {
    (void)ctx;
    *out = 18 * ((elems(ndim, shape) + 31) / 32);
    return NULL;
}
static cmf_error *q4t_deq(void *ctx, const cmf_tensor_view *t, uint64_t r0, uint64_t r1, float *dst) {
    (void)ctx;
    uint64_t row_len = 1;
    for (uint32_t i = (t->ndim >= 2 ? 1 : 0); i < t->ndim; ++i) row_len *= t->shape[i];
    const uint8_t *p = (const uint8_t *)t->data;
    for (uint64_t k = r0 * row_len; k < r1 * row_len; ++k) {
        const uint8_t *tile = p + (k / 32) * 18;
        uint16_t s;
        memcpy(&s, tile, 2);
        uint8_t b = tile[2 + (k % 32) / 2];
        int q = (k % 2) ? (b >> 4) : (b & 15);
        *dst++ = (float)(q - 8) * f16_to_f32(s);
    }
    return NULL;
}
static cmf_error *var_size(void *ctx, uint32_t ndim, const uint64_t *shape, uint64_t *out) {
    (void)ctx; (void)ndim; (void)shape;
    *out = CMF_SIZE_VARIABLE;
    return NULL;
}
static cmf_error *var_validate(void *ctx, const cmf_tensor_view *t) {
    (void)ctx;
    return t->nbytes >= 4 ? NULL : g_host->error_create(CMF_ERR_BOUNDS, "test-var payload shorter than its 4-byte count");
}
static cmf_error *var_deq(void *ctx, const cmf_tensor_view *t, uint64_t a, uint64_t b, float *d) {
    (void)ctx; (void)t; (void)a; (void)b; (void)d;
    return g_host->error_create(CMF_ERR_UNSUPPORTED, "test-var cannot dequantize");
}

static cmf_codec_vt g_q4t, g_var;

CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi, cmf_registrar *reg,
                                                void **state) {
    (void)abi; (void)state;
    g_host = host;
    g_q4t.struct_size = sizeof g_q4t;
    g_q4t.abi_version = 1;
    g_q4t.name = "test-q4_tiled";
    g_q4t.version = "0";
    g_q4t.dtype_id = 11;
    g_q4t.expected_size = q4t_size;
    g_q4t.dequantize_rows = q4t_deq;
    g_var = g_q4t;
    g_var.name = "test-q1s";
    g_var.dtype_id = 13;
    g_var.flags = CMF_CODEC_VARIABLE_SIZE;
    g_var.expected_size = var_size;
    g_var.validate = var_validate;
    g_var.dequantize_rows = var_deq;
    cmf_error *e = host->register_codec(reg, &g_q4t, NULL);
    if (e) return e;
    return host->register_codec(reg, &g_var, NULL);
}
