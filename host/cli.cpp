#include "cli.hpp"

#include <cmf/json_text.hpp>

#include <boost/json.hpp>

#include <iostream>

namespace cmfhost {

void check(cmf_error *e, const std::string &context) {
    if (e == nullptr) return;
    std::string msg = std::string(cmf_error_code_name(cmf_error_code(e))) + ": " + cmf_error_message(e);
    cmf_error_free(e);
    throw Failure(context.empty() ? msg : context + ": " + msg);
}

boost::json::value parse_user_json(const std::string &text, const std::string &source) {
    boost::json::parse_options opt;
    opt.max_depth = cmf::json::kMaxDepth;
    boost::json::error_code ec;
    boost::json::value v = boost::json::parse(text, ec, {}, opt);
    if (!ec) return v;
    // Strict parse failed: once more over the library's rewrite of what
    // Python's json writes and strict parsers refuse.
    cmf::json::Normalised n = cmf::json::normalise(text);
    if (!n.error.empty()) throw Failure(source + ": not valid JSON: " + n.error);
    if (n.changed) {
        boost::json::error_code ec2;
        v = boost::json::parse(n.text, ec2, {}, opt);
        if (!ec2) return v;
        ec = ec2;
    }
    throw Failure(source + ": not valid JSON: " + ec.message());
}

void add_common_options(po::options_description &desc, CommonOptions &common) {
    desc.add_options()
        ("threads,t", po::value(&common.threads)->default_value(0),
         "worker threads (0 = physical cores of this machine)")
        ("plugin-path", po::value(&common.plugin_path),
         "extra ':'-separated plugin dirs or files, searched before CMF_PLUGIN_PATH and the default dir")
        ("verbose,v", po::bool_switch(&common.verbose), "log plugin loading and other details");
}

RuntimePtr make_runtime(const CommonOptions &common, int32_t quiet_level) {
    cmf_runtime_options opts;
    cmf_runtime_options_init(&opts);
    opts.n_threads = common.threads;
    opts.plugin_path = common.plugin_path.empty() ? nullptr : common.plugin_path.c_str();
    opts.log_level = common.verbose ? CMF_LOG_DEBUG : quiet_level;
    cmf_runtime *rt = nullptr;
    check(cmf_runtime_create(&opts, &rt), "cannot start the runtime");
    return RuntimePtr(rt);
}

bool parse_args(const std::string &command, const std::string &usage, const std::vector<std::string> &args,
                po::options_description &desc, const po::positional_options_description &pos,
                po::variables_map &vm) {
    desc.add_options()("help,h", "show this help");
    try {
        po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
        if (vm.count("help")) {
            std::cout << "usage: cmfhost " << command << " " << usage << "\n\n" << desc << "\n";
            return false;
        }
        po::notify(vm);
    } catch (const po::error &e) {
        throw Failure(std::string(e.what()) + "\nusage: cmfhost " + command + " " + usage +
                          "\n(try 'cmfhost " + command + " --help')",
                      2);
    }
    return true;
}

}  // namespace cmfhost
