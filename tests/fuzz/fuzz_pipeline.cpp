// libFuzzer target: the text-to-image pipeline's component configs, which a
// pipeline .cmf stores as u8 tensors (dit.config_json, vae.config_json,
// scheduler.config_json) and the lumina2 arch plugin parses when
// cmf_imagine binds the file (docs/imagine.md). Input: the three texts, NUL
// separated, each fed to its parser; an accepted VAE config's image scale
// and an accepted DiT config's derived widths are read as the plugin reads
// them. Errors are expected; a crash, hang, leak or sanitizer report is a bug.
#include "fuzz_util.hpp"

#include "lumina2/config.hpp"

#include <cmf/plugin.hpp>

#include <numeric>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    namespace l2 = cmf::archs::lumina2;
    auto [dit, rest] = cmf::fuzz::split_at_nul(data, size);
    auto [vae, sched] = cmf::fuzz::split_at_nul(reinterpret_cast<const uint8_t *>(rest.data()), rest.size());
    volatile uint64_t sink = 0;
    try {
        const l2::DitConfig c = l2::parse_dit_config(dit);
        sink = c.head_dim + c.t_dim + std::accumulate(c.axes_lens.begin(), c.axes_lens.end(), uint64_t(0));
    } catch (const cmf::sdk::Error &) {
    }
    try {
        const l2::VaeConfig c = l2::parse_vae_config(vae);
        sink = c.scale();
    } catch (const cmf::sdk::Error &) {
    }
    try {
        const l2::SchedulerConfig c = l2::parse_scheduler_config(sched);
        sink = c.train_steps;
    } catch (const cmf::sdk::Error &) {
    }
    (void)sink;
    return 0;
}
