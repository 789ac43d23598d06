// imagine-pack: a diffusers text-to-image pipeline directory -> one pipeline
// container (spec 12), streamed like `convert` (plan.hpp's executor: bounded
// memory, progress). Today: Lumina-Image 2.0 (model_index.json
// "Lumina2Pipeline"), laid out as the original's packer does:
//   te.*   the Gemma-2 text encoder, HF names with "model." left out, no lm_head
//   dit.*  the Next-DiT (transformer/), diffusers names
//   vae.*  the VAE's decoder half (vae/ decoder.*; post_quant_conv.* too
//          when the config uses one, which the FLUX VAE does not)
//   {te,dit,vae,scheduler}.config_json  each component's config.json
//          verbatim as a 1-D u8 tensor (scheduler/: an addition of ours,
//          read when present, so the file states its own shift)
//   vocab section: tokenizer/'s tokenizer.json (bos/eos policy as convert)
//   header: arch from the text encoder's config (arch_name
//          "lumina2-image", every layer FullAttention, linear_* 0),
//          provenance {components, packed_from, pipeline, quant, tool}.
// Dtypes per --quant (q8 | q4t, the original's two levels; f32 keeps
// everything exact): te embedding q8_row, te *_proj and the dit's
// caption_embedder.1 and attention/FFN matrices of >= 1024 columns at the
// level (q4t falls back to q8_row when columns % 32 != 0), dit adaLN
// (norm1.linear) q8_row, VAE convolution kernels (4-D) f16, the rest f32.
#pragma once

#include "convert/convert.hpp"

namespace cmf::convert {

// opts.model_dir: the pipeline directory; opts.quant: q8|q4t|f32 (or their
// long names q8_row, q4_tiled); opts.quant_map must be empty.
ConvertPlan plan_pipeline_pack(Runtime &rt, const ConvertOptions &opts);
ConvertStats pack_pipeline(Runtime &rt, const ConvertOptions &opts, TensorSink &sink);

}  // namespace cmf::convert
