// The component configs of a Lumina-Image 2.0 pipeline container: each
// component's diffusers config.json stored verbatim as a u8 tensor
// ("te.config_json", "dit.config_json", "vae.config_json", and
// "scheduler.config_json" when the packer had one). Keys a config leaves
// out take diffusers' defaults for that class (what from_config would
// give); what this runtime does not implement is refused naming the key.
#pragma once

#include <cmf/cmf_plugin.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cmf::archs::lumina2 {

// Lumina2Transformer2DModel.
struct DitConfig {
    uint64_t hidden = 0, layers = 0, refiner_layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
    uint64_t in_channels = 0, out_channels = 0, patch = 0, cap_feat_dim = 0;
    uint64_t t_dim = 0;  // the conditioning width, min(hidden, 1024)
    double norm_eps = 1e-5;
    std::vector<uint64_t> axes_dim, axes_lens;  // 3-axis RoPE: dims per axis (sum head_dim), position limits
};

// AutoencoderKL's decoder half.
struct VaeConfig {
    uint64_t latent_channels = 0, out_channels = 0, layers_per_block = 0, groups = 0;
    std::vector<uint64_t> block_out;  // encoder order: the decoder walks it reversed
    double scaling_factor = 0, shift_factor = 0;
    bool post_quant_conv = true, mid_attention = true;
    // Image pixels per latent position along each side: 2^(blocks - 1).
    uint64_t scale() const { return uint64_t(1) << (block_out.size() - 1); }
};

// FlowMatchEulerDiscreteScheduler with a static shift.
struct SchedulerConfig {
    double shift = 6.0;           // Lumina-Image 2.0's; diffusers' class default is 1.0
    uint64_t train_steps = 1000;  // num_train_timesteps
};

// The bytes of the u8 tensor `name`, as text (CMF_ERR_MISSING_TENSOR if
// absent, CMF_ERR_PARSE if it is not a 1-D u8 tensor). nullopt when
// `optional` and absent.
std::optional<std::string> config_text(const cmf_host_api *host, const cmf_model_source *src, const std::string &name,
                                       bool optional = false);

DitConfig parse_dit_config(std::string_view json);
VaeConfig parse_vae_config(std::string_view json);
SchedulerConfig parse_scheduler_config(std::string_view json);

}  // namespace cmf::archs::lumina2
