// cmfhost moe-defrag / moe-mask: a mixture-of-experts model without the
// experts its recorded routing does not need (spec §11.1), or the same
// restriction as a task mask that --task switches on (spec §5).
#include "commands/model_util.hpp"

#include <boost/json.hpp>

#include <cstdio>

namespace cmfhost {

namespace {

struct MoeArgs {
    CommonOptions common;
    std::string in, out, stats, name;
    double cover = 0.95;
};

void add_moe_options(po::options_description &desc, MoeArgs &a, const char *stats_help) {
    add_common_options(desc, a.common);
    desc.add_options()("model", po::value(&a.in)->required(), "input CMF file (a mixture-of-experts model)")
        ("output,o", po::value(&a.out)->required(), "output file (written to a temp file, then renamed)")
        ("stats", po::value(&a.stats), stats_help)
        ("cover", po::value(&a.cover)->default_value(0.95),
         "per MoE layer, keep the experts covering this share of its recorded selections, (0, 1]: by count descending, "
         "ties to the lower expert index, the expert that reaches the share included");
}

boost::json::object report_of(char *report) {
    boost::json::object r = boost::json::parse(report).as_object();
    cmf_string_free(report);
    return r;
}

}  // namespace

int cmd_moe_defrag(const std::vector<std::string> &args) {
    MoeArgs a;
    po::options_description desc("options");
    add_moe_options(desc, a,
                    "routing statistics ({\"<layer>\": [count per expert], ...}: run --route-stats FILE); "
                    "default: the file's provenance.moe_defrag.routing_counts (cut a defragged file tighter)");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("moe-defrag", "MODEL [--stats STATS.json] [--cover 0.95] -o OUT", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(a.common);
    cmf_moe_defrag_options o;
    cmf_moe_defrag_options_init(&o);
    o.input = a.in.c_str();
    o.output = a.out.c_str();
    o.stats = a.stats.empty() ? nullptr : a.stats.c_str();
    o.cover = a.cover;
    if (a.cover == 0) throw Failure("--cover must be in (0, 1], not 0", 2);
    char *report = nullptr;
    check(cmf_moe_defrag(rt.get(), &o, &report), a.in);
    const boost::json::object r = report_of(report);
    std::printf("wrote %s: %llu experts kept, %llu dropped in %llu MoE layers (cover %.0f%%), kept per layer %s\n", a.out.c_str(),
                static_cast<unsigned long long>(r.at("experts_kept").to_number<uint64_t>()),
                static_cast<unsigned long long>(r.at("experts_dropped").to_number<uint64_t>()),
                static_cast<unsigned long long>(r.at("layers").to_number<uint64_t>()), 100.0 * a.cover,
                boost::json::serialize(r.at("kept_per_layer")).c_str());
    for (const auto &m : r.at("masks_dropped").as_array())
        std::printf("task '%s' left out: it routes to none of the kept experts of some layer\n", m.as_string().c_str());
    return 0;
}

int cmd_moe_mask(const std::vector<std::string> &args) {
    MoeArgs a;
    po::options_description desc("options");
    add_moe_options(desc, a, "routing statistics ({\"<layer>\": [count per expert], ...}: run --route-stats FILE); required");
    desc.add_options()("name", po::value(&a.name)->required(), "the new task mask's name (run it with --task NAME)");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("moe-mask", "MODEL --stats STATS.json [--cover 0.95] --name NAME -o OUT", args, desc, pos, vm)) return 0;
    if (a.stats.empty()) throw Failure("moe-mask: --stats is required (record the routing with run --route-stats FILE)", 2);
    if (a.cover == 0) throw Failure("--cover must be in (0, 1], not 0", 2);
    RuntimePtr rt = make_runtime(a.common);
    cmf_moe_defrag_options o;
    cmf_moe_defrag_options_init(&o);
    o.input = a.in.c_str();
    o.output = a.out.c_str();
    o.stats = a.stats.c_str();
    o.cover = a.cover;
    o.name = a.name.c_str();
    char *report = nullptr;
    check(cmf_moe_mask(rt.get(), &o, &report), a.in);
    const boost::json::object r = report_of(report);
    std::printf("wrote %s: task '%s' (id %llu) routes among %s experts per MoE layer (%llu layers, expert sparsity %.0f%%); "
                "run it with --task %s\n",
                a.out.c_str(), a.name.c_str(), static_cast<unsigned long long>(r.at("task_id").to_number<uint64_t>()),
                boost::json::serialize(r.at("kept_per_layer")).c_str(),
                static_cast<unsigned long long>(r.at("layers").to_number<uint64_t>()),
                100.0 * r.at("sparsity").to_number<double>(), a.name.c_str());
    return 0;
}

}  // namespace cmfhost
