#!/usr/bin/python3
"""Cross-check expected_greedy.json with an independent numpy Qwen3 forward.

    /usr/bin/python3 tools/train/check_reference.py models/austen-tiny

The numpy forward is written from Hugging Face's modeling_qwen3 semantics in f64,
loop-per-head attention, no KV cache -- it shares no model code with
qwen3_torch.py. Prints the largest logit difference against the torch model over
prompt+generated tokens and whether numpy greedy decoding (full recompute each step)
reproduces the recorded ids. Exit status 1 on any mismatch.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3_torch import load_checkpoint, load_safetensors  # noqa: E402  (file loading only)

d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', '..', 'models', 'austen-tiny')
torch.set_num_threads(2)
cfg = json.load(open(d + '/config.json'))
W = {k: v.double().numpy() for k, v in load_safetensors(d + '/model.safetensors').items()}
H, nh, nkv, hd, eps = cfg['hidden_size'], cfg['num_attention_heads'], cfg['num_key_value_heads'], cfg['head_dim'], cfg['rms_norm_eps']
def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
def rope(v, p):
    m = hd // 2
    inv = 1.0 / cfg['rope_theta'] ** (np.arange(m) * 2 / hd)
    th = p * inv; c, s = np.cos(th), np.sin(th)
    a, b = v[..., :m], v[..., m:]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)
def forward(ids):
    T = len(ids); h = W['model.embed_tokens.weight'][ids]
    for i in range(cfg['num_hidden_layers']):
        P = f'model.layers.{i}.'
        x = rms(h, W[P + 'input_layernorm.weight'])
        q = (x @ W[P + 'self_attn.q_proj.weight'].T).reshape(T, nh, hd)
        k = (x @ W[P + 'self_attn.k_proj.weight'].T).reshape(T, nkv, hd)
        v = (x @ W[P + 'self_attn.v_proj.weight'].T).reshape(T, nkv, hd)
        q = rms(q, W[P + 'self_attn.q_norm.weight']); k = rms(k, W[P + 'self_attn.k_norm.weight'])
        pos = np.arange(T)[:, None, None]
        q = rope(q, pos); k = rope(k, pos)
        out = np.zeros((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            for p in range(T):
                s = k[:p + 1, g] @ q[p, hh] / np.sqrt(hd)
                e = np.exp(s - s.max()); e /= e.sum()
                out[p, hh] = e @ v[:p + 1, g]
        h = h + out.reshape(T, nh * hd) @ W[P + 'self_attn.o_proj.weight'].T
        x = rms(h, W[P + 'post_attention_layernorm.weight'])
        gt = x @ W[P + 'mlp.gate_proj.weight'].T
        h = h + ((gt / (1 + np.exp(-gt))) * (x @ W[P + 'mlp.up_proj.weight'].T)) @ W[P + 'mlp.down_proj.weight'].T
    return rms(h, W['model.norm.weight']) @ W['model.embed_tokens.weight'].T
eg = json.load(open(d + '/expected_greedy.json'))
model, _ = load_checkpoint(d)
ok = True
for c in eg['cases']:
    ids = c['prompt_ids'] + c['generated_ids']
    ref = forward(ids)
    with torch.no_grad(): got = model(torch.tensor([ids]))[0].double().numpy()
    diff = np.abs(ref - got).max()
    print(c['name'], 'max|torch-numpy| logits', diff, 'max|logit|', np.abs(ref).max())
    ok &= bool(diff < 1e-4)
    # greedy from numpy full recompute (no cache) must equal the recorded ids
    seq = list(c['prompt_ids']); gen = []
    for _ in range(len(c['generated_ids'])):
        nxt = int(np.argmax(forward(seq)[-1])); gen.append(nxt); seq.append(nxt)
    print(c['name'], 'numpy greedy == recorded:', gen == c['generated_ids'])
    ok &= gen == c['generated_ids']
print('OK' if ok else 'MISMATCH')
sys.exit(0 if ok else 1)
