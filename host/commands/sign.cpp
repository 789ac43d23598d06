// cmfhost sign / keygen: detached Ed25519 signatures (spec §8.2).
#include "commands/model_util.hpp"

#include <iostream>

namespace cmfhost {

int cmd_keygen(const std::vector<std::string> &args) {
    std::string key;
    po::options_description desc("options");
    desc.add_options()("key", po::value(&key)->required(), "where to write the secret seed (KEY) and public key (KEY.pub)");
    po::positional_options_description pos;
    pos.add("key", 1);
    po::variables_map vm;
    if (!parse_args("keygen", "KEY", args, desc, pos, vm)) return 0;
    check(cmf_sign_keygen(key.c_str()), key);
    std::printf("wrote %s (secret, keep private) and %s.pub\n", key.c_str(), key.c_str());
    return 0;
}

int cmd_sign(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string path, key;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file; every shard of a sharded model is signed")
        ("key", po::value(&key)->required(), "key file from 'cmfhost keygen' (64 hex chars)");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("sign", "MODEL --key KEY", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), path);  // sign only what opens
    cmf_model_info info;
    cmf_model_info_init(&info);
    check(cmf_model_get_info(m.get(), &info));
    for (uint32_t s = 0; s < info.shard_count; ++s) {
        const char *file = cmf_model_shard_path(m.get(), s);
        char fp[17];
        check(cmf_sign_file(file, key.c_str(), fp), file);
        std::printf("signed %s -> %s.sig (key %s)\n", file, file, fp);
    }
    return 0;
}

}  // namespace cmfhost
