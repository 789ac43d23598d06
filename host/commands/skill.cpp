// cmfhost skill list|add|export|apply: the skills of a file (spec §9).
//   list MODEL                      the registry, with each skill's tensors and bytes
//   add MODEL --from DONOR --id ID  graft a donor checkpoint as a skill, growing the file in place
//   export SPECIALIST --base BASE --id ID -o OUT   the standalone skill file (feature bit 6)
//   apply BASE SKILL -o OUT [--force]             a skill file laid over its base
#include "commands/model_util.hpp"

#include <boost/json.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace cmfhost {

namespace {

namespace bj = boost::json;

// JSON for the terminal: numbers as %g (Boost's own spelling is 8.0623E1).
std::string text_of(const bj::value &v) {
    char buf[64];
    switch (v.kind()) {
    case bj::kind::double_: std::snprintf(buf, sizeof buf, "%g", v.get_double()); return buf;
    case bj::kind::object: {
        std::string s = "{";
        for (const auto &kv : v.get_object())
            s += (s.size() > 1 ? ", " : "") + std::string(kv.key()) + ": " + text_of(kv.value());
        return s + "}";
    }
    case bj::kind::array: {
        std::string s = "[";
        for (const auto &x : v.get_array()) s += (s.size() > 1 ? "," : "") + text_of(x);
        return s + "]";
    }
    case bj::kind::string: return std::string(v.get_string());
    default: return bj::serialize(v);
    }
}

std::string take_report(char *s) {
    std::string r = s ? s : "";
    cmf_string_free(s);
    return r;
}

int skill_list(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string path;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("skill list", "MODEL", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), path);
    cmf_model_info info;
    cmf_model_info_init(&info);
    check(cmf_model_get_info(m.get(), &info), path);
    bj::array skills;
    if (info.skills_json && *info.skills_json) skills = bj::parse(info.skills_json).as_array();
    if (skills.empty()) {
        std::printf("no skills: a flat backbone\n");
        return 0;
    }
    std::map<std::string, std::pair<uint64_t, uint64_t>> per;  // id -> tensors, bytes
    for (size_t i = 0; i < cmf_tensor_count(m.get()); ++i) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        check(cmf_tensor_at(m.get(), i, &t), path);
        const std::string n = t.name;
        if (n.compare(0, 6, "skill.") != 0) continue;
        const std::string id = n.substr(6, n.find('.', 6) - 6);
        ++per[id].first;
        per[id].second += t.nbytes;
    }
    std::printf("%zu skill(s):\n", skills.size());
    for (const auto &v : skills) {
        const bj::object &s = v.as_object();
        const std::string id = s.contains("id") && s.at("id").is_string() ? std::string(s.at("id").as_string()) : "?";
        const std::string name = s.contains("name") && s.at("name").is_string() ? std::string(s.at("name").as_string()) : "\u2014";
        // A skill file's record counts the tensors it carries (named as the base's).
        auto [n, bytes] = per[id];
        if (info.required_features & CMF_FEATURE_SKILL_FILE) n = cmf_tensor_count(m.get()), bytes = info.data_len;
        std::printf("  %-10s %-24s %llu tensor(s), %.1f MB, layers %s, %s\n", id.c_str(), name.c_str(),
                    static_cast<unsigned long long>(n), double(bytes) / 1e6,
                    s.contains("layers") ? bj::serialize(s.at("layers")).c_str() : "[]",
                    s.contains("selection") ? "routable" : "no selection");
        if (s.contains("quality")) std::printf("      quality: %s\n", text_of(s.at("quality")).c_str());
        if (s.contains("base_dir_hash"))
            std::printf("      standalone skill file for a base with directory hash %s\n",
                        bj::serialize(s.at("base_dir_hash")).c_str());
    }
    return 0;
}

int skill_add(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string model, output, donor, id, name, layers = "all", tensors = "ffn", prompts, skill_quant, quality;
    int64_t phi_layer = -1;
    uint32_t rank = 2;
    float min_delta = 0;
    uint64_t quality_tokens = 1024;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()
        ("model", po::value(&model)->required(), "the CMF file that takes the skill (grown in place)")
        ("from", po::value(&donor)->required(), "donor: Hugging Face checkpoint directory of the same shapes")
        ("id", po::value(&id)->required(), "skill id, [A-Za-z0-9_-]+ (an existing skill of that id is replaced)")
        ("name", po::value(&name), "human name")
        ("layers", po::value(&layers)->default_value(layers), "all | A-B | i,j,k")
        ("tensors", po::value(&tensors)->default_value(tensors), "ffn (gate/up/down) | attn (q/k/v/o) | all")
        ("prompts", po::value(&prompts), "file of example prompts, one per line: fits the routing descriptor")
        ("phi-layer", po::value(&phi_layer)->default_value(phi_layer), "layer whose output routes (-1: 2/3 of the layers)")
        ("rank", po::value(&rank)->default_value(rank), "routing subspace rank (at most prompts - 1 and 8)")
        ("min-delta", po::value(&min_delta)->default_value(min_delta), "keep the backbone's tensor when the donor changed it by less (relative RMS)")
        ("skill-quant", po::value(&skill_quant), "dtype of the skill's tensors (a --quant name); default: each backbone tensor's")
        ("quality", po::value(&quality), "held-out text: backbone and skill perplexity go into the record")
        ("quality-tokens", po::value(&quality_tokens)->default_value(quality_tokens), "tokens of --quality scored")
        ("output,o", po::value(&output), "write a new file (the model's bytes plus the skill) instead of growing MODEL");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("skill add", "MODEL --from DONOR --id ID [options]", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    cmf_skill_add_options o;
    cmf_skill_add_options_init(&o);
    o.model = model.c_str();
    o.output = output.empty() ? nullptr : output.c_str();
    o.donor_dir = donor.c_str();
    o.id = id.c_str();
    o.name = name.empty() ? nullptr : name.c_str();
    o.layers = layers.c_str();
    o.tensors = tensors.c_str();
    o.prompts_file = prompts.empty() ? nullptr : prompts.c_str();
    o.phi_layer = phi_layer;
    o.rank = rank;
    o.min_delta = min_delta;
    o.skill_quant = skill_quant.empty() ? nullptr : skill_quant.c_str();
    o.quality_file = quality.empty() ? nullptr : quality.c_str();
    o.quality_tokens = quality_tokens;
    char *rep = nullptr;
    check(cmf_skill_add(rt.get(), &o, &rep), "skill add");
    const bj::object r = bj::parse(take_report(rep)).as_object();
    for (const auto &s : r.at("skipped").as_array()) std::printf("  skipped: %s\n", std::string(s.as_string()).c_str());
    if (!r.at("unchanged").as_array().empty())
        std::printf("  %zu tensor(s) below --min-delta stay the backbone's\n", r.at("unchanged").as_array().size());
    const bj::object &rec = r.at("record").as_object();
    std::printf("skill '%s': %llu tensor(s), +%.1f MB, layers %s, %s\n", id.c_str(),
                static_cast<unsigned long long>(r.at("tensors").to_number<uint64_t>()),
                double(r.at("bytes").to_number<uint64_t>()) / 1e6, bj::serialize(rec.at("layers")).c_str(),
                rec.contains("selection") ? "routable" : "no selection (route skips it)");
    if (rec.contains("quality")) std::printf("  quality: %s\n", text_of(rec.at("quality")).c_str());
    std::printf("wrote %s\n", std::string(r.at("output").as_string()).c_str());
    return 0;
}

int skill_export(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string spec, base, id, name, output;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()
        ("specialist", po::value(&spec)->required(), "the specialist .cmf (a base with changed tensors)")
        ("base", po::value(&base)->required(), "the base it was made from")
        ("id", po::value(&id)->required(), "skill id")
        ("name", po::value(&name), "human name")
        ("output,o", po::value(&output)->required(), "the skill file to write");
    po::positional_options_description pos;
    pos.add("specialist", 1);
    po::variables_map vm;
    if (!parse_args("skill export", "SPECIALIST --base BASE --id ID [--name N] -o OUT", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    char *rep = nullptr;
    check(cmf_skill_export(rt.get(), spec.c_str(), base.c_str(), id.c_str(), name.empty() ? nullptr : name.c_str(),
                           output.c_str(), &rep),
          "skill export");
    const bj::object r = bj::parse(take_report(rep)).as_object();
    std::printf("skill '%s': %llu tensor(s) across layers %s, %llu mask(s) -> %s\n", id.c_str(),
                static_cast<unsigned long long>(r.at("tensors").to_number<uint64_t>()), bj::serialize(r.at("layers")).c_str(),
                static_cast<unsigned long long>(r.at("masks").to_number<uint64_t>()), output.c_str());
    return 0;
}

int skill_apply(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string base, skill, output;
    bool force = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()
        ("base", po::value(&base)->required(), "the base .cmf")
        ("skill", po::value(&skill)->required(), "the skill file (skill export)")
        ("output,o", po::value(&output)->required(), "the complete model to write")
        ("force", po::bool_switch(&force), "apply to a base whose directory hash is not the skill's key (a warning)");
    po::positional_options_description pos;
    pos.add("base", 1).add("skill", 1);
    po::variables_map vm;
    if (!parse_args("skill apply", "BASE SKILL -o OUT [--force]", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    char *rep = nullptr;
    check(cmf_skill_apply(rt.get(), base.c_str(), skill.c_str(), output.c_str(), force, &rep), "skill apply");
    const bj::object r = bj::parse(take_report(rep)).as_object();
    std::printf("applied skill '%s': %llu tensor(s) replaced, %llu mask(s) carried -> %s\n",
                std::string(r.at("id").as_string()).c_str(), static_cast<unsigned long long>(r.at("replaced").to_number<uint64_t>()),
                static_cast<unsigned long long>(r.at("masks").to_number<uint64_t>()), output.c_str());
    return 0;
}

}  // namespace

int cmd_skill(const std::vector<std::string> &args) {
    const std::string usage = "usage: cmfhost skill (list|add|export|apply) ... (--help after each for its options)";
    if (args.empty() || args[0] == "-h" || args[0] == "--help") {
        std::printf("%s\n  list MODEL\n  add MODEL --from DONOR --id ID [--layers all] [--tensors ffn] [--prompts F] "
                    "[--min-delta X] [--quality F] [-o OUT]\n  export SPECIALIST --base BASE --id ID [--name N] -o OUT\n"
                    "  apply BASE SKILL -o OUT [--force]\n",
                    usage.c_str());
        return args.empty() ? 2 : 0;
    }
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    if (args[0] == "list") return skill_list(rest);
    if (args[0] == "add") return skill_add(rest);
    if (args[0] == "export") return skill_export(rest);
    if (args[0] == "apply") return skill_apply(rest);
    throw Failure("unknown skill subcommand '" + args[0] + "'; " + usage, 2);
}

}  // namespace cmfhost
