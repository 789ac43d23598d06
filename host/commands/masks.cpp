// cmfhost masks: the task masks as the original's `masks` lists them (name,
// sparsity, measured quality, alive layers, hot pack); --detail adds each
// layer's active neurons, heads and experts and the sparse index.
#include "commands/model_util.hpp"

#include <boost/json.hpp>

#include <string>

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
    bool detail = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file")
        ("detail", po::bool_switch(&detail), "per layer: active FFN neurons, heads, gate, routable experts; and the sparse index");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("masks", "MODEL [--detail]", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), path);
    size_t n = cmf_mask_count(m.get());
    if (n == 0) {
        std::printf("No masks in %s\n", path.c_str());
        return 0;
    }
    std::printf("Masks in %s:\n", path.c_str());
    std::printf("  %-15s %8s %12s %6s %8s\n", "Name", "Sparsity", "Quality", "Layers", "Hot");
    std::printf("  %s\n", std::string(56, '-').c_str());
    for (size_t k = 0; k < n; ++k) {
        cmf_mask_info mi;
        cmf_mask_info_init(&mi);
        check(cmf_mask_at(m.get(), k, &mi));
        std::string quality = "unmeasured";
        if (mi.quality_json) {
            boost::json::error_code ec;
            boost::json::value q = boost::json::parse(mi.quality_json, ec);
            const boost::json::object *o = ec ? nullptr : q.if_object();
            const boost::json::value *v = o ? o->if_contains("value") : nullptr;
            const boost::json::value *metric = o ? o->if_contains("metric") : nullptr;
            char buf[128];
            std::snprintf(buf, sizeof buf, "%.3f (%s)", v && v->is_number() ? v->to_number<double>() : 0.0,
                          metric && metric->is_string() ? metric->as_string().c_str() : "?");
            quality = buf;
        }
        const uint8_t *gates = mi.blob + mi.ffn_rows * mi.ffn_row_bytes + mi.layers * mi.head_row_bytes;
        uint64_t alive = 0;
        for (uint64_t l = 0; l < mi.layers; ++l) alive += (gates[l / 8] >> (l % 8)) & 1;
        std::printf("  %-15s %7.0f%% %12s %6llu %8s\n", mi.name, double(mi.sparsity) * 100.0, quality.c_str(),
                    static_cast<unsigned long long>(alive), mi.has_hot_pack ? "hot" : "\u2014");
    }
    if (!detail) return 0;
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
