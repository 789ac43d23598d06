// The qwen architecture plugin: qwen2 (q/k/v biases) and qwen3 (q/k-norm)
// dense decoders on the shared decoder (../common/decoder.hpp), and the
// converter hooks of every Qwen family (hf_import.cpp).
//
// The qwen choices: norms x^*w (or x^*(1+w) when the file says
// norm_style "gemma"), SwiGLU (or the file's hidden_act), attention scale
// 1/sqrt(head_dim), one RoPE base, full causal attention in every layer.
#include "hf_import.hpp"
#include "../common/decoder.hpp"

#include <cmf/cmf_plugin.h>
#include <cmf/plugin.hpp>

#include <cmath>
#include <memory>

namespace {

using cmf::archs::ArchConfig;
using cmf::archs::DecoderChoices;
using cmf::archs::LayerType;
using cmf::sdk::Error;

DecoderChoices qwen_choices(const ArchConfig &c) {
    if (c.has_yarn) throw Error(CMF_ERR_UNSUPPORTED, "qwen: arch.yarn RoPE scaling is not implemented yet");
    DecoderChoices ch;
    ch.family = "qwen";
    ch.norm_style = c.gemma_norm ? CMF_NORM_GEMMA : CMF_NORM_QWEN;
    ch.act = c.gelu_tanh ? CMF_ACT_GELU_TANH : CMF_ACT_SILU;
    ch.embed_scale = float(c.embed_multiplier);
    ch.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
    for (uint64_t i = 0; i < c.num_layers; ++i) {
        if (c.layer_types[i] == LayerType::SlidingAttention)
            throw Error(CMF_ERR_UNSUPPORTED, "qwen: layer " + std::to_string(i) +
                                                 " is SlidingAttention, which the qwen arch does not run");
        ch.layers.push_back({0, float(c.rope_theta)});
    }
    return ch;
}

// Converter hooks: the HF config -> arch block mapping and tensor plans
// (hf_import.cpp, shared machinery in ../common).
cmf_error *vt_import_config(void *ctx, const char *json, size_t len, const cmf_byte_sink *out) {
    return cmf::archs::import_config_hook(static_cast<cmf::archs::ArchPlugin *>(ctx)->host, json, len, out,
                                          cmf::archs::qwen::import_config);
}

cmf_error *vt_import_tensor(void *ctx, const char *arch_json, size_t arch_len, const char *hf_name, uint32_t ndim,
                            const uint64_t *shape, const cmf_byte_sink *out) {
    return cmf::archs::import_tensor_hook(static_cast<cmf::archs::ArchPlugin *>(ctx)->host, arch_json, arch_len,
                                          hf_name, ndim, shape, out, cmf::archs::qwen::import_tensor);
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "qwen arch needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto pl = std::make_unique<cmf::archs::ArchPlugin>();
    pl->host = host;
    pl->family = "qwen";
    pl->choose = qwen_choices;
    cmf_arch_vt &vt = pl->vt;
    vt = cmf_arch_vt{};
    vt.struct_size = sizeof vt;
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "qwen";
    vt.version = CMF_QWEN_VERSION;
    vt.arch_names = "qwen2,qwen3";
    // Runs the dense families; converts every Qwen family (MoE and hybrid
    // files convert now and run once their forward passes land).
    vt.hf_model_types = cmf::archs::qwen::kModelTypes;
    vt.import_config = vt_import_config;
    vt.import_tensor = vt_import_tensor;
    cmf::archs::set_decoder_run_members(vt);
    if (cmf_error *e = host->register_arch(reg, &pl->vt, pl.get())) return e;
    *plugin_state = pl.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) {
    delete static_cast<cmf::archs::ArchPlugin *>(plugin_state);
}
