// Expert routing statistics (the original's CMF_MOE_STATS file) and the
// expert sets that cover a share of them: what a runtime MoE mask, a
// `moe-mask` task and `moe-defrag` keep (spec §11.1, docs/tasks-and-skills.md).
//
// The file is a JSON object {"<layer>": [count of expert 0, count of expert 1, ...], ...}:
// per MoE layer, how many times top-k routing selected each expert over a run.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cmf::runtime {

struct MoeStats {
    std::map<uint64_t, std::vector<uint64_t>> counts;  // layer -> count per expert
    std::string text;                                  // the file's bytes, as read
};

// Parses the stats text; CMF_ERR_PARSE names what is wrong (not an object, a
// key that is not a layer number, a value that is not an array of counts).
MoeStats parse_moe_stats(const std::string &text, const std::string &what);
MoeStats read_moe_stats(const std::string &path);

// The experts of one layer kept at `cover` in (0, 1]: by count descending
// (ties: lower index first), taken until their running sum reaches
// cover * total, the expert that crosses included; ascending. Empty when
// the layer's total is 0 (nothing was routed: the caller keeps the layer as it is).
std::vector<uint32_t> covering_experts(const std::vector<uint64_t> &counts, double cover);

}  // namespace cmf::runtime
