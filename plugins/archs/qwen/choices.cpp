#include "choices.hpp"

#include <cmf/plugin.hpp>

#include <cmath>

namespace cmf::archs::qwen {

using cmf::sdk::Error;

DecoderChoices choices(const ArchConfig &c) {
    DecoderChoices ch;
    ch.family = "qwen";
    ch.norm_style = c.gemma_norm ? CMF_NORM_GEMMA : CMF_NORM_QWEN;
    if (c.hidden_act != "silu" && c.hidden_act != "gelu_tanh")
        throw Error(CMF_ERR_UNSUPPORTED, "qwen: arch.hidden_act \"" + c.hidden_act + "\" is not an activation the qwen "
                                         "arch runs (silu, gelu_tanh)");
    ch.act = c.hidden_act == "gelu_tanh" ? CMF_ACT_GELU_TANH : CMF_ACT_SILU;
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

}  // namespace cmf::archs::qwen
