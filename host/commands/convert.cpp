// cmfhost convert / requant: a Hugging Face checkpoint -> .cmf, and
// re-encoding an existing .cmf to another dtype (cmf_convert, cmf_requant).
#include "commands/convert_util.hpp"

namespace cmfhost {

int cmd_convert(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string model_dir, output, quant = "q8", defrag;
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
        ("defrag", po::value(&defrag),
         "drop FFN neurons while converting (spec §11): DIR/ffn_keep.npy ([layers, intermediate], nonzero = kept) or, "
         "without it, the neurons whose down_proj column is all zero are left out; DIR/tensors/NAME.npy replace FFN weights first")
        ("no-progress", po::bool_switch(&no_progress), "no progress bar even on a terminal");
    po::positional_options_description pos;
    po::variables_map vm;
    if (!parse_args("convert", "--model DIR --output OUT.cmf [--quant DTYPE] [--quant-map PATTERN=DTYPE]... [--defrag SKILL_DIR]", args, desc,
                    pos, vm))
        return 0;
    const std::string map = join_quant_map(quant_map);
    RuntimePtr rt = make_runtime(common);
    cmf_convert_options o;
    cmf_convert_options_init(&o);
    o.model_dir = model_dir.c_str();
    o.output = output.c_str();
    o.quant = quant.c_str();
    o.quant_map = map.empty() ? nullptr : map.c_str();
    o.shard_max_bytes = gb_to_bytes(shard_gb);
    o.defrag_dir = defrag.empty() ? nullptr : defrag.c_str();
    Bar bar;
    attach_bar(o, bar, no_progress);
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
    bool no_progress = false, in_place = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&in)->required(), "input .cmf (any shard name: shards are merged)")
        ("output,o", po::value(&out), "output .cmf (must differ from the input)")
        ("in-place", po::bool_switch(&in_place),
         "rewrite the input itself: each new payload must fit its tensor's slot (checked for all before writing), "
         "the header and the file length stay; journaled, so a crash leaves the old or the new tensor")
        ("quant,q", po::value(&quant)->required(), "target dtype, as for convert --quant")
        ("only", po::value(&only), "re-encode only tensors matching this glob (name or dot-suffix); others are copied")
        ("shard-max-gb", po::value(&shard_gb)->default_value(0), "split into shards of at most N GiB of payload")
        ("no-progress", po::bool_switch(&no_progress), "no progress bar even on a terminal");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("requant", "IN --quant DTYPE [--only PATTERN] (-o OUT | --in-place)", args, desc, pos, vm)) return 0;
    if (in_place == !out.empty()) throw Failure("give either --output or --in-place", 2);
    RuntimePtr rt = make_runtime(common);
    cmf_requant_options o;
    cmf_requant_options_init(&o);
    o.input = in.c_str();
    o.output = in_place ? nullptr : out.c_str();
    o.flags = in_place ? CMF_REQUANT_IN_PLACE : 0;
    o.quant = quant.c_str();
    o.only = only.empty() ? nullptr : only.c_str();
    o.shard_max_bytes = gb_to_bytes(shard_gb);
    Bar bar;
    attach_bar(o, bar, no_progress);
    cmf_error *err = cmf_requant(rt.get(), &o);
    bar.end();
    check_convert(err, "requant " + in);
    if (in_place) std::printf("rewrote %s in place (%s)\n", in.c_str(), quant.c_str());
    else std::printf("wrote %s (%s)\n", out.c_str(), quant.c_str());
    return 0;
}

}  // namespace cmfhost
