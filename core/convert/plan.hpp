// The converter's plan of output tensors and the streaming executor that
// writes it, shared by `convert` (one checkpoint, the arch plugin's tensor
// plans, convert.cpp) and `imagine-pack` (the components of a diffusers
// pipeline, pipeline_pack.cpp): whatever builds the plan, tensors are read
// from the mappings, encoded in parallel batches under a memory budget and
// handed to the sink in order, with progress.
#pragma once

#include "convert/convert.hpp"
#include "convert/source_tensor.hpp"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cmf::convert {

// An output tensor: which source, which part of it, which dtype; or, with
// src NULL, bytes stored as they are (a config.json as a u8 tensor).
struct OutTensor {
    PlannedTensor p;
    const SourceTensor *src = nullptr;
    std::optional<uint64_t> index;
    bool transpose = false;
    std::vector<std::pair<uint64_t, uint64_t>> rows;
    uint64_t elements = 0;                  // source elements read (0 for stored bytes)
    std::string bytes;                      // the payload when src is NULL
    // Convert-time defrag: the full-width f32 values (an overlay's when
    // `replace` is set, else the source's) cut to `keep` rows, or columns,
    // before encoding at p.shape. Such a tensor is encoded whole.
    struct Cut {
        std::vector<uint32_t> keep;
        bool columns = false;
        std::vector<uint64_t> full_shape;
        const std::vector<float> *replace = nullptr;
    };
    std::shared_ptr<const Cut> cut;
    uint64_t input_bytes() const { return src ? source_bytes(*src, elements) : bytes.size(); }
};

struct Planned {
    ConvertPlan plan;                                 // header, vocab, the tensors' names/dtypes/shapes
    std::vector<std::shared_ptr<void>> keep;          // what the sources point into (mappings)
    uint64_t source_tensors = 0;                      // tensors in the sources: what the writer sizes its gap from
    std::vector<OutTensor> outs;                      // in output order
};

// Writes a plan into `sink` (opts: memory budget, chunking, progress). On
// error calls sink.abort() and rethrows.
ConvertStats write_planned(Runtime &rt, Planned &pl, const ConvertOptions &opts, TensorSink &sink);

// A file's bytes, or nullopt when it does not exist (CMF_ERR_IO when it
// cannot be read).
std::optional<std::string> read_file_if_exists(const std::filesystem::path &p);
// The vocab section for a tokenizer directory: its tokenizer.json with the
// post-processor tokenizer_config.json's bos/eos policy implies (as HF's
// GemmaTokenizerFast / LlamaTokenizerFast rebuild it), else one built from
// its tokenizer.model; nullopt when it has neither.
std::optional<std::string> tokenizer_json_of(Runtime &rt, const std::filesystem::path &dir);

}  // namespace cmf::convert
