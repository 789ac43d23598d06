// cmfhost verify: the whole hash chain of every shard plus signatures.
#include "commands/model_util.hpp"

#include <fstream>
#include <iostream>
#include <unistd.h>

namespace cmfhost {

namespace {
void show_progress(void *, uint64_t done, uint64_t total) {
    static int last = -1;
    int pct = total ? int(done * 100 / total) : 100;
    if (pct == last) return;
    last = pct;
    std::fprintf(stderr, "\rverifying %3d%%", pct);
    if (done == total) std::fprintf(stderr, "\n");
}
// A trusted key: a 64-hex public key or 16-hex fingerprint, or a file holding one (key.pub).
std::string load_key(const std::string &k) {
    std::ifstream f(k);
    if (!f) return k;
    std::string s;
    f >> s;
    return s;
}
}  // namespace

int cmd_verify(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string path;
    std::vector<std::string> trusted;
    bool no_progress = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&path)->required(), "CMF file (any shard: all shards are verified)")
        ("trusted-key", po::value(&trusted)->composing(),
         "trusted signer (64-hex public key, 16-hex fingerprint, or a .pub file); repeatable. "
         "With any, every file must carry a valid signature by one of them")
        ("no-progress", po::bool_switch(&no_progress), "no progress line even on a terminal");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("verify", "MODEL [--trusted-key KEY]...", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), path);
    std::vector<std::string> keys;
    for (auto &k : trusted) keys.push_back(load_key(k));
    std::vector<const char *> key_ptrs;
    for (auto &k : keys) key_ptrs.push_back(k.c_str());
    cmf_verify_options o;
    cmf_verify_options_init(&o);
    if (!no_progress && isatty(STDERR_FILENO)) o.progress = show_progress;
    o.trusted_keys = key_ptrs.data();
    o.n_trusted_keys = key_ptrs.size();
    cmf_verify_report *r = nullptr;
    check(cmf_verify(m.get(), &o, &r), path);
    std::unique_ptr<cmf_verify_report, void (*)(cmf_verify_report *)> guard(r, cmf_verify_report_free);
    for (size_t i = 0; i < cmf_verify_signature_count(r); ++i) {
        cmf_signature_info s;
        cmf_signature_info_init(&s);
        check(cmf_verify_signature_at(r, i, &s));
        std::printf("signature ok: %s signed by %s%s\n", s.file, s.fingerprint, s.trusted && !keys.empty() ? " (trusted)" : "");
    }
    size_t n = cmf_verify_problem_count(r);
    for (size_t i = 0; i < n; ++i) std::printf("PROBLEM: %s\n", cmf_verify_problem(r, i));
    cmf_model_info info;
    cmf_model_info_init(&info);
    check(cmf_model_get_info(m.get(), &info));
    if (n) {
        std::printf("%s: %zu problem(s)\n", path.c_str(), n);
        return 1;
    }
    std::printf("%s: ok (%llu tensors, %u shard(s))\n", path.c_str(), (unsigned long long)info.tensor_count, info.shard_count);
    return 0;
}

}  // namespace cmfhost
