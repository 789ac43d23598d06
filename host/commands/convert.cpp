// cmfhost convert / requant: a Hugging Face checkpoint -> .cmf, and
// re-encoding an existing .cmf to another dtype (cmf_convert, cmf_requant).
#include "cli.hpp"

#include <chrono>
#include <cstdio>
#include <unistd.h>

namespace cmfhost {

namespace {

// Exit codes: 0 ok, 1 the conversion failed, 2 a bad argument (unknown
// --quant, bad --quant-map, missing paths).
void check_convert(cmf_error *e, const std::string &context) {
    if (e == nullptr) return;
    int code = cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT ? 2 : 1;
    std::string msg = std::string(cmf_error_code_name(cmf_error_code(e))) + ": " + cmf_error_message(e);
    cmf_error_free(e);
    throw Failure(context + ": " + msg, code);
}

// A progress bar on stderr (terminal only): tensors, MiB of input, ETA.
struct Bar {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    bool drawn = false;
    static void draw(void *user, uint64_t t, uint64_t tt, uint64_t b, uint64_t bt) {
        auto *bar = static_cast<Bar *>(user);
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - bar->t0).count();
        double frac = bt ? double(b) / double(bt) : 1.0;
        int width = 30, fill = int(frac * width);
        double eta = frac > 0 ? el * (1 - frac) / frac : 0;
        std::fprintf(stderr, "\r[%.*s%*s] %llu/%llu tensors  %.1f/%.1f MiB  ETA %d:%02d ", fill,
                     "##############################", width - fill, "", (unsigned long long)t, (unsigned long long)tt,
                     double(b) / 1048576.0, double(bt) / 1048576.0, int(eta) / 60, int(eta) % 60);
        std::fflush(stderr);
        bar->drawn = true;
    }
    // Ends the bar's line (before the result is printed, or on unwinding).
    void end() {
        if (drawn) std::fprintf(stderr, "\n");
        drawn = false;
    }
    ~Bar() { end(); }
};

uint64_t gb_to_bytes(double gb) {
    if (gb < 0) throw Failure("--shard-max-gb must be >= 0", 2);
    return uint64_t(gb * 1024.0 * 1024.0 * 1024.0);
}

}  // namespace

int cmd_convert(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string model_dir, output, quant = "q8";
    std::vector<std::string> quant_map;
    double shard_gb = 0;
    bool no_progress = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&model_dir)->required(),
                       "Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)")
        ("output,o", po::value(&output)->required(), "output .cmf (written to a temp file, then renamed)")
        ("quant,q", po::value(&quant)->default_value("q8"),
         "dtype for large 2-D weights: f16|bf16|q8|q8_2f|q4|q4t|q4tp|q2tp|vbit|q1|q1p|q1s|q1t "
         "(1-D, small and keep-f16 tensors stay f16; docs/convert.md)")
        ("quant-map", po::value(&quant_map)->composing(),
         "override PATTERN=DTYPE (glob on the name or a dot-suffix of it); repeatable, first match wins")
        ("shard-max-gb", po::value(&shard_gb)->default_value(0), "split into shards of at most N GiB of payload (0 = one file)")
        ("no-progress", po::bool_switch(&no_progress), "no progress bar even on a terminal");
    po::positional_options_description pos;
    po::variables_map vm;
    if (!parse_args("convert", "--model DIR --output OUT.cmf [--quant DTYPE] [--quant-map PATTERN=DTYPE]...", args, desc,
                    pos, vm))
        return 0;
    std::string map;
    for (auto &m : quant_map) map += (map.empty() ? "" : ",") + m;
    RuntimePtr rt = make_runtime(common);
    cmf_convert_options o;
    cmf_convert_options_init(&o);
    o.model_dir = model_dir.c_str();
    o.output = output.c_str();
    o.quant = quant.c_str();
    o.quant_map = map.empty() ? nullptr : map.c_str();
    o.shard_max_bytes = gb_to_bytes(shard_gb);
    Bar bar;
    if (!no_progress && isatty(STDERR_FILENO)) {
        o.progress = Bar::draw;
        o.progress_user = &bar;
    }
    auto t0 = std::chrono::steady_clock::now();
    cmf_error *err = cmf_convert(rt.get(), &o);
    bar.end();
    check_convert(err, "convert " + model_dir);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s (%s, %.1f s)\n", output.c_str(), quant.c_str(), s);
    return 0;
}

int cmd_requant(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string in, out, quant, only;
    double shard_gb = 0;
    bool no_progress = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&in)->required(), "input .cmf (any shard name: shards are merged)")
        ("output,o", po::value(&out)->required(), "output .cmf (must differ from the input)")
        ("quant,q", po::value(&quant)->required(), "target dtype, as for convert --quant")
        ("only", po::value(&only), "re-encode only tensors matching this glob (name or dot-suffix); others are copied")
        ("shard-max-gb", po::value(&shard_gb)->default_value(0), "split into shards of at most N GiB of payload")
        ("no-progress", po::bool_switch(&no_progress), "no progress bar even on a terminal");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("requant", "IN --quant DTYPE [--only PATTERN] -o OUT", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    cmf_requant_options o;
    cmf_requant_options_init(&o);
    o.input = in.c_str();
    o.output = out.c_str();
    o.quant = quant.c_str();
    o.only = only.empty() ? nullptr : only.c_str();
    o.shard_max_bytes = gb_to_bytes(shard_gb);
    Bar bar;
    if (!no_progress && isatty(STDERR_FILENO)) {
        o.progress = Bar::draw;
        o.progress_user = &bar;
    }
    cmf_error *err = cmf_requant(rt.get(), &o);
    bar.end();
    check_convert(err, "requant " + in);
    std::printf("wrote %s (%s)\n", out.c_str(), quant.c_str());
    return 0;
}

}  // namespace cmfhost
