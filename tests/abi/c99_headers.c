/* Compiled with -std=c99 -pedantic -Wall -Wextra -Werror: the public headers
 * must be plain C99. */
#include <cmf/cmf.h>
#include <cmf/cmf_plugin.h>
#include <cmf/cmf_types.h>

int main(void) {
    cmf_runtime_options o;
    cmf_codec_vt vt;
    cmf_host_api host;
    (void)o;
    (void)vt;
    (void)host;
    return 0;
}
