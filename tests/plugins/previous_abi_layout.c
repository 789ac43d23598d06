/* previous_abi/cmf/cmf_plugin.h really is the shorter layout: the vtables
 * end where plugin ABI 1 first ended (the members appended since then are
 * absent), and what they share with today's header sits at the same
 * offsets (tests/unit/abi_layout_test.cpp pins today's). */
#include <cmf/cmf_plugin.h>

#include <stddef.h>
#include <stdio.h>

static int failures = 0;
static void expect(size_t got, size_t want, const char *what) {
    if (got != want) {
        fprintf(stderr, "%s: %zu, want %zu\n", what, got, want);
        ++failures;
    }
}

int main(void) {
    expect(sizeof(cmf_codec_vt), 80, "sizeof(cmf_codec_vt)");
    expect(offsetof(cmf_codec_vt, matmul_rows), 72, "cmf_codec_vt.matmul_rows");
    expect(sizeof(cmf_backend_vt), 152, "sizeof(cmf_backend_vt)");
    expect(offsetof(cmf_backend_vt, embed), 144, "cmf_backend_vt.embed");
    expect(sizeof(cmf_arch_vt), 112, "sizeof(cmf_arch_vt)");
    expect(sizeof(cmf_host_api), 104, "sizeof(cmf_host_api)");
    if (failures == 0) printf("previous plugin ABI header: codec vt 80, backend vt 152 bytes\n");
    return failures == 0 ? 0 : 1;
}
