// cmfhost dequant: tensors dequantized to raw little-endian f32 or bf16
// files (the original's `dequant`), one tensor or every tensor of a prefix.
#include "commands/model_util.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace cmfhost {

namespace {

uint16_t to_bf16(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40);  // stays a (quiet) NaN
    return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);  // round to nearest even
}

// Streams tensor `index` to `path` (temp + rename) in row chunks, so a large
// tensor is never whole in memory.
void dump(cmf_model *m, size_t index, const cmf_tensor_info &t, const std::string &path, bool bf16) {
    const uint64_t rows = t.ndim >= 2 ? t.shape[0] : 1;
    uint64_t row_len = 1;
    for (uint32_t d = t.ndim >= 2 ? 1 : 0; d < t.ndim; ++d) row_len *= t.shape[d];
    const uint64_t step = std::max<uint64_t>(1, (uint64_t(4) << 20) / std::max<uint64_t>(row_len, 1));
    const std::string tmp = path + ".tmp";
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Failure("cannot create " + tmp);
    std::vector<float> buf;
    std::vector<uint16_t> half;
    for (uint64_t r = 0; r < rows; r += step) {
        const uint64_t n = std::min(step, rows - r) * row_len;
        buf.resize(n);
        check(cmf_tensor_dequantize(m, index, r, r + std::min(step, rows - r), buf.data(), n), t.name);
        if (bf16) {
            half.resize(n);
            for (uint64_t i = 0; i < n; ++i) half[i] = to_bf16(buf[i]);
            f.write(reinterpret_cast<const char *>(half.data()), std::streamsize(n * 2));
        } else {
            f.write(reinterpret_cast<const char *>(buf.data()), std::streamsize(n * 4));
        }
    }
    f.close();
    if (!f || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw Failure("cannot write " + path);
    }
}

}  // namespace

int cmd_dequant(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string path, name, out, dtype = "f32", all_dir;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file (any shard of a sharded model)")
        ("name", po::value(&name)->required(), "tensor name (with --all: a name prefix, \"\" for every tensor)")
        ("out", po::value(&out), "output file (with --all and no DIR: the output directory)")
        ("dtype", po::value(&dtype)->default_value("f32"), "f32 or bf16 (rounded to nearest even), little-endian, row-major")
        ("all", po::value(&all_dir)->implicit_value(""),
         "every tensor whose name starts with --name, one DIR/<name>.bin each (DIR defaults to --out)");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("dequant", "MODEL --name NAME --out F [--dtype f32|bf16] [--all [DIR]]", args, desc, pos, vm)) return 0;
    if (dtype != "f32" && dtype != "bf16") throw Failure("--dtype must be f32 or bf16, not '" + dtype + "'", 2);
    const bool all = vm.count("all") > 0;
    if (all && all_dir.empty()) all_dir = out;
    if ((all ? all_dir : out).empty()) throw Failure(all ? "--all needs a directory (--all DIR or --out DIR)" : "--out is required", 2);
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), path);
    if (all) std::filesystem::create_directories(all_dir);
    size_t written = 0;
    for (size_t k = 0; k < cmf_tensor_count(m.get()); ++k) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        check(cmf_tensor_at(m.get(), k, &t));
        const std::string tn = t.name;
        if (all ? tn.rfind(name, 0) != 0 : tn != name) continue;
        if (all && (tn.find('/') != std::string::npos || tn == "." || tn == ".."))
            throw Failure("tensor '" + tn + "' cannot be a file name under " + all_dir);
        const std::string file = all ? all_dir + "/" + tn + ".bin" : out;
        dump(m.get(), k, t, file, dtype == "bf16");
        if (all) std::fprintf(stderr, "%s\t%s\t%s\n", t.name, debug_dtype_name(t.dtype), debug_shape(t).c_str());
        else std::printf("%s %s %s -> %s\n", t.name, debug_dtype_name(t.dtype), debug_shape(t).c_str(), out.c_str());
        ++written;
    }
    if (!written) {
        throw Failure(std::string(cmf_error_code_name(CMF_ERR_MISSING_TENSOR)) + ": no tensor " + (all ? "starting with '" : "named '") + name +
                      "' in " + path);
    }
    if (all) std::printf("%zu tensors -> %s\n", written, all_dir.c_str());
    return 0;
}

}  // namespace cmfhost
