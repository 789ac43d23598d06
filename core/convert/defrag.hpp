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

#include <functional>
#include <string>

namespace cmf { class Runtime; }

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

}  // namespace cmf::convert
