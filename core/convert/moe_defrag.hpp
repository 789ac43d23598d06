// Expert defrag of a mixture-of-experts model (spec §11.1) and its
// switchable twin, a task mask with expert fields (spec §5). Both keep, per
// MoE layer of a routing statistics file (CMF_MOE_STATS, the output of
// `run --route-stats`), the experts that cover a share of the recorded
// selections (runtime/moe_stats.hpp: by count descending, ties to the lower
// index, the crossing expert included).
//
// moe_defrag drops the other experts from the file: kept experts are
// renumbered 0..k-1 in their old order (payloads copied byte for byte),
// the router's rows (and an expert_bias) are gathered in the same order,
// arch.moe.num_experts and top_k stay (nominal: the runtime enumerates
// experts by presence and clamps top_k), and provenance.moe_defrag records
// the cut with the routing counts renumbered, so a later moe_defrag without
// a stats file can cut tighter. Masks are kept, their expert rows
// renumbered.
//
// moe_mask writes a copy of the file with one more task mask whose expert
// rows are the kept sets (every FFN row, head and layer on), runnable with
// --task: the same routing as the defragged file, no weight removed.
#pragma once

#include <functional>
#include <string>

namespace cmf { class Runtime; }

namespace cmf::convert {

struct MoeDefragOptions {
    std::string input, output;
    std::string stats;    // the stats file; "" = provenance.moe_defrag.routing_counts (moe_defrag only)
    double cover = 0.95;  // (0, 1]
    std::string name;     // moe_mask: the new task's name
    std::function<void(const std::string &)> say;  // progress lines
};

// Both write opts.output (temp file + rename) and return a JSON report.
std::string moe_defrag(Runtime &rt, const MoeDefragOptions &opts);
std::string moe_mask(Runtime &rt, const MoeDefragOptions &opts);

}  // namespace cmf::convert
