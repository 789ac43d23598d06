#include "vae.hpp"

#include <cmf/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace cmf::archs::lumina2 {

using cmf::sdk::Error;

namespace {

constexpr float kNormEps = 1e-6f;  // resnet_eps of the decoder's blocks and conv_norm_out

VaeResnet bind_resnet(Binder &b, const std::string &p, uint64_t c_in, uint64_t c_out) {
    VaeResnet r;
    r.c_in = c_in;
    r.c_out = c_out;
    r.n1w = b.bind(p + "norm1.weight", {c_in});
    r.n1b = b.bind(p + "norm1.bias", {c_in});
    r.c1 = b.bind_flat(p + "conv1.weight", {c_out, c_in, 3, 3});
    r.c1b = b.bind(p + "conv1.bias", {c_out});
    r.n2w = b.bind(p + "norm2.weight", {c_out});
    r.n2b = b.bind(p + "norm2.bias", {c_out});
    r.c2 = b.bind_flat(p + "conv2.weight", {c_out, c_out, 3, 3});
    r.c2b = b.bind(p + "conv2.bias", {c_out});
    if (c_in != c_out) {
        r.sc = b.bind_flat(p + "conv_shortcut.weight", {c_out, c_in, 1, 1});
        r.scb = b.bind(p + "conv_shortcut.bias", {c_out});
    }
    return r;
}

}  // namespace

VaeDecoder::VaeDecoder(const Device &d, const cmf_model_source *src, const VaeConfig &cfg) : d_(d), c_(cfg) {
    try {
        Binder b(src, d.be, d.ctx, "vae.", owned_);
        const uint64_t lat = c_.latent_channels, top = c_.block_out.back();
        if (c_.post_quant_conv) {
            if (!b.present("post_quant_conv.weight"))
                throw Error(CMF_ERR_MISSING_TENSOR, "lumina2: vae.config_json says use_post_quant_conv but the file has no "
                                                    "vae.post_quant_conv.weight (a packer that kept only the decoder)");
            pq = b.bind_flat("post_quant_conv.weight", {lat, lat, 1, 1});
            pq_b = b.bind("post_quant_conv.bias", {lat});
        }
        conv_in = b.bind_flat("decoder.conv_in.weight", {top, lat, 3, 3});
        conv_in_b = b.bind("decoder.conv_in.bias", {top});
        mid0 = bind_resnet(b, "decoder.mid_block.resnets.0.", top, top);
        mid1 = bind_resnet(b, "decoder.mid_block.resnets.1.", top, top);
        has_attn = c_.mid_attention;
        if (has_attn) {
            const std::string p = "decoder.mid_block.attentions.0.";
            an_w = b.bind(p + "group_norm.weight", {top});
            an_b = b.bind(p + "group_norm.bias", {top});
            aq = b.bind(p + "to_q.weight", {top, top});
            aq_b = b.bind(p + "to_q.bias", {top});
            ak = b.bind(p + "to_k.weight", {top, top});
            ak_b = b.bind(p + "to_k.bias", {top});
            av = b.bind(p + "to_v.weight", {top, top});
            av_b = b.bind(p + "to_v.bias", {top});
            ao = b.bind(p + "to_out.0.weight", {top, top});
            ao_b = b.bind(p + "to_out.0.bias", {top});
        }
        const uint64_t n = c_.block_out.size();
        uint64_t prev = top;
        for (uint64_t i = 0; i < n; ++i) {
            VaeUpBlock u;
            u.channels = c_.block_out[n - 1 - i];
            const std::string p = "decoder.up_blocks." + std::to_string(i) + ".";
            for (uint64_t r = 0; r <= c_.layers_per_block; ++r)
                u.resnets.push_back(bind_resnet(b, p + "resnets." + std::to_string(r) + ".", r == 0 ? prev : u.channels, u.channels));
            if (i + 1 < n) {
                u.up = b.bind_flat(p + "upsamplers.0.conv.weight", {u.channels, u.channels, 3, 3});
                u.up_b = b.bind(p + "upsamplers.0.conv.bias", {u.channels});
            }
            prev = u.channels;
            up_.push_back(std::move(u));
        }
        norm_out_w = b.bind("decoder.conv_norm_out.weight", {c_.block_out[0]});
        norm_out_b = b.bind("decoder.conv_norm_out.bias", {c_.block_out[0]});
        conv_out = b.bind_flat("decoder.conv_out.weight", {c_.out_channels, c_.block_out[0], 3, 3});
        conv_out_b = b.bind("decoder.conv_out.bias", {c_.out_channels});
    } catch (...) {
        for (auto *w : owned_) d_.be->weight_free(d_.ctx, w);
        throw;
    }
}

VaeDecoder::~VaeDecoder() {
    for (Buffer &s : s_) s.release();
    for (auto *w : owned_) d_.be->weight_free(d_.ctx, w);
}

float *VaeDecoder::other(const float *a, const float *b) const {
    for (const Buffer &s : s_)
        if (s.get() != a && s.get() != b) return s.get();
    throw Error(CMF_ERR_INTERNAL, "lumina2: vae scratch buffers exhausted");
}

float *VaeDecoder::resnet(const VaeResnet &r, float *x, uint64_t hh, uint64_t ww) {
    const cmf_backend_vt *be = d_.be;
    void *bc = d_.ctx;
    const uint32_t g = uint32_t(c_.groups);
    const uint64_t n = hh * ww;
    float *t1 = other(x, nullptr);
    float *t2 = other(x, t1);
    // h = conv1(SiLU(GN1(x))) into t2, then h = conv2(SiLU(GN2(h))) into t2.
    check(be->group_norm(bc, x, r.n1w.w, r.n1b.w, n, r.c_in, g, kNormEps, t1));
    check(be->activation(bc, t1, n * r.c_in, CMF_ACT_SILU, t1));
    check(be->conv2d(bc, r.c1.w, r.c1b.w, t1, hh, ww, r.c_in, 3, 3, 1, t2));
    check(be->group_norm(bc, t2, r.n2w.w, r.n2b.w, n, r.c_out, g, kNormEps, t1));
    check(be->activation(bc, t1, n * r.c_out, CMF_ACT_SILU, t1));
    check(be->conv2d(bc, r.c2.w, r.c2b.w, t1, hh, ww, r.c_out, 3, 3, 1, t2));
    if (r.sc) {  // shortcut(x) + h
        check(be->conv2d(bc, r.sc.w, r.scb.w, x, hh, ww, r.c_in, 1, 1, 0, t1));
        check(be->add(bc, t1, t2, n * r.c_out));
        return t1;
    }
    check(be->add(bc, t2, x, n * r.c_out));
    return t2;
}

void VaeDecoder::attention(float *x, uint64_t n) {
    const cmf_backend_vt *be = d_.be;
    void *bc = d_.ctx;
    const uint64_t C = c_.block_out.back();
    float *t = other(x, nullptr);
    q_.ensure(d_, n * C);
    k_.ensure(d_, n * C);
    v_.ensure(d_, n * C);
    a_.ensure(d_, n * C);
    check(be->group_norm(bc, x, an_w.w, an_b.w, n, C, uint32_t(c_.groups), kNormEps, t));
    for (auto [w, b, y] : {std::tuple{&aq, &aq_b, q_.get()}, std::tuple{&ak, &ak_b, k_.get()}, std::tuple{&av, &av_b, v_.get()}}) {
        check(be->matmul(bc, w->w, t, n, y));
        check(be->add_bias(bc, y, b->w, n, C));
    }
    // One head of all C channels: scale 1/sqrt(C).
    check(be->attention_full(bc, q_.get(), k_.get(), v_.get(), a_.get(), n, n, 1, 1, uint32_t(C),
                             float(1.0 / std::sqrt(double(C))), nullptr));
    check(be->matmul(bc, ao.w, a_.get(), n, t));
    check(be->add_bias(bc, t, ao_b.w, n, C));
    check(be->add(bc, x, t, n * C));
}

void VaeDecoder::decode(const float *latent, uint64_t h, uint64_t w, float *image) {
    const cmf_backend_vt *be = d_.be;
    void *bc = d_.ctx;
    const uint64_t lat = c_.latent_channels, top = c_.block_out.back(), n0 = h * w;
    if (h == 0 || w == 0) throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: empty latent");
    // The largest image any stage holds: each up block's input and output
    // channels at its resolution, and its upsampled output at twice it.
    uint64_t need = n0 * std::max(lat, top), res = n0, prev = top;
    for (size_t i = 0; i < up_.size(); ++i) {
        need = std::max(need, res * std::max(prev, up_[i].channels));
        if (up_[i].up) res *= 4;
        need = std::max(need, res * up_[i].channels);
        prev = up_[i].channels;
    }
    for (Buffer &s : s_) s.ensure(d_, need);
    // z = latent / scaling_factor + shift_factor, as an HWC image.
    std::vector<float> z(n0 * lat);
    const float sf = float(c_.scaling_factor), sh = float(c_.shift_factor);
    for (uint64_t c = 0; c < lat; ++c)
        for (uint64_t p = 0; p < n0; ++p) z[p * lat + c] = latent[c * n0 + p] / sf + sh;
    s_[0].write(z.data(), z.size());
    float *cur = s_[0].get();
    if (pq) {
        float *o = other(cur, nullptr);
        check(be->conv2d(bc, pq.w, pq_b.w, cur, h, w, lat, 1, 1, 0, o));
        cur = o;
    }
    float *o = other(cur, nullptr);
    check(be->conv2d(bc, conv_in.w, conv_in_b.w, cur, h, w, lat, 3, 3, 1, o));
    cur = resnet(mid0, o, h, w);
    if (has_attn) attention(cur, n0);
    cur = resnet(mid1, cur, h, w);
    uint64_t hh = h, ww = w;
    for (const VaeUpBlock &u : up_) {
        for (const VaeResnet &r : u.resnets) cur = resnet(r, cur, hh, ww);
        if (!u.up) continue;
        float *big = other(cur, nullptr);
        check(be->upsample2x(bc, cur, hh, ww, u.channels, big));
        hh *= 2, ww *= 2;
        float *conv = other(big, nullptr);
        check(be->conv2d(bc, u.up.w, u.up_b.w, big, hh, ww, u.channels, 3, 3, 1, conv));
        cur = conv;
    }
    const uint64_t c0 = c_.block_out[0], n = hh * ww;
    float *t = other(cur, nullptr);
    check(be->group_norm(bc, cur, norm_out_w.w, norm_out_b.w, n, c0, uint32_t(c_.groups), kNormEps, t));
    check(be->activation(bc, t, n * c0, CMF_ACT_SILU, t));
    float *rgb = other(t, nullptr);
    check(be->conv2d(bc, conv_out.w, conv_out_b.w, t, hh, ww, c0, 3, 3, 1, rgb));
    std::vector<float> hwc(n * c_.out_channels);
    check(be->buffer_read(bc, hwc.data(), rgb, hwc.size() * sizeof(float)));
    for (uint64_t c = 0; c < c_.out_channels; ++c)
        for (uint64_t p = 0; p < n; ++p) image[c * n + p] = hwc[p * c_.out_channels + c];
}

}  // namespace cmf::archs::lumina2
