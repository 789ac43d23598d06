// cmfhost compact: rewrite a model as one W1 file without dead bytes.
#include "commands/model_util.hpp"

namespace cmfhost {

int cmd_compact(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string in, out;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&in)->required(), "input CMF file (shards are merged)")
        ("output,o", po::value(&out)->required(), "output file (written to a temp file, then renamed)");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("compact", "IN -o OUT", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    check(cmf_compact(rt.get(), in.c_str(), out.c_str()), in);
    std::printf("wrote %s\n", out.c_str());
    return 0;
}

}  // namespace cmfhost
