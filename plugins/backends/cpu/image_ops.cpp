// The CPU backend's image and diffusion operations (cmf_backend_vt members
// modulate .. upsample2x): adaLN modulation and gated residuals of
// diffusion transformers, RoPE from a table of angles, LayerNorm, and the
// convolution, GroupNorm and upsampling of VAE decoders over HWC images.
//
// conv2d is an im2col + GEMM: output positions are cut into chunks, each
// chunk's patches are gathered into rows of c_in * kh * kw values (the
// column order of PyTorch's weight, [c_out][c_in][kh][kw] row-major), and
// the chunk goes through this backend's matmul, so a convolution runs at
// the prefill GEMM's rate over whatever dtype the weight is stored in.
// Reductions (GroupNorm's statistics) are summed in double over a fixed
// split of the positions, so results do not depend on the thread count.
#include "backend.hpp"
#include "kernels.hpp"

#include <cmf/plugin.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace cmf::cpu {

namespace {

using cmf::sdk::Error;

constexpr uint64_t kElementGrain = 16384;

void require(bool ok, const char *op, const std::string &what) {
    if (!ok) throw Error(CMF_ERR_INVALID_ARGUMENT, std::string(op) + ": " + what);
}

// Rows per parallel chunk for row-wise work on rows of `dim` floats.
uint64_t row_grain(uint64_t dim) { return std::max<uint64_t>(1, kElementGrain / std::max<uint64_t>(1, dim)); }

float apply_act(int32_t act, float x) {
    switch (act) {
    case CMF_ACT_SILU: return x / (1.0f + std::exp(-x));
    case CMF_ACT_GELU_TANH: return gelu_tanh(x);
    case CMF_ACT_TANH: return std::tanh(x);
    default: return x;
    }
}

cmf_error *modulate(void *ctx, const float *x, const float *scale, const float *shift, uint64_t n_rows, uint64_t dim,
                    float *y) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        require(x != nullptr && scale != nullptr && y != nullptr, "modulate", "NULL argument");
        parallel(be, n_rows, row_grain(dim), [&](uint64_t r0, uint64_t r1) {
            for (uint64_t r = r0; r < r1; ++r) {
                const float *xr = x + r * dim;
                float *yr = y + r * dim;
                if (shift != nullptr)
                    for (uint64_t j = 0; j < dim; ++j) yr[j] = xr[j] * (1.0f + scale[j]) + shift[j];
                else
                    for (uint64_t j = 0; j < dim; ++j) yr[j] = xr[j] * (1.0f + scale[j]);
            }
        });
    });
}

cmf_error *add_gated(void *ctx, float *y, const float *x, const float *gate, uint64_t n_rows, uint64_t dim,
                     int32_t act) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        require(x != nullptr && gate != nullptr && y != nullptr, "add_gated", "NULL argument");
        require(act == CMF_ACT_TANH || act == CMF_ACT_IDENTITY, "add_gated",
                "the gate's activation must be CMF_ACT_TANH or CMF_ACT_IDENTITY, not " + std::to_string(act));
        std::vector<float> g(dim);
        for (uint64_t j = 0; j < dim; ++j) g[j] = apply_act(act, gate[j]);
        parallel(be, n_rows, row_grain(dim), [&](uint64_t r0, uint64_t r1) {
            for (uint64_t r = r0; r < r1; ++r) {
                const float *xr = x + r * dim;
                float *yr = y + r * dim;
                for (uint64_t j = 0; j < dim; ++j) yr[j] += g[j] * xr[j];
            }
        });
    });
}

cmf_error *activation(void *ctx, const float *x, uint64_t n, int32_t act, float *y) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        require(n == 0 || (x != nullptr && y != nullptr), "activation", "NULL argument");
        require(act == CMF_ACT_SILU || act == CMF_ACT_GELU_TANH || act == CMF_ACT_TANH || act == CMF_ACT_IDENTITY,
                "activation", "unknown activation " + std::to_string(act));
        parallel(be, n, kElementGrain, [&](uint64_t i0, uint64_t i1) {
            if (act == CMF_ACT_SILU)
                kernels().silu(x + i0, i1 - i0, y + i0);
            else if (act == CMF_ACT_IDENTITY)
                std::memmove(y + i0, x + i0, (i1 - i0) * sizeof(float));
            else
                for (uint64_t i = i0; i < i1; ++i) y[i] = apply_act(act, x[i]);
        });
    });
}

// Mean and 1/sqrt(biased variance + eps) of n floats, in double (two passes).
std::pair<double, double> moments(const float *x, uint64_t n, float eps) {
    double s = 0;
    for (uint64_t j = 0; j < n; ++j) s += x[j];
    const double mean = s / double(n);
    double ss = 0;
    for (uint64_t j = 0; j < n; ++j) ss += (x[j] - mean) * (x[j] - mean);
    return {mean, 1.0 / std::sqrt(ss / double(n) + double(eps))};
}

const float *optional_vector(const cmf_backend_weight *w, uint64_t dim, const char *op) {
    return w == nullptr ? nullptr : vector_of(w, dim, op);
}

cmf_error *layer_norm(void *ctx, const float *x, const cmf_backend_weight *w, const cmf_backend_weight *b,
                      uint64_t n_rows, uint64_t dim, float eps, float *y) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        require(x != nullptr && y != nullptr, "layer_norm", "NULL argument");
        require(dim > 0, "layer_norm", "dim is 0");
        const float *wv = optional_vector(w, dim, "layer_norm"), *bv = optional_vector(b, dim, "layer_norm");
        parallel(be, n_rows, row_grain(dim), [&](uint64_t r0, uint64_t r1) {
            for (uint64_t r = r0; r < r1; ++r) {
                const float *xr = x + r * dim;
                float *yr = y + r * dim;
                const auto [mean, rstd] = moments(xr, dim, eps);
                const float m = float(mean), rs = float(rstd);
                for (uint64_t j = 0; j < dim; ++j) {
                    float v = (xr[j] - m) * rs;
                    if (wv) v *= wv[j];
                    if (bv) v += bv[j];
                    yr[j] = v;
                }
            }
        });
    });
}

cmf_error *rope_table(void *ctx, float *x, uint64_t n_tokens, uint64_t ld, uint32_t n_heads, uint32_t head_dim,
                      const float *cos_sin, int32_t layout) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        require(n_tokens == 0 || (x != nullptr && cos_sin != nullptr), "rope_table", "NULL argument");
        require(head_dim % 2 == 0 && uint64_t(n_heads) * head_dim <= ld, "rope_table",
                "head_dim must be even and the heads must fit ld");
        require(layout == CMF_ROPE_INTERLEAVED || layout == CMF_ROPE_HALF, "rope_table",
                "unknown pair layout " + std::to_string(layout));
        const uint64_t half = head_dim / 2;
        // Element offsets of pair m's two values in a head.
        const uint64_t step = layout == CMF_ROPE_INTERLEAVED ? 2 : 1, other = layout == CMF_ROPE_INTERLEAVED ? 1 : half;
        parallel(be, n_tokens, row_grain(ld), [&](uint64_t t0, uint64_t t1) {
            for (uint64_t t = t0; t < t1; ++t) {
                const float *cs = cos_sin + t * head_dim;
                for (uint32_t h = 0; h < n_heads; ++h) {
                    float *v = x + t * ld + uint64_t(h) * head_dim;
                    for (uint64_t m = 0; m < half; ++m) {
                        float &a = v[m * step], &b = v[m * step + other];
                        const float c = cs[2 * m], s = cs[2 * m + 1], a0 = a, b0 = b;
                        a = a0 * c - b0 * s;
                        b = b0 * c + a0 * s;
                    }
                }
            }
        });
    });
}

// Output positions per conv2d chunk: its patches take at most this many
// floats (plus the chunk's rows of y), and at least 64 positions go
// together so the GEMM has token blocks to work with.
constexpr uint64_t kConvChunkFloats = uint64_t(4) << 20;  // 16 MiB

cmf_error *conv2d(void *ctx, const cmf_backend_weight *w, const cmf_backend_weight *bias, const float *x,
                  uint64_t height, uint64_t width, uint64_t c_in, uint32_t kh, uint32_t kw, uint32_t pad, float *y) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        require(w != nullptr && x != nullptr && y != nullptr, "conv2d", "NULL argument");
        require(w->view.ndim == 2, "conv2d", "the weight must be bound as 2-D [c_out, c_in * kh * kw]");
        const uint64_t K = c_in * kh * kw, c_out = w->rows;
        require(kh > 0 && kw > 0 && w->cols == K, "conv2d",
                "the weight has " + std::to_string(w->cols) + " columns, expected c_in * kh * kw = " + std::to_string(K));
        require(height + 2 * uint64_t(pad) >= kh && width + 2 * uint64_t(pad) >= kw, "conv2d",
                "the kernel is larger than the padded image");
        const float *bv = optional_vector(bias, c_out, "conv2d");
        const uint64_t h_out = height + 2 * uint64_t(pad) - kh + 1, w_out = width + 2 * uint64_t(pad) - kw + 1;
        const uint64_t n_pos = h_out * w_out;
        if (kh == 1 && kw == 1 && pad == 0) {  // a 1x1 convolution is a matmul over positions
            if (cmf_error *e = matmul(ctx, w, x, n_pos, y)) throw cmf::sdk::HostError{e};
        } else {
            const uint64_t chunk = std::max<uint64_t>(64, kConvChunkFloats / K);
            // The calling thread's: it waits for every loop below.
            thread_local std::vector<float> patches;
            patches.resize(std::min(chunk, n_pos) * K);
            float *const pt = patches.data();
            for (uint64_t p0 = 0; p0 < n_pos; p0 += chunk) {
                const uint64_t np = std::min(chunk, n_pos - p0);
                parallel(be, np, 16, [&](uint64_t i0, uint64_t i1) {
                    for (uint64_t i = i0; i < i1; ++i) {
                        const uint64_t oy = (p0 + i) / w_out, ox = (p0 + i) % w_out;
                        float *dst = pt + i * K;
                        for (uint32_t ky = 0; ky < kh; ++ky) {
                            const int64_t iy = int64_t(oy) + ky - int64_t(pad);
                            for (uint32_t kx = 0; kx < kw; ++kx) {
                                const int64_t ix = int64_t(ox) + kx - int64_t(pad);
                                float *d = dst + ky * kw + kx;
                                const uint64_t stride = uint64_t(kh) * kw;
                                if (iy < 0 || iy >= int64_t(height) || ix < 0 || ix >= int64_t(width)) {
                                    for (uint64_t c = 0; c < c_in; ++c) d[c * stride] = 0.0f;
                                } else {
                                    const float *src = x + (uint64_t(iy) * width + uint64_t(ix)) * c_in;
                                    for (uint64_t c = 0; c < c_in; ++c) d[c * stride] = src[c];
                                }
                            }
                        }
                    }
                });
                if (cmf_error *e = matmul(ctx, w, pt, np, y + p0 * c_out)) throw cmf::sdk::HostError{e};
            }
            constexpr size_t kKeepFloats = size_t(16) << 20;  // keep up to 64 MiB for the next call
            if (patches.size() > kKeepFloats) std::vector<float>().swap(patches);
        }
        if (bv != nullptr)
            parallel(be, n_pos, row_grain(c_out), [&](uint64_t r0, uint64_t r1) {
                for (uint64_t r = r0; r < r1; ++r)
                    for (uint64_t o = 0; o < c_out; ++o) y[r * c_out + o] += bv[o];
            });
    });
}

// GroupNorm's statistics go over this many runs of positions at most (a
// fixed split, whatever the thread count).
constexpr uint64_t kStatRuns = 64;

cmf_error *group_norm(void *ctx, const float *x, const cmf_backend_weight *w, const cmf_backend_weight *b,
                      uint64_t n_pos, uint64_t channels, uint32_t groups, float eps, float *y) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        require(x != nullptr && y != nullptr, "group_norm", "NULL argument");
        require(groups > 0 && channels % groups == 0, "group_norm",
                std::to_string(channels) + " channels do not split into " + std::to_string(groups) + " groups");
        require(n_pos > 0, "group_norm", "no positions");
        const float *wv = optional_vector(w, channels, "group_norm"), *bv = optional_vector(b, channels, "group_norm");
        const uint64_t runs = std::min(kStatRuns, n_pos), cg = channels / groups;
        // Per run: per channel sum, then per channel sum of squares.
        std::vector<double> part(runs * 2 * channels, 0.0);
        parallel(be, runs, 1, [&](uint64_t r0, uint64_t r1) {
            for (uint64_t r = r0; r < r1; ++r) {
                double *s = part.data() + r * 2 * channels, *ss = s + channels;
                for (uint64_t p = n_pos * r / runs; p < n_pos * (r + 1) / runs; ++p) {
                    const float *xp = x + p * channels;
                    for (uint64_t c = 0; c < channels; ++c) {
                        s[c] += xp[c];
                        ss[c] += double(xp[c]) * xp[c];
                    }
                }
            }
        });
        // y = x * a[c] + d[c]: the group's normalisation and the affine in one.
        std::vector<float> a(channels), d(channels);
        const double count = double(n_pos) * double(cg);
        for (uint64_t g = 0; g < groups; ++g) {
            double s = 0, ss = 0;
            for (uint64_t r = 0; r < runs; ++r)
                for (uint64_t c = g * cg; c < (g + 1) * cg; ++c) {
                    s += part[r * 2 * channels + c];
                    ss += part[r * 2 * channels + channels + c];
                }
            const double mean = s / count, var = std::max(0.0, ss / count - mean * mean);
            const double rstd = 1.0 / std::sqrt(var + double(eps));
            for (uint64_t c = g * cg; c < (g + 1) * cg; ++c) {
                const double sc = rstd * (wv ? double(wv[c]) : 1.0);
                a[c] = float(sc);
                d[c] = float((bv ? double(bv[c]) : 0.0) - mean * sc);
            }
        }
        parallel(be, n_pos, row_grain(channels), [&](uint64_t p0, uint64_t p1) {
            for (uint64_t p = p0; p < p1; ++p) {
                const float *xp = x + p * channels;
                float *yp = y + p * channels;
                for (uint64_t c = 0; c < channels; ++c) yp[c] = xp[c] * a[c] + d[c];
            }
        });
    });
}

cmf_error *upsample2x(void *ctx, const float *x, uint64_t height, uint64_t width, uint64_t channels, float *y) {
    Backend *be = as_backend(ctx);
    return cmf::sdk::call(be->host, [&] {
        require(x != nullptr && y != nullptr, "upsample2x", "NULL argument");
        const uint64_t w2 = 2 * width;
        parallel(be, 2 * height, std::max<uint64_t>(1, kElementGrain / std::max<uint64_t>(1, w2 * channels)),
                 [&](uint64_t r0, uint64_t r1) {
                     for (uint64_t oy = r0; oy < r1; ++oy) {
                         const float *src = x + (oy / 2) * width * channels;
                         float *dst = y + oy * w2 * channels;
                         for (uint64_t ox = 0; ox < w2; ++ox)
                             std::memcpy(dst + ox * channels, src + (ox / 2) * channels, channels * sizeof(float));
                     }
                 });
    });
}

}  // namespace

void set_image_ops(cmf_backend_vt &vt) {
    vt.modulate = modulate;
    vt.add_gated = add_gated;
    vt.activation = activation;
    vt.layer_norm = layer_norm;
    vt.rope_table = rope_table;
    vt.conv2d = conv2d;
    vt.group_norm = group_norm;
    vt.upsample2x = upsample2x;
}

}  // namespace cmf::cpu
