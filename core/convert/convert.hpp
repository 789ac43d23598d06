// The native converter: a Hugging Face checkpoint directory -> the tensors
// and header of a .cmf file, streamed into a TensorSink.
//
// Flow: config.json -> arch plugin (by HF model_type) -> `arch` block; every
// safetensors tensor -> the plugin's tensor plan (renames, fused splits,
// expert unpacking; docs/convert.md) -> output tensors in canonical order
// (experts role-contiguous, spec §2.2) -> each read from the mapping,
// converted to f32, quantized by the registered codec (in parallel, in
// batches bounded by a memory budget), handed to the sink in order.
// The chat bundle (tokenizer.json, tokenizer_config.json,
// chat_template.jinja, generation_config.json) gives the vocab section and
// header.tokenizer_config (spec §6.1).
#pragma once

#include "convert/dtype_policy.hpp"
#include "convert/source_tensor.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cmf {
class Runtime;
}

namespace cmf::convert {

// Where converted tensors go. The container writer implements it (W2
// semantics, docs/container.md: payloads in push order, header and directory
// written at the end); tests implement it in memory. Calls come from one
// thread, in this order: begin, (add | mark)*, finish — or abort after any
// of them when the conversion fails.
class TensorSink {
public:
    virtual ~TensorSink() = default;
    // header_json: the complete header object (format, version, arch,
    // quant_type, provenance, tokenizer_config) WITHOUT section_hashes, which
    // the writer computes and appends as the last key. source_tensor_count:
    // what W2 sizes its reserved gap from; planned_tensor_count: exactly how
    // many add() calls follow.
    virtual void begin(const std::string &header_json, uint64_t source_tensor_count, uint64_t planned_tensor_count) = 0;
    // One payload. `data` is valid only during the call; the writer
    // computes hash64 and places it (64/4096 alignment rule).
    virtual void add(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, const uint8_t *data,
                     uint64_t nbytes) = 0;
    // One payload in pieces, for tensors encoded a few rows at a time:
    // begin_tensor (nbytes: the whole payload), append in order until
    // nbytes have come, end_tensor -- in place of add(). The default
    // gathers the pieces and calls add(); the container sink streams them
    // to the file instead, so the payload is never whole in memory.
    virtual void begin_tensor(const std::string &name, int32_t dtype, const std::vector<uint64_t> &shape, uint64_t nbytes);
    virtual void append(const uint8_t *data, uint64_t n);
    virtual void end_tensor();
    // All outputs that read from this source file have been added (the W2
    // manifest's resume milestone). Informative; may be ignored.
    virtual void mark(const std::string &) {}
    // The vocab section bytes (tokenizer.json verbatim; empty = none). The
    // file becomes visible only here (write to a temp name, rename).
    virtual void finish(const std::string &vocab_bytes) = 0;
    // The conversion failed: remove anything partial. Must not throw.
    virtual void abort() noexcept {}

private:
    struct Piecewise {
        std::string name;
        int32_t dtype;
        std::vector<uint64_t> shape;
        std::vector<uint8_t> bytes;
    };
    std::optional<Piecewise> piecewise_;  // the default begin/append/end's gathered tensor
};

struct ConvertOptions {
    std::string model_dir;
    // --quant; "keep": each tensor gets the CMF dtype nearest to how its
    // source stores it (F32 -> f32, F16 -> f16, BF16 -> bf16, GGUF types
    // per gguf::nearest_quant), the usual policy applied on top.
    std::string quant = "q8";
    std::string quant_map;          // --quant-map "pattern=quant,..."
    std::string source_name;        // provenance.source_model ("" = model_dir)
    std::string tool = "cmfhost convert";
    // Dense FFN defrag at convert time (spec §11, convert/defrag.hpp's
    // plan_convert_defrag): the skill directory; "" = none.
    std::string defrag_dir;
    // Upper bound on f32 staging buffers of the work converted at once (0 =
    // 64 MiB). Large tensors go in row chunks of 16 MiB of f32 when their
    // codec encodes by rows; a tensor that must go whole is always allowed.
    uint64_t memory_budget = 0;
    // A tensor of more elements than this is encoded that many elements'
    // worth of rows at a time when its codec encodes by rows
    // (cmf_codec_vt.quantize_rows), so no large tensor is ever whole in f32:
    // on the Qwen3-0.6B shape the embedding alone would be 594 MiB
    // (0 = 4 Mi elements, 16 MiB of f32).
    uint64_t chunk_elements = 0;
    bool progress = false;          // draw a progress bar on stderr when it is a terminal
    // Called after each tensor handed to the sink (from the calling thread):
    // tensors done/total, source bytes done/total. Empty = none.
    std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> on_progress;
};

struct ConvertStats {
    uint64_t source_tensors = 0;
    uint64_t tensors = 0;
    uint64_t source_bytes = 0;      // bytes of the source tensors read
    uint64_t output_bytes = 0;      // payload bytes handed to the sink
    double seconds = 0;
};

// What the converter would do, without reading tensor data.
struct PlannedTensor {
    std::string name;
    int32_t dtype;
    std::string options;            // encoder options (cmf_quantize_params.options)
    std::vector<uint64_t> shape;
    std::string source;             // the HF tensor it comes from
};
struct ConvertPlan {
    std::string header_json;
    std::string vocab_bytes;
    std::vector<PlannedTensor> tensors;  // in output order
};

// A model to convert, whatever it was read from: the Hugging Face
// config.json it amounts to, the header's tokenizer_config block, the vocab
// section and its tensors under Hugging Face names and shapes. `keep` owns
// what the tensors point into.
struct SourceModel {
    std::string config_json;
    std::string config_label;           // where config_json came from, for messages
    std::string tokenizer_config_json;  // header.tokenizer_config (a JSON object)
    std::string vocab_bytes;            // tokenizer.json ("" = no vocab section)
    std::vector<const SourceTensor *> tensors;
    uint64_t source_tensor_count = 0;   // tensors in the source file(s) (0 = tensors.size())
    std::string provenance_source_key = "source_model";
    std::shared_ptr<void> keep;
};

// A Hugging Face checkpoint directory as a SourceModel (config.json, the
// safetensors files, the chat bundle: docs/convert.md).
SourceModel load_checkpoint(Runtime &rt, const std::string &model_dir);

// Read config and chat bundle, ask the arch plugin, plan every tensor.
// Throws cmf::Error naming the file/tensor on bad input.
ConvertPlan plan_conversion(Runtime &rt, const ConvertOptions &opts);

// The whole conversion of opts.model_dir into `sink`. On error calls
// sink.abort() and rethrows.
ConvertStats convert_checkpoint(Runtime &rt, const ConvertOptions &opts, TensorSink &sink);
// The same pipeline over any source (a GGUF file: convert/gguf_import.hpp).
ConvertStats convert_source(Runtime &rt, const SourceModel &src, const ConvertOptions &opts, TensorSink &sink);

struct SourceTensor;

// What plan_conversion makes of config.json text and source tensors once
// it has read them, without touching files: the header's `arch` block (by
// the arch plugin of config.json's model_type) and every output tensor
// (the plugin's plan, a dtype by `policy`, canonical order). `config_name`
// names config.json in messages. Throws cmf::Error like plan_conversion.
struct ImportPlan {
    std::string arch_json;
    std::vector<PlannedTensor> tensors;
};
ImportPlan plan_import(Runtime &rt, const std::string &config_json, const std::string &config_name,
                       const std::vector<const SourceTensor *> &tensors, const QuantPolicy &policy);

// Canonical output order (docs/convert.md): embed, final norm, lm_head,
// layers by index (experts role-contiguous: all gate_proj, then up_proj,
// then down_proj, experts in numeric order), MTP, the rest; numbers compare
// numerically.
bool canonical_less(const std::string &a, const std::string &b);

}  // namespace cmf::convert
