// cmfhost info: envelope, features, header summary, tensors, masks, skills, shards.
#include "commands/model_util.hpp"

#include <boost/json.hpp>

#include <iostream>

namespace cmfhost {

int cmd_info(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string path, prefix;
    bool json = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file (any shard of a sharded model)")
        ("json", po::bool_switch(&json), "print JSON instead of text")
        ("tensors", po::value(&prefix),
         "only the tensors whose name starts with PREFIX (\"\" for all), one 'name<TAB>dtype<TAB>shape<TAB>bytes' row each "
         "as the original tool prints them, then '# N tensors, B bytes (G GiB)'");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("info", "MODEL [--json] [--tensors PREFIX]", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), path);
    if (vm.count("tensors")) {
        uint64_t total = 0, n = 0;
        for (size_t k = 0; k < cmf_tensor_count(m.get()); ++k) {
            cmf_tensor_info t;
            cmf_tensor_info_init(&t);
            check(cmf_tensor_at(m.get(), k, &t));
            if (std::string_view(t.name).rfind(prefix, 0) != 0) continue;
            std::printf("%s\t%s\t%s\t%llu\n", t.name, debug_dtype_name(t.dtype), debug_shape(t).c_str(), (unsigned long long)t.nbytes);
            total += t.nbytes;
            ++n;
        }
        std::printf("# %llu tensors, %llu bytes (%.2f GiB)\n", (unsigned long long)n, (unsigned long long)total, double(total) / double(1u << 30));
        return 0;
    }
    cmf_model_info i;
    cmf_model_info_init(&i);
    check(cmf_model_get_info(m.get(), &i));

    boost::json::array tensors, masks, shards;
    uint64_t total = 0;
    for (size_t k = 0; k < cmf_tensor_count(m.get()); ++k) {
        cmf_tensor_info t;
        cmf_tensor_info_init(&t);
        check(cmf_tensor_at(m.get(), k, &t));
        boost::json::array shape;
        for (uint32_t d = 0; d < t.ndim; ++d) shape.push_back(t.shape[d]);
        tensors.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"dtype_id", t.dtype}, {"shape", shape},
                           {"nbytes", t.nbytes}, {"offset", t.offset}, {"shard", t.shard}, {"hash", hex64(t.hash)}});
        total += t.nbytes;
    }
    for (size_t k = 0; k < cmf_mask_count(m.get()); ++k) {
        cmf_mask_info mi;
        cmf_mask_info_init(&mi);
        check(cmf_mask_at(m.get(), k, &mi));
        masks.push_back({{"task_id", mi.task_id}, {"name", mi.name}, {"priority", mi.priority}, {"sparsity", mi.sparsity},
                         {"quality", mi.quality_json ? boost::json::parse(mi.quality_json) : boost::json::value(nullptr)},
                         {"blob_len", mi.blob_len}, {"expert_fields", mi.has_expert_fields != 0}});
    }
    for (uint32_t s = 0; s < i.shard_count; ++s) shards.push_back(boost::json::string(cmf_model_shard_path(m.get(), s)));
    boost::json::value skills = i.skills_json[0] ? boost::json::parse(i.skills_json) : boost::json::array();
    if (json) {
        boost::json::object sections;
        const std::pair<const char *, std::pair<uint64_t, uint64_t>> secs[] = {
            {"header", {i.header_off, i.header_len}}, {"dir", {i.dir_off, i.dir_len}},     {"data", {i.data_off, i.data_len}},
            {"masks", {i.masks_off, i.masks_len}},    {"vocab", {i.vocab_off, i.vocab_len}}, {"index", {i.index_off, i.index_len}}};
        for (auto &[n, ol] : secs) sections[n] = {{"off", ol.first}, {"len", ol.second}};
        std::cout << boost::json::serialize(boost::json::object{
                         {"path", path}, {"version", i.version}, {"required_features", i.required_features},
                         {"features", features_str(i.required_features)}, {"sections", sections},
                         {"header_hash", hex64(i.header_hash)}, {"dir_hash", hex64(i.dir_hash)},
                         {"header", parse_user_json(std::string(i.header_json, i.header_json_len), path + ": header")},
                         {"shards", shards}, {"tensors", tensors}, {"masks", masks}, {"skills", skills}})
                  << "\n";
        return 0;
    }
    std::printf("file          %s (%llu bytes)\n", path.c_str(), static_cast<unsigned long long>(i.file_size));
    std::printf("version       %u   features 0x%02x %s\n", i.version, i.required_features, features_str(i.required_features).c_str());
    std::printf("arch          %s   quant_type %s\n", i.arch_name, i.quant_type);
    std::printf("sections      header %llu+%llu  dir %llu+%llu  data %llu+%llu  masks %llu  vocab %llu  index %llu\n",
                (unsigned long long)i.header_off, (unsigned long long)i.header_len, (unsigned long long)i.dir_off,
                (unsigned long long)i.dir_len, (unsigned long long)i.data_off, (unsigned long long)i.data_len,
                (unsigned long long)i.masks_len, (unsigned long long)i.vocab_len, (unsigned long long)i.index_len);
    std::printf("hashes        header %s  dir %s\n", hex64(i.header_hash).c_str(), hex64(i.dir_hash).c_str());
    std::printf("chat bundle   %s\n", i.tokenizer_config_json[0] ? "yes" : "no");
    // A pipeline container (imagine-pack) names its pipeline and components
    // in the header's provenance.
    if (i.provenance_json[0] != '\0') {
        boost::system::error_code ec;
        const boost::json::value prov = boost::json::parse(i.provenance_json, ec);
        if (!ec && prov.is_object() && prov.as_object().contains("pipeline") && prov.at("pipeline").is_string()) {
            std::string line = std::string(prov.at("pipeline").as_string());
            if (const auto *comps = prov.as_object().if_contains("components"); comps && comps->is_object()) {
                const char *sep = ": ";
                for (const auto &[k, v] : comps->as_object()) {
                    line += sep + std::string(k) + " " + (v.is_string() ? std::string(v.as_string()) : boost::json::serialize(v));
                    sep = ", ";
                }
            }
            std::printf("pipeline      %s (cmfhost imagine)\n", line.c_str());
        }
    }
    std::printf("shards        %u\n", i.shard_count);
    for (auto &s : shards) std::printf("  %s\n", std::string(s.as_string()).c_str());
    std::printf("tensors       %llu (%llu payload bytes)\n", (unsigned long long)i.tensor_count, (unsigned long long)total);
    std::printf("  %-50s %-9s %-20s %12s %s\n", "NAME", "DTYPE", "SHAPE", "BYTES", "SHARD");
    for (auto &v : tensors) {
        auto &o = v.as_object();
        std::string shape = boost::json::serialize(o.at("shape"));
        std::printf("  %-50s %-9s %-20s %12lld %lld\n", std::string(o.at("name").as_string()).c_str(),
                    std::string(o.at("dtype").as_string()).c_str(), shape.c_str(),
                    (long long)o.at("nbytes").to_number<int64_t>(), (long long)o.at("shard").to_number<int64_t>() + 1);
    }
    std::printf("masks         %zu%s%s\n", masks.size(), masks.empty() ? "" : "  default task: ",
                masks.empty() ? "" : cmf_mask_default_task(m.get()));
    for (auto &v : masks) {
        auto &o = v.as_object();
        std::printf("  %-20s priority %-8s sparsity %g quality %s\n", std::string(o.at("name").as_string()).c_str(),
                    std::string(o.at("priority").as_string()).c_str(), o.at("sparsity").to_number<double>(),
                    o.at("quality").is_null() ? "not measured" : boost::json::serialize(o.at("quality")).c_str());
    }
    std::printf("skills        %llu\n", (unsigned long long)i.skill_count);
    for (auto &s : skills.as_array()) {
        auto &o = s.as_object();
        std::printf("  %s%s\n", o.contains("id") ? boost::json::serialize(o.at("id")).c_str() : "?",
                    o.contains("base_dir_hash") ? "  (standalone skill file)" : "");
    }
    return 0;
}

}  // namespace cmfhost
