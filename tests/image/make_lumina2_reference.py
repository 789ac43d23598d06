#!/usr/bin/python3
"""A tiny Lumina-Image 2.0 pipeline and its PyTorch reference, for the
lumina2 parity tests (tests/image/).

Usage: make_lumina2_reference.py OUT_DIR

Writes OUT_DIR/pipeline/, a diffusers tree as Lumina2Pipeline.save_pretrained
lays it out (model_index.json, text_encoder/ config.json + model.safetensors,
tokenizer/ tokenizer.json + tokenizer_config.json, transformer/ and vae/
config.json + diffusion_pytorch_model.safetensors, scheduler/
scheduler_config.json), all weights F32 and seeded, and OUT_DIR/ref/:
  case.json        sizes, the prompt, its token ids, the sampling settings
  latent_in.f32    the injected initial latent [C][h][w]
  features.f32     the prompt's caption features [L][te hidden] (hidden_states[-2])
  velocity.f32     the DiT's output for (latent_in, features, tau = case.tau) [C][h][w]
  vae.f32          the VAE decoder's raw output for latent_in (after the
                   scaling/shift the pipeline applies) [3][H][W]
  latent_out.f32   the latent after the whole loop (case.steps steps,
                   guidance, truncation, normalisation) [C][h][w]
  image.u8         the final RGB8 image [H][W][3] as diffusers' image
                   processor rounds it

The text encoder is the Gemma-2 reference of tests/runtime/make_reference.py
(imported, not restated). The Next-DiT, the scheduler loop and the VAE
decoder are written here from diffusers' transformer_lumina2.py,
normalization.py (LuminaRMSNormZero, LuminaLayerNormContinuous, RMSNorm),
attention.py (LuminaFeedForward), embeddings.py (Timesteps,
TimestepEmbedding, get_1d_rotary_pos_embed, apply_rotary_emb),
pipeline_lumina2.py, scheduling_flow_match_euler_discrete.py and the
AutoencoderKL decoder (vae.py Decoder, resnet.py ResnetBlock2D,
unet_2d_blocks.py, upsampling.py, the mid-block Attention), since diffusers
is not a Debian package. Batch size 1 and no padding: diffusers pads
captions to 256 and masks the padding out of every attention, which leaves
the valid rows as an unpadded run computes them.

The tokenizer is a BPE over single characters without merges (printable
ASCII, "Ġ" for the space), so its ids are computed here directly; the
tokenizer_config.json (GemmaTokenizerFast, add_bos_token) makes the packer
add <bos> as Gemma's tokenizer does.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
import make_reference as gemma_ref  # noqa: E402

torch.set_num_threads(2)

SYSTEM_PROMPT = ("You are an assistant designed to generate superior images with the superior degree of image-text "
                 "alignment based on textual prompts or user prompts.")
PROMPT = "a red fox in the snow, at dusk"

# The text encoder: the gemma2 case of the decoder reference (sandwich
# norms, soft-caps, sliding windows), hidden 64.
TE = dict(gemma_ref.CASES["gemma2"])
DIT = dict(hidden=64, layers=2, refiners=1, heads=4, kv=2, in_ch=4, patch=2, multiple_of=16, axes_dim=[4, 6, 6],
           axes_lens=[300, 32, 32], eps=1e-5)
VAE = dict(latent=4, block_out=[16, 32], layers_per_block=1, groups=8, scaling=0.3611, shift=0.1159)
WIDTH, HEIGHT = 32, 24          # pixels: latent 16 x 12, 8 x 6 image tokens (not square: catches a swapped axis)
STEPS, GUIDANCE, SHIFT = 3, 4.0, 6.0
TAU = 0.375                     # the model time of the single-velocity check


def ffn_width(dim, multiple_of):
    inner = int(2 * (4 * dim) / 3)  # LuminaFeedForward, ffn_dim_multiplier None
    return multiple_of * ((inner + multiple_of - 1) // multiple_of)


# ---------------------------------------------------------------- weights

def dit_weights(g):
    H, hd, nh, nkv, T = DIT["hidden"], DIT["hidden"] // DIT["heads"], DIT["heads"], DIT["kv"], min(DIT["hidden"], 1024)
    F, C, p = ffn_width(H, DIT["multiple_of"]), DIT["in_ch"], DIT["patch"]

    def rnd(*shape, std=0.1):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    def norm(n):
        return 1.0 + rnd(n, std=0.2)

    w = {}
    w["x_embedder.weight"] = rnd(H, p * p * C, std=0.3)
    w["x_embedder.bias"] = rnd(H)
    w["time_caption_embed.timestep_embedder.linear_1.weight"] = rnd(T, 256, std=0.1)
    w["time_caption_embed.timestep_embedder.linear_1.bias"] = rnd(T)
    w["time_caption_embed.timestep_embedder.linear_2.weight"] = rnd(T, T, std=0.15)
    w["time_caption_embed.timestep_embedder.linear_2.bias"] = rnd(T)
    w["time_caption_embed.caption_embedder.0.weight"] = norm(TE["hidden"])
    w["time_caption_embed.caption_embedder.1.weight"] = rnd(H, TE["hidden"], std=0.15)
    w["time_caption_embed.caption_embedder.1.bias"] = rnd(H)

    def block(prefix, modulated):
        if modulated:
            w[prefix + "norm1.linear.weight"] = rnd(4 * H, T, std=0.15)
            w[prefix + "norm1.linear.bias"] = rnd(4 * H, std=0.2)
            w[prefix + "norm1.norm.weight"] = norm(H)
        else:
            w[prefix + "norm1.weight"] = norm(H)
        w[prefix + "attn.to_q.weight"] = rnd(nh * hd, H, std=0.15)
        w[prefix + "attn.to_k.weight"] = rnd(nkv * hd, H, std=0.15)
        w[prefix + "attn.to_v.weight"] = rnd(nkv * hd, H, std=0.15)
        w[prefix + "attn.to_out.0.weight"] = rnd(H, nh * hd, std=0.15)
        w[prefix + "attn.norm_q.weight"] = norm(hd)
        w[prefix + "attn.norm_k.weight"] = norm(hd)
        w[prefix + "feed_forward.linear_1.weight"] = rnd(F, H, std=0.15)
        w[prefix + "feed_forward.linear_2.weight"] = rnd(H, F, std=0.1)
        w[prefix + "feed_forward.linear_3.weight"] = rnd(F, H, std=0.15)
        w[prefix + "norm2.weight"] = norm(H)
        w[prefix + "ffn_norm1.weight"] = norm(H)
        w[prefix + "ffn_norm2.weight"] = norm(H)

    for i in range(DIT["refiners"]):
        block(f"noise_refiner.{i}.", True)
        block(f"context_refiner.{i}.", False)
    for i in range(DIT["layers"]):
        block(f"layers.{i}.", True)
    w["norm_out.linear_1.weight"] = rnd(H, T, std=0.15)
    w["norm_out.linear_1.bias"] = rnd(H)
    w["norm_out.linear_2.weight"] = rnd(p * p * C, H, std=0.2)
    w["norm_out.linear_2.bias"] = rnd(p * p * C)
    return w


def vae_weights(g):
    groups = VAE["groups"]

    def conv(o, i, k):
        return torch.randn(o, i, k, k, generator=g) * (1.0 / math.sqrt(i * k * k))

    def vec(n, std=0.1, base=0.0):
        return base + torch.randn(n, generator=g) * std

    w = {}

    def gn(prefix, c):
        w[prefix + ".weight"] = vec(c, 0.1, 1.0)
        w[prefix + ".bias"] = vec(c)

    def resnet(prefix, cin, cout):
        gn(prefix + ".norm1", cin)
        w[prefix + ".conv1.weight"] = conv(cout, cin, 3)
        w[prefix + ".conv1.bias"] = vec(cout)
        gn(prefix + ".norm2", cout)
        w[prefix + ".conv2.weight"] = conv(cout, cout, 3)
        w[prefix + ".conv2.bias"] = vec(cout)
        if cin != cout:
            w[prefix + ".conv_shortcut.weight"] = conv(cout, cin, 1)
            w[prefix + ".conv_shortcut.bias"] = vec(cout)

    rev = list(reversed(VAE["block_out"]))
    top = rev[0]
    # A piece of the encoder half, which the packer leaves out.
    w["encoder.conv_in.weight"] = conv(VAE["block_out"][0], 3, 3)
    w["encoder.conv_in.bias"] = vec(VAE["block_out"][0])
    w["decoder.conv_in.weight"] = conv(top, VAE["latent"], 3)
    w["decoder.conv_in.bias"] = vec(top)
    resnet("decoder.mid_block.resnets.0", top, top)
    gn("decoder.mid_block.attentions.0.group_norm", top)
    for n in ("to_q", "to_k", "to_v", "to_out.0"):
        w[f"decoder.mid_block.attentions.0.{n}.weight"] = torch.randn(top, top, generator=g) * (1.0 / math.sqrt(top))
        w[f"decoder.mid_block.attentions.0.{n}.bias"] = vec(top)
    resnet("decoder.mid_block.resnets.1", top, top)
    prev = top
    for b, ch in enumerate(rev):
        for j in range(VAE["layers_per_block"] + 1):
            resnet(f"decoder.up_blocks.{b}.resnets.{j}", prev if j == 0 else ch, ch)
        if b != len(rev) - 1:
            w[f"decoder.up_blocks.{b}.upsamplers.0.conv.weight"] = conv(ch, ch, 3)
            w[f"decoder.up_blocks.{b}.upsamplers.0.conv.bias"] = vec(ch)
        prev = ch
    gn("decoder.conv_norm_out", VAE["block_out"][0])
    w["decoder.conv_out.weight"] = conv(3, VAE["block_out"][0], 3)
    w["decoder.conv_out.bias"] = vec(3)
    assert groups <= VAE["block_out"][0]
    return w


# ---------------------------------------------------------------- Next-DiT

def rms(x, weight, eps):
    # diffusers' RMSNorm: f32 variance, x * rsqrt(var + eps), then * weight.
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(var + eps)) * weight


def timestep_features(tau):
    # Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0): cos first.
    half = 128
    exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32) / half
    emb = torch.tensor([tau], dtype=torch.float32)[:, None] * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    return torch.cat([emb[:, half:], emb[:, :half]], dim=-1)[0]


def freqs_cis(positions):
    """[n, head_dim / 2] complex128: each axis' get_1d_rotary_pos_embed (float64) gathered at its position."""
    parts = []
    for a, d in enumerate(DIT["axes_dim"]):
        freqs = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64)[: d // 2] / d))
        pos = torch.tensor([p[a] for p in positions], dtype=torch.float64)
        ang = torch.outer(pos, freqs)
        parts.append(torch.polar(torch.ones_like(ang), ang))
    return torch.cat(parts, dim=-1)


def rope(x, fc):
    # apply_rotary_emb(use_real=False): pairs (2m, 2m+1) as complex numbers.
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * fc[:, None, :]).flatten(2)
    return out.type_as(x)


def attention(w, prefix, xn, fc):
    H, nh, nkv = DIT["hidden"], DIT["heads"], DIT["kv"]
    hd = H // nh
    n = xn.shape[0]
    q = (xn @ w[prefix + "attn.to_q.weight"].T).view(n, nh, hd)
    k = (xn @ w[prefix + "attn.to_k.weight"].T).view(n, nkv, hd)
    v = (xn @ w[prefix + "attn.to_v.weight"].T).view(n, nkv, hd)
    q = rms(q, w[prefix + "attn.norm_q.weight"], 1e-5)
    k = rms(k, w[prefix + "attn.norm_k.weight"], 1e-5)
    q, k = rope(q, fc), rope(k, fc)
    rep = nh // nkv
    k = k.unsqueeze(2).repeat(1, 1, rep, 1).flatten(1, 2)
    v = v.unsqueeze(2).repeat(1, 1, rep, 1).flatten(1, 2)
    s = torch.einsum("qhd,khd->hqk", q, k) * (hd ** -0.5)
    a = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v).reshape(n, nh * hd)
    return a @ w[prefix + "attn.to_out.0.weight"].T


def feed_forward(w, prefix, x):
    a = torch.nn.functional.silu(x @ w[prefix + "feed_forward.linear_1.weight"].T)
    return (a * (x @ w[prefix + "feed_forward.linear_3.weight"].T)) @ w[prefix + "feed_forward.linear_2.weight"].T


def block(w, prefix, x, fc, temb):
    eps = DIT["eps"]
    if temb is not None:  # LuminaRMSNormZero
        emb = torch.nn.functional.silu(temb) @ w[prefix + "norm1.linear.weight"].T + w[prefix + "norm1.linear.bias"]
        scale_msa, gate_msa, scale_mlp, gate_mlp = emb.chunk(4)
        xn = rms(x, w[prefix + "norm1.norm.weight"], eps) * (1 + scale_msa)
        a = attention(w, prefix, xn, fc)
        x = x + gate_msa.tanh() * rms(a, w[prefix + "norm2.weight"], eps)
        m = feed_forward(w, prefix, rms(x, w[prefix + "ffn_norm1.weight"], eps) * (1 + scale_mlp))
        return x + gate_mlp.tanh() * rms(m, w[prefix + "ffn_norm2.weight"], eps)
    a = attention(w, prefix, rms(x, w[prefix + "norm1.weight"], eps), fc)
    x = x + rms(a, w[prefix + "norm2.weight"], eps)
    m = feed_forward(w, prefix, rms(x, w[prefix + "ffn_norm1.weight"], eps))
    return x + rms(m, w[prefix + "ffn_norm2.weight"], eps)


def dit_forward(w, latent, tau, features):
    """Lumina2Transformer2DModel.forward for one sample: latent [C, h, w], caption features [L, cap]."""
    C, p = DIT["in_ch"], DIT["patch"]
    _, h, wd = latent.shape
    L = features.shape[0]
    rows, cols = h // p, wd // p
    t = timestep_features(tau)
    temb = (torch.nn.functional.silu(t @ w["time_caption_embed.timestep_embedder.linear_1.weight"].T +
                                     w["time_caption_embed.timestep_embedder.linear_1.bias"])
            @ w["time_caption_embed.timestep_embedder.linear_2.weight"].T +
            w["time_caption_embed.timestep_embedder.linear_2.bias"])
    cap = rms(features, w["time_caption_embed.caption_embedder.0.weight"], DIT["eps"])
    cap = cap @ w["time_caption_embed.caption_embedder.1.weight"].T + w["time_caption_embed.caption_embedder.1.bias"]
    positions = [(i, 0, 0) for i in range(L)] + [(L, r, q) for r in range(rows) for q in range(cols)]
    fc = freqs_cis(positions)
    tokens = latent.view(C, rows, p, cols, p).permute(1, 3, 2, 4, 0).flatten(2).flatten(0, 1)
    img = tokens @ w["x_embedder.weight"].T + w["x_embedder.bias"]
    for i in range(DIT["refiners"]):
        cap = block(w, f"context_refiner.{i}.", cap, fc[:L], None)
    for i in range(DIT["refiners"]):
        img = block(w, f"noise_refiner.{i}.", img, fc[L:], temb)
    x = torch.cat([cap, img], dim=0)
    for i in range(DIT["layers"]):
        x = block(w, f"layers.{i}.", x, fc, temb)
    scale = torch.nn.functional.silu(temb) @ w["norm_out.linear_1.weight"].T + w["norm_out.linear_1.bias"]
    x = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale)
    x = x @ w["norm_out.linear_2.weight"].T + w["norm_out.linear_2.bias"]
    out = x[L:].view(rows, cols, p, p, C).permute(4, 0, 2, 1, 3).flatten(3, 4).flatten(1, 2)
    return out


# ---------------------------------------------------------------- VAE decoder

def vae_decode(w, z):
    """AutoencoderKL's decoder on z [latent, h, w] -> [3, H, W] (raw, about -1..1)."""
    F = torch.nn.functional
    groups = VAE["groups"]

    def gn(prefix, x):
        return F.group_norm(x, groups, w[prefix + ".weight"], w[prefix + ".bias"], eps=1e-6)

    def conv(prefix, x):
        wt = w[prefix + ".weight"]
        return F.conv2d(x, wt, w[prefix + ".bias"], padding=wt.shape[-1] // 2)

    def resnet(prefix, x):
        h = conv(prefix + ".conv1", F.silu(gn(prefix + ".norm1", x)))
        h = conv(prefix + ".conv2", F.silu(gn(prefix + ".norm2", h)))
        if prefix + ".conv_shortcut.weight" in w:
            x = conv(prefix + ".conv_shortcut", x)
        return x + h

    def attn(prefix, x):
        _, c, hh, ww = x.shape
        n = gn(prefix + ".group_norm", x).view(c, hh * ww).T
        q = n @ w[prefix + ".to_q.weight"].T + w[prefix + ".to_q.bias"]
        k = n @ w[prefix + ".to_k.weight"].T + w[prefix + ".to_k.bias"]
        v = n @ w[prefix + ".to_v.weight"].T + w[prefix + ".to_v.bias"]
        a = torch.softmax((q @ k.T) / math.sqrt(c), dim=-1) @ v
        o = a @ w[prefix + ".to_out.0.weight"].T + w[prefix + ".to_out.0.bias"]
        return x + o.T.reshape(1, c, hh, ww)

    x = conv("decoder.conv_in", z[None])
    x = resnet("decoder.mid_block.resnets.0", x)
    x = attn("decoder.mid_block.attentions.0", x)
    x = resnet("decoder.mid_block.resnets.1", x)
    n_blocks = len(VAE["block_out"])
    for b in range(n_blocks):
        for j in range(VAE["layers_per_block"] + 1):
            x = resnet(f"decoder.up_blocks.{b}.resnets.{j}", x)
        if b != n_blocks - 1:
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            x = conv(f"decoder.up_blocks.{b}.upsamplers.0.conv", x)
    x = conv("decoder.conv_out", F.silu(gn("decoder.conv_norm_out", x)))
    return x[0]


# ---------------------------------------------------------------- pipeline

def scheduler_sigmas(n):
    # pipeline_lumina2: np.linspace(1, 1/N, N); the scheduler: float32, static shift, a final 0.
    s = np.linspace(1.0, 1 / n, n).astype(np.float32)
    s = SHIFT * s / (1 + (SHIFT - 1) * s)
    s = torch.from_numpy(s).to(torch.float32)
    return torch.cat([s, torch.zeros(1)])


def sample(wd, latent, cond, uncond):
    sig = scheduler_sigmas(STEPS)
    timesteps = sig[:-1] * 1000
    x = latent.clone()
    for i in range(STEPS):
        t = timesteps[i]
        tau = float(1 - t / 1000)
        v_c = dit_forward(wd, x, tau, cond)
        if GUIDANCE > 1 and not ((i + 1) / STEPS > 1.0):
            v_u = dit_forward(wd, x, tau, uncond)
            v = v_u + GUIDANCE * (v_c - v_u)
            v = v * (torch.norm(v_c, dim=-1, keepdim=True) / torch.norm(v, dim=-1, keepdim=True))
        else:
            v = v_c
        x = x + (sig[i + 1] - sig[i]) * (-v)
    return x


def tokenizer_files(d):
    chars = [chr(c) for c in range(33, 127)]
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2}
    for c in chars + ["Ġ", "Ċ"]:
        vocab[c] = len(vocab)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for s, i in list(vocab.items())[:3]],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GemmaTokenizerFast", "add_bos_token": True, "add_eos_token": False,
                   "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}, f)
    return vocab


def encode(vocab, text):
    return [2] + [vocab["Ġ" if c == " " else c] for c in text]


def write_f32(path, t):
    with open(path, "wb") as f:
        f.write(t.contiguous().numpy().astype("<f4").tobytes())


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_lumina2_reference.py OUT_DIR")
    out = sys.argv[1]
    pipe, ref = os.path.join(out, "pipeline"), os.path.join(out, "ref")
    for sub in ("text_encoder", "tokenizer", "transformer", "vae", "scheduler"):
        os.makedirs(os.path.join(pipe, sub), exist_ok=True)
    os.makedirs(ref, exist_ok=True)

    with open(os.path.join(pipe, "model_index.json"), "w") as f:
        json.dump({"_class_name": "Lumina2Pipeline", "_diffusers_version": "0.33.0",
                   "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
                   "text_encoder": ["transformers", "Gemma2Model"], "tokenizer": ["transformers", "GemmaTokenizerFast"],
                   "transformer": ["diffusers", "Lumina2Transformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]},
                  f, indent=2)
    vocab = tokenizer_files(os.path.join(pipe, "tokenizer"))

    wt = gemma_ref.make_weights(TE, 7)
    te_cfg = gemma_ref.hf_config(TE)
    te_cfg["architectures"] = ["Gemma2Model"]
    with open(os.path.join(pipe, "text_encoder", "config.json"), "w") as f:
        json.dump(te_cfg, f, indent=2)
    # Gemma2Model's checkpoint: no lm_head, names under model. as the
    # original pipeline stores them.
    gemma_ref.write_safetensors(os.path.join(pipe, "text_encoder", "model.safetensors"), wt)

    g = torch.Generator().manual_seed(11)
    wd = dit_weights(g)
    F = ffn_width(DIT["hidden"], DIT["multiple_of"])
    assert wd["layers.0.feed_forward.linear_1.weight"].shape[0] == F
    dit_cfg = {"_class_name": "Lumina2Transformer2DModel", "_diffusers_version": "0.33.0", "sample_size": 16,
               "patch_size": DIT["patch"], "in_channels": DIT["in_ch"], "out_channels": None,
               "hidden_size": DIT["hidden"], "num_layers": DIT["layers"], "num_refiner_layers": DIT["refiners"],
               "num_attention_heads": DIT["heads"], "num_kv_heads": DIT["kv"], "multiple_of": DIT["multiple_of"],
               "ffn_dim_multiplier": None, "norm_eps": DIT["eps"], "scaling_factor": 1.0,
               "axes_dim_rope": DIT["axes_dim"], "axes_lens": DIT["axes_lens"], "cap_feat_dim": TE["hidden"]}
    with open(os.path.join(pipe, "transformer", "config.json"), "w") as f:
        json.dump(dit_cfg, f, indent=2)
    gemma_ref.write_safetensors(os.path.join(pipe, "transformer", "diffusion_pytorch_model.safetensors"), wd)

    wv = vae_weights(g)
    n_blocks = len(VAE["block_out"])
    vae_cfg = {"_class_name": "AutoencoderKL", "_diffusers_version": "0.33.0", "in_channels": 3, "out_channels": 3,
               "latent_channels": VAE["latent"], "block_out_channels": VAE["block_out"],
               "down_block_types": ["DownEncoderBlock2D"] * n_blocks, "up_block_types": ["UpDecoderBlock2D"] * n_blocks,
               "layers_per_block": VAE["layers_per_block"], "norm_num_groups": VAE["groups"], "act_fn": "silu",
               "sample_size": 32, "scaling_factor": VAE["scaling"], "shift_factor": VAE["shift"],
               "use_quant_conv": False, "use_post_quant_conv": False, "mid_block_add_attention": True,
               "force_upcast": True}
    with open(os.path.join(pipe, "vae", "config.json"), "w") as f:
        json.dump(vae_cfg, f, indent=2)
    gemma_ref.write_safetensors(os.path.join(pipe, "vae", "diffusion_pytorch_model.safetensors"), wv)
    with open(os.path.join(pipe, "scheduler", "scheduler_config.json"), "w") as f:
        json.dump({"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.33.0",
                   "num_train_timesteps": 1000, "shift": SHIFT, "use_dynamic_shifting": False}, f, indent=2)

    ids = encode(vocab, SYSTEM_PROMPT + " <Prompt Start> " + PROMPT)
    neg = encode(vocab, "")
    assert len(ids) <= 256
    s = 2 ** (n_blocks - 1)
    h, w = HEIGHT // s, WIDTH // s
    latent = torch.randn(VAE["latent"], h, w, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        feats = gemma_ref.forward(TE, wt, ids, TE["layers"] - 1)
        feats_neg = gemma_ref.forward(TE, wt, neg, TE["layers"] - 1)
        vel = dit_forward(wd, latent, TAU, feats)
        vae = vae_decode(wv, latent / VAE["scaling"] + VAE["shift"])
        final = sample(wd, latent, feats, feats_neg)
        img = vae_decode(wv, final / VAE["scaling"] + VAE["shift"])
        img = (img / 2 + 0.5).clamp(0, 1)
        u8 = (img.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    write_f32(os.path.join(ref, "latent_in.f32"), latent)
    write_f32(os.path.join(ref, "features.f32"), feats)
    write_f32(os.path.join(ref, "velocity.f32"), vel)
    write_f32(os.path.join(ref, "vae.f32"), vae)
    write_f32(os.path.join(ref, "latent_out.f32"), final)
    with open(os.path.join(ref, "image.u8"), "wb") as f:
        f.write(u8.tobytes())
    with open(os.path.join(ref, "case.json"), "w") as f:
        json.dump({"width": WIDTH, "height": HEIGHT, "latent_channels": VAE["latent"], "latent_h": h, "latent_w": w,
                   "prompt": PROMPT, "ids": ids, "negative_ids": neg, "steps": STEPS, "guidance": GUIDANCE,
                   "tau": TAU, "te_hidden": TE["hidden"]}, f)
    print(f"lumina2 reference: {len(ids)} prompt tokens, velocity max |x| {float(vel.abs().max()):.3f}, "
          f"VAE max |x| {float(vae.abs().max()):.3f}, final latent max |x| {float(final.abs().max()):.3f}, "
          f"image mean {float(img.mean()):.3f} std {float(img.std()):.3f}")


if __name__ == "__main__":
    main()
