// libFuzzer target: open + iterate + verify over arbitrary bytes, as a .cmf
// file. Any crash, hang, sanitizer report or leak is a bug; errors are the
// expected outcome. Built only with -Dfuzz=true and clang
// (docs/reliability.md).
#include "fuzz_util.hpp"

#include <cmf/cmf.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {
// The runtime, plus the test codecs plugin (a variable-size dtype) when
// CMF_FUZZ_PLUGIN names it.
cmf_runtime *runtime() {
    static cmf_runtime *rt = [] {
        cmf_runtime *r = cmf::fuzz::runtime();
        if (const char *extra = std::getenv("CMF_FUZZ_PLUGIN")) cmf_error_free(cmf_runtime_load_plugin(r, extra));
        return r;
    }();
    return rt;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // In $TMPDIR when set: run.sh points it at its scratch dir, which it removes.
    static const std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                                    "/cmf-fuzz-" + std::to_string(::getpid()) + ".cmf";
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) return 0;
    std::fwrite(data, 1, size, f);
    std::fclose(f);
    cmf_open_options oo;
    cmf_open_options_init(&oo);
    oo.flags = (size & 1) ? CMF_OPEN_NO_MMAP : 0;
    cmf_model *m = nullptr;
    cmf_error *e = cmf_open(runtime(), path.c_str(), &oo, &m);
    if (e) {
        cmf_error_free(e);
        return 0;
    }
    for (size_t i = 0; i < cmf_tensor_count(m); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        if (!(e = cmf_tensor_at(m, i, &t))) {
            volatile uint8_t sink = t.nbytes ? static_cast<const uint8_t *>(t.data)[t.nbytes - 1] : 0;
            (void)sink;
            float one[64];
            uint64_t n = 1;
            for (uint32_t d = (t.ndim >= 2 ? 1 : 0); d < t.ndim; ++d) n *= t.shape[d];
            if (n <= 64) cmf_error_free(cmf_tensor_dequantize(m, i, 0, 1, one, 64));
        }
        cmf_error_free(e);
    }
    for (size_t i = 0; i < cmf_mask_count(m); ++i) {
        cmf_mask_info mi;
        cmf_mask_info_init(&mi);
        if (!(e = cmf_mask_at(m, i, &mi)) && mi.blob_len) {
            volatile uint8_t sink = mi.blob[mi.blob_len - 1];
            (void)sink;
        }
        cmf_error_free(e);
    }
    cmf_verify_options vo;
    cmf_verify_options_init(&vo);
    vo.flags = CMF_VERIFY_SKIP_SIGNATURE;
    cmf_verify_report *r = nullptr;
    cmf_error_free(cmf_verify(m, &vo, &r));
    cmf_verify_report_free(r);
    cmf_close(m);
    return 0;
}
