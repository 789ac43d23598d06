// Dense FFN defrag (spec §11): a copy of a model without the FFN neurons a
// keep set leaves out. Per layer the kept neurons' gate/up rows and down
// columns are written at the smaller width; arch.intermediate_size becomes
// the widest layer's (nominal: the runtime takes each layer's width from
// its tensors) and provenance.defrag records what was kept. The keep set is
// a task mask's FFN rows (the defragged file then computes what running the
// task computes, reading nothing of the left-out neurons), a boolean
// [layers, intermediate] ffn_keep.npy, or, with neither, the neurons whose
// down_proj input column is not all zero.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace cmf { class Runtime; }
namespace cmf::container { class Model; struct TensorRec; }

namespace cmf::convert {

struct DefragOptions {
    std::string input, output;
    std::string task;       // keep what this task mask runs; or
    std::string keep_npy;   // ffn_keep.npy; neither: the nonzero down_proj columns
    std::string source;     // provenance.defrag.source_skill ("" = the task or the npy's folder)
    std::function<void(const std::string &)> say;  // progress lines
};

// Writes opts.output (temp file + rename); returns a JSON report.
std::string defrag_ffn(Runtime &rt, const DefragOptions &opts);

// A NumPy .npy array (format 1-3, C order, little-endian): bool, uint8,
// float32 or float64, as f32 values. CMF_ERR_PARSE names what is wrong;
// with `want` given, a shape other than it is reported as such first.
struct Npy {
    std::vector<uint64_t> shape;
    std::vector<float> values;
    bool boolean = false;
};
Npy read_npy(const std::string &path, const std::vector<uint64_t> &want = {});

// Per layer, the kept FFN neurons, ascending.
using KeepSets = std::vector<std::vector<uint32_t>>;

// provenance.defrag for a keep set of a model `inter` neurons wide.
boost::json::object defrag_provenance(const KeepSets &keep, uint64_t inter, const std::string &source);

// convert --defrag DIR, the original converter's skill directory: baked FFN
// overlays DIR/tensors/NAME.npy (float; NAME a dense FFN weight, at its full
// shape) replace the checkpoint's values, and the keep set is
// DIR/ffn_keep.npy ([layers, intermediate], nonzero = kept) or, without it,
// the neurons whose down_proj column (overlay, else checkpoint) is not all
// zero. `values(name, shape)` gives a checkpoint tensor as f32 and its shape.
struct ConvertDefrag {
    KeepSets keep;
    std::map<std::string, Npy> overlays;
};
ConvertDefrag plan_convert_defrag(
    const std::string &dir, uint64_t layers, uint64_t inter,
    const std::function<std::vector<float>(const std::string &name, std::vector<uint64_t> &shape)> &values,
    const std::function<void(const std::string &)> &say);
// The kept neurons of a full-width FFN weight's f32 values: gate/up rows,
// down_proj columns.
std::vector<float> cut_ffn(const std::vector<float> &full, const std::vector<uint64_t> &full_shape,
                           const std::vector<uint32_t> &keep, bool columns);

// A tensor cut down to some of its rows or columns.
struct SlicedTensor {
    int32_t dtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> bytes;
    bool exact;  // the kept values are the source's, byte for byte
};

// Rows `keep` (ascending) of a 2-D tensor, or entries of a 1-D one. Byte
// copies where the payload is per-row sections (floats; q8_row's codes and
// scales; any dtype whose quantize_rows says so), else dequantized and
// re-encoded (exact = false).
SlicedTensor take_rows(Runtime &rt, const container::Model &m, const container::TensorRec &t,
                       const std::vector<uint32_t> &keep);

}  // namespace cmf::convert
