// cmfhost masks: the task masks, their per-layer activity and the sparse index.
#include "commands/model_util.hpp"

namespace cmfhost {

namespace {
uint64_t popcount(const uint8_t *p, uint64_t n) {
    uint64_t c = 0;
    for (uint64_t i = 0; i < n; ++i) c += uint64_t(__builtin_popcount(p[i]));
    return c;
}
}  // namespace

int cmd_masks(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string path;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("masks", "MODEL", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), path);
    size_t n = cmf_mask_count(m.get());
    if (n == 0) {
        std::printf("%s: no masks\n", path.c_str());
        return 0;
    }
    std::printf("default task: %s\n", cmf_mask_default_task(m.get()));
    for (size_t k = 0; k < n; ++k) {
        cmf_mask_info mi;
        cmf_mask_info_init(&mi);
        check(cmf_mask_at(m.get(), k, &mi));
        std::printf("mask %u '%s' priority %s sparsity %g quality %s%s%s\n", mi.task_id, mi.name, mi.priority, double(mi.sparsity),
                    mi.quality_json ? mi.quality_json : "not measured", mi.parent ? " parent " : "", mi.parent ? mi.parent : "");
        if (mi.description) std::printf("  %s\n", mi.description);
        const uint8_t *heads = mi.blob + mi.ffn_rows * mi.ffn_row_bytes;
        const uint8_t *gates = heads + mi.layers * mi.head_row_bytes;
        const uint8_t *experts = gates + mi.gate_bytes;
        for (uint64_t l = 0; l < mi.ffn_rows; ++l) {
            uint64_t phys = l % (mi.layers ? mi.layers : 1);
            std::printf("  %s %3llu: ffn %6llu active  heads %3llu  %s", mi.ffn_rows > mi.layers ? "visit" : "layer",
                        (unsigned long long)l, (unsigned long long)popcount(mi.blob + l * mi.ffn_row_bytes, mi.ffn_row_bytes),
                        (unsigned long long)popcount(heads + phys * mi.head_row_bytes, mi.head_row_bytes),
                        ((gates[phys / 8] >> (phys % 8)) & 1) ? "alive" : "gated off");
            if (mi.has_expert_fields)
                std::printf("  experts %llu routable",
                            (unsigned long long)popcount(experts + phys * mi.expert_row_bytes, mi.expert_row_bytes));
            std::printf("\n");
        }
    }
    size_t ne = cmf_index_entry_count(m.get());
    std::printf("sparse index: %zu entries\n", ne);
    for (size_t k = 0; k < ne; ++k) {
        cmf_index_entry e;
        cmf_index_entry_init(&e);
        check(cmf_index_entry_at(m.get(), k, &e));
        std::printf("  task %u layer %u: %u FFN groups, %u heads\n", e.task_id, e.layer, e.n_groups, e.n_heads);
    }
    return 0;
}

}  // namespace cmfhost
