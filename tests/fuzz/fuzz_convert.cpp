// libFuzzer target: the converter's input, in memory. Input: config.json,
// NUL, a safetensors file. The safetensors header is parsed and validated
// as `cmfhost convert` does for each checkpoint file, config.json goes to
// the arch plugin of its model_type, every tensor through that plugin's
// plan and the dtype policy (plan_import), and each source tensor's first
// and last elements are read as f32. Errors are expected; a crash, hang,
// leak or sanitizer report is a bug.
#include "fuzz_util.hpp"

#include "common/error.hpp"
#include "convert/convert.hpp"
#include "convert/safetensors.hpp"
#include "plugin_host/runtime.hpp"

#include <algorithm>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    auto [config, st] = cmf::fuzz::split_at_nul(data, size);
    // The dtype policy's branches depend on the quantization: pick one by the input's size.
    static const char *const quants[] = {"q8", "q4", "q4tp", "q2tp", "q1", "vbit", "f16", "q8_2f"};
    try {
        cmf::convert::SafetensorsFile file("model.safetensors", reinterpret_cast<const uint8_t *>(st.data()), st.size());
        std::vector<const cmf::convert::SourceTensor *> tensors;
        for (const auto &t : file.tensors()) {
            tensors.push_back(&t);
            float f[2];
            if (t.elements > 0) {
                cmf::convert::read_f32(t, 0, 1, f);
                cmf::convert::read_f32(t, t.elements - 1, 1, f + 1);
            }
        }
        const cmf::convert::QuantPolicy policy(quants[size % 8]);
        (void)cmf::convert::plan_import(*cmf::fuzz::runtime(), std::string(config), "config.json", tensors, policy);
    } catch (const cmf::Error &) {
    }
    return 0;
}
