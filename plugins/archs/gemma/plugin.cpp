// The gemma architecture plugin: gemma, gemma2 and gemma3 (text) on the
// shared decoder (../common/decoder.hpp), and their converter hooks
// (hf_import.cpp).
//
// The Gemma choices (Hugging Face's modeling_gemma.py, modeling_gemma2.py,
// modeling_gemma3.py): norms x^*(1+w); GeGLU with the tanh GELU whatever
// the config's activation string says (the models were trained with it);
// the embedding times sqrt(hidden) rounded to f32; attention scale
// 1/sqrt(query_pre_attn_scalar) when the file gives it, else
// 1/sqrt(head_dim); attention and final logit soft-capping when given;
// sandwich norms and q/k-norm where the tensors exist. Sliding-window
// layers: `layer_types` when it names any SlidingAttention layer, else the
// pattern rule (layer i is local iff (i+1) % sliding_window_pattern != 0);
// local layers use rope_local_base_freq when given.
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

DecoderChoices gemma_choices(const ArchConfig &c) {
    if (c.has_yarn) throw Error(CMF_ERR_UNSUPPORTED, "gemma: arch.yarn RoPE scaling is not used by Gemma models");
    DecoderChoices ch;
    ch.family = "gemma";
    ch.norm_style = CMF_NORM_GEMMA;
    ch.act = CMF_ACT_GELU_TANH;
    // HF: hidden_size**0.5 as a tensor of the activation dtype (f32 here).
    ch.embed_scale = float(std::sqrt(double(c.hidden_size)));
    // HF: query_pre_attn_scalar**-0.5 (gemma2/3) or head_dim**-0.5, a
    // Python float applied to f32 scores.
    const double q = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(c.head_dim);
    ch.attn_scale = float(1.0 / std::sqrt(q));
    ch.attn_softcap = float(c.attn_logit_softcapping);
    ch.final_softcap = float(c.final_logit_softcapping);
    bool any_sliding = false;
    for (LayerType t : c.layer_types) any_sliding |= t == LayerType::SlidingAttention;
    const bool pattern = !any_sliding && c.sliding_window_pattern > 0;
    for (uint64_t i = 0; i < c.num_layers; ++i) {
        const bool local = any_sliding ? c.layer_types[i] == LayerType::SlidingAttention
                                       : pattern && (i + 1) % c.sliding_window_pattern != 0;
        cmf::archs::LayerChoice l;
        l.rope_theta = float(c.rope_theta);
        if (local) {
            if (c.sliding_window == 0)
                throw Error(CMF_ERR_PARSE, "gemma: layer " + std::to_string(i) +
                                               " is a sliding-window layer but arch.sliding_window is missing");
            if (c.sliding_window > UINT32_MAX) throw Error(CMF_ERR_BOUNDS, "gemma: arch.sliding_window is too large");
            l.window = uint32_t(c.sliding_window);
            if (c.rope_local_base_freq > 0) l.rope_theta = float(c.rope_local_base_freq);
        }
        ch.layers.push_back(l);
    }
    return ch;
}

const cmf_host_api *host_of(void *ctx) { return static_cast<cmf::archs::ArchPlugin *>(ctx)->host; }

cmf_error *vt_import_config(void *ctx, const char *json, size_t len, const cmf_byte_sink *out) {
    return cmf::archs::import_config_hook(host_of(ctx), json, len, out, cmf::archs::gemma::import_config);
}

cmf_error *vt_import_tensor(void *ctx, const char *arch_json, size_t arch_len, const char *hf_name, uint32_t ndim,
                            const uint64_t *shape, const cmf_byte_sink *out) {
    return cmf::archs::import_tensor_hook(host_of(ctx), arch_json, arch_len, hf_name, ndim, shape, out,
                                          cmf::archs::gemma::import_tensor);
}

}  // namespace

extern "C" CMF_PLUGIN_EXPORT cmf_error *cmf_plugin_init_v1(const cmf_host_api *host, uint32_t *abi_version,
                                                            cmf_registrar *reg, void **plugin_state) {
    if (*abi_version < 1) return host->error_create(CMF_ERR_PLUGIN, "gemma arch plugin needs plugin ABI >= 1");
    *abi_version = CMF_PLUGIN_ABI_VERSION;
    auto pl = std::make_unique<cmf::archs::ArchPlugin>();
    pl->host = host;
    pl->family = "gemma";
    pl->choose = gemma_choices;
    cmf_arch_vt &vt = pl->vt;
    vt = cmf_arch_vt{};
    vt.struct_size = sizeof(cmf_arch_vt);
    vt.abi_version = CMF_PLUGIN_ABI_VERSION;
    vt.name = "gemma";
    vt.version = CMF_ARCH_VERSION;
    vt.arch_names = cmf::archs::gemma::kModelTypes;
    vt.hf_model_types = cmf::archs::gemma::kModelTypes;
    vt.import_config = vt_import_config;
    vt.import_tensor = vt_import_tensor;
    cmf::archs::set_decoder_run_members(vt);
    if (cmf_error *e = host->register_arch(reg, &vt, pl.get())) return e;
    *plugin_state = pl.release();
    return nullptr;
}

extern "C" CMF_PLUGIN_EXPORT void cmf_plugin_fini_v1(void *plugin_state) {
    delete static_cast<cmf::archs::ArchPlugin *>(plugin_state);
}
