// The decoder choices of the Gemma family, shared by the gemma arch plugin
// and by anything that runs a Gemma text stack (a text encoder).
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
#pragma once

#include "../common/decoder.hpp"

namespace cmf::archs::gemma {

// Throws cmf::sdk::Error for what the family does not run.
DecoderChoices choices(const ArchConfig &cfg);

}  // namespace cmf::archs::gemma
