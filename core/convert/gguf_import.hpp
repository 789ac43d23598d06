// A GGUF file (llama.cpp) seen as the Hugging Face checkpoint it was made
// from, so the converter's pipeline (arch plugins, dtype policy, container
// writer) imports it unchanged:
//  - the metadata of general.architecture (qwen2, qwen3, qwen2moe, qwen3moe,
//    gemma, gemma2, gemma3) becomes the HF config.json it amounts to, which
//    the arch plugin turns into the header's `arch` block;
//  - llama.cpp's tensor names go back to HF's (token_embd -> embed_tokens,
//    blk.N.attn_q -> model.layers.N.self_attn.q_proj, ...), shapes are the
//    GGUF dims reversed (ggml lists the fastest dimension first), stacked
//    expert tensors (ffn_*_exps) are split back into one tensor per expert,
//    and Gemma's norm weights, which llama.cpp stores as w + 1, read as w;
//    llama.cpp permutes q/k rows only for llama-family archs, none of these;
//  - tokenizer.ggml.* becomes tokenizer.json (convert/gguf_tokenizer.hpp),
//    tokenizer.chat_template and the special ids header.tokenizer_config.
// docs/convert.md "GGUF" has the tables.
#pragma once

#include "convert/convert.hpp"

#include <string>

namespace cmf::convert {

// Opens, validates and maps `path`; throws cmf::Error naming the file and
// the key or tensor at fault (an unsupported architecture, a tensor of an
// unsupported type or with no HF counterpart, missing metadata, ...).
SourceModel load_gguf(Runtime &rt, const std::string &path);

namespace gguf {
class File;
// The HF config.json a GGUF's metadata amounts to.
std::string hf_config(const File &f);
// The HF name of a GGUF tensor of `arch` ("" = dropped: rope_freqs);
// throws for a name with no HF counterpart. Stacked expert tensors map to
// "model.layers.N.mlp.experts.{}.gate_proj.weight" (split per expert).
std::string hf_name(const std::string &arch, const std::string &gguf_name);
}  // namespace gguf

}  // namespace cmf::convert
