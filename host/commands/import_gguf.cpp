// cmfhost import-gguf: a llama.cpp GGUF file -> .cmf (cmf_import_gguf).
#include "commands/convert_util.hpp"

namespace cmfhost {

int cmd_import_gguf(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string gguf, output, quant = "keep";
    std::vector<std::string> quant_map;
    double shard_gb = 0;
    bool no_progress = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("gguf", po::value(&gguf)->required(),
                       "GGUF file (v2/v3; qwen2, qwen3, qwen2moe, qwen3moe, gemma, gemma2, gemma3)")
        ("output,o", po::value(&output)->required(), "output .cmf (written to a temp file, then renamed)")
        ("quant,q", po::value(&quant)->default_value("keep"),
         "keep: each tensor gets the CMF dtype nearest to its GGUF type (Q8_0/Q5/Q6_K -> q8, Q4/Q3_K/Q2_K -> q4tp, "
         "F16 -> f16, BF16 -> bf16, F32 -> f32; docs/convert.md); or any convert --quant name: every tensor re-encoded")
        ("quant-map", po::value(&quant_map)->composing(),
         "override PATTERN=DTYPE (glob on the HF name or a dot-suffix of it); repeatable, first match wins")
        ("shard-max-gb", po::value(&shard_gb)->default_value(0), "split into shards of at most N GiB of payload (0 = one file)")
        ("no-progress", po::bool_switch(&no_progress), "no progress bar even on a terminal");
    po::positional_options_description pos;
    pos.add("gguf", 1);
    po::variables_map vm;
    if (!parse_args("import-gguf", "GGUF --output OUT.cmf [--quant keep|DTYPE] [--quant-map PATTERN=DTYPE]...", args, desc, pos, vm))
        return 0;
    const std::string map = join_quant_map(quant_map);
    RuntimePtr rt = make_runtime(common);
    cmf_import_gguf_options o;
    cmf_import_gguf_options_init(&o);
    o.gguf = gguf.c_str();
    o.output = output.c_str();
    o.quant = quant.c_str();
    o.quant_map = map.empty() ? nullptr : map.c_str();
    o.shard_max_bytes = gb_to_bytes(shard_gb);
    Bar bar;
    attach_bar(o, bar, no_progress);
    auto t0 = std::chrono::steady_clock::now();
    cmf_error *err = cmf_import_gguf(rt.get(), &o);
    bar.end();
    check_convert(err, "import-gguf " + gguf);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s (%s, %.1f s)\n", output.c_str(), quant.c_str(), s);
    return 0;
}

}  // namespace cmfhost
