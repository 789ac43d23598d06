"""Plain-torch Qwen3 (dense) decoder with HF Qwen3ForCausalLM semantics.

Mirrors transformers' modeling_qwen3:
  h = embed(t)
  per layer:  h += o_proj(attn(input_layernorm(h)))
              h += down(silu(gate(x)) * up(x)),  x = post_attention_layernorm(h)
  logits = embed^T · norm(h)            (tied embeddings)
Attention: q/k/v projections without bias, per-head RMSNorm on q and k
(weight [head_dim]) BEFORE RoPE, half-split ("rotate_half") RoPE with
inv_freq computed in f32, GQA with query head h reading KV head
h // (n_heads / n_kv_heads), scale 1/sqrt(head_dim), causal mask.
RMSNorm: x * rsqrt(mean(x^2) + eps) * w, computed in f32.

Parameter names equal the HF state-dict names, so the state dict can be
written to model.safetensors as is (minus the tied lm_head).

Also: minimal safetensors writer/reader (format: 8-byte little-endian header
length, JSON header with dtype/shape/data_offsets, raw little-endian bytes),
written here because Debian has no python3-safetensors package.
"""

import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(positions, head_dim, theta):
    # HF: inv_freq = 1 / base^(arange(0, d, 2)/d) in f32; angles = pos * inv_freq
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64)
                                .float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"])

    def forward(self, x, cos, sin, mask, cache=None):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            if "k" in cache:
                k = torch.cat((cache["k"], k), dim=2)
                v = torch.cat((cache["v"], v), dim=2)
            cache["k"], cache["v"] = k, v
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        if mask is not None:
            s = s + mask
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        o = (p @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, h, cos, sin, mask, cache=None):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Qwen3Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if not cfg.get("tie_word_embeddings", False):
            raise ValueError("this implementation only covers tied embeddings")
        self.cfg = cfg
        self.model = Qwen3Model(cfg)

    def init_weights(self, std=0.02):
        # HF Qwen3PreTrainedModel._init_weights: normal(0, initializer_range)
        # for linears/embeddings, ones for RMSNorm. Additionally scale the
        # residual-output projections by 1/sqrt(2*layers) (GPT-2 style) for
        # stabler training of a deep-ish small model.
        n = self.cfg["num_hidden_layers"]
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * n))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids, start_pos=0, caches=None):
        B, T = ids.shape
        h = self.model.embed_tokens(ids)
        pos = torch.arange(start_pos, start_pos + T)
        cos, sin = rope_cos_sin(pos, self.cfg["head_dim"], self.cfg["rope_theta"])
        total = start_pos + T
        mask = None
        if T > 1:
            mask = torch.full((T, total), float("-inf")).triu(start_pos + 1)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, mask, caches[i] if caches is not None else None)
        h = self.model.norm(h)
        return h @ self.model.embed_tokens.weight.t()

    def hf_state_dict(self):
        """HF tensor names -> tensors (lm_head omitted: tied)."""
        return {k: v.detach() for k, v in self.state_dict().items()}


# ---- safetensors -------------------------------------------------------------

_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_ST_TORCH = {v: k for k, v in _ST_DTYPES.items()}


def _tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        # numpy has no bf16: reinterpret the 16-bit patterns as int16.
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    return t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()


def save_safetensors(tensors, path, metadata=None):
    """Write {name: tensor} in sorted-name order; atomic (temp file + rename)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        b = _tensor_bytes(t)
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)  # pad so tensor data is 8-aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        dt = _ST_TORCH[info["dtype"]]
        if dt == torch.bfloat16:
            t = torch.from_numpy(np.frombuffer(raw, dtype="<i2").copy()).view(torch.bfloat16)
        elif dt == torch.float16:
            t = torch.from_numpy(np.frombuffer(raw, dtype="<f2").copy())
        else:
            t = torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy())
        out[name] = t.reshape(info["shape"])
    return out


@torch.no_grad()
def sample_generate(model, prompt_ids, max_new_tokens, eos_ids=(), temperature=0.8,
                    top_k=40, top_p=0.95, repetition_penalty=1.1, generator=None):
    """Sampling as HF generate() does with these settings: repetition penalty
    (divide positive / multiply negative logits of already-present ids), then
    temperature, top-k, top-p (keep the smallest set with mass >= top_p)."""
    caches = [dict() for _ in model.model.layers]
    logits = model(torch.tensor([prompt_ids]), 0, caches)
    pos = len(prompt_ids)
    seq = list(prompt_ids)
    out = []
    for _ in range(max_new_tokens):
        z = logits[0, -1].clone()
        if repetition_penalty != 1.0:
            idx = torch.tensor(sorted(set(seq)))
            v = z[idx]
            z[idx] = torch.where(v > 0, v / repetition_penalty, v * repetition_penalty)
        z = z / temperature
        kth = torch.topk(z, top_k).values[-1]
        z[z < kth] = float("-inf")
        sz, si = torch.sort(z, descending=True)
        cum = torch.softmax(sz, -1).cumsum(-1)
        drop = cum - torch.softmax(sz, -1) >= top_p
        z[si[drop]] = float("-inf")
        nxt = int(torch.multinomial(torch.softmax(z, -1), 1, generator=generator))
        out.append(nxt)
        seq.append(nxt)
        if nxt in eos_ids:
            break
        logits = model(torch.tensor([[nxt]]), pos, caches)
        pos += 1
    return out


def load_checkpoint(model_dir, dtype=torch.float32):
    """Load config.json + model.safetensors into a Qwen3ForCausalLM (eval mode)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "qwen3":
        raise ValueError(f"model_type {cfg.get('model_type')!r} is not qwen3")
    model = Qwen3ForCausalLM(cfg)
    sd = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    sd = {k: v.to(dtype) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    model.eval()
    return model, cfg


@torch.no_grad()
def greedy_generate(model, prompt_ids, max_new_tokens, eos_ids=(), margins=None):
    """Greedy decoding with a KV cache (prefill then one token per step).

    Ties in argmax resolve to the lowest id (torch.argmax semantics). If
    `margins` is a list, the top-1 minus top-2 logit gap of every step is
    appended to it (small gaps are where another runtime may diverge)."""
    caches = [dict() for _ in model.model.layers]
    logits = model(torch.tensor([prompt_ids]), 0, caches)
    pos = len(prompt_ids)
    out = []
    for _ in range(max_new_tokens):
        nxt = int(torch.argmax(logits[0, -1]))
        if margins is not None:
            top2 = torch.topk(logits[0, -1], 2).values
            margins.append(float(top2[0] - top2[1]))
        out.append(nxt)
        if nxt in eos_ids:
            break
        logits = model(torch.tensor([[nxt]]), pos, caches)
        pos += 1
    return out
