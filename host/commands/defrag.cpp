// cmfhost defrag: a copy of a model without the FFN neurons a keep set
// leaves out (spec §11): a task mask's, an ffn_keep.npy's, or the neurons
// whose down_proj column is all zero.
#include "commands/model_util.hpp"

#include <boost/json.hpp>

#include <cstdio>

namespace cmfhost {

int cmd_defrag(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string in, out, task, keep, source;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&in)->required(), "input CMF file")
        ("output,o", po::value(&out)->required(), "output file (written to a temp file, then renamed)")
        ("task", po::value(&task), "keep the FFN neurons this task mask runs (every layer and head must stay on)")
        ("keep", po::value(&keep), "ffn_keep.npy: bool/uint8 [layers, intermediate_size], nonzero = kept")
        ("source", po::value(&source), "provenance.defrag.source_skill (default: the task, or the .npy's folder)");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("defrag", "MODEL -o OUT [--task NAME | --keep ffn_keep.npy]", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    cmf_defrag_options o;
    cmf_defrag_options_init(&o);
    o.input = in.c_str();
    o.output = out.c_str();
    o.task = task.empty() ? nullptr : task.c_str();
    o.keep_file = keep.empty() ? nullptr : keep.c_str();
    o.source = source.empty() ? nullptr : source.c_str();
    char *report = nullptr;
    check(cmf_defrag(rt.get(), &o, &report), in);
    const boost::json::object r = boost::json::parse(report).as_object();
    cmf_string_free(report);
    std::printf("wrote %s: FFN %llu -> max %llu neurons per layer, %.1f%% pruned, kept per layer %s\n", out.c_str(),
                static_cast<unsigned long long>(r.at("pre_intermediate").to_number<uint64_t>()),
                static_cast<unsigned long long>(r.at("post_intermediate_max").to_number<uint64_t>()),
                100.0 * r.at("pruned_ratio").to_number<double>(), boost::json::serialize(r.at("kept_per_layer")).c_str());
    if (const uint64_t n = r.at("reencoded").to_number<uint64_t>())
        std::printf("%llu tensor(s) re-encoded at the new width (their dtype cannot keep single columns)\n",
                    static_cast<unsigned long long>(n));
    return 0;
}

}  // namespace cmfhost
