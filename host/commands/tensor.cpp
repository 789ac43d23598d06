// cmfhost tensor: one tensor dequantized to raw little-endian f32.
#include "commands/model_util.hpp"

#include <fstream>
#include <vector>

namespace cmfhost {

int cmd_tensor(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string path, name, out;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file")
        ("name", po::value(&name)->required(), "tensor name")
        ("out", po::value(&out)->required(), "output file: row-major f32 values");
    po::positional_options_description pos;
    pos.add("model", 1).add("name", 1);
    po::variables_map vm;
    if (!parse_args("tensor", "MODEL NAME --out f.bin", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), path);
    size_t index = SIZE_MAX;
    cmf_tensor_info t;
    cmf_tensor_info_init(&t);
    for (size_t k = 0; k < cmf_tensor_count(m.get()) && index == SIZE_MAX; ++k) {
        check(cmf_tensor_at(m.get(), k, &t));
        if (name == t.name) index = k;
    }
    if (index == SIZE_MAX) throw Failure("no tensor named '" + name + "' in " + path);
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
    const uint64_t rows = t.ndim >= 2 ? t.shape[0] : 1;
    std::vector<float> buf(n);
    check(cmf_tensor_dequantize(m.get(), index, 0, rows, buf.data(), n), name);
    std::ofstream f(out, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char *>(buf.data()), std::streamsize(n * sizeof(float)));
    if (!f) throw Failure("cannot write " + out);
    std::printf("%s %s %s -> %s (%llu f32 values)\n", name.c_str(), dtype_name(t.dtype), shape_str(t).c_str(), out.c_str(),
                (unsigned long long)n);
    return 0;
}

}  // namespace cmfhost
