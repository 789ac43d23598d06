/* Deliberately broken plugins for the negotiation tests. One source, built
 * several times with a different -DBAD_KIND each. */
#include <cmf/cmf_plugin.h>

#include <stddef.h>

#define TOO_NEW 1
#define TOO_OLD 2
#define NO_ENTRY 3
#define UNRESOLVED 4
#define INIT_FAILS 5
#define FUTURE_ONLY 6
#define REGISTERS_NOTHING 7

#if BAD_KIND == UNRESOLVED
extern int cmf_test_symbol_that_does_not_exist(void);
#endif

CMF_PLUGIN_EXPORT cmf_error *dummy_size(void *ctx, uint32_t ndim, const uint64_t *shape, uint64_t *out) {
    (void)ctx; (void)ndim; (void)shape;
    *out = 0;
    return NULL;
}
CMF_PLUGIN_EXPORT cmf_error *dummy_deq(void *ctx, const cmf_tensor_view *t, uint64_t a, uint64_t b, float *d) {
    (void)ctx; (void)t; (void)a; (void)b; (void)d;
    return NULL;
}

CMF_PLUGIN_EXPORT cmf_codec_vt g_vt;

#if BAD_KIND == NO_ENTRY
CMF_PLUGIN_EXPORT int cmf_plugin_something_else(void) { return 1; }
#elif BAD_KIND == FUTURE_ONLY
CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v2(const cmf_host_api *host, uint32_t *abi, cmf_registrar *reg,
                                                void **state) {
    (void)host; (void)abi; (void)reg; (void)state;
    return NULL;
}
#else
CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi, cmf_registrar *reg,
                                                void **state) {
    (void)state;
    (void)abi;
#if BAD_KIND == TOO_NEW
    *abi = CMF_PLUGIN_ABI_VERSION + 1;
#elif BAD_KIND == TOO_OLD
    *abi = 0;
#elif BAD_KIND == INIT_FAILS
    return host->error_create(CMF_ERR_PLUGIN, "this test plugin always fails");
#elif BAD_KIND == UNRESOLVED
    if (cmf_test_symbol_that_does_not_exist()) return NULL;
#elif BAD_KIND == REGISTERS_NOTHING
    return NULL;
#endif
    g_vt.struct_size = sizeof g_vt;
    g_vt.abi_version = 1;
    g_vt.name = "test-dtype";
    g_vt.version = "0";
    g_vt.dtype_id = 200;
    g_vt.expected_size = dummy_size;
    g_vt.dequantize_rows = dummy_deq;
    return host->register_codec(reg, &g_vt, NULL);
}
#endif
