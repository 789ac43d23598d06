// The decoder choices of the qwen family (qwen2, qwen3 dense): norms x^*w
// (or x^*(1+w) when the file says norm_style "gemma"), SwiGLU (or the
// file's hidden_act), attention scale 1/sqrt(head_dim), one RoPE base,
// full causal attention in every layer.
#pragma once

#include "../common/decoder.hpp"

namespace cmf::archs::qwen {

// Throws cmf::sdk::Error for what the family does not run.
DecoderChoices choices(const ArchConfig &cfg);

}  // namespace cmf::archs::qwen
