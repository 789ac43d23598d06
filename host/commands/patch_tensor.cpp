// cmfhost patch-tensor: new values for tensors of a .cmf (the original's
// `patch-tensor`), in place when every payload fits its slot, else into a
// new file with --output (cmf_patch_tensors).
#include "commands/convert_util.hpp"

#include <fstream>
#include <iterator>

namespace cmfhost {

int cmd_patch_tensor(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string path, dtype, output;
    std::vector<std::string> sets;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file (patched in place unless --output)")
        ("set", po::value(&sets)->composing(),
         "NAME=FILE: the tensor's new values, raw little-endian f32, row-major, one per element; repeatable")
        ("dtype", po::value(&dtype), "encode the patched tensors as this dtype (a convert --quant name) instead of their own")
        ("output,o", po::value(&output),
         "write a new file (every other tensor, the masks, vocab and header copied) instead of patching in place; "
         "needed when a new payload is larger than its slot");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("patch-tensor", "MODEL --set NAME=values.f32 ... [--dtype DTYPE] [--output OUT.cmf]", args, desc, pos, vm)) return 0;
    if (sets.empty()) throw Failure("nothing to patch: give --set NAME=values.f32 (repeatable)", 2);
    std::vector<std::string> names;
    std::vector<std::vector<float>> values;
    for (const auto &s : sets) {
        const size_t eq = s.rfind('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) throw Failure("--set wants NAME=FILE, got '" + s + "'", 2);
        const std::string file = s.substr(eq + 1);
        std::ifstream f(file, std::ios::binary);
        if (!f) throw Failure("cannot read " + file);
        std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        if (raw.size() % 4) throw Failure(file + ": " + std::to_string(raw.size()) + " bytes is not a whole number of f32 values");
        std::vector<float> v(raw.size() / 4);
        std::memcpy(v.data(), raw.data(), raw.size());
        names.push_back(s.substr(0, eq));
        values.push_back(std::move(v));
    }
    std::vector<cmf_patch_tensor> patches(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
        cmf_patch_tensor_init(&patches[i]);
        patches[i].name = names[i].c_str();
        patches[i].values = values[i].data();
        patches[i].count = values[i].size();
    }
    RuntimePtr rt = make_runtime(common);
    cmf_patch_options o;
    cmf_patch_options_init(&o);
    o.model = path.c_str();
    o.output = output.empty() ? nullptr : output.c_str();
    o.dtype = dtype.empty() ? nullptr : dtype.c_str();
    check_convert(cmf_patch_tensors(rt.get(), &o, patches.data(), patches.size()), "patch-tensor " + path);
    if (output.empty()) std::printf("patched %zu tensor(s) in place in %s\n", patches.size(), path.c_str());
    else std::printf("wrote %s with %zu patched tensor(s)\n", output.c_str(), patches.size());
    return 0;
}

}  // namespace cmfhost
