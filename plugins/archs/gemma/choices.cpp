#include "choices.hpp"

#include <cmf/plugin.hpp>

#include <cmath>

namespace cmf::archs::gemma {

using cmf::sdk::Error;

DecoderChoices choices(const ArchConfig &c) {
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
        LayerChoice l;
        l.rope_theta = float(c.rope_theta);
        if (local) {
            if (c.sliding_window == 0)
                throw Error(CMF_ERR_PARSE, "gemma: layer " + std::to_string(i) +
                                               " is a sliding-window layer but arch.sliding_window is missing");
            if (c.sliding_window > UINT32_MAX) throw Error(CMF_ERR_BOUNDS, "gemma: arch.sliding_window is too large");
            l.window = uint32_t(c.sliding_window);
            if (c.rope_local_base_freq > 0) {
                // Local layers on their own base run unscaled RoPE, as HF's
                // rotary_emb_local (Gemma 3's linear x8 is for global layers).
                l.rope_theta = float(c.rope_local_base_freq);
                l.scaled_rope = false;
            }
        }
        ch.layers.push_back(l);
    }
    return ch;
}

}  // namespace cmf::archs::gemma
