// The decoder choices of the qwen family (every Qwen model type): norms
// x^*w (or x^*(1+w) when the file says norm_style "gemma", as the hybrids
// do), SwiGLU (or the file's hidden_act), attention scale 1/sqrt(head_dim),
// one RoPE base (partial rotary per the file), no sliding windows. The layer
// kinds (MoE, gated delta net, output-gated attention) are read from the
// tensors and arch.layer_types by the decoder.
#pragma once

#include "../common/decoder.hpp"

namespace cmf::archs::qwen {

// Throws cmf::sdk::Error for what the family does not run.
DecoderChoices choices(const ArchConfig &cfg);

}  // namespace cmf::archs::qwen
