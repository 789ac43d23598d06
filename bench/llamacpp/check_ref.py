#!/usr/bin/python3
"""Checks that a GGUF made by hf_to_gguf.py computes the same function in llama.cpp
as the HF checkpoint it came from: a plain numpy (f32) Qwen3 (or Qwen3-MoE) forward pass over the
token ids bench.mjs --check-tokens feeds, compared with the logits it dumped.

usage: /usr/bin/python3 check_ref.py HF_DIR LOGITS.f32 K [QK_NORM_SCALE=1] [MAX_REL_RMS=0.01]

QK_NORM_SCALE must be the one the GGUF was made with (hf_to_gguf.py's 4th argument;
run.sh uses 100 so that attention is sharp and RoPE and q/k matter).

Prints, per position, the argmax of both and the relative RMS error of llama.cpp's
logits against the reference; exits 1 if an argmax differs or an error exceeds
MAX_REL_RMS. Reads one layer's weights at a time (~100 MB). Takes ~20 s.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_to_gguf import SafeTensors, fail  # noqa: E402


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_neox(x, pos, theta):
    """Rotates the two halves of each head (Qwen/NeoX layout). x: [T, H, D]."""
    d = x.shape[-1]
    freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, None] * freq[None, :]
    cos = np.cos(ang).astype(np.float32)[:, None, :]
    sin = np.sin(ang).astype(np.float32)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def swiglu(h, w, p):
    g = h @ w(p + "gate_proj.weight").T
    u = h @ w(p + "up_proj.weight").T
    return ((g / (1 + np.exp(-g))) * u) @ w(p + "down_proj.weight").T


def moe_ffn(h, w, p, cfg):
    """Qwen3-MoE's sparse block as HF's Qwen3MoeSparseMoeBlock computes it: softmax
    over all experts, top-k (ties to the lower index), renormalised when
    norm_topk_prob, the chosen experts' SwiGLU outputs summed with those weights."""
    logits = h @ w(p + "mlp.gate.weight").T
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    k = cfg["num_experts_per_tok"]
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        wt = probs[t, top[t]]
        if cfg.get("norm_topk_prob", False):
            wt = wt / wt.sum()
        for e, we in zip(top[t], wt):
            out[t] += we * swiglu(h[t:t + 1], w, p + f"mlp.experts.{e}.")[0]
    return out


def main():
    if len(sys.argv) not in (4, 5, 6):
        fail("usage: check_ref.py HF_DIR LOGITS.f32 K [QK_NORM_SCALE] [MAX_REL_RMS]")
    hf, dump, K = sys.argv[1], sys.argv[2], int(sys.argv[3])
    qk_scale = float(sys.argv[4]) if len(sys.argv) >= 5 else 1.0
    tol = float(sys.argv[5]) if len(sys.argv) == 6 else 0.01
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    st = SafeTensors(os.path.join(hf, "model.safetensors"))
    V, E = cfg["vocab_size"], cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", E // nh)
    eps, theta = cfg.get("rms_norm_eps", 1e-6), float(cfg.get("rope_theta", 1e6))
    got = np.fromfile(dump, dtype="<f4")
    if got.size != K * V:
        fail(f"{dump}: {got.size} floats, expected {K} x {V}")
    got = got.reshape(K, V)

    def w(name):
        shape = st.shape(name)
        return st.rows_f32(name, 0, shape[0]).reshape(shape)

    # The same ids bench.mjs --check-tokens feeds, at positions 0..K-1.
    toks = [(i * 7919 + 11) % V for i in range(K)]
    pos = np.arange(K, dtype=np.float64)
    x = np.stack([st.rows_f32("model.embed_tokens.weight", t, 1) for t in toks])
    mask = np.triu(np.full((K, K), -np.inf, dtype=np.float32), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, w(p + "input_layernorm.weight"), eps)
        q = (h @ w(p + "self_attn.q_proj.weight").T).reshape(K, nh, hd)
        k = (h @ w(p + "self_attn.k_proj.weight").T).reshape(K, nkv, hd)
        v = (h @ w(p + "self_attn.v_proj.weight").T).reshape(K, nkv, hd)
        q = rope_neox(rmsnorm(q, qk_scale * w(p + "self_attn.q_norm.weight"), eps), pos, theta)
        k = rope_neox(rmsnorm(k, qk_scale * w(p + "self_attn.k_norm.weight"), eps), pos, theta)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", s, v).reshape(K, nh * hd)
        x = x + o @ w(p + "self_attn.o_proj.weight").T
        h = rmsnorm(x, w(p + "post_attention_layernorm.weight"), eps)
        if cfg.get("model_type") == "qwen3_moe":
            x = x + moe_ffn(h, w, p, cfg)
        else:
            x = x + swiglu(h, w, p + "mlp.")
    x = rmsnorm(x, w("model.norm.weight"), eps)
    head = "lm_head.weight" if "lm_head.weight" in st.header else "model.embed_tokens.weight"
    ref = np.empty((K, V), dtype=np.float32)
    for r in range(0, V, 16384):
        n = min(16384, V - r)
        ref[:, r:r + n] = x @ st.rows_f32(head, r, n).reshape(n, E).T

    ok = True
    for t in range(K):
        err = np.sqrt(np.mean((got[t] - ref[t]) ** 2) / np.mean(ref[t] ** 2))
        same = int(got[t].argmax()) == int(ref[t].argmax())
        ok &= same and err <= tol
        print(f"ref pos {t} in {toks[t]}: argmax llama.cpp {got[t].argmax()} ref {ref[t].argmax()}"
              f" ({'same' if same else 'DIFFERENT'}), rel RMS error {err:.2e}")
    print("ref check:", "ok" if ok else f"FAILED (tolerance {tol})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
