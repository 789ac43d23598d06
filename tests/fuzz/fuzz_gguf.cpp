// libFuzzer target: the GGUF reader over arbitrary bytes, then what
// import-gguf does with a file that parses (HF config, tensor names,
// tokenizer, the first block of every decodable tensor). Any crash, hang,
// sanitizer report or leak is a bug; errors are the expected outcome.
// Built only with -Dfuzz=true and clang (docs/reliability.md).
#include "common/error.hpp"
#include "convert/gguf.hpp"
#include "convert/gguf_import.hpp"
#include "convert/gguf_tokenizer.hpp"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    namespace g = cmf::convert::gguf;
    try {
        g::File f(data, size, "fuzz.gguf");
        std::vector<float> out(256);
        for (const auto &t : f.tensors()) {
            const g::TypeInfo *ti = g::type_info(t.type);
            if (ti->decodable) g::dequantize(t.type, t.data, ti->elems, out.data());
            try {
                (void)g::hf_name("qwen3", t.name);
            } catch (const cmf::Error &) {
            }
        }
        try {
            (void)g::hf_config(f);
        } catch (const cmf::Error &) {
        }
        (void)cmf::convert::build_gguf_tokenizer(f);
    } catch (const cmf::Error &) {
    }
    return 0;
}
