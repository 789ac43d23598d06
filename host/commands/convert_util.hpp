// What the commands that write a model from another (convert, requant,
// import-gguf) share: their exit codes, the progress bar, --shard-max-gb.
#pragma once

#include "cli.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

namespace cmfhost {

// Exit codes: 0 ok, 1 the conversion failed, 2 a bad argument (unknown
// --quant, bad --quant-map, missing paths).
inline void check_convert(cmf_error *e, const std::string &context) {
    if (e == nullptr) return;
    int code = cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT ? 2 : 1;
    std::string msg = std::string(cmf_error_code_name(cmf_error_code(e))) + ": " + cmf_error_message(e);
    cmf_error_free(e);
    throw Failure(context + ": " + msg, code);
}

// A progress bar on stderr (terminal only): tensors, MiB of input, ETA.
struct Bar {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    bool drawn = false;
    static void draw(void *user, uint64_t t, uint64_t tt, uint64_t b, uint64_t bt) {
        auto *bar = static_cast<Bar *>(user);
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - bar->t0).count();
        double frac = bt ? double(b) / double(bt) : 1.0;
        int width = 30, fill = int(frac * width);
        double eta = frac > 0 ? el * (1 - frac) / frac : 0;
        std::fprintf(stderr, "\r[%.*s%*s] %llu/%llu tensors  %.1f/%.1f MiB  ETA %d:%02d ", fill,
                     "##############################", width - fill, "", (unsigned long long)t, (unsigned long long)tt,
                     double(b) / 1048576.0, double(bt) / 1048576.0, int(eta) / 60, int(eta) % 60);
        std::fflush(stderr);
        bar->drawn = true;
    }
    // Ends the bar's line (before the result is printed, or on unwinding).
    void end() {
        if (drawn) std::fprintf(stderr, "\n");
        drawn = false;
    }
    ~Bar() { end(); }
};

// Draw `bar` from the options' progress callback when stderr is a terminal.
template <class Options>
void attach_bar(Options &o, Bar &bar, bool no_progress) {
    if (no_progress || !::isatty(STDERR_FILENO)) return;
    o.progress = Bar::draw;
    o.progress_user = &bar;
}

// Repeated --quant-map values as the one comma-separated list the C API takes.
inline std::string join_quant_map(const std::vector<std::string> &items) {
    std::string map;
    for (const auto &m : items) map += (map.empty() ? "" : ",") + m;
    return map;
}

inline uint64_t gb_to_bytes(double gb) {
    if (gb < 0) throw Failure("--shard-max-gb must be >= 0", 2);
    return uint64_t(gb * 1024.0 * 1024.0 * 1024.0);
}

}  // namespace cmfhost
