// The decoder half of diffusers' AutoencoderKL (autoencoder_kl.py,
// autoencoders/vae.py Decoder, resnet.py ResnetBlock2D, unet_2d_blocks.py
// UNetMidBlock2D / UpDecoderBlock2D, upsampling.py Upsample2D), tensors
// "vae.decoder.*" (and "vae.post_quant_conv.*" when the config uses one),
// computed through the backend's operations on HWC images:
//   z = latent / scaling_factor + shift_factor
//   [post_quant_conv 1x1]  conv_in 3x3
//   mid: resnet, single-head attention over all positions (GroupNorm, q/k/v
//        linears with bias, softmax(q k^T / sqrt(C)) v, out linear, residual), resnet
//   up blocks (widest first): layers_per_block + 1 resnets, then nearest 2x
//        + 3x3 conv, except after the last
//   GroupNorm, SiLU, conv_out 3x3 -> RGB
// Resnet: h = conv1(SiLU(GN1(x))), h = conv2(SiLU(GN2(h))), out = shortcut(x) + h
// (shortcut: a 1x1 conv when the channel count changes). GroupNorms: eps 1e-6.
#pragma once

#include "config.hpp"
#include "device.hpp"

#include "../common/binder.hpp"

#include <cstdint>
#include <vector>

namespace cmf::archs::lumina2 {

struct VaeResnet {
    uint64_t c_in = 0, c_out = 0;
    Weight n1w, n1b, c1, c1b, n2w, n2b, c2, c2b, sc, scb;  // sc: conv_shortcut, only when c_in != c_out
};

struct VaeUpBlock {
    uint64_t channels = 0;
    std::vector<VaeResnet> resnets;
    Weight up, up_b;  // upsamplers.0.conv, absent on the last block
};

class VaeDecoder {
public:
    VaeDecoder(const Device &d, const cmf_model_source *src, const VaeConfig &cfg);
    VaeDecoder(const VaeDecoder &) = delete;
    VaeDecoder &operator=(const VaeDecoder &) = delete;
    ~VaeDecoder();

    const VaeConfig &config() const { return c_; }
    // latent [latent_channels][h][w] (host) -> image [3][h s][w s] (host),
    // the decoder's raw output (about -1..1), s = config().scale().
    void decode(const float *latent, uint64_t h, uint64_t w, float *image);

private:
    // x (c_in channels) -> the resnet's output, in one of the scratch
    // buffers; returns which.
    float *resnet(const VaeResnet &r, float *x, uint64_t height, uint64_t width);
    void attention(float *x, uint64_t n_pos);
    float *other(const float *a, const float *b) const;  // the scratch buffer that is neither

    Device d_;
    VaeConfig c_;
    std::vector<cmf_backend_weight *> owned_;
    Weight pq, pq_b;                  // post_quant_conv (1x1), when the config uses it
    Weight conv_in, conv_in_b;
    VaeResnet mid0, mid1;
    bool has_attn = false;
    Weight an_w, an_b, aq, aq_b, ak, ak_b, av, av_b, ao, ao_b;  // mid_block.attentions.0
    std::vector<VaeUpBlock> up_;
    Weight norm_out_w, norm_out_b, conv_out, conv_out_b;
    Buffer s_[3];                     // scratch images, sized for the largest stage
    Buffer q_, k_, v_, a_;            // mid attention
};

}  // namespace cmf::archs::lumina2
