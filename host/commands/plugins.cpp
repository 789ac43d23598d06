// cmfhost plugins: what the runtime loaded (and refused), and what each
// plugin registered.
#include "cli.hpp"

#include <boost/json.hpp>

#include <cstdio>
#include <iostream>

namespace cmfhost {

namespace {
const char *kind_name(int32_t kind) {
    switch (kind) {
    case CMF_COMPONENT_CODEC: return "codec";
    case CMF_COMPONENT_ARCH: return "arch";
    case CMF_COMPONENT_BACKEND: return "backend";
    default: return "?";
    }
}
}  // namespace

int cmd_plugins(const std::vector<std::string> &args) {
    CommonOptions common;
    bool json = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("json", po::bool_switch(&json), "print JSON instead of a table");
    po::variables_map vm;
    if (!parse_args("plugins", "[options]", args, desc, {}, vm)) return 0;

    // Refusals are part of this command's output; do not log them twice.
    RuntimePtr rt = make_runtime(common, CMF_LOG_ERROR);
    boost::json::array files, components;
    for (size_t i = 0; i < cmf_runtime_plugin_count(rt.get()); ++i) {
        cmf_plugin_info p;
        cmf_plugin_info_init(&p);
        check(cmf_runtime_plugin_info(rt.get(), i, &p));
        files.push_back({{"path", p.path},
                         {"status", p.status == CMF_PLUGIN_STATUS_LOADED ? "loaded" : "refused"},
                         {"abi_version", p.abi_version},
                         {"message", p.message}});
    }
    for (int32_t kind : {CMF_COMPONENT_CODEC, CMF_COMPONENT_ARCH, CMF_COMPONENT_BACKEND}) {
        for (size_t i = 0; i < cmf_runtime_component_count(rt.get(), kind); ++i) {
            cmf_component_info c;
            cmf_component_info_init(&c);
            check(cmf_runtime_component_info(rt.get(), kind, i, &c));
            boost::json::object o{{"kind", kind_name(kind)}, {"name", c.name},       {"version", c.version},
                                  {"abi_version", c.abi_version}, {"plugin", c.plugin_path}};
            if (kind == CMF_COMPONENT_CODEC) o["dtype_id"] = c.dtype_id;
            if (kind == CMF_COMPONENT_ARCH) o["arch_names"] = c.detail;
            if (kind == CMF_COMPONENT_BACKEND) o["description"] = c.detail;
            components.push_back(std::move(o));
        }
    }
    if (json) {
        std::cout << boost::json::serialize(boost::json::object{
                         {"host_abi", cmf_abi_version()},
                         {"plugin_abi", {{"min", cmf_plugin_abi_min_version()}, {"max", cmf_plugin_abi_version()}}},
                         {"threads", cmf_runtime_threads(rt.get())},
                         {"plugins", files},
                         {"components", components}})
                  << "\n";
        return 0;
    }
    std::printf("%-8s %-12s %-34s %-4s %s\n", "KIND", "NAME", "DTYPE / ARCHS / DEVICE", "ABI", "FILE");
    for (const auto &v : components) {
        const auto &o = v.as_object();
        std::string what;
        if (o.contains("dtype_id")) {
            const int64_t id = o.at("dtype_id").as_int64();
            what = "dtype " + std::to_string(id) + (id >= CMF_DTYPE_MEMORY_FIRST ? " (memory-only)" : "");
        }
        if (o.contains("arch_names")) what = std::string(o.at("arch_names").as_string());
        if (o.contains("description")) what = std::string(o.at("description").as_string());
        std::printf("%-8s %-12s %-34s %-4lld %s\n", std::string(o.at("kind").as_string()).c_str(),
                    std::string(o.at("name").as_string()).c_str(), what.c_str(),
                    static_cast<long long>(o.at("abi_version").to_number<int64_t>()),
                    std::string(o.at("plugin").as_string()).c_str());
    }
    size_t refused = 0;
    for (const auto &v : files) {
        const auto &o = v.as_object();
        if (o.at("status").as_string() == "refused") {
            if (refused++ == 0) std::printf("\nrefused plugins:\n");
            std::printf("  %s: %s\n", std::string(o.at("path").as_string()).c_str(),
                        std::string(o.at("message").as_string()).c_str());
        }
    }
    if (files.empty())
        std::printf("(no plugins found: set CMF_PLUGIN_PATH or install cmf so plugins sit in lib/%s)\n",
                    "cmf/plugins");
    return 0;
}

}  // namespace cmfhost
