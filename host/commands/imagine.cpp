// cmfhost imagine-pack / imagine: a diffusers text-to-image pipeline ->
// one pipeline container (cmf_imagine_pack), and an image from a prompt
// (cmf_image_pipeline_create + cmf_imagine), written as an RGB8 PNG with
// libpng.
#include "commands/convert_util.hpp"
#include "commands/model_util.hpp"

#include <png.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <vector>

namespace cmfhost {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Exit codes as convert: 1 the work failed, 2 a bad argument.
void check_code(cmf_error *e, const std::string &context) {
    if (e == nullptr) return;
    const int code = cmf_error_code(e) == CMF_ERR_INVALID_ARGUMENT ? 2 : 1;
    std::string msg = std::string(cmf_error_code_name(cmf_error_code(e))) + ": " + cmf_error_message(e);
    cmf_error_free(e);
    throw Failure(context + ": " + msg, code);
}

// The denoising loop's bar: steps, seconds per step, ETA; and the times the
// summary line reports.
// This process's CPU seconds (all threads): on a shared machine the wall
// time of a phase says little alone, its CPU time says how much work it was.
double cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

struct StepBar {
    Clock::time_point t0 = Clock::now(), first, last;
    double cpu_t0 = 0, cpu_first = 0, cpu_last = 0;
    bool tty = false, drawn = false;
    uint32_t done = 0;
    static int32_t on_step(void *user, uint32_t step, uint32_t n) {
        auto *bar = static_cast<StepBar *>(user);
        const auto now = Clock::now();
        const double cpu = cpu_seconds();
        if (step == 1) {
            bar->first = now;
            bar->cpu_first = cpu;
        }
        bar->last = now;
        bar->cpu_last = cpu;
        bar->done = step;
        if (!bar->tty) return 0;
        // Seconds per step from the second step on (the first also encodes the prompt).
        const double per = step > 1 ? std::chrono::duration<double>(now - bar->first).count() / double(step - 1)
                                    : std::chrono::duration<double>(now - bar->t0).count();
        const int width = 30, fill = int(double(step) / double(n) * width);
        const double eta = per * double(n - step);
        std::fprintf(stderr, "\r[%.*s%*s] step %u/%u  %.2f s/step  ETA %d:%02d ", fill, "##############################",
                     width - fill, "", step, n, per, int(eta) / 60, int(eta) % 60);
        std::fflush(stderr);
        bar->drawn = true;
        return 0;
    }
    void end() {
        if (drawn) std::fprintf(stderr, "\n");
        drawn = false;
    }
    ~StepBar() { end(); }
};

// "512x768" -> width, height.
std::pair<uint32_t, uint32_t> parse_size(const std::string &s) {
    unsigned w = 0, h = 0;
    char x = 0, extra = 0;
    if (std::sscanf(s.c_str(), "%u%c%u%c", &w, &x, &h, &extra) != 3 || (x != 'x' && x != 'X') || w == 0 || h == 0)
        throw Failure("--size must be WIDTHxHEIGHT, e.g. 512x512 (got '" + s + "')", 2);
    return {w, h};
}

std::vector<float> read_latent(const std::string &path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw Failure("--latent-in: cannot open " + path, 2);
    const std::streamsize n = in.tellg();
    if (n % 4 != 0) throw Failure("--latent-in: " + path + " holds " + std::to_string(n) + " bytes, not whole f32 values", 2);
    std::vector<float> v(size_t(n) / 4);
    in.seekg(0);
    if (!in.read(reinterpret_cast<char *>(v.data()), n)) throw Failure("--latent-in: cannot read " + path);
    return v;
}

// Written to a temp file beside `path`, then renamed over it.
template <class Write>
void write_atomically(const std::string &path, Write &&write) {
    const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
    try {
        write(tmp);
        std::filesystem::rename(tmp, path);
    } catch (...) {
        std::error_code ec;
        std::filesystem::remove(tmp, ec);
        throw;
    }
}

void write_latent(const std::string &path, const std::vector<float> &v) {
    write_atomically(path, [&](const std::string &tmp) {
        std::ofstream out(tmp, std::ios::binary);
        out.write(reinterpret_cast<const char *>(v.data()), std::streamsize(v.size() * 4));
        out.close();
        if (!out) throw Failure("--latent-out: cannot write " + path);
    });
}

void write_png(const std::string &path, const std::vector<uint8_t> &rgb, uint32_t width, uint32_t height) {
    write_atomically(path, [&](const std::string &tmp) {
        png_image img{};
        img.version = PNG_IMAGE_VERSION;
        img.width = width;
        img.height = height;
        img.format = PNG_FORMAT_RGB;
        if (!png_image_write_to_file(&img, tmp.c_str(), 0, rgb.data(), 0, nullptr))
            throw Failure("cannot write " + path + ": " + img.message);
    });
}

}  // namespace

int cmd_imagine_pack(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string model_dir, output, quant = "q8";
    bool no_progress = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&model_dir)->required(),
                       "diffusers pipeline directory (model_index.json, text_encoder/, tokenizer/, transformer/, vae/, scheduler/)")
        ("output,o", po::value(&output)->required(), "output .cmf (written to a temp file, then renamed)")
        ("quant,q", po::value(&quant)->default_value("q8"),
         "dtype of the large matrices: q8 or q4t (adaLN and the embedding stay q8, VAE kernels f16, the rest f32), "
         "or f32 for everything")
        ("no-progress", po::bool_switch(&no_progress), "no progress bar even on a terminal");
    po::positional_options_description pos;
    po::variables_map vm;
    if (!parse_args("imagine-pack", "--model DIR --output OUT.cmf [--quant q8|q4t|f32]", args, desc, pos, vm)) return 0;
    RuntimePtr rt = make_runtime(common);
    cmf_convert_options o;
    cmf_convert_options_init(&o);
    o.model_dir = model_dir.c_str();
    o.output = output.c_str();
    o.quant = quant.c_str();
    Bar bar;
    attach_bar(o, bar, no_progress);
    const auto t0 = Clock::now();
    cmf_error *err = cmf_imagine_pack(rt.get(), &o);
    bar.end();
    check_code(err, "imagine-pack " + model_dir);
    std::printf("wrote %s (%s, %.1f s)\n", output.c_str(), quant.c_str(), seconds_since(t0));
    return 0;
}

int cmd_imagine(const std::vector<std::string> &args) {
    CommonOptions common;
    std::string model, prompt, negative, size = "512x512", output, latent_in, latent_out, backend;
    cmf_imagine_options io;
    cmf_imagine_options_init(&io);
    uint32_t steps = io.steps;
    float cfg = io.guidance_scale, trunc = io.cfg_trunc_ratio;
    uint64_t seed = io.seed;
    bool no_norm = false, no_progress = false;
    po::options_description desc("options");
    add_common_options(desc, common);
    desc.add_options()("model", po::value(&model)->required(), "pipeline container (.cmf from imagine-pack)")
        ("prompt,p", po::value(&prompt)->required(), "what the image shows")
        ("negative", po::value(&negative)->default_value(""), "negative prompt (the unconditional branch of guidance)")
        ("steps", po::value(&steps)->default_value(steps), "denoising steps")
        ("cfg", po::value(&cfg)->default_value(cfg), "classifier-free guidance scale (<= 1: no guidance, one pass per step)")
        ("cfg-trunc", po::value(&trunc)->default_value(trunc),
         "guide step i (from 0) only while (i + 1) / steps <= this ratio")
        ("no-cfg-norm", po::bool_switch(&no_norm), "do not rescale the guided prediction to the conditional one's norm")
        ("seed", po::value(&seed)->default_value(seed), "seed of the initial noise")
        ("size", po::value(&size)->default_value(size), "WIDTHxHEIGHT in pixels")
        ("output,o", po::value(&output)->required(), "the PNG to write (RGB, 8 bits)")
        ("latent-in", po::value(&latent_in), "start from this latent (raw f32 [channels][height/s][width/s]) instead of the seeded noise")
        ("latent-out", po::value(&latent_out), "also write the final latent there (raw f32)")
        ("backend", po::value(&backend), "compute backend (default: the first loaded)")
        ("no-progress", po::bool_switch(&no_progress), "no progress bar even on a terminal");
    po::positional_options_description pos;
    pos.add("model", 1);
    po::variables_map vm;
    if (!parse_args("imagine", "MODEL -p PROMPT [--negative TEXT] [--steps 30] [--cfg 4.0] [--seed N] [--size 512x512] -o OUT.png",
                    args, desc, pos, vm))
        return 0;
    const auto [width, height] = parse_size(size);
    if (steps == 0) throw Failure("--steps must be >= 1", 2);
    RuntimePtr rt = make_runtime(common);
    ModelPtr m = open_model(rt.get(), model);
    cmf_image_pipeline_options po_;
    cmf_image_pipeline_options_init(&po_);
    po_.backend = backend.empty() ? nullptr : backend.c_str();
    const auto t_load = Clock::now();
    cmf_image_pipeline *raw = nullptr;
    check_code(cmf_image_pipeline_create(rt.get(), m.get(), &po_, &raw), model);
    const std::unique_ptr<cmf_image_pipeline, decltype(&cmf_image_pipeline_free)> pipe(raw, cmf_image_pipeline_free);
    const double load_s = seconds_since(t_load);
    cmf_image_pipeline_info info;
    cmf_image_pipeline_info_init(&info);
    check(cmf_image_pipeline_get_info(pipe.get(), &info));
    if (width % info.size_multiple != 0 || height % info.size_multiple != 0)
        throw Failure("--size " + size + ": width and height must be multiples of " + std::to_string(info.size_multiple), 2);
    const uint64_t n_latent = uint64_t(info.latent_channels) * (height / info.latent_scale) * (width / info.latent_scale);
    std::vector<float> lat_in, lat_out(latent_out.empty() ? 0 : n_latent);
    if (!latent_in.empty()) {
        lat_in = read_latent(latent_in);
        if (lat_in.size() != n_latent)
            throw Failure("--latent-in: " + latent_in + " holds " + std::to_string(lat_in.size()) + " floats; a " + size +
                              " image starts from " + std::to_string(n_latent) + " (" + std::to_string(info.latent_channels) +
                              " x " + std::to_string(height / info.latent_scale) + " x " +
                              std::to_string(width / info.latent_scale) + ")",
                          2);
    }
    io.width = width;
    io.height = height;
    io.steps = steps;
    io.guidance_scale = cfg;
    io.cfg_trunc_ratio = trunc;
    io.cfg_normalization = no_norm ? 0 : 1;
    io.seed = seed;
    io.prompt = prompt.c_str();
    io.negative_prompt = negative.c_str();
    if (!lat_in.empty()) {
        io.latent_in = lat_in.data();
        io.latent_in_len = lat_in.size();
    }
    if (!lat_out.empty()) {
        io.latent_out = lat_out.data();
        io.latent_out_len = lat_out.size();
    }
    StepBar bar;
    bar.tty = !no_progress && isatty(STDERR_FILENO);
    io.on_step = StepBar::on_step;
    io.user = &bar;
    std::vector<uint8_t> rgb(uint64_t(width) * height * 3);
    bar.t0 = Clock::now();
    bar.cpu_t0 = cpu_seconds();
    cmf_error *err = cmf_imagine(pipe.get(), &io, rgb.data(), rgb.size());
    const auto t_end = Clock::now();
    const double cpu_end = cpu_seconds();
    bar.end();
    check_code(err, "imagine");
    if (!latent_out.empty()) write_latent(latent_out, lat_out);
    write_png(output, rgb, width, height);
    // The first step also holds the prompt's encoding: s/step is measured
    // from the second on, and the time before it is reported apart.
    const double steps_s = std::chrono::duration<double>(bar.last - bar.first).count();
    const double per = steps > 1 ? steps_s / double(steps - 1) : std::chrono::duration<double>(bar.last - bar.t0).count();
    const double before = std::chrono::duration<double>(bar.first - bar.t0).count() - (steps > 1 ? per : 0.0);
    const double decode = std::chrono::duration<double>(t_end - bar.last).count();
    // The same split of this process's CPU seconds.
    const double cpu_per = steps > 1 ? (bar.cpu_last - bar.cpu_first) / double(steps - 1) : bar.cpu_last - bar.cpu_t0;
    const double cpu_before = bar.cpu_first - bar.cpu_t0 - (steps > 1 ? cpu_per : 0.0);
    std::fprintf(stderr,
                 "[%s: load %.2f s, prompt %.2f s, %u steps %.2f s/step, decode %.2f s; CPU: prompt %.2f s, %.2f s/step, "
                 "decode %.2f s]\n",
                 info.arch, load_s, std::max(0.0, before), steps, per, decode, std::max(0.0, cpu_before), cpu_per,
                 cpu_end - bar.cpu_last);
    std::printf("wrote %s (%ux%u)\n", output.c_str(), width, height);
    return 0;
}

}  // namespace cmfhost
