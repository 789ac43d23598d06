#include "nextdit.hpp"

#include <cmf/plugin.hpp>

#include <cmath>
#include <string>

namespace cmf::archs::lumina2 {

using cmf::sdk::Error;

namespace {

constexpr uint64_t kFreqDim = 256;       // Timesteps(num_channels=256)
constexpr float kAttnNormEps = 1e-5f;    // Attention(qk_norm="rms_norm", eps=1e-5)
constexpr float kFinalNormEps = 1e-6f;   // LuminaLayerNormContinuous(eps=1e-6)

DitBlock bind_block(Binder &b, const DitConfig &c, const std::string &p, bool modulated) {
    const uint64_t H = c.hidden, hd = c.head_dim;
    DitBlock k;
    k.modulated = modulated;
    if (modulated) {
        k.ada = b.bind(p + "norm1.linear.weight", {4 * H, c.t_dim});
        k.ada_b = b.bind(p + "norm1.linear.bias", {4 * H});
        k.norm1 = b.bind(p + "norm1.norm.weight", {H});
    } else {
        k.norm1 = b.bind(p + "norm1.weight", {H});
    }
    k.q = b.bind(p + "attn.to_q.weight", {c.heads * hd, H});
    k.k = b.bind(p + "attn.to_k.weight", {c.kv_heads * hd, H});
    k.v = b.bind(p + "attn.to_v.weight", {c.kv_heads * hd, H});
    k.o = b.bind(p + "attn.to_out.0.weight", {H, c.heads * hd});
    k.q_norm = b.bind(p + "attn.norm_q.weight", {hd});
    k.k_norm = b.bind(p + "attn.norm_k.weight", {hd});
    k.norm2 = b.bind(p + "norm2.weight", {H});
    k.ffn_norm1 = b.bind(p + "ffn_norm1.weight", {H});
    k.ffn_norm2 = b.bind(p + "ffn_norm2.weight", {H});
    // The FFN width (multiple_of and ffn_dim_multiplier rounding) is the tensor's.
    k.w1 = b.bind(p + "feed_forward.linear_1.weight", {0, H});
    k.ffn = k.w1.rows;
    k.w2 = b.bind(p + "feed_forward.linear_2.weight", {H, k.ffn});
    k.w3 = b.bind(p + "feed_forward.linear_3.weight", {k.ffn, H});
    return k;
}

}  // namespace

std::vector<std::array<uint64_t, 3>> joint_positions(const DitConfig &c, uint64_t L, uint64_t rows, uint64_t cols) {
    if (L >= c.axes_lens[0] || rows > c.axes_lens[1] || cols > c.axes_lens[2])
        throw Error(CMF_ERR_BOUNDS, "lumina2: " + std::to_string(L) + " caption tokens and " + std::to_string(rows) + "x" +
                                        std::to_string(cols) + " patches exceed the model's RoPE positions (axes_lens " +
                                        std::to_string(c.axes_lens[0]) + ", " + std::to_string(c.axes_lens[1]) + ", " +
                                        std::to_string(c.axes_lens[2]) + ")");
    std::vector<std::array<uint64_t, 3>> pos;
    pos.reserve(L + rows * cols);
    for (uint64_t i = 0; i < L; ++i) pos.push_back({i, 0, 0});
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t q = 0; q < cols; ++q) pos.push_back({L, r, q});
    return pos;
}

std::vector<float> rope_table(const DitConfig &c, const std::vector<std::array<uint64_t, 3>> &positions) {
    constexpr double kTheta = 10000.0;  // Lumina2RotaryPosEmbed(theta=10000)
    std::vector<std::vector<double>> freqs(3);
    for (int a = 0; a < 3; ++a)
        for (uint64_t j = 0; j < c.axes_dim[a] / 2; ++j)
            freqs[a].push_back(1.0 / std::pow(kTheta, double(2 * j) / double(c.axes_dim[a])));
    const uint64_t half = c.head_dim / 2;
    std::vector<float> t(positions.size() * half * 2);
    for (size_t n = 0; n < positions.size(); ++n) {
        float *row = t.data() + n * half * 2;
        for (int a = 0; a < 3; ++a)
            for (double f : freqs[a]) {
                const double angle = double(positions[n][a]) * f;
                *row++ = float(std::cos(angle));
                *row++ = float(std::sin(angle));
            }
    }
    return t;
}

NextDit::NextDit(const Device &d, const cmf_model_source *src, const DitConfig &cfg) : d_(d), c_(cfg) {
    try {
        Binder b(src, d.be, d.ctx, "dit.", owned_);
        const uint64_t H = c_.hidden, T = c_.t_dim, P = c_.patch * c_.patch;
        x_emb = b.bind("x_embedder.weight", {H, P * c_.in_channels});
        x_emb_b = b.bind("x_embedder.bias", {H});
        t1 = b.bind("time_caption_embed.timestep_embedder.linear_1.weight", {T, kFreqDim});
        t1_b = b.bind("time_caption_embed.timestep_embedder.linear_1.bias", {T});
        t2 = b.bind("time_caption_embed.timestep_embedder.linear_2.weight", {T, T});
        t2_b = b.bind("time_caption_embed.timestep_embedder.linear_2.bias", {T});
        cap_norm = b.bind("time_caption_embed.caption_embedder.0.weight", {c_.cap_feat_dim});
        cap_lin = b.bind("time_caption_embed.caption_embedder.1.weight", {H, c_.cap_feat_dim});
        cap_lin_b = b.bind("time_caption_embed.caption_embedder.1.bias", {H});
        out1 = b.bind("norm_out.linear_1.weight", {H, T});
        out1_b = b.bind("norm_out.linear_1.bias", {H});
        out2 = b.bind("norm_out.linear_2.weight", {P * c_.out_channels, H});
        out2_b = b.bind("norm_out.linear_2.bias", {P * c_.out_channels});
        for (uint64_t i = 0; i < c_.refiner_layers; ++i) {
            noise_.push_back(bind_block(b, c_, "noise_refiner." + std::to_string(i) + ".", true));
            context_.push_back(bind_block(b, c_, "context_refiner." + std::to_string(i) + ".", false));
        }
        for (uint64_t i = 0; i < c_.layers; ++i) layers_.push_back(bind_block(b, c_, "layers." + std::to_string(i) + ".", true));
        for (const auto *set : {&noise_, &context_, &layers_})
            for (const DitBlock &k : *set) max_ffn_ = std::max(max_ffn_, k.ffn);
        if (b.present("layers." + std::to_string(c_.layers) + ".norm2.weight"))
            throw Error(CMF_ERR_BOUNDS, "lumina2: dit has more layers than num_layers " + std::to_string(c_.layers));
    } catch (...) {
        for (auto *w : owned_) d_.be->weight_free(d_.ctx, w);
        throw;
    }
}

NextDit::~NextDit() {
    for (auto *w : owned_) d_.be->weight_free(d_.ctx, w);
}

uint64_t NextDit::conditioning_floats() const { return (noise_.size() + layers_.size()) * 4 * c_.hidden + c_.hidden; }

void NextDit::ensure_scratch(uint64_t n) {
    if (n <= cap_) return;
    const uint64_t H = c_.hidden, qd = c_.heads * c_.head_dim, kvd = c_.kv_heads * c_.head_dim;
    xn_.ensure(d_, n * H);
    tmp_.ensure(d_, n * H);
    q_.ensure(d_, n * qd);
    attn_.ensure(d_, n * qd);
    k_.ensure(d_, n * kvd);
    v_.ensure(d_, n * kvd);
    gate_.ensure(d_, n * max_ffn_);
    up_.ensure(d_, n * max_ffn_);
    io_.ensure(d_, n * std::max(H, c_.patch * c_.patch * std::max(c_.in_channels, c_.out_channels)));
    cap_ = n;
}

// One block over x [n][H] in place; mod: its 4H adaLN vector (modulated) or NULL.
void NextDit::block(const DitBlock &b, float *x, uint64_t n, const float *rope, const float *mod) {
    const cmf_backend_vt *be = d_.be;
    void *bc = d_.ctx;
    const uint64_t H = c_.hidden, hd = c_.head_dim, nh = c_.heads, nkv = c_.kv_heads;
    const float eps = float(c_.norm_eps);
    float *xn = xn_.get(), *q = q_.get(), *k = k_.get(), *v = v_.get(), *a = attn_.get(), *t = tmp_.get();
    check(be->rms_norm(bc, x, b.norm1.w, n, H, eps, CMF_NORM_QWEN, xn));
    if (mod) check(be->modulate(bc, xn, mod, nullptr, n, H, xn));
    check(be->matmul(bc, b.q.w, xn, n, q));
    check(be->matmul(bc, b.k.w, xn, n, k));
    check(be->matmul(bc, b.v.w, xn, n, v));
    check(be->rms_norm(bc, q, b.q_norm.w, n * nh, hd, kAttnNormEps, CMF_NORM_QWEN, q));
    check(be->rms_norm(bc, k, b.k_norm.w, n * nkv, hd, kAttnNormEps, CMF_NORM_QWEN, k));
    check(be->rope_table(bc, q, n, nh * hd, uint32_t(nh), uint32_t(hd), rope, CMF_ROPE_INTERLEAVED));
    check(be->rope_table(bc, k, n, nkv * hd, uint32_t(nkv), uint32_t(hd), rope, CMF_ROPE_INTERLEAVED));
    check(be->attention_full(bc, q, k, v, a, n, n, uint32_t(nh), uint32_t(nkv), uint32_t(hd),
                             float(1.0 / std::sqrt(double(hd))), nullptr));
    check(be->matmul(bc, b.o.w, a, n, t));
    check(be->rms_norm(bc, t, b.norm2.w, n, H, eps, CMF_NORM_QWEN, t));
    if (mod)
        check(be->add_gated(bc, x, t, mod + H, n, H, CMF_ACT_TANH));
    else
        check(be->add(bc, x, t, n * H));
    check(be->rms_norm(bc, x, b.ffn_norm1.w, n, H, eps, CMF_NORM_QWEN, xn));
    if (mod) check(be->modulate(bc, xn, mod + 2 * H, nullptr, n, H, xn));
    check(be->matmul(bc, b.w1.w, xn, n, gate_.get()));
    check(be->matmul(bc, b.w3.w, xn, n, up_.get()));
    check(be->gated_act(bc, gate_.get(), up_.get(), n * b.ffn, CMF_ACT_SILU, gate_.get()));
    check(be->matmul(bc, b.w2.w, gate_.get(), n, t));
    check(be->rms_norm(bc, t, b.ffn_norm2.w, n, H, eps, CMF_NORM_QWEN, t));
    if (mod)
        check(be->add_gated(bc, x, t, mod + 3 * H, n, H, CMF_ACT_TANH));
    else
        check(be->add(bc, x, t, n * H));
}

void NextDit::caption(const float *features, uint64_t L, const float *rope, Buffer &out) {
    const uint64_t H = c_.hidden, F = c_.cap_feat_dim;
    ensure_scratch(std::max<uint64_t>(L, 1));
    out.ensure(d_, L * H);
    if (L == 0) return;
    Buffer feats(d_, L * F);
    feats.write(features, L * F);
    check(d_.be->rms_norm(d_.ctx, feats.get(), cap_norm.w, L, F, float(c_.norm_eps), CMF_NORM_QWEN, feats.get()));
    check(d_.be->matmul(d_.ctx, cap_lin.w, feats.get(), L, out.get()));
    check(d_.be->add_bias(d_.ctx, out.get(), cap_lin_b.w, L, H));
    for (const DitBlock &b : context_) block(b, out.get(), L, rope, nullptr);
}

void NextDit::conditioning(float tau, Buffer &cond) {
    const cmf_backend_vt *be = d_.be;
    void *bc = d_.ctx;
    const uint64_t H = c_.hidden, T = c_.t_dim;
    // Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0): f_i =
    // exp(-ln(10000) * i / 128) and [cos(t f), sin(t f)], in f32 as torch.
    constexpr uint64_t half = kFreqDim / 2;
    std::vector<float> e(kFreqDim);
    const float neg_log = float(-std::log(10000.0));
    for (uint64_t i = 0; i < half; ++i) {
        const float f = std::exp(neg_log * float(i) / float(half));
        const float arg = tau * f;
        e[i] = std::cos(arg);
        e[half + i] = std::sin(arg);
    }
    temb_.ensure(d_, kFreqDim + 2 * T);
    float *proj = temb_.get(), *h1 = proj + kFreqDim, *temb = h1 + T;
    temb_.write(e.data(), kFreqDim);
    check(be->matmul(bc, t1.w, proj, 1, h1));
    check(be->add_bias(bc, h1, t1_b.w, 1, T));
    check(be->activation(bc, h1, T, CMF_ACT_SILU, h1));
    check(be->matmul(bc, t2.w, h1, 1, temb));
    check(be->add_bias(bc, temb, t2_b.w, 1, T));
    // Every adaLN linear reads SiLU(temb).
    check(be->activation(bc, temb, T, CMF_ACT_SILU, h1));
    cond.ensure(d_, conditioning_floats());
    float *m = cond.get();
    for (const auto *set : {&noise_, &layers_})
        for (const DitBlock &b : *set) {
            check(be->matmul(bc, b.ada.w, h1, 1, m));
            check(be->add_bias(bc, m, b.ada_b.w, 1, 4 * H));
            m += 4 * H;
        }
    check(be->matmul(bc, out1.w, h1, 1, m));
    check(be->add_bias(bc, m, out1_b.w, 1, H));
}

void NextDit::image_tokens(const float *latent, uint64_t h, uint64_t w, const float *rope, const Buffer &cond,
                           Buffer &out) {
    const uint64_t p = c_.patch, C = c_.in_channels, H = c_.hidden;
    if (h % p != 0 || w % p != 0)
        throw Error(CMF_ERR_INVALID_ARGUMENT, "lumina2: a latent of " + std::to_string(h) + "x" + std::to_string(w) +
                                                  " does not split into patches of " + std::to_string(p));
    const uint64_t rows = h / p, cols = w / p, N = rows * cols, F = p * p * C;
    // Patchify: token (r, q) holds X[ch][r p + dy][q p + dx] at (dy p + dx) C + ch.
    std::vector<float> patches(N * F);
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t q = 0; q < cols; ++q)
            for (uint64_t dy = 0; dy < p; ++dy)
                for (uint64_t dx = 0; dx < p; ++dx)
                    for (uint64_t ch = 0; ch < C; ++ch)
                        patches[(r * cols + q) * F + (dy * p + dx) * C + ch] = latent[(ch * h + r * p + dy) * w + q * p + dx];
    ensure_scratch(N);
    io_.write(patches.data(), N * F);
    out.ensure(d_, N * H);
    check(d_.be->matmul(d_.ctx, x_emb.w, io_.get(), N, out.get()));
    check(d_.be->add_bias(d_.ctx, out.get(), x_emb_b.w, N, H));
    const float *m = cond.get();
    for (const DitBlock &b : noise_) {
        block(b, out.get(), N, rope, m);
        m += 4 * H;
    }
}

void NextDit::velocity(Buffer &seq, uint64_t L, uint64_t h, uint64_t w, const float *rope, const Buffer &cond, float *out) {
    const uint64_t p = c_.patch, C = c_.out_channels, H = c_.hidden;
    const uint64_t rows = h / p, cols = w / p, N = rows * cols, F = p * p * C, n = L + N;
    ensure_scratch(n);
    const float *m = cond.get() + noise_.size() * 4 * H;
    for (const DitBlock &b : layers_) {
        block(b, seq.get(), n, rope, m);
        m += 4 * H;
    }
    // Final layer on the image rows: LayerNorm (no affine) * (1 + scale), linear_2.
    float *img = seq.get() + L * H;
    check(d_.be->layer_norm(d_.ctx, img, nullptr, nullptr, N, H, kFinalNormEps, xn_.get()));
    check(d_.be->modulate(d_.ctx, xn_.get(), m, nullptr, N, H, xn_.get()));
    check(d_.be->matmul(d_.ctx, out2.w, xn_.get(), N, io_.get()));
    check(d_.be->add_bias(d_.ctx, io_.get(), out2_b.w, N, F));
    std::vector<float> tok(N * F);
    io_.read(tok.data(), N * F);
    // Unpatchify: the inverse of image_tokens' layout.
    for (uint64_t r = 0; r < rows; ++r)
        for (uint64_t q = 0; q < cols; ++q)
            for (uint64_t dy = 0; dy < p; ++dy)
                for (uint64_t dx = 0; dx < p; ++dx)
                    for (uint64_t ch = 0; ch < C; ++ch)
                        out[(ch * h + r * p + dy) * w + q * p + dx] = tok[(r * cols + q) * F + (dy * p + dx) * C + ch];
}

}  // namespace cmf::archs::lumina2
