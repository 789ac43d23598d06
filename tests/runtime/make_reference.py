#!/usr/bin/python3
"""PyTorch reference for the decoder parity tests (tests/runtime/): the qwen
and gemma arch plugins.

Writes, for each tiny config (qwen2, qwen3, an untied qwen2 whose head has
fewer rows than vocab_size; gemma, gemma2, gemma3 text with sequences longer
than their sliding windows), a directory with:
  index.json   {"arch": <CMF header arch block>, "tensors": [{name, shape, offset}],
                "prompt": [64 ids], "greedy": [32 ids], "positions": P, "vocab": V}
  weights.f32  every tensor, f32 little-endian, at its offset (in floats)
  logits.f32   [P, V] logits of prompt + greedy[:-1], position by position
  hidden_m2.f32 [P, hidden] the residual stream after all layers but the
               last (HF's hidden_states[-2], what a text encoder reads)
  hf/          the same weights as a Hugging Face checkpoint (config.json,
               model.safetensors in F32, no tokenizer), for the quantized
               parity cases, which convert it with cmf_convert as a user would

The forward pass is written from Hugging Face's modeling_qwen2.py,
modeling_qwen3.py, modeling_gemma.py, modeling_gemma2.py and
modeling_gemma3.py: RMSNorm x^*w (qwen) or x^*(1+w) in f32 (gemma) with the
mean of squares in f32, half-split RoPE with inv_freq and angles in f32,
eager attention with repeat_kv GQA and a causal mask (HF's SDPA path skips
gemma2's soft-cap), SwiGLU or GeGLU (tanh GELU); gemma's embedding times
sqrt(hidden) as an f32 tensor, sandwich norms (gemma2/3), scale
query_pre_attn_scalar**-0.5, attention soft-cap before the mask, final
logit soft-cap, q/k-norm (gemma3), and sliding-window layers (a query sees
keys j > i - window) with their own RoPE base (gemma3's
rope_local_base_freq). transformers is not a Debian package, so the models
are restated here instead of imported.
The greedy continuation is HF generate()'s: the prompt in one forward call,
then one token per call over a KV cache; logits.f32 is one full causal
recompute of prompt + greedy[:-1], so the C++ KV-cache path is checked
against a full recompute.

RoPE scaling (cases with "rope"): inv_freq and the attention factor are
restated from transformers' modeling_rope_utils.py (_compute_linear_scaling_,
_compute_dynamic_ntk_, _compute_yarn_, _compute_llama3_parameters, with
HF's tensor dtypes), and the rotary embedding keeps HF's state
(dynamic_rope_update: a forward call whose last position + 1 exceeds the
largest seen recomputes the table for that length; one under
max_position_embeddings after growth resets it; cached keys keep their
rotation). Dynamic NTK's results depend on how the sequence is split into
calls, so its case also writes cached.f32 (the prompt in one call, then one
token per call with a KV cache, as HF's generate() runs it) and short.f32
(a new 20-token sequence on that state: the table is reset).

Weights are seeded random (not HF's 0.02 init, which makes every logit
~0): N(0, 0.1^2) matrices, N(0, 0.5^2) embeddings, norms 1 + N(0, 0.3^2),
biases N(0, 0.1^2). Like upstream's harness, the first seed whose greedy run
has a top1-top2 margin >= 1e-2 at every step is kept.
"""
import json
import math
import os
import struct
import sys

import torch

torch.set_num_threads(2)

CASES = {
    # T1: qwen2, q/k/v biases, tied head, implicit head_dim 16.
    "qwen2_tied": dict(arch="qwen2", hidden=64, inter=128, layers=2, heads=4, kv=2, head_dim=16, vocab=128,
                       theta=10000.0, tied=True, bias=True, qknorm=False, head_rows=128),
    # T2: qwen3, explicit head_dim 32 != 64/4, q/k-norm, untied head.
    "qwen3_untied": dict(arch="qwen3", hidden=64, inter=128, layers=2, heads=4, kv=2, head_dim=32, vocab=128,
                         theta=1000000.0, tied=False, bias=False, qknorm=True, head_rows=128),
    # qwen2 untied with a head of 120 rows for vocab_size 128 (logits 120.. = 0).
    "qwen2_short_head": dict(arch="qwen2", hidden=64, inter=96, layers=2, heads=4, kv=1, head_dim=16, vocab=128,
                             theta=10000.0, tied=False, bias=True, qknorm=False, head_rows=120),
    # gemma (1): MQA, sqrt(96) not exact, tanh GELU, tied head, scale 1/sqrt(head_dim).
    "gemma": dict(arch="gemma", hidden=96, inter=192, layers=2, heads=4, kv=1, head_dim=32, vocab=128,
                  theta=10000.0, tied=True, bias=False, qknorm=False, head_rows=128),
    # gemma2: sandwich norms, window 4 on even layers (written as the pattern
    # rule, as the converter writes gemma2 files), soft-caps made small so
    # tanh bends, query_pre_attn_scalar 24 != head_dim.
    "gemma2": dict(arch="gemma2", hidden=64, inter=128, layers=4, heads=4, kv=2, head_dim=32, vocab=128,
                   theta=10000.0, tied=True, bias=False, qknorm=False, head_rows=128, sandwich=True, qpas=24.0,
                   window=4, pattern=2, attn_cap=1.0, final_cap=2.0),
    # gemma3 text: q/k-norm, 2 local : 1 global from layer_types, local and
    # global RoPE bases, window 28 (prefill runs in chunks long enough for
    # the blocked attention path, and the local rings wrap).
    "gemma3": dict(arch="gemma3_text", hidden=64, inter=128, layers=6, heads=4, kv=2, head_dim=32, vocab=128,
                   theta=1000000.0, tied=True, bias=False, qknorm=True, head_rows=128, sandwich=True, qpas=32.0,
                   window=28, pattern=3, explicit_types=True, local_theta=10000.0),
}
# RoPE scaling cases: the HF config's scaling object (spelled `rope_scaling`,
# or transformers v5's `rope_parameters` with rope_theta inside), and
# max_position_embeddings small enough that 96 positions go past the
# pre-training window the scaling is about.
QWEN3 = dict(arch="qwen3", hidden=64, inter=128, layers=2, heads=4, kv=2, head_dim=32, vocab=128,
             theta=1000000.0, tied=False, bias=False, qknorm=True, head_rows=128)
QWEN2 = dict(arch="qwen2", hidden=64, inter=128, layers=2, heads=4, kv=2, head_dim=16, vocab=128,
             theta=10000.0, tied=True, bias=True, qknorm=False, head_rows=128)
CASES.update({
    # Qwen's own long-context recipe, v4 spelling.
    "qwen3_yarn": dict(QWEN3, max_pos=40, rope={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    # v5 spelling; beta_fast/slow, DeepSeek's mscale ratio, no truncation of the correction range.
    # (base 100 and these betas put the correction range's ends between
    # integers, so truncating them or not changes the table.)
    "qwen2_yarn_v5": dict(QWEN2, theta=100.0, max_pos=96, spelling="rope_parameters",
                          rope={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 48, "beta_fast": 2.0,
                                "beta_slow": 0.25, "mscale": 1.2, "mscale_all_dim": 0.8, "truncate": False}),
    # The pre-rope_type spelling ("type").
    "qwen2_linear": dict(QWEN2, rope={"type": "linear", "factor": 2.5}),
    # Llama 3.1's bands: dims above, inside and below the smoothing range.
    "qwen3_llama3": dict(QWEN3, theta=10000.0, rope={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 8.0, "original_max_position_embeddings": 64}),
    # NTK: the base grows with the sequence past max_position_embeddings 48.
    "qwen3_dynamic": dict(QWEN3, max_pos=48, rope={"rope_type": "dynamic", "factor": 2.0}),
    # attention_bias: q/k/v and o_proj biases.
    "qwen3_attn_bias": dict(QWEN3, bias=True, obias=True),
})
EPS = 1e-6
N_PROMPT, N_GEN = 64, 32


def make_weights(c, seed):
    g = torch.Generator().manual_seed(seed)
    H, I, hd, nh, nkv = c["hidden"], c["inter"], c["head_dim"], c["heads"], c["kv"]

    def rnd(*shape, std=0.1):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    gemma = is_gemma(c)

    def norm(n):  # gemma's norms multiply by (1 + w): weights around 0
        return (0.0 if gemma else 1.0) + rnd(n, std=0.3)

    # gemma scales the embedding by sqrt(hidden) and ties its head: smaller rows
    w = {"model.embed_tokens.weight": rnd(c["vocab"], H, std=0.1 if is_gemma(c) else 0.5)}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        if c.get("sandwich"):
            w[p + "pre_feedforward_layernorm.weight"] = norm(H)
            w[p + "post_feedforward_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = rnd(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = rnd(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = rnd(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = rnd(H, nh * hd)
        if c["bias"]:
            w[p + "self_attn.q_proj.bias"] = rnd(nh * hd)
            w[p + "self_attn.k_proj.bias"] = rnd(nkv * hd)
            w[p + "self_attn.v_proj.bias"] = rnd(nkv * hd)
        if c.get("obias"):
            w[p + "self_attn.o_proj.bias"] = rnd(H)
        if c["qknorm"]:
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "mlp.gate_proj.weight"] = rnd(I, H)
        w[p + "mlp.up_proj.weight"] = rnd(I, H)
        w[p + "mlp.down_proj.weight"] = rnd(H, I)
    w["model.norm.weight"] = norm(H)
    if not c["tied"]:
        w["lm_head.weight"] = rnd(c["head_rows"], H)
    return w


def is_gemma(c):
    return c["arch"].startswith("gemma")


def rms_norm(c, x, weight):
    var = x.pow(2).mean(-1, keepdim=True)
    if is_gemma(c):
        # GemmaRMSNorm: x * rsqrt(mean(x^2) + eps), then * (1 + w), in f32.
        return (x * torch.rsqrt(var + EPS)) * (1.0 + weight)
    # Qwen2RMSNorm: variance in f32, x * rsqrt(var + eps), then * weight.
    return weight * (x * torch.rsqrt(var + EPS))


def is_sliding(c, i):
    """HF's layer_types: gemma2 and gemma3 derive them from the pattern."""
    return "window" in c and (i + 1) % c["pattern"] != 0


def rope_kind(c):
    r = c.get("rope") or {}
    return r.get("rope_type", r.get("type", "default"))


def rope_init(c, seq_len=None, local=False):
    """(inv_freq, attention_scaling): transformers' ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len);
    local: gemma3's rotary_emb_local (rope_local_base_freq, default RoPE)."""
    r = {} if local else (c.get("rope") or {})
    kind = "default" if local else rope_kind(c)
    base = c.get("local_theta", c["theta"]) if local else c["theta"]
    dim = c["head_dim"]
    mpe = c.get("max_pos", 256)

    def default(b):
        return 1.0 / (b ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))

    if kind == "default":
        return default(base), 1.0
    if kind == "linear":
        inv_freq = default(base)
        inv_freq /= r["factor"]
        return inv_freq, 1.0
    if kind == "dynamic":
        factor = r["factor"]
        if seq_len is None:
            seq_len = mpe
        elif isinstance(seq_len, torch.Tensor):
            seq_len = torch.maximum(seq_len, torch.tensor(mpe, dtype=seq_len.dtype, device=seq_len.device))
        else:
            seq_len = max(seq_len, mpe)
        base = base * ((factor * seq_len / mpe) - (factor - 1)) ** (dim / (dim - 2))
        return default(base), 1.0
    if kind == "yarn":
        factor = r["factor"]
        attention_factor = r.get("attention_factor")
        mscale, mscale_all_dim = r.get("mscale"), r.get("mscale_all_dim")
        original = r["original_max_position_embeddings"]
        if factor is None:
            factor = mpe / original

        def get_mscale(scale, m=1):
            if scale <= 1:
                return 1.0
            return 0.1 * m * math.log(scale) + 1.0

        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
            else:
                attention_factor = get_mscale(factor)
        beta_fast = r.get("beta_fast") or 32
        beta_slow = r.get("beta_slow") or 1

        def find_correction_dim(num_rotations):
            return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        truncate = r.get("truncate", True)
        low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
        inv_freq_extrapolation = 1.0 / pos_freqs
        inv_freq_interpolation = 1.0 / (factor * pos_freqs)
        extrapolation_factor = 1 - ramp
        inv_freq = inv_freq_interpolation * (1 - extrapolation_factor) + inv_freq_extrapolation * extrapolation_factor
        return inv_freq, attention_factor
    if kind == "llama3":
        inv_freq = default(base)
        factor, low_ff, high_ff = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old_context_len = r["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_context_len / low_ff, old_context_len / high_ff
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_ff) / (high_ff - low_ff)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama), 1.0
    raise ValueError(kind)


class Rotary:
    """HF's rotary embedding module with dynamic_rope_update's state."""

    def __init__(self, c, local=False):
        self.c, self.local = c, local
        self.inv_freq, self.attention_scaling = rope_init(c, local=local)
        self.original_inv_freq = self.inv_freq
        self.max_seq_len_cached = self.original_max_seq_len = c.get("max_pos", 256)

    def __call__(self, position_ids):
        if not self.local and "dynamic" in rope_kind(self.c):
            seq_len = torch.max(position_ids) + 1
            if seq_len > self.max_seq_len_cached:  # growth
                self.inv_freq, self.attention_scaling = rope_init(self.c, seq_len)
                self.max_seq_len_cached = seq_len
            if seq_len < self.original_max_seq_len and self.max_seq_len_cached > self.original_max_seq_len:  # reset
                self.inv_freq = self.original_inv_freq
                self.max_seq_len_cached = self.original_max_seq_len
        freqs = position_ids.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(c, w, ids, n_layers=None, rotary=None, cache=None, pos0=0):
    """Logits [n, vocab] for the token ids at positions pos0.. in one forward
    call; with n_layers, the residual stream after that many layers instead
    (HF's hidden_states[n_layers]). `cache` (per layer [K, V] after RoPE)
    holds positions < pos0 and gets the new ones; without one this is a
    full causal recompute. `rotary`: the (global, local) rotary modules,
    whose state persists across calls as a model's does."""
    H, hd, nh, nkv = c["hidden"], c["head_dim"], c["heads"], c["kv"]
    gemma = is_gemma(c)
    n = len(ids)
    h = w["model.embed_tokens.weight"][torch.tensor(ids)]
    if gemma:  # the normalizer is a tensor of the activation dtype
        h = h * torch.tensor(H ** 0.5, dtype=h.dtype)
    rotary = rotary or (Rotary(c), Rotary(c, local=True))
    cache = cache if cache is not None else {}
    positions = torch.arange(pos0, pos0 + n)
    rope_global = rotary[0](positions)
    rope_local = rotary[1](positions)
    causal = torch.full((n, pos0 + n), float("-inf")).triu(pos0 + 1)
    qpos, kpos = positions, torch.arange(pos0 + n)
    scaling = c.get("qpas", hd) ** -0.5
    for i in range(c["layers"] if n_layers is None else n_layers):
        p = f"model.layers.{i}."
        mask = causal
        if is_sliding(c, i):  # keys j > i - window only
            far = kpos[None, :] <= qpos[:, None] - c["window"]
            mask = causal.masked_fill(far, float("-inf"))
        # Sliding layers on their own base (gemma3) use the local, unscaled table.
        cos, sin = rope_local if is_sliding(c, i) and "local_theta" in c else rope_global
        x = rms_norm(c, h, w[p + "input_layernorm.weight"])
        q = x @ w[p + "self_attn.q_proj.weight"].T
        k = x @ w[p + "self_attn.k_proj.weight"].T
        v = x @ w[p + "self_attn.v_proj.weight"].T
        if c["bias"]:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.view(n, nh, hd).transpose(0, 1)
        k = k.view(n, nkv, hd).transpose(0, 1)
        v = v.view(n, nkv, hd).transpose(0, 1)
        if c["qknorm"]:
            q = rms_norm(c, q, w[p + "self_attn.q_norm.weight"])
            k = rms_norm(c, k, w[p + "self_attn.k_norm.weight"])
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if i in cache:
            k = torch.cat((cache[i][0], k), dim=1)
            v = torch.cat((cache[i][1], v), dim=1)
        cache[i] = (k, v)
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=0)
        v = v.repeat_interleave(rep, dim=0)
        scores = (q @ k.transpose(1, 2)) * scaling
        if c.get("attn_cap"):
            scores = torch.tanh(scores / c["attn_cap"]) * c["attn_cap"]
        probs = torch.softmax((scores + mask).float(), dim=-1)
        a = (probs @ v).transpose(0, 1).reshape(n, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        if c.get("obias"):
            a = a + w[p + "self_attn.o_proj.bias"]
        if c.get("sandwich"):
            a = rms_norm(c, a, w[p + "post_attention_layernorm.weight"])
            x = rms_norm(c, h + a, w[p + "pre_feedforward_layernorm.weight"])
        else:
            x = rms_norm(c, h + a, w[p + "post_attention_layernorm.weight"])
        h = h + a
        gate = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        act = torch.nn.functional.gelu(gate, approximate="tanh") if gemma else torch.nn.functional.silu(gate)
        f = (act * up) @ w[p + "mlp.down_proj.weight"].T
        if c.get("sandwich"):
            f = rms_norm(c, f, w[p + "post_feedforward_layernorm.weight"])
        h = h + f
    if n_layers is not None:
        return h
    x = rms_norm(c, h, w["model.norm.weight"])
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    logits = x @ head.T
    if c.get("final_cap"):
        logits = torch.tanh(logits / c["final_cap"]) * c["final_cap"]
    if logits.shape[1] < c["vocab"]:  # vocab_size beyond the head's rows: zeros
        logits = torch.cat((logits, torch.zeros(n, c["vocab"] - logits.shape[1])), dim=1)
    return logits


def cached_run(c, w, prompt, n_gen):
    """HF's generate() with a KV cache on a freshly built model: the prompt in
    one call, then greedy tokens one call each. Logits of every position,
    the greedy ids, the worst top1-top2 margin, and the rotary state."""
    rotary, cache = (Rotary(c), Rotary(c, local=True)), {}
    rows = [forward(c, w, prompt, None, rotary, cache, 0)]
    ids = list(prompt)
    margin = float("inf")
    for _ in range(n_gen):
        last = rows[-1][-1]
        top = torch.topk(last, 2).values
        margin = min(margin, float(top[0] - top[1]))
        ids.append(int(torch.argmax(last)))
        if len(ids) - len(prompt) == n_gen:
            break
        rows.append(forward(c, w, [ids[-1]], None, rotary, cache, len(ids) - 1))
    return torch.cat(rows, dim=0), ids[len(prompt):], margin, rotary


def rope_record(c):
    """The arch block's rope_scaling object as the converter writes it (HF's
    keys, defaults resolved)."""
    r = dict(c["rope"])
    kind = r.pop("type", None) or r.pop("rope_type")
    rec = {"rope_type": kind, "factor": r.pop("factor")}
    if kind == "dynamic":
        rec["max_position_embeddings"] = c.get("max_pos", 256)
    if kind == "yarn":
        rec["original_max_position_embeddings"] = r.pop("original_max_position_embeddings")
        rec.update({k: r[k] for k in ("attention_factor", "mscale", "mscale_all_dim") if k in r})
        rec.update(beta_fast=r.get("beta_fast", 32.0), beta_slow=r.get("beta_slow", 1.0), truncate=r.get("truncate", True))
    if kind == "llama3":
        rec.update({k: r[k] for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")})
    return rec


def arch_block(c):
    """The header arch block as the converter writes it from hf_config(c)."""
    gemma = is_gemma(c)
    types = ["FullAttention"] * c["layers"]
    if c.get("explicit_types"):
        types = ["SlidingAttention" if is_sliding(c, i) else "FullAttention" for i in range(c["layers"])]
    a = {
        "arch_name": c["arch"], "hidden_size": c["hidden"], "intermediate_size": c["inter"],
        "num_layers": c["layers"], "num_attention_heads": c["heads"], "num_kv_heads": c["kv"],
        "head_dim": c["head_dim"], "vocab_size": c["vocab"],
        "layer_types": types, "rms_norm_eps": EPS, "norm_style": "gemma" if gemma else "qwen",
        "rope_theta": c["theta"], "partial_rotary_factor": 1.0, "tie_word_embeddings": c["tied"],
    }
    if c.get("rope"):
        a["rope_scaling"] = rope_record(c)
    max_pos = c.get("max_pos", 256)
    if c.get("rope") and c.get("spelling") != "rope_parameters" and "original_max_position_embeddings" in c["rope"]:
        max_pos = c["rope"]["original_max_position_embeddings"]  # the original's "native window"
    a.update({"max_position_embeddings": max_pos, "linear_conv_kernel_dim": None, "linear_num_key_heads": None,
              "linear_num_value_heads": None})
    if gemma:
        a["hidden_act"] = "gelu_tanh"
        a["embed_multiplier"] = float(torch.tensor(c["hidden"] ** 0.5, dtype=torch.float32))
        if "qpas" in c:
            a["query_pre_attn_scalar"] = c["qpas"]
        if "window" in c:
            a["sliding_window"] = c["window"]
            a["sliding_window_pattern"] = c["pattern"]
        if "local_theta" in c:
            a["rope_local_base_freq"] = c["local_theta"]
        if c.get("final_cap"):
            a["final_logit_softcapping"] = c["final_cap"]
        if c.get("attn_cap"):
            a["attn_logit_softcapping"] = c["attn_cap"]
    return a


HF_CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
              "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def hf_config(c):
    """config.json as transformers writes it for these models (the keys the converter reads)."""
    cfg = {
        "model_type": c["arch"], "architectures": [HF_CLASSES[c["arch"]]],
        "hidden_size": c["hidden"], "intermediate_size": c["inter"], "num_hidden_layers": c["layers"],
        "num_attention_heads": c["heads"], "num_key_value_heads": c["kv"], "vocab_size": c["vocab"],
        "hidden_act": "silu", "max_position_embeddings": c.get("max_pos", 256), "rms_norm_eps": EPS, "rope_theta": c["theta"],
        "tie_word_embeddings": c["tied"], "use_sliding_window": False, "attention_dropout": 0.0,
    }
    if c["head_dim"] != c["hidden"] // c["heads"] or is_gemma(c):
        cfg["head_dim"] = c["head_dim"]
    if c["arch"] == "qwen3":
        cfg["attention_bias"] = c["bias"]
    if c.get("rope"):
        if c.get("spelling") == "rope_parameters":  # transformers v5: rope_theta moves inside
            del cfg["rope_theta"]
            cfg["rope_parameters"] = dict(c["rope"], rope_theta=c["theta"])
        else:
            cfg["rope_scaling"] = c["rope"]
    if is_gemma(c):
        del cfg["use_sliding_window"]
        cfg.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                   bos_token_id=2, eos_token_id=1, pad_token_id=0)
        if "qpas" in c:
            cfg["query_pre_attn_scalar"] = c["qpas"]
        if "window" in c:
            cfg["sliding_window"] = c["window"]
        if c["arch"] == "gemma3_text":
            cfg["sliding_window_pattern"] = c["pattern"]
            cfg["rope_local_base_freq"] = c["local_theta"]
            cfg["rope_scaling"] = None
            cfg["layer_types"] = ["sliding_attention" if is_sliding(c, i) else "full_attention" for i in range(c["layers"])]
        cfg["attn_logit_softcapping"] = c.get("attn_cap")
        cfg["final_logit_softcapping"] = c.get("final_cap")
    return cfg


def write_safetensors(path, w):
    """F32 safetensors: u64 header length, JSON header (padded to 8), payloads."""
    header, blobs, off = {}, [], 0
    for name, t in w.items():
        data = t.contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(b"".join(blobs))


def write_case(out_dir, name, c):
    with torch.no_grad():
        for seed in range(20):
            w = make_weights(c, seed)
            g = torch.Generator().manual_seed(1000 + seed)
            prompt = torch.randint(0, c["vocab"], (N_PROMPT,), generator=g).tolist()
            cached, gen, margin, rotary = cached_run(c, w, prompt, N_GEN)
            if margin >= 1e-2:
                break
        else:
            sys.exit(f"{name}: no seed in 0..19 gives a greedy margin >= 1e-2")
        seq = prompt + gen[:-1]
        logits = forward(c, w, seq)  # one call from position 0 on a fresh model
        hidden = forward(c, w, seq, c["layers"] - 1)
        if rope_kind(c) == "dynamic":
            # After the cached run, a new short sequence: HF resets the table.
            short = forward(c, w, seq[:20], None, rotary, {}, 0)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    tensors, offset, blobs = [], 0, []
    for tname, t in w.items():
        t = t.contiguous()
        tensors.append({"name": tname, "shape": list(t.shape), "offset": offset})
        offset += t.numel()
        blobs.append(t.numpy().astype("<f4").tobytes())
    with open(os.path.join(d, "weights.f32"), "wb") as f:
        f.write(b"".join(blobs))
    with open(os.path.join(d, "logits.f32"), "wb") as f:
        f.write(logits.numpy().astype("<f4").tobytes())
    with open(os.path.join(d, "hidden_m2.f32"), "wb") as f:  # hidden_states[-2]: after all layers but the last
        f.write(hidden.numpy().astype("<f4").tobytes())
    if rope_kind(c) == "dynamic":
        for fname, t in (("cached.f32", cached), ("short.f32", short)):
            with open(os.path.join(d, fname), "wb") as f:
                f.write(t.contiguous().numpy().astype("<f4").tobytes())
    index = {"arch": arch_block(c), "tensors": tensors, "prompt": prompt, "greedy": gen,
             "positions": len(seq), "vocab": c["vocab"], "seed": seed, "margin": margin}
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(index, f)
    hf = os.path.join(d, "hf")
    os.makedirs(hf, exist_ok=True)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2)
    write_safetensors(os.path.join(hf, "model.safetensors"), w)
    print(f"{name}: seed {seed}, greedy margin {margin:.4f}, logit max |x| {float(logits.abs().max()):.3f}")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: make_reference.py OUT_DIR [CASE ...]")
    for name, c in CASES.items():
        if len(sys.argv) == 2 or name in sys.argv[2:]:
            write_case(sys.argv[1], name, c)


if __name__ == "__main__":
    main()
