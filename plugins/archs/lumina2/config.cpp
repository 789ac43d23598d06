#include "config.hpp"

#include "../common/json_fields.hpp"

#include <cmf/plugin.hpp>

#include <simdjson.h>

#include <algorithm>
#include <numeric>

namespace cmf::archs::lumina2 {

using cmf::sdk::Error;

std::optional<std::string> config_text(const cmf_host_api *host, const cmf_model_source *src, const std::string &name,
                                       bool optional) {
    cmf_tensor_view v{};
    v.struct_size = sizeof v;
    if (cmf_error *e = src->tensor(src->user, name.c_str(), &v)) {
        if (!optional) throw cmf::sdk::HostError{e};
        host->error_free(e);
        return std::nullopt;
    }
    if (v.dtype != CMF_DTYPE_U8 || v.ndim != 1 || v.nbytes != v.shape[0])
        throw Error(CMF_ERR_PARSE, "tensor " + name + " must be a 1-D u8 tensor holding the component's config.json");
    return std::string(static_cast<const char *>(v.data), v.nbytes);
}

namespace {

// The config's root object and a reader that names the tensor in errors.
struct Doc {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    Doc(std::string_view json, const char *name) {
        if (auto err = parser.parse(json.data(), json.size()).get(root))
            throw Error(CMF_ERR_PARSE, std::string(name) + ": invalid JSON: " + simdjson::error_message(err));
        if (!root.is_object()) throw Error(CMF_ERR_PARSE, std::string(name) + ": must be a JSON object");
    }
};

void check_class(const JsonFields &f, const char *name, const char *want) {
    const std::string cls = f.string("_class_name", want);
    if (cls != want)
        throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": _class_name is \"" + cls + "\"; this pipeline runs " + want);
}

}  // namespace

DitConfig parse_dit_config(std::string_view json) {
    constexpr const char *name = "dit.config_json";
    Doc d(json, name);
    const JsonFields f(d.root, std::string(name) + ": ");
    check_class(f, name, "Lumina2Transformer2DModel");
    DitConfig c;
    // Missing keys: Lumina2Transformer2DModel's defaults.
    c.patch = f.uint("patch_size", 2);
    c.in_channels = f.uint("in_channels", 16);
    c.out_channels = f.uint("out_channels", c.in_channels);
    c.hidden = f.uint("hidden_size", 2304);
    c.layers = f.uint("num_layers", 26);
    c.refiner_layers = f.uint("num_refiner_layers", 2);
    c.heads = f.uint("num_attention_heads", 24);
    c.kv_heads = f.uint("num_kv_heads", 8);
    c.norm_eps = f.number("norm_eps", 1e-5);
    c.cap_feat_dim = f.uint("cap_feat_dim", 1024);
    c.axes_dim = f.has("axes_dim_rope") ? f.uints("axes_dim_rope") : std::vector<uint64_t>{32, 32, 32};
    c.axes_lens = f.has("axes_lens") ? f.uints("axes_lens") : std::vector<uint64_t>{300, 512, 512};
    if (c.patch == 0 || c.in_channels == 0 || c.hidden == 0 || c.heads == 0 || c.kv_heads == 0 || c.cap_feat_dim == 0)
        throw Error(CMF_ERR_PARSE, std::string(name) + ": patch_size, in_channels, hidden_size, num_attention_heads, "
                                                       "num_kv_heads and cap_feat_dim must be > 0");
    if (c.out_channels != c.in_channels)
        f.bad("out_channels", "is " + std::to_string(c.out_channels) + " but the velocity steps a latent of in_channels " +
                                  std::to_string(c.in_channels));
    if (c.hidden % c.heads != 0) f.bad("num_attention_heads", "does not divide hidden_size");
    if (c.heads % c.kv_heads != 0) f.bad("num_kv_heads", "num_attention_heads must be a multiple of it");
    c.head_dim = c.hidden / c.heads;
    if (c.axes_dim.size() != 3 || c.axes_lens.size() != 3) f.bad("axes_dim_rope", "3-axis RoPE needs 3 dims and 3 axes_lens");
    for (uint64_t a : c.axes_dim)
        if (a == 0 || a % 2 != 0) f.bad("axes_dim_rope", "every axis needs an even, nonzero number of dims");
    if (std::accumulate(c.axes_dim.begin(), c.axes_dim.end(), uint64_t(0)) != c.head_dim)
        f.bad("axes_dim_rope", "the axes' dims must add up to head_dim = hidden_size / num_attention_heads = " +
                                   std::to_string(c.head_dim));
    if (!(c.norm_eps > 0)) f.bad("norm_eps", "must be > 0");
    c.t_dim = std::min<uint64_t>(c.hidden, 1024);
    return c;
}

VaeConfig parse_vae_config(std::string_view json) {
    constexpr const char *name = "vae.config_json";
    Doc d(json, name);
    const JsonFields f(d.root, std::string(name) + ": ");
    check_class(f, name, "AutoencoderKL");
    VaeConfig c;
    // Missing keys: AutoencoderKL's defaults.
    c.latent_channels = f.uint("latent_channels", 4);
    c.out_channels = f.uint("out_channels", 3);
    c.block_out = f.has("block_out_channels") ? f.uints("block_out_channels") : std::vector<uint64_t>{64};
    c.layers_per_block = f.uint("layers_per_block", 1);
    c.groups = f.uint("norm_num_groups", 32);
    c.scaling_factor = f.number("scaling_factor", 0.18215);
    c.shift_factor = f.number("shift_factor", 0.0);
    c.post_quant_conv = f.boolean("use_post_quant_conv", true);
    c.mid_attention = f.boolean("mid_block_add_attention", true);
    const std::string act = f.string("act_fn", "silu");
    if (act != "silu") throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": act_fn \"" + act + "\": only silu is implemented");
    if (c.out_channels != 3) f.bad("out_channels", "must be 3 (an RGB image)");
    if (c.block_out.empty() || c.block_out.size() > 8) f.bad("block_out_channels", "must have 1 to 8 entries");
    if (c.latent_channels == 0 || c.groups == 0) f.bad("latent_channels", "latent_channels and norm_num_groups must be > 0");
    for (uint64_t ch : c.block_out)
        if (ch == 0 || ch % c.groups != 0)
            f.bad("block_out_channels", "every entry must be a nonzero multiple of norm_num_groups " + std::to_string(c.groups));
    if (f.has("up_block_types")) {
        const auto types = f.strings("up_block_types");
        if (types.size() != c.block_out.size()) f.bad("up_block_types", "needs one entry per block_out_channels entry");
        for (const std::string &t : types)
            if (t != "UpDecoderBlock2D")
                throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": up block \"" + t + "\": only UpDecoderBlock2D is implemented");
    }
    if (!(c.scaling_factor != 0)) f.bad("scaling_factor", "must be nonzero");
    return c;
}

SchedulerConfig parse_scheduler_config(std::string_view json) {
    constexpr const char *name = "scheduler.config_json";
    Doc d(json, name);
    const JsonFields f(d.root, std::string(name) + ": ");
    check_class(f, name, "FlowMatchEulerDiscreteScheduler");
    SchedulerConfig c;
    c.shift = f.number("shift", 1.0);
    c.train_steps = f.uint("num_train_timesteps", 1000);
    if (!(c.shift > 0)) f.bad("shift", "must be > 0");
    if (c.train_steps == 0) f.bad("num_train_timesteps", "must be > 0");
    for (const char *key : {"use_dynamic_shifting", "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                            "invert_sigmas", "stochastic_sampling"})
        if (f.boolean(key, false))
            throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": " + key + " is true; only the static shift is implemented");
    if (f.number("shift_terminal", 0) != 0)
        throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": shift_terminal is set; only the static shift is implemented");
    return c;
}

}  // namespace cmf::archs::lumina2
