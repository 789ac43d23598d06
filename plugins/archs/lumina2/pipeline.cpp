#include "pipeline.hpp"

#include "../common/arch_config.hpp"
#include "../gemma/choices.hpp"
#include "../gemma/hf_import.hpp"

#include <cmf/options.hpp>
#include <cmf/plugin.hpp>

#include <cmath>
#include <cstring>
#include <string>

namespace cmf::archs::lumina2 {

using cmf::sdk::Error;

std::vector<float> sigmas(const SchedulerConfig &s, uint32_t steps) {
    // numpy's linspace(1, 1/N, N) in float64 (i * step + start, the last
    // point exactly the stop), cast to float32; the shift in float32.
    std::vector<float> out(steps + 1, 0.0f);
    const double stop = 1.0 / double(steps);
    const double step = steps > 1 ? (stop - 1.0) / double(steps - 1) : 0.0;
    const float shift = float(s.shift);
    for (uint32_t i = 0; i < steps; ++i) {
        const float x = float(i + 1 == steps ? stop : double(i) * step + 1.0);
        out[i] = (shift * x) / (1.0f + (shift - 1.0f) * x);
    }
    return out;
}

Pipeline::Pipeline(const cmf_host_api *host, const cmf_model_source *src, const cmf_backend_vt *be, void *be_ctx,
                   const char *options) {
    if (src == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: NULL model source");
    require_image_ops(be);
    for (const cmf::sdk::OptionItem &item : cmf::sdk::split_options(options))
        throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: unknown pipeline option \"" + item.key + "\" (it takes none)");
    d_ = Device{host, be, be_ctx};
    // The header's arch block describes the text encoder only roughly (the
    // original packer leaves its Gemma keys out): te.config_json decides.
    const std::string te_json = *config_text(host, src, "te.config_json");
    const std::string te_arch = gemma::import_config(te_json);
    const ArchConfig te_cfg = parse_arch_config(te_arch.data(), te_arch.size());
    if (te_cfg.num_layers < 2)
        throw Error(CMF_ERR_UNSUPPORTED, "lumina2: the text encoder needs at least 2 layers (its features are hidden_states[-2])");
    DecoderChoices ch = gemma::choices(te_cfg);
    ch.family = "lumina2 text encoder";
    te_ = create_decoder(host, src, be, be_ctx, nullptr, te_cfg, std::move(ch), DecoderNames{"te.", ""});
    const uint64_t te_ctx = te_cfg.max_position_embeddings ? std::min<uint64_t>(kMaxTextTokens, te_cfg.max_position_embeddings)
                                                           : kMaxTextTokens;
    te_state_ = create_decoder_state(*te_, te_ctx);
    const DitConfig dc = parse_dit_config(*config_text(host, src, "dit.config_json"));
    const VaeConfig vc = parse_vae_config(*config_text(host, src, "vae.config_json"));
    if (auto sj = config_text(host, src, "scheduler.config_json", true)) sched_ = parse_scheduler_config(*sj);
    if (dc.cap_feat_dim != te_cfg.hidden_size)
        throw Error(CMF_ERR_PARSE, "lumina2: dit.config_json cap_feat_dim " + std::to_string(dc.cap_feat_dim) +
                                       " differs from the text encoder's hidden_size " + std::to_string(te_cfg.hidden_size));
    if (dc.in_channels != vc.latent_channels)
        throw Error(CMF_ERR_PARSE, "lumina2: dit.config_json in_channels " + std::to_string(dc.in_channels) +
                                       " differs from vae.config_json latent_channels " + std::to_string(vc.latent_channels));
    dit_ = std::make_unique<NextDit>(d_, src, dc);
    vae_ = std::make_unique<VaeDecoder>(d_, src, vc);
    description_ = "Lumina-Image 2.0: Gemma-2 text encoder (" + std::to_string(te_cfg.num_layers) + " layers, hidden " +
                   std::to_string(te_cfg.hidden_size) + "), Next-DiT (" + std::to_string(dc.layers) + " layers + " +
                   std::to_string(dc.refiner_layers) + "+" + std::to_string(dc.refiner_layers) + " refiners, hidden " +
                   std::to_string(dc.hidden) + ", patch " + std::to_string(dc.patch) + "), VAE decoder (" +
                   std::to_string(vc.block_out.size()) + " blocks, " + std::to_string(vc.latent_channels) +
                   " latent channels, " + std::to_string(vc.scale()) + "x)";
    prompt_template_ = std::string(kSystemPrompt) + " <Prompt Start> {prompt}";
}

void Pipeline::info(cmf_pipeline_info &out) const {
    out = cmf_pipeline_info{};
    out.struct_size = sizeof out;
    out.kind = CMF_PIPELINE_TEXT_TO_IMAGE;
    out.description = description_.c_str();
    out.prompt_template = prompt_template_.c_str();
    out.negative_template = "{prompt}";
    out.max_text_tokens = uint32_t(te_state_->n_ctx);
    out.latent_channels = uint32_t(dit_->config().in_channels);
    out.latent_scale = uint32_t(vae_->config().scale());
    out.size_multiple = uint32_t(vae_->config().scale() * dit_->config().patch);
}

std::vector<float> Pipeline::encode(const int32_t *ids, uint64_t n) {
    if (n == 0 || ids == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: a text of no tokens (it needs at least <bos>)");
    if (n > te_state_->n_ctx)
        throw Error(CMF_ERR_BOUNDS, "lumina2: " + std::to_string(n) + " text tokens exceed the text encoder's " +
                                        std::to_string(te_state_->n_ctx));
    truncate_decoder_state(*te_state_, 0);
    std::vector<float> hidden(n * te_->cfg.hidden_size);
    DecoderStep step;
    step.tokens = ids;
    step.n_tokens = n;
    step.n_layers = te_->layers.size() - 1;  // hidden_states[-2]
    step.hidden = hidden.data();
    decoder_forward(*te_, *te_state_, step);
    return hidden;
}

void Pipeline::velocity(const float *features, uint64_t L, const float *latent, uint64_t h, uint64_t w, float tau,
                        float *out) {
    const DitConfig &dc = dit_->config();
    if (L == 0 || h == 0 || w == 0 || h % dc.patch != 0 || w % dc.patch != 0)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: velocity needs caption tokens and a latent of whole patches");
    const uint64_t rows = h / dc.patch, cols = w / dc.patch, N = rows * cols, H = dc.hidden;
    const std::vector<float> table = rope_table(dc, joint_positions(dc, L, rows, cols));
    Buffer rope(d_, table.size()), cap, cond, img, seq(d_, (L + N) * H);
    rope.write(table.data(), table.size());
    dit_->caption(features, L, rope.get(), cap);
    dit_->conditioning(tau, cond);
    dit_->image_tokens(latent, h, w, rope.get() + L * dc.head_dim, cond, img);
    check(d_.be->copy(d_.ctx, seq.get(), cap.get(), L * H));
    check(d_.be->copy(d_.ctx, seq.get() + L * H, img.get(), N * H));
    dit_->velocity(seq, L, h, w, rope.get(), cond, out);
}

namespace {

// One classifier-free-guidance branch: its caption's tokens through the
// context refiner and the RoPE table of [caption ; image].
struct Branch {
    uint64_t L = 0;
    Buffer rope, cap;
};

}  // namespace

void Pipeline::text_to_image(const cmf_text_to_image_args &a) {
    const DitConfig &dc = dit_->config();
    const uint64_t s = vae_->config().scale(), mult = s * dc.patch, C = dc.in_channels, H = dc.hidden, hd = dc.head_dim;
    if (a.width == 0 || a.height == 0 || a.width % mult != 0 || a.height % mult != 0)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: the image size " + std::to_string(a.width) + "x" +
                                                  std::to_string(a.height) + " must be a nonzero multiple of " +
                                                  std::to_string(mult) + " on each side");
    if (a.steps == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: steps must be >= 1");
    if (a.latent_in == nullptr) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: no initial latent (latent_in)");
    if (!std::isfinite(a.guidance_scale) || !std::isfinite(a.cfg_trunc_ratio))
        throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: guidance_scale and cfg_trunc_ratio must be finite");
    const uint64_t h = a.height / s, w = a.width / s, rows = h / dc.patch, cols = w / dc.patch, N = rows * cols;
    const uint64_t n_lat = C * h * w;
    // Guidance runs on step i (from 0) while (i + 1) / steps <= cfg_trunc_ratio.
    auto guided = [&](uint32_t i) {
        return a.guidance_scale > 1.0f && double(i + 1) / double(a.steps) <= double(a.cfg_trunc_ratio);
    };
    const bool any_guided = guided(0);
    if (any_guided && (a.n_negative == 0 || a.negative == nullptr))
        throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: guidance needs the negative prompt's token ids (at least <bos>)");

    Branch branch[2];
    for (int b = 0; b < (any_guided ? 2 : 1); ++b) {
        const int32_t *ids = b == 0 ? a.prompt : a.negative;
        const uint64_t n = b == 0 ? a.n_prompt : a.n_negative;
        const std::vector<float> feats = encode(ids, n);
        Branch &br = branch[b];
        br.L = n;
        const std::vector<float> table = rope_table(dc, joint_positions(dc, n, rows, cols));
        br.rope.ensure(d_, table.size());
        br.rope.write(table.data(), table.size());
        dit_->caption(feats.data(), n, br.rope.get(), br.cap);
    }

    std::vector<float> x(a.latent_in, a.latent_in + n_lat), vc(n_lat), vu(n_lat);
    const std::vector<float> sig = sigmas(sched_, a.steps);
    const float train = float(sched_.train_steps);
    Buffer cond, img, seq;
    auto velocity = [&](Branch &br, float *out) {
        seq.ensure(d_, (br.L + N) * H);
        check(d_.be->copy(d_.ctx, seq.get(), br.cap.get(), br.L * H));
        check(d_.be->copy(d_.ctx, seq.get() + br.L * H, img.get(), N * H));
        dit_->velocity(seq, br.L, h, w, br.rope.get(), cond, out);
    };
    for (uint32_t i = 0; i < a.steps; ++i) {
        // diffusers: timesteps = sigmas * num_train_timesteps; the model
        // sees 1 - t / num_train_timesteps (all f32).
        const float t = sig[i] * train;
        const float tau = 1.0f - t / train;
        dit_->conditioning(tau, cond);
        // The image tokens' RoPE rows: any branch's (they differ only in
        // the first axis, the same for every image token).
        dit_->image_tokens(x.data(), h, w, branch[0].rope.get() + branch[0].L * hd, cond, img);
        velocity(branch[0], vc.data());
        const float *v = vc.data();
        if (guided(i)) {
            velocity(branch[1], vu.data());
            const float g = a.guidance_scale;
            for (uint64_t j = 0; j < n_lat; ++j) vu[j] = vu[j] + g * (vc[j] - vu[j]);
            if (a.cfg_normalization) {
                // Each latent row (channel, y) scaled to the conditional
                // prediction's norm along the last axis.
                for (uint64_t r = 0; r < C * h; ++r) {
                    double nc = 0, ng = 0;
                    for (uint64_t j = r * w; j < (r + 1) * w; ++j) {
                        nc += double(vc[j]) * vc[j];
                        ng += double(vu[j]) * vu[j];
                    }
                    const float f = float(std::sqrt(nc)) / float(std::sqrt(ng));
                    for (uint64_t j = r * w; j < (r + 1) * w; ++j) vu[j] = vu[j] * f;
                }
            }
            v = vu.data();
        }
        const float dt = sig[i + 1] - sig[i];
        for (uint64_t j = 0; j < n_lat; ++j) x[j] = x[j] + dt * -v[j];
        if (a.on_step != nullptr && a.on_step(a.user, i + 1, a.steps) != 0)
            throw Error(CMF_ERR_CANCELLED, "lumina2: cancelled after step " + std::to_string(i + 1) + " of " +
                                               std::to_string(a.steps));
    }
    if (a.latent_out != nullptr) std::memcpy(a.latent_out, x.data(), n_lat * sizeof(float));
    if (a.image == nullptr) return;
    vae_->decode(x.data(), h, w, a.image);
    const uint64_t px = uint64_t(3) * a.width * a.height;
    for (uint64_t j = 0; j < px; ++j) a.image[j] = std::clamp(a.image[j] / 2.0f + 0.5f, 0.0f, 1.0f);
}

}  // namespace cmf::archs::lumina2
