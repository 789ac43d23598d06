// cmfhost entry point: global flags, then one subcommand per table row.
#include "cli.hpp"

#include <csignal>
#include <cstring>
#include <iostream>

#include <unistd.h>

namespace {

// No process survives a plugin that crashes in its own code, but the user
// should learn which file did it: on a fatal signal while the library loads
// or unloads a plugin, say so, then die of the same signal (the exit status
// stays 128 + signal). Only async-signal-safe calls.
void on_fatal_signal(int sig) {
    if (const char *plugin = cmf_plugin_in_progress()) {
        const char *name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGILL ? "SIGILL"
                           : sig == SIGFPE ? "SIGFPE" : "SIGABRT";
        const char *parts[] = {"cmfhost: plugin ", plugin, " crashed (", name,
                               ") while loading; remove it from the plugin path (CMF_PLUGIN_PATH, --plugin-path or the "
                               "installed plugin directory) and run again\n"};
        for (const char *p : parts) {
            ssize_t ignored = ::write(STDERR_FILENO, p, std::strlen(p));
            (void)ignored;
        }
    }
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

void install_signal_handlers() {
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
        // A sanitizer's or debugger's handler, when present, reports more.
        struct sigaction old {};
        if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
        struct sigaction sa {};
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND | SA_NODEFER;
        sigaction(sig, &sa, nullptr);
    }
    // Over RLIMIT_FSIZE a write fails with EFBIG and the writers clean up
    // and report it, instead of the process dying of SIGXFSZ mid-file.
    std::signal(SIGXFSZ, SIG_IGN);
}

using cmfhost::Command;

const Command kCommands[] = {
    {"plugins", "list loaded plugins, their codecs/archs/backends, and refused plugins", cmfhost::cmd_plugins},
    {"tokenize", "encode text to token ids with a tokenizer.json", cmfhost::cmd_tokenize},
    {"detokenize", "decode token ids to text with a tokenizer.json", cmfhost::cmd_detokenize},
    {"info", "envelope, features, header, tensors, masks, skills and shards of a model", cmfhost::cmd_info},
    {"verify", "check every hash (and signature) of a model; non-zero exit on any problem", cmfhost::cmd_verify},
    {"sign", "write a detached Ed25519 signature MODEL.sig", cmfhost::cmd_sign},
    {"keygen", "create an Ed25519 signing key (KEY and KEY.pub)", cmfhost::cmd_keygen},
    {"compact", "rewrite a model as one file without dead bytes", cmfhost::cmd_compact},
    {"tensor", "dequantize one tensor to raw f32", cmfhost::cmd_tensor},
    {"masks", "list task masks and the sparse index", cmfhost::cmd_masks},
    {"render", "render a chat template (tokenizer_config.json) over a conversation", cmfhost::cmd_render},

    {"convert", "convert a Hugging Face checkpoint directory to .cmf", cmfhost::cmd_convert},
    {"requant", "re-encode the tensors of a .cmf to another dtype (to a new file, or in place)", cmfhost::cmd_requant},
    {"import-gguf", "import a llama.cpp GGUF file (qwen2/3, qwen2/3 MoE, gemma 1-3) as .cmf", cmfhost::cmd_import_gguf},
    {"diff", "compare two .cmf files: header, tensors by hash (shared/new/removed/changed), skills", cmfhost::cmd_diff},
    {"dequant", "dequantize tensors to raw f32/bf16 files (one, or every tensor of a prefix)", cmfhost::cmd_dequant},
    {"patch-tensor", "replace tensors' values from raw f32 files, in place or into a new file", cmfhost::cmd_patch_tensor},
    {"imagine-pack", "pack a diffusers text-to-image pipeline directory into one .cmf", cmfhost::cmd_imagine_pack},
    {"run", "generate: one prompt (-p) or an interactive chat", cmfhost::cmd_run},
    {"bench", "prompt-processing and generation speed (pp/tg), peak RSS", cmfhost::cmd_bench},
    {"ppl", "perplexity of a text file", cmfhost::cmd_ppl},
    {"logits", "f32 logits of every prompt position to a file", cmfhost::cmd_logits},
    {"route", "which skill of the file a prompt goes to (recon-argmin over the selection descriptors)", cmfhost::cmd_route},
    {"explain", "every skill's routing error, margin, novelty and the routed first token", cmfhost::cmd_explain},
    {"skill", "skills of a file: list, add (a donor checkpoint, in place), export, apply", cmfhost::cmd_skill},
    {"defrag", "a copy without the FFN neurons a task mask (or ffn_keep.npy) leaves out", cmfhost::cmd_defrag},
    {"moe-defrag", "a copy of a MoE model without the experts its recorded routing does not need", cmfhost::cmd_moe_defrag},
    {"moe-mask", "a copy of a MoE model with a task mask routing only among the experts its recorded routing needs",
     cmfhost::cmd_moe_mask},
    {"imagine", "text to image: a prompt -> PNG with a pipeline .cmf", cmfhost::cmd_imagine},
    {"serve", "OpenAI-compatible HTTP server with continuous batching and a chat page", cmfhost::cmd_serve},
};

void print_help() {
    std::cout << "cmfhost — run and inspect CMF v2 model files\n\n"
                 "usage: cmfhost [--version] [--help] <command> [options]\n\ncommands:\n";
    for (const auto &c : kCommands) std::printf("  %-12s %s\n", c.name, c.summary);
    std::cout << "\n'cmfhost <command> --help' describes a command.\n"
                 "Environment: CMF_PLUGIN_PATH (extra plugin dirs), CMF_THREADS (default thread count).\n";
}

}  // namespace

int main(int argc, char **argv) {
    install_signal_handlers();
    if (argc < 2) {
        print_help();
        return 2;
    }
    std::string first = argv[1];
    if (first == "--help" || first == "-h" || first == "help") {
        print_help();
        return 0;
    }
    if (first == "--version" || first == "-V") {
        std::cout << "cmfhost " << cmf_version_string() << " (host ABI " << cmf_abi_version() << ", plugin ABI "
                  << cmf_plugin_abi_min_version() << ".." << cmf_plugin_abi_version() << ")\n";
        return 0;
    }
    std::vector<std::string> args(argv + 2, argv + argc);
    for (const auto &c : kCommands) {
        if (first != c.name) continue;
        try {
            return c.run(args);
        } catch (const cmfhost::Failure &f) {
            std::cerr << "cmfhost " << c.name << ": " << f.what() << "\n";
            return f.exit_code;
        } catch (const std::exception &e) {
            std::cerr << "cmfhost " << c.name << ": " << e.what() << "\n";
            return 1;
        }
    }
    std::cerr << "cmfhost: unknown command '" << first << "' (see 'cmfhost --help')\n";
    return 2;
}
