// Lumina-Image 2.0 text to image from one pipeline container (diffusers'
// Lumina2Pipeline, pipeline_lumina2.py): the Gemma-2 text encoder ("te.*",
// the shared decoder with the Gemma choices, its config from
// te.config_json), the Next-DiT ("dit.*") and the VAE decoder ("vae.*"),
// sampled with FlowMatchEulerDiscreteScheduler's static shift.
//
//   caption features = the encoder's hidden_states[-2]: the residual stream
//     after all layers but the last, over the prompt's valid tokens (the
//     host renders "{system prompt} <Prompt Start> {prompt}", tokenizes with
//     <bos> and truncates to 256; padding on the right of a causal encoder
//     changes none of the valid rows, so none is added);
//   sigma_i = s x / (1 + (s - 1) x), x = linspace(1, 1/N, N)_i, sigma_N = 0,
//     in f32 as diffusers; model time tau_i = 1 - (1000 sigma_i) / 1000;
//   v = DiT(X, caption, tau_i); with guidance (scale > 1, while
//     (i + 1) / N <= cfg_trunc_ratio): v = v_u + g (v_c - v_u), rescaled per
//     latent row (last axis) to |v_c| / |v| when cfg_normalization;
//   X <- X + (sigma_{i+1} - sigma_i) (-v)   (Lumina predicts towards the image);
//   image = clamp(VAE(X) / 2 + 0.5, 0, 1).
#pragma once

#include "config.hpp"
#include "device.hpp"
#include "nextdit.hpp"
#include "vae.hpp"

#include "../common/decoder.hpp"

#include <memory>
#include <string>
#include <vector>

namespace cmf::archs::lumina2 {

// The system prompt Lumina2Pipeline puts before every prompt.
inline constexpr const char *kSystemPrompt =
    "You are an assistant designed to generate superior images with the superior degree of image-text alignment "
    "based on textual prompts or user prompts.";
inline constexpr uint32_t kMaxTextTokens = 256;  // max_sequence_length

// The step sizes of the flow-matching Euler scheduler: steps + 1 sigmas
// (the last 0), in f32 as diffusers computes them.
std::vector<float> sigmas(const SchedulerConfig &s, uint32_t steps);

class Pipeline {
public:
    Pipeline(const cmf_host_api *host, const cmf_model_source *src, const cmf_backend_vt *be, void *be_ctx,
             const char *options);
    Pipeline(const Pipeline &) = delete;
    Pipeline &operator=(const Pipeline &) = delete;

    void info(cmf_pipeline_info &out) const;
    void text_to_image(const cmf_text_to_image_args &a);

    // The components, for tests that check them one at a time.
    // Caption features [n][te hidden] of token ids: hidden_states[-2].
    std::vector<float> encode(const int32_t *ids, uint64_t n);
    // One DiT evaluation as diffusers' transformer call: velocity [C][h][w]
    // of the latent [C][h][w] at model time tau under caption features
    // [L][te hidden] (what a sampling step computes per guidance branch).
    void velocity(const float *features, uint64_t L, const float *latent, uint64_t h, uint64_t w, float tau, float *out);
    NextDit &dit() { return *dit_; }
    VaeDecoder &vae() { return *vae_; }
    const SchedulerConfig &scheduler() const { return sched_; }

private:
    Device d_;
    std::string description_, prompt_template_;
    std::unique_ptr<DecoderModel> te_;
    std::unique_ptr<DecoderState> te_state_;
    std::unique_ptr<NextDit> dit_;
    std::unique_ptr<VaeDecoder> vae_;
    SchedulerConfig sched_;
};

}  // namespace cmf::archs::lumina2
