// libFuzzer target: chat template parsing and rendering (the Jinja
// interpreter). Input: template, NUL, context JSON (messages, tools,
// add_generation_prompt, ...); without a NUL the template renders a fixed
// two-message conversation. Rendering runs with small limits (RenderLimits)
// so an input that loops or recurses fails at a limit within the per-input
// time limit; the limit code is the same as in production, only the numbers
// differ. Errors are expected; a crash, hang, leak or sanitizer report is a bug.
#include "fuzz_util.hpp"

#include "common/error.hpp"
#include "text/jinja.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    auto [tmpl, ctx] = cmf::fuzz::split_at_nul(data, size);
    static const std::string fixed =
        R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi, Mr. Darcy."}],)"
        R"("add_generation_prompt":true,"bos_token":"<s>","eos_token":"</s>"})";
    cmf::text::RenderLimits limits;
    limits.steps = 200'000;
    limits.bytes = 1 << 20;
    try {
        cmf::text::ChatTemplate t(tmpl);
        (void)t.render(ctx.empty() ? std::string_view(fixed) : ctx, 1700000000, limits);
    } catch (const cmf::Error &) {
    }
    return 0;
}
