/* Deliberately broken plugins for the negotiation tests. One source, built
 * several times with a different -DBAD_KIND each. */
#if BAD_KIND == 15 /* REPORTS_IN_PROGRESS: dlsym(RTLD_DEFAULT, ...) */
#define _GNU_SOURCE 1
#endif
#include <cmf/cmf_plugin.h>

#include <stddef.h>

#define TOO_NEW 1
#define TOO_OLD 2
#define NO_ENTRY 3
#define UNRESOLVED 4
#define INIT_FAILS 5
#define FUTURE_ONLY 6
#define REGISTERS_NOTHING 7
#define CRASHES_IN_INIT 8     /* SIGSEGV inside init: no host survives it in-process */
#define VT_TOO_SMALL 9        /* struct_size below the v1 minimum */
#define VT_HUGE 10            /* struct_size far beyond the host's: it reads only its own size */
#define NULL_REQUIRED 11      /* dequantize_rows NULL */
#define BAD_NAME 12           /* a name that is not UTF-8 */
#define NULL_VTABLE 13        /* register_codec(reg, NULL, ...) */
#define BACKEND_NULL_OPS 14   /* a backend whose operations are NULL */
#define REPORTS_IN_PROGRESS 15 /* fails init with what cmf_plugin_in_progress() says */
#define LONG_NAME 16          /* a 300-byte name */
#define DTYPE_BETWEEN 17      /* dtype id 300: neither a file dtype nor a memory-only one */

#if BAD_KIND == CRASHES_IN_INIT
#include <signal.h>
#endif
#if BAD_KIND == REPORTS_IN_PROGRESS
#include <dlfcn.h>
#endif
#include <string.h>

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
#elif BAD_KIND == CRASHES_IN_INIT
    raise(SIGSEGV);
#elif BAD_KIND == NULL_VTABLE
    return host->register_codec(reg, NULL, NULL);
#elif BAD_KIND == BACKEND_NULL_OPS
    {
        static cmf_backend_vt b;
        b.struct_size = sizeof b;
        b.abi_version = 1;
        b.name = "hollow";
        b.version = "0";
        b.description = "a backend with no operations";
        return host->register_backend(reg, &b, NULL);
    }
#elif BAD_KIND == REPORTS_IN_PROGRESS
    {
        typedef const char *(*in_progress_fn)(void);
        in_progress_fn f = (in_progress_fn)dlsym(RTLD_DEFAULT, "cmf_plugin_in_progress");
        const char *p = f ? f() : "cmf_plugin_in_progress not found";
        return host->error_create(CMF_ERR_PLUGIN, p ? p : "(null)");
    }
#endif
    g_vt.struct_size = sizeof g_vt;
    g_vt.abi_version = 1;
    g_vt.name = "test-dtype";
    g_vt.version = "0";
    g_vt.dtype_id = 200;
    g_vt.expected_size = dummy_size;
    g_vt.dequantize_rows = dummy_deq;
#if BAD_KIND == VT_TOO_SMALL
    g_vt.struct_size = 8;
#elif BAD_KIND == VT_HUGE
    g_vt.struct_size = 0x7fffffffu;
#elif BAD_KIND == NULL_REQUIRED
    g_vt.dequantize_rows = NULL;
#elif BAD_KIND == BAD_NAME
    g_vt.name = "bad\xff\x01name";
#elif BAD_KIND == DTYPE_BETWEEN
    g_vt.dtype_id = 300;
#elif BAD_KIND == LONG_NAME
    {
        static char name[301];
        memset(name, 'n', 300);
        g_vt.name = name;
    }
#endif
    return host->register_codec(reg, &g_vt, NULL);
}
#endif
