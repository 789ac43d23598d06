// The Next-DiT denoiser of Lumina-Image 2.0 (diffusers'
// Lumina2Transformer2DModel, transformer_lumina2.py), tensors "dit.*",
// computed through the backend's operations.
//
// One forward of diffusers at time t over caption features and a latent is
// split here by what each part depends on, so a sampling loop computes
// each part once:
//   - per prompt: the caption embedding (RMSNorm + linear) and the context
//     refiner blocks (unmodulated, captions only) -> caption();
//   - per step: the timestep embedding and, from it, every modulated
//     block's adaLN vector (scale_msa, gate_msa, scale_mlp, gate_mlp) and
//     the final layer's scale -> conditioning(); the same for both
//     classifier-free-guidance branches;
//   - per step: patchify + x_embedder and the noise refiner blocks (image
//     tokens only, modulated) -> image_tokens(); also shared by both
//     branches (all image tokens have the same first RoPE axis, so the
//     caption length, which sets it, drops out of their attention);
//   - per step and branch: the joint layers over [caption ; image], the
//     final layer and unpatchify -> velocity().
// Every block: x += gate * RMSNorm(attn(RMSNorm(x) * (1 + scale))) and the
// same around the SwiGLU FFN, attention with per-head RMSNorm on q and k,
// 3-axis RoPE on interleaved pairs, GQA, no mask (each sequence runs
// unpadded, so nothing needs masking).
#pragma once

#include "config.hpp"
#include "device.hpp"

#include "../common/binder.hpp"

#include <array>
#include <cstdint>
#include <vector>

namespace cmf::archs::lumina2 {

struct DitBlock {
    bool modulated = false;
    Weight ada, ada_b;          // norm1.linear [4H, T] and its bias (modulated blocks)
    Weight norm1;               // norm1.norm.weight (modulated) or norm1.weight
    Weight q, k, v, o;          // attn.to_q, to_k, to_v, to_out.0
    Weight q_norm, k_norm;      // attn.norm_q, norm_k: [head_dim]
    Weight norm2, ffn_norm1, ffn_norm2;
    Weight w1, w2, w3;          // feed_forward.linear_1 [F, H], linear_2 [H, F], linear_3 [F, H]
    uint64_t ffn = 0;
};

// RoPE angles of each token's three positions: [n][head_dim / 2][2] (cos,
// sin), pairs of axis 0, then 1, then 2; frequencies and angles in double
// as diffusers computes them (its freqs_cis are float64).
std::vector<float> rope_table(const DitConfig &c, const std::vector<std::array<uint64_t, 3>> &positions);
// Positions of a sequence of L caption tokens ((i, 0, 0)) followed by the
// image's patches in row-major order ((L, row, col)); CMF_ERR_BOUNDS when
// one exceeds the model's axes_lens.
std::vector<std::array<uint64_t, 3>> joint_positions(const DitConfig &c, uint64_t L, uint64_t rows, uint64_t cols);

class NextDit {
public:
    NextDit(const Device &d, const cmf_model_source *src, const DitConfig &cfg);
    NextDit(const NextDit &) = delete;
    NextDit &operator=(const NextDit &) = delete;
    ~NextDit();

    const DitConfig &config() const { return c_; }
    // Floats conditioning() writes: 4H per modulated block, then H.
    uint64_t conditioning_floats() const;

    // Caption features [L][cap_feat_dim] (host) -> refined caption tokens
    // [L][H] in `out` (device); rope: the first L rows of the sequence's table.
    void caption(const float *features, uint64_t L, const float *rope, Buffer &out);
    // The adaLN vectors at model time tau into `cond` (device).
    void conditioning(float tau, Buffer &cond);
    // The latent [C][h][w] (host) -> image tokens [N][H] after the noise
    // refiner in `out` (device); rope: the N image rows of a sequence's table.
    void image_tokens(const float *latent, uint64_t h, uint64_t w, const float *rope, const Buffer &cond, Buffer &out);
    // The velocity [C][h][w] (host) of a sequence [caption (L) ; image (N)]
    // whose tokens are in `seq` (device, [L + N][H], overwritten);
    // rope: the sequence's table.
    void velocity(Buffer &seq, uint64_t L, uint64_t h, uint64_t w, const float *rope, const Buffer &cond, float *out);

private:
    void block(const DitBlock &b, float *x, uint64_t n, const float *rope, const float *mod);
    void ensure_scratch(uint64_t n);

    Device d_;
    DitConfig c_;
    std::vector<cmf_backend_weight *> owned_;
    Weight x_emb, x_emb_b;                   // x_embedder [H, p*p*C]
    Weight t1, t1_b, t2, t2_b;               // time_caption_embed.timestep_embedder.linear_1 [T, 256], linear_2 [T, T]
    Weight cap_norm, cap_lin, cap_lin_b;     // time_caption_embed.caption_embedder.0 (RMSNorm), .1 [H, cap_feat]
    Weight out1, out1_b, out2, out2_b;       // norm_out.linear_1 [H, T], linear_2 [p*p*C, H]
    std::vector<DitBlock> noise_, context_, layers_;
    uint64_t max_ffn_ = 0;
    // Scratch, grown to the longest sequence seen.
    uint64_t cap_ = 0;
    Buffer xn_, q_, k_, v_, attn_, tmp_, gate_, up_, io_, temb_;
};

}  // namespace cmf::archs::lumina2
