#include "runtime/image_pipeline.hpp"

#include "common/error.hpp"
#include "common/splitmix64.hpp"
#include "plugin_host/runtime.hpp"
#include "runtime/session.hpp"

#include <cmath>
#include <cstddef>
#include <numbers>

namespace cmf::runtime {

std::vector<float> gaussian_noise(uint64_t n, uint64_t seed) {
    std::vector<float> out;
    out.reserve(n);
    uint64_t state = seed;
    auto uniform = [&] { return double(splitmix64_next(state) >> 11) / double(uint64_t(1) << 53); };
    while (out.size() < n) {
        const double a = std::max(uniform(), 1e-300), b = uniform();
        const double r = std::sqrt(-2.0 * std::log(a)), angle = 2.0 * std::numbers::pi * b;
        out.push_back(float(r * std::cos(angle)));
        if (out.size() < n) out.push_back(float(r * std::sin(angle)));
    }
    return out;
}

std::string render_template(const std::string &tmpl, const std::string &text) {
    static const std::string mark = "{prompt}";
    std::string out;
    size_t at = 0;
    for (size_t p; (p = tmpl.find(mark, at)) != std::string::npos; at = p + mark.size()) out += tmpl.substr(at, p - at) + text;
    return out + tmpl.substr(at);
}

namespace {

bool has_pipeline_members(const cmf_arch_vt &vt) {
    return vt.struct_size >= offsetof(cmf_arch_vt, text_to_image) + sizeof(void *) && vt.pipeline_create &&
           vt.pipeline_free && vt.pipeline_info && vt.text_to_image;
}

}  // namespace

ImagePipeline::ImagePipeline(Runtime &rt, std::shared_ptr<const cmf_model_source> src, std::string_view vocab,
                             const std::string &backend, const std::string &arch_options)
    : rt_(rt), src_(std::move(src)) {
    arch_name_ = arch_name_of(src_->arch_json, src_->arch_json_len);
    arch_ = rt.arch_for(arch_name_);
    if (arch_ == nullptr) throw Error(CMF_ERR_UNSUPPORTED, "no arch plugin runs arch_name \"" + arch_name_ + "\"");
    if (!has_pipeline_members(arch_->vt))
        throw Error(CMF_ERR_UNSUPPORTED, "arch \"" + arch_name_ + "\" (plugin '" + arch_->name +
                                             "') is not an image pipeline: run it as a text model (a session)");
    const BackendEntry *be = rt.backend(backend);
    if (be == nullptr)
        throw Error(CMF_ERR_NOT_FOUND, backend.empty() ? std::string("no compute backend is loaded")
                                                       : "no backend named \"" + backend + "\"");
    if (vocab.empty())
        throw Error(CMF_ERR_NOT_FOUND, "the pipeline file has no tokenizer (vocab section): it cannot turn a prompt into tokens");
    tokenizer_ = text::Tokenizer::from_json(vocab);
    cmf_arch_model_params params{};
    params.struct_size = sizeof params;
    params.options = arch_options.empty() ? nullptr : arch_options.c_str();
    throw_if_error(arch_->vt.pipeline_create(arch_->ctx, src_.get(), &be->vt, be->ctx, &params, &pipeline_),
                   "arch '" + arch_->name + "'");
    try {
        cmf_pipeline_info pi{};
        pi.struct_size = sizeof pi;
        throw_if_error(arch_->vt.pipeline_info(arch_->ctx, pipeline_, &pi), "arch '" + arch_->name + "'");
        if (pi.kind != CMF_PIPELINE_TEXT_TO_IMAGE)
            throw Error(CMF_ERR_UNSUPPORTED, "arch '" + arch_->name + "' runs a pipeline of kind " + std::to_string(pi.kind) +
                                                 ", not text to image");
        if (pi.latent_channels == 0 || pi.latent_scale == 0 || pi.size_multiple == 0 || pi.max_text_tokens == 0)
            throw Error(CMF_ERR_PLUGIN, "arch '" + arch_->name + "' gave a pipeline_info with zero sizes");
        description_ = pi.description ? pi.description : "";
        prompt_template_ = pi.prompt_template ? pi.prompt_template : "{prompt}";
        negative_template_ = pi.negative_template ? pi.negative_template : "{prompt}";
        info_.struct_size = sizeof info_;
        info_.latent_channels = pi.latent_channels;
        info_.latent_scale = pi.latent_scale;
        info_.size_multiple = pi.size_multiple;
        info_.max_text_tokens = pi.max_text_tokens;
        info_.arch = arch_->name.c_str();
        info_.description = description_.c_str();
    } catch (...) {
        arch_->vt.pipeline_free(arch_->ctx, pipeline_);
        throw;
    }
}

ImagePipeline::~ImagePipeline() { arch_->vt.pipeline_free(arch_->ctx, pipeline_); }

std::vector<int32_t> ImagePipeline::tokens(const std::string &tmpl, const std::string &text) const {
    std::vector<int32_t> ids = tokenizer_->encode(render_template(tmpl, text), true);
    if (ids.size() > info_.max_text_tokens) ids.resize(info_.max_text_tokens);
    return ids;
}

void ImagePipeline::imagine(const cmf_imagine_options &o, uint8_t *rgb, uint64_t rgb_len) {
    const uint32_t m = info_.size_multiple, s = info_.latent_scale;
    if (o.width == 0 || o.height == 0 || o.width % m != 0 || o.height % m != 0)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "imagine: width and height must be nonzero multiples of " + std::to_string(m) +
                                                  " (got " + std::to_string(o.width) + "x" + std::to_string(o.height) + ")");
    if (o.steps == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "imagine: steps must be >= 1");
    const uint64_t n_latent = uint64_t(info_.latent_channels) * (o.height / s) * (o.width / s);
    const uint64_t n_pixels = uint64_t(o.width) * o.height;
    std::vector<float> noise;
    const float *latent_in = o.latent_in;
    if (latent_in != nullptr) {
        if (o.latent_in_len != n_latent)
            throw Error(CMF_ERR_INVALID_ARGUMENT, "imagine: latent_in holds " + std::to_string(o.latent_in_len) +
                                                      " floats; a " + std::to_string(o.width) + "x" + std::to_string(o.height) +
                                                      " image starts from " + std::to_string(n_latent) + " (" +
                                                      std::to_string(info_.latent_channels) + " x " +
                                                      std::to_string(o.height / s) + " x " + std::to_string(o.width / s) + ")");
    } else {
        noise = gaussian_noise(n_latent, o.seed);
        latent_in = noise.data();
    }
    if (o.latent_out != nullptr && o.latent_out_len != n_latent)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "imagine: latent_out holds " + std::to_string(o.latent_out_len) +
                                                  " floats, the latent " + std::to_string(n_latent));
    if (rgb != nullptr && rgb_len != n_pixels * 3)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "imagine: rgb holds " + std::to_string(rgb_len) + " bytes, the image " +
                                                  std::to_string(n_pixels * 3));
    if (rgb == nullptr && rgb_len != 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "imagine: NULL rgb with a nonzero rgb_len");
    const std::vector<int32_t> prompt = tokens(prompt_template_, o.prompt ? o.prompt : "");
    const std::vector<int32_t> negative = tokens(negative_template_, o.negative_prompt ? o.negative_prompt : "");
    std::vector<float> planes(rgb != nullptr ? n_pixels * 3 : 0);
    cmf_text_to_image_args a{};
    a.struct_size = sizeof a;
    a.width = o.width;
    a.height = o.height;
    a.steps = o.steps;
    a.guidance_scale = o.guidance_scale;
    a.cfg_trunc_ratio = o.cfg_trunc_ratio;
    a.cfg_normalization = o.cfg_normalization;
    a.n_prompt = uint32_t(prompt.size());
    a.prompt = prompt.data();
    a.negative = negative.data();
    a.n_negative = uint32_t(negative.size());
    a.latent_in = latent_in;
    a.latent_out = o.latent_out;
    a.image = rgb != nullptr ? planes.data() : nullptr;
    a.on_step = o.on_step;
    a.user = o.user;
    throw_if_error(arch_->vt.text_to_image(arch_->ctx, pipeline_, &a), "arch '" + arch_->name + "'");
    // As diffusers' image processor: (v * 255) in f32, rounded half to even.
    for (uint64_t p = 0; p < n_pixels && rgb != nullptr; ++p)
        for (uint64_t c = 0; c < 3; ++c) {
            const float v = std::clamp(planes[c * n_pixels + p], 0.0f, 1.0f) * 255.0f;
            rgb[p * 3 + c] = uint8_t(std::nearbyint(v));
        }
}

}  // namespace cmf::runtime
