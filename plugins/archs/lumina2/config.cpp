#include "config.hpp"

#include <cmf/json_read.hpp>
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

using cmf::json::Object;

std::vector<uint64_t> uints(const Object &o, const char *key) {
    std::vector<uint64_t> out;
    const simdjson::dom::array arr = *o.array(key);
    for (simdjson::dom::element e : arr) {
        uint64_t v;
        if (e.get_uint64().get(v)) o.fail(key, "must be an array of non-negative integers");
        out.push_back(v);
    }
    return out;
}

std::vector<std::string> strings(const Object &o, const char *key) {
    std::vector<std::string> out;
    const simdjson::dom::array arr = *o.array(key);
    for (simdjson::dom::element e : arr) {
        std::string_view v;
        if (e.get_string().get(v)) o.fail(key, "must be an array of strings");
        out.emplace_back(v);
    }
    return out;
}

void check_class(const Object &o, const char *name, const char *want) {
    const std::string cls = o.str("_class_name").value_or(want);
    if (cls != want)
        throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": _class_name is \"" + cls + "\"; this pipeline runs " + want);
}

}  // namespace

DitConfig parse_dit_config(std::string_view json) {
    constexpr const char *name = "dit.config_json";
    simdjson::dom::parser parser;
    const Object f = cmf::json::parse_object(parser, json, name);
    check_class(f, name, "Lumina2Transformer2DModel");
    DitConfig c;
    // Missing keys: Lumina2Transformer2DModel's defaults.
    c.patch = f.u64("patch_size").value_or(2);
    c.in_channels = f.u64("in_channels").value_or(16);
    c.out_channels = f.u64("out_channels").value_or(c.in_channels);
    c.hidden = f.u64("hidden_size").value_or(2304);
    c.layers = f.u64("num_layers").value_or(26);
    c.refiner_layers = f.u64("num_refiner_layers").value_or(2);
    c.heads = f.u64("num_attention_heads").value_or(24);
    c.kv_heads = f.u64("num_kv_heads").value_or(8);
    c.norm_eps = f.finite("norm_eps").value_or(1e-5);
    c.cap_feat_dim = f.u64("cap_feat_dim").value_or(1024);
    c.axes_dim = f.has("axes_dim_rope") ? uints(f, "axes_dim_rope") : std::vector<uint64_t>{32, 32, 32};
    c.axes_lens = f.has("axes_lens") ? uints(f, "axes_lens") : std::vector<uint64_t>{300, 512, 512};
    if (c.patch == 0 || c.in_channels == 0 || c.hidden == 0 || c.heads == 0 || c.kv_heads == 0 || c.cap_feat_dim == 0)
        throw Error(CMF_ERR_PARSE, std::string(name) + ": patch_size, in_channels, hidden_size, num_attention_heads, "
                                                       "num_kv_heads and cap_feat_dim must be > 0");
    if (c.out_channels != c.in_channels)
        f.fail("out_channels", "is " + std::to_string(c.out_channels) + " but the velocity steps a latent of in_channels " +
                                  std::to_string(c.in_channels));
    if (c.hidden % c.heads != 0) f.fail("num_attention_heads", "does not divide hidden_size");
    if (c.heads % c.kv_heads != 0) f.fail("num_kv_heads", "num_attention_heads must be a multiple of it");
    c.head_dim = c.hidden / c.heads;
    if (c.axes_dim.size() != 3 || c.axes_lens.size() != 3) f.fail("axes_dim_rope", "3-axis RoPE needs 3 dims and 3 axes_lens");
    for (uint64_t a : c.axes_dim)
        if (a == 0 || a % 2 != 0) f.fail("axes_dim_rope", "every axis needs an even, nonzero number of dims");
    if (std::accumulate(c.axes_dim.begin(), c.axes_dim.end(), uint64_t(0)) != c.head_dim)
        f.fail("axes_dim_rope", "the axes' dims must add up to head_dim = hidden_size / num_attention_heads = " +
                                   std::to_string(c.head_dim));
    if (!(c.norm_eps > 0)) f.fail("norm_eps", "must be > 0");
    c.t_dim = std::min<uint64_t>(c.hidden, 1024);
    return c;
}

VaeConfig parse_vae_config(std::string_view json) {
    constexpr const char *name = "vae.config_json";
    simdjson::dom::parser parser;
    const Object f = cmf::json::parse_object(parser, json, name);
    check_class(f, name, "AutoencoderKL");
    VaeConfig c;
    // Missing keys: AutoencoderKL's defaults.
    c.latent_channels = f.u64("latent_channels").value_or(4);
    c.out_channels = f.u64("out_channels").value_or(3);
    c.block_out = f.has("block_out_channels") ? uints(f, "block_out_channels") : std::vector<uint64_t>{64};
    c.layers_per_block = f.u64("layers_per_block").value_or(1);
    c.groups = f.u64("norm_num_groups").value_or(32);
    c.scaling_factor = f.finite("scaling_factor").value_or(0.18215);
    c.shift_factor = f.finite("shift_factor").value_or(0.0);
    c.post_quant_conv = f.boolean("use_post_quant_conv").value_or(true);
    c.mid_attention = f.boolean("mid_block_add_attention").value_or(true);
    const std::string act = f.str("act_fn").value_or("silu");
    if (act != "silu") throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": act_fn \"" + act + "\": only silu is implemented");
    if (c.out_channels != 3) f.fail("out_channels", "must be 3 (an RGB image)");
    if (c.block_out.empty() || c.block_out.size() > 8) f.fail("block_out_channels", "must have 1 to 8 entries");
    if (c.latent_channels == 0 || c.groups == 0) f.fail("latent_channels", "latent_channels and norm_num_groups must be > 0");
    for (uint64_t ch : c.block_out)
        if (ch == 0 || ch % c.groups != 0)
            f.fail("block_out_channels", "every entry must be a nonzero multiple of norm_num_groups " + std::to_string(c.groups));
    if (f.has("up_block_types")) {
        const auto types = strings(f, "up_block_types");
        if (types.size() != c.block_out.size()) f.fail("up_block_types", "needs one entry per block_out_channels entry");
        for (const std::string &t : types)
            if (t != "UpDecoderBlock2D")
                throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": up block \"" + t + "\": only UpDecoderBlock2D is implemented");
    }
    if (!(c.scaling_factor != 0)) f.fail("scaling_factor", "must be nonzero");
    return c;
}

SchedulerConfig parse_scheduler_config(std::string_view json) {
    constexpr const char *name = "scheduler.config_json";
    simdjson::dom::parser parser;
    const Object f = cmf::json::parse_object(parser, json, name);
    check_class(f, name, "FlowMatchEulerDiscreteScheduler");
    SchedulerConfig c;
    c.shift = f.finite("shift").value_or(1.0);
    c.train_steps = f.u64("num_train_timesteps").value_or(1000);
    if (!(c.shift > 0)) f.fail("shift", "must be > 0");
    if (c.train_steps == 0) f.fail("num_train_timesteps", "must be > 0");
    for (const char *key : {"use_dynamic_shifting", "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                            "invert_sigmas", "stochastic_sampling"})
        if (f.boolean(key).value_or(false))
            throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": " + key + " is true; only the static shift is implemented");
    if (f.finite("shift_terminal").value_or(0) != 0)
        throw Error(CMF_ERR_UNSUPPORTED, std::string(name) + ": shift_terminal is set; only the static shift is implemented");
    return c;
}

}  // namespace cmf::archs::lumina2
