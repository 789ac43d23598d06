// cmfhost: the command-line front end. It uses cmf.h only; every command is
// a function in commands/, registered in main.cpp's table.
#pragma once

#include <cmf/cmf.h>

#include <boost/json/value.hpp>
#include <boost/program_options.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace cmfhost {

namespace po = boost::program_options;

// A failure to report to the user: message and exit code.
struct Failure : std::runtime_error {
    Failure(const std::string &msg, int code = 1) : std::runtime_error(msg), exit_code(code) {}
    int exit_code;
};

// Throws Failure carrying the error's code name and message (and frees it).
void check(cmf_error *e, const std::string &context = {});

struct RuntimeDeleter {
    void operator()(cmf_runtime *rt) const { cmf_runtime_free(rt); }
};
using RuntimePtr = std::unique_ptr<cmf_runtime, RuntimeDeleter>;

// Options every command that needs a runtime accepts.
struct CommonOptions {
    int threads = 0;
    std::string plugin_path;
    bool verbose = false;
};
void add_common_options(po::options_description &desc, CommonOptions &common);
RuntimePtr make_runtime(const CommonOptions &common, int32_t quiet_level = CMF_LOG_WARN);

// Parse `args` (the words after the subcommand) against `desc` and positional
// `pos`; prints usage and returns false for --help.
bool parse_args(const std::string &command, const std::string &usage, const std::vector<std::string> &args,
                po::options_description &desc, const po::positional_options_description &pos,
                po::variables_map &vm);

// JSON from a user's file (`source` names it in errors), read as the library
// reads it (cmf/json_text.hpp): big integers, NaN/Infinity, a byte order
// mark and nesting up to its bound are accepted.
boost::json::value parse_user_json(const std::string &text, const std::string &source);

struct Command {
    const char *name;
    const char *summary;
    int (*run)(const std::vector<std::string> &args);
};

int cmd_plugins(const std::vector<std::string> &args);
int cmd_tokenize(const std::vector<std::string> &args);
int cmd_detokenize(const std::vector<std::string> &args);
// container
int cmd_info(const std::vector<std::string> &args);
int cmd_verify(const std::vector<std::string> &args);
int cmd_sign(const std::vector<std::string> &args);
int cmd_keygen(const std::vector<std::string> &args);
int cmd_compact(const std::vector<std::string> &args);
int cmd_tensor(const std::vector<std::string> &args);
int cmd_masks(const std::vector<std::string> &args);
int cmd_render(const std::vector<std::string> &args);

// convert
int cmd_convert(const std::vector<std::string> &args);
int cmd_requant(const std::vector<std::string> &args);
int cmd_imagine_pack(const std::vector<std::string> &args);
int cmd_import_gguf(const std::vector<std::string> &args);
// the original's file tools
int cmd_diff(const std::vector<std::string> &args);
int cmd_dequant(const std::vector<std::string> &args);
int cmd_patch_tensor(const std::vector<std::string> &args);

// running models
int cmd_run(const std::vector<std::string> &args);
int cmd_bench(const std::vector<std::string> &args);
int cmd_ppl(const std::vector<std::string> &args);
int cmd_logits(const std::vector<std::string> &args);
int cmd_route(const std::vector<std::string> &args);
int cmd_explain(const std::vector<std::string> &args);
int cmd_skill(const std::vector<std::string> &args);
int cmd_defrag(const std::vector<std::string> &args);
int cmd_moe_defrag(const std::vector<std::string> &args);
int cmd_moe_mask(const std::vector<std::string> &args);
int cmd_imagine(const std::vector<std::string> &args);
int cmd_serve(const std::vector<std::string> &args);

}  // namespace cmfhost
