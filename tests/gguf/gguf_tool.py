#!/usr/bin/python3
"""GGUF files for the tests, written from the format's definition.

Usage:
  gguf_tool.py from-hf HF_DIR OUT.gguf [--type F32|F16|BF16|Q8_0|...] [--tokenizer tokenizer.json]
      The tiny HF checkpoint as llama.cpp's converter lays it out: tensor
      names (token_embd, blk.N.attn_q, ...), dims reversed, experts stacked
      into ffn_*_exps, Gemma norms stored + 1, tied heads left out, the
      metadata keys of general.architecture, tokenizer.ggml.* from the
      tokenizer.json (gpt2 model: tokens by id, token types, merges).
      2-D weights whose rows are whole blocks get --type, others F32/F16
      as llama.cpp keeps them.
  gguf_tool.py blocks OUT_DIR [--stamp FILE]
      For each decodable type: random blocks (payload.bin) and their values
      (expected.f32) computed by the reference decoders below, for the
      C++ dequantizer test.

Everything is numpy (Debian's python3-numpy): the ggml Python package is
not used. The decoders here are written from the block layouts in
ggml-common.h and the reference code in ggml-quants.c, every operation in
f32 in the same order, so their results are the bits llama.cpp computes.
The quantizers are simple ones from the same layouts (not llama.cpp's
search for the best scales): any valid block decodes the same way.
"""
import json
import os
import re
import struct
import sys

import numpy as np

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30
TYPES = {'F32': F32, 'F16': F16, 'BF16': BF16, 'Q8_0': Q8_0, 'Q4_0': Q4_0, 'Q4_1': Q4_1, 'Q5_0': Q5_0, 'Q5_1': Q5_1,
         'Q2_K': Q2_K, 'Q3_K': Q3_K, 'Q4_K': Q4_K, 'Q5_K': Q5_K, 'Q6_K': Q6_K}
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24),
         Q8_0: (32, 34), Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}

# GGUF value types
U8, I8, U16, I16, U32, I32, FLOAT32, BOOL, STRING, ARRAY, U64, I64, FLOAT64 = range(13)

f32 = np.float32


# ---------------------------------------------------------------- writer

def gguf_string(s):
    b = s.encode('utf-8') if isinstance(s, str) else s
    return struct.pack('<Q', len(b)) + b


def gguf_value(vtype, v):
    if vtype == STRING:
        return gguf_string(v)
    if vtype == ARRAY:
        etype, items = v
        out = struct.pack('<IQ', etype, len(items))
        return out + b''.join(gguf_value(etype, x) for x in items)
    fmt = {U8: '<B', I8: '<b', U16: '<H', I16: '<h', U32: '<I', I32: '<i', FLOAT32: '<f', BOOL: '<?', U64: '<Q',
           I64: '<q', FLOAT64: '<d'}[vtype]
    return struct.pack(fmt, v)


def write_gguf(path, kvs, tensors, alignment=32, version=3):
    """kvs: [(key, vtype, value)]; tensors: [(name, ggml_type, dims (ggml order), payload bytes)]."""
    head = b'GGUF' + struct.pack('<IQQ', version, len(tensors), len(kvs))
    for k, t, v in kvs:
        head += gguf_string(k) + struct.pack('<I', t) + gguf_value(t, v)
    offs, off = [], 0
    for name, t, dims, data in tensors:
        offs.append(off)
        off += len(data)
        off += (-off) % alignment
    for (name, t, dims, data), o in zip(tensors, offs):
        head += gguf_string(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims)
        head += struct.pack('<IQ', t, o)
    head += b'\0' * ((-len(head)) % alignment)
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(head)
        for (name, t, dims, data), o in zip(tensors, offs):
            f.write(b'\0' * (len(head) + o - f.tell()))
            f.write(data)
    os.replace(tmp, path)


# ---------------------------------------------------------------- f16 helpers

def h(x):
    """f16 bytes of x (round to nearest even) and its f32 value."""
    v = np.array([x], dtype=np.float16)
    return v.tobytes(), f32(v.astype(np.float32)[0])


def h2f(b, off):
    return f32(np.frombuffer(b, dtype=np.float16, count=1, offset=off).astype(np.float32)[0])


# ---------------------------------------------------------------- decoders (from the definition)

def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def decode_block(t, b):
    """One block's values, each computed in f32 in ggml's operation order."""
    y = []
    if t == Q8_0:
        d = h2f(b, 0)
        return [f32(f32(np.int8(np.uint8(q))) * d) for q in b[2:34]]
    if t in (Q4_0, Q4_1, Q5_0, Q5_1):
        d = h2f(b, 0)
        m = h2f(b, 2) if t in (Q4_1, Q5_1) else None
        qh = struct.unpack_from('<I', b, 4 if t == Q5_1 else 2)[0] if t in (Q5_0, Q5_1) else 0
        qs = b[{Q4_0: 2, Q4_1: 4, Q5_0: 6, Q5_1: 8}[t]:]
        lo, hi = [0] * 16, [0] * 16
        for j in range(16):
            x0, x1 = qs[j] & 0xF, qs[j] >> 4
            if t in (Q5_0, Q5_1):
                x0 |= ((qh >> j) << 4) & 0x10
                x1 |= (qh >> (j + 12)) & 0x10
            if t == Q4_0:
                x0, x1 = x0 - 8, x1 - 8
            if t == Q5_0:
                x0, x1 = x0 - 16, x1 - 16
            if m is None:
                lo[j], hi[j] = f32(f32(x0) * d), f32(f32(x1) * d)
            else:
                lo[j], hi[j] = f32(f32(f32(x0) * d) + m), f32(f32(f32(x1) * d) + m)
        return lo + hi
    if t == Q2_K:
        scales, q = b[0:16], b[16:80]
        d, mn = h2f(b, 80), h2f(b, 82)
        for i in range(256):
            n, j, l = i // 128, (i % 128) // 32, i % 32
            sc = scales[i // 16]
            dl, ml = f32(d * f32(sc & 0xF)), f32(mn * f32(sc >> 4))
            y.append(f32(f32(dl * f32((q[32 * n + l] >> (2 * j)) & 3)) - ml))
        return y
    if t == Q3_K:
        hm, q, raw = b[0:32], b[32:96], b[96:108]
        d = h2f(b, 108)
        sc = [0] * 16
        for i in range(4):
            sc[i] = (raw[i] & 0xF) | ((raw[8 + i] & 3) << 4)
            sc[4 + i] = (raw[4 + i] & 0xF) | (((raw[8 + i] >> 2) & 3) << 4)
            sc[8 + i] = (raw[i] >> 4) | (((raw[8 + i] >> 4) & 3) << 4)
            sc[12 + i] = (raw[4 + i] >> 4) | (((raw[8 + i] >> 6) & 3) << 4)
        for i in range(256):
            n, j, l = i // 128, (i % 128) // 32, i % 32
            dl = f32(d * f32(np.int8(np.uint8(sc[i // 16])) - 32))
            low = (q[32 * n + l] >> (2 * j)) & 3
            high = 0 if hm[l] & (1 << (4 * n + j)) else 4
            y.append(f32(dl * f32(low - high)))
        return y
    if t in (Q4_K, Q5_K):
        d, mn = h2f(b, 0), h2f(b, 2)
        scales = b[4:16]
        qh = b[16:48] if t == Q5_K else None
        qs = b[48:176] if t == Q5_K else b[16:144]
        for c in range(4):
            for half in range(2):
                sc, m = scale_min_k4(2 * c + half, scales)
                dl, ml = f32(d * f32(sc)), f32(mn * f32(m))
                for l in range(32):
                    qv = (qs[32 * c + l] >> (4 * half)) & 0xF
                    if qh is not None and qh[l] & (1 << (2 * c + half)):
                        qv += 16
                    y.append(f32(f32(dl * f32(qv)) - ml))
        return y
    if t == Q6_K:
        ql, qh, sc = b[0:128], b[128:192], b[192:208]
        d = h2f(b, 208)
        y = [f32(0)] * 256
        for n in range(2):
            for l in range(32):
                for k in range(4):
                    lo = (ql[64 * n + l + (32 if k & 1 else 0)] >> (4 if k >= 2 else 0)) & 0xF
                    hb = (qh[32 * n + l] >> (2 * k)) & 3
                    qv = np.int8((lo | (hb << 4)) - 32)
                    s = np.int8(np.uint8(sc[8 * n + l // 16 + 2 * k]))
                    y[128 * n + 32 * k + l] = f32(f32(d * f32(s)) * f32(qv))
        return y
    raise ValueError(t)


def decode(t, data, n):
    if t == F32:
        return np.frombuffer(data, dtype='<f4', count=n).copy()
    if t == F16:
        return np.frombuffer(data, dtype='<f2', count=n).astype(np.float32)
    if t == BF16:
        return (np.frombuffer(data, dtype='<u2', count=n).astype(np.uint32) << 16).view(np.float32)
    be, bb = BLOCK[t]
    out = []
    for i in range(n // be):
        out += decode_block(t, data[i * bb:(i + 1) * bb])
    return np.array(out, dtype=np.float32)


# ---------------------------------------------------------------- quantizers (simple, valid blocks)

def rnd(x):
    return int(np.floor(x + 0.5))


def q_block(t, x):
    x = [float(v) for v in x]
    if t == Q8_0:
        amax = max(abs(v) for v in x)
        db, d = h(amax / 127)
        return db + bytes(np.int8(0 if d == 0 else max(-127, min(127, rnd(v / d)))).view(np.uint8) for v in x)
    if t in (Q4_0, Q5_0):
        top = 8 if t == Q4_0 else 16
        mx = max(x, key=abs)
        db, d = h(mx / -top)
        q = [0 if d == 0 else min(2 * top - 1, max(0, int(v / d + top + 0.5))) for v in x]
    elif t in (Q4_1, Q5_1):
        top = 15 if t == Q4_1 else 31
        lo, hi = min(x), max(x)
        db, d = h((hi - lo) / top)
        mb, m = h(lo)
        q = [0 if d == 0 else min(top, max(0, rnd((v - m) / d))) for v in x]
        db += mb
    if t in (Q4_0, Q4_1):
        return db + bytes((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4) for j in range(16))
    if t in (Q5_0, Q5_1):
        qh = 0
        for j in range(16):
            qh |= ((q[j] >> 4) & 1) << j
            qh |= ((q[j + 16] >> 4) & 1) << (j + 16)
        return db + struct.pack('<I', qh) + bytes((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4) for j in range(16))
    if t in (Q2_K, Q4_K, Q5_K):
        sub = 16 if t == Q2_K else 32
        top = {Q2_K: 3, Q4_K: 15, Q5_K: 31}[t]
        smax = 15 if t == Q2_K else 63
        groups = [x[i:i + sub] for i in range(0, 256, sub)]
        mins = [max(0.0, -min(g)) for g in groups]
        scales = [(max(g) + m) / top for g, m in zip(groups, mins)]
        db, d = h(max(scales) / smax)
        mb, dmin = h(max(mins) / smax)
        sc = [0 if d == 0 else min(smax, rnd(s / d)) for s in scales]
        mq = [0 if dmin == 0 else min(smax, rnd(m / dmin)) for m in mins]
        q = []
        for g, s, m in zip(groups, sc, mq):
            dl, ml = float(f32(d * f32(s))), float(f32(dmin * f32(m)))
            q += [0 if dl == 0 else min(top, max(0, rnd((v + ml) / dl))) for v in g]
        if t == Q2_K:
            qs = bytearray(64)
            for i in range(256):
                n, j, l = i // 128, (i % 128) // 32, i % 32
                qs[32 * n + l] |= q[i] << (2 * j)
            return bytes((s & 0xF) | (m << 4) for s, m in zip(sc, mq)) + bytes(qs) + db + mb
        packed = bytearray(12)
        for j in range(4):
            packed[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
            packed[j + 4] = (mq[j] & 63) | ((mq[j + 4] >> 4) << 6)
            packed[j + 8] = (sc[j + 4] & 0xF) | ((mq[j + 4] & 0xF) << 4)
        qs = bytearray(128)
        qh = bytearray(32)
        for c in range(4):
            for l in range(32):
                a, b = q[64 * c + l], q[64 * c + 32 + l]
                qs[32 * c + l] = (a & 0xF) | ((b & 0xF) << 4)
                qh[l] |= ((a >> 4) & 1) << (2 * c) | ((b >> 4) & 1) << (2 * c + 1)
        return db + mb + bytes(packed) + (bytes(qh) if t == Q5_K else b'') + bytes(qs)
    if t in (Q3_K, Q6_K):
        lo_q, hi_q, lim = (-4, 3, 31) if t == Q3_K else (-32, 31, 127)
        groups = [x[i:i + 16] for i in range(0, 256, 16)]
        scales = [max(abs(v) for v in g) / -lo_q for g in groups]
        db, d = h(max(scales) / lim)
        sc = [0 if d == 0 else min(lim, rnd(s / d)) for s in scales]
        q = []
        for g, s in zip(groups, sc):
            dl = float(f32(d * f32(s)))
            q += [0 if dl == 0 else max(lo_q, min(hi_q, rnd(v / dl))) for v in g]
        if t == Q6_K:
            ql, qh = bytearray(128), bytearray(64)
            for i in range(256):
                n, k, l = i // 128, (i % 128) // 32, i % 32
                u = q[i] + 32
                ql[64 * n + l + (32 if k & 1 else 0)] |= (u & 0xF) << (4 if k >= 2 else 0)
                qh[32 * n + l] |= (u >> 4) << (2 * k)
            return bytes(ql) + bytes(qh) + bytes(np.array(sc, dtype=np.int8).view(np.uint8)) + db
        hm, qs = bytearray(32), bytearray(64)
        for i in range(256):
            n, j, l = i // 128, (i % 128) // 32, i % 32
            u = q[i] + 4
            qs[32 * n + l] |= (u & 3) << (2 * j)
            if u >> 2:
                hm[l] |= 1 << (4 * n + j)
        s6 = [s + 32 for s in sc]
        raw = bytearray(12)
        for i in range(4):
            raw[i] = (s6[i] & 0xF) | ((s6[8 + i] & 0xF) << 4)
            raw[4 + i] = (s6[4 + i] & 0xF) | ((s6[12 + i] & 0xF) << 4)
            raw[8 + i] = (s6[i] >> 4) | ((s6[4 + i] >> 4) << 2) | ((s6[8 + i] >> 4) << 4) | ((s6[12 + i] >> 4) << 6)
        return bytes(hm) + bytes(qs) + bytes(raw) + db
    raise ValueError(t)


def quantize(t, values):
    v = np.asarray(values, dtype=np.float32).reshape(-1)
    if t == F32:
        return v.astype('<f4').tobytes()
    if t == F16:
        return v.astype('<f2').tobytes()
    if t == BF16:
        b = v.view(np.uint32).astype(np.uint64)
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype('<u2').tobytes()
    be = BLOCK[t][0]
    return b''.join(q_block(t, v[i:i + be]) for i in range(0, len(v), be))


# ---------------------------------------------------------------- blocks for the dequantizer test

def cmd_blocks(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1234)
    index = {}
    for name, t in TYPES.items():
        be, bb = BLOCK[t]
        n = 512 if be == 1 else be * 4
        blocks = bytearray()
        if be == 1:
            vals = rng.normal(0, 2, n).astype(np.float32)
            blocks = bytearray(quantize(t, vals))
        else:
            # Random bytes everywhere (every bit pattern of codes and packed
            # scales), with finite f16 super-scales of either sign.
            for i in range(n // be):
                b = bytearray(rng.integers(0, 256, bb, dtype=np.uint8).tobytes())
                for off in {Q8_0: [0], Q4_0: [0], Q4_1: [0, 2], Q5_0: [0], Q5_1: [0, 2], Q2_K: [80, 82], Q3_K: [108],
                            Q4_K: [0, 2], Q5_K: [0, 2], Q6_K: [208]}[t]:
                    b[off:off + 2] = h(float(rng.normal(0, 0.05)))[0]
                blocks += b
            # and one block quantized from real values, as a file holds them
            blocks[-bb:] = q_block(t, rng.normal(0, 1, be).astype(np.float32))
        expected = decode(t, bytes(blocks), n)
        with open(os.path.join(out, name + '.bin'), 'wb') as f:
            f.write(bytes(blocks))
        with open(os.path.join(out, name + '.f32'), 'wb') as f:
            f.write(expected.astype('<f4').tobytes())
        index[name] = {'type': t, 'values': n}
    with open(os.path.join(out, 'index.json'), 'w') as f:
        json.dump(index, f, indent=1)


# ---------------------------------------------------------------- HF checkpoint -> GGUF

def read_safetensors(d):
    files = []
    if os.path.exists(os.path.join(d, 'model.safetensors.index.json')):
        wm = json.load(open(os.path.join(d, 'model.safetensors.index.json')))['weight_map']
        files = sorted(set(wm.values()))
    else:
        files = ['model.safetensors']
    out = {}
    for fn in files:
        with open(os.path.join(d, fn), 'rb') as f:
            n = struct.unpack('<Q', f.read(8))[0]
            hdr = json.loads(f.read(n))
            base = 8 + n
            for name, info in hdr.items():
                if name == '__metadata__':
                    continue
                f.seek(base + info['data_offsets'][0])
                raw = f.read(info['data_offsets'][1] - info['data_offsets'][0])
                dt = info['dtype']
                if dt == 'F32':
                    a = np.frombuffer(raw, dtype='<f4')
                elif dt == 'F16':
                    a = np.frombuffer(raw, dtype='<f2').astype(np.float32)
                else:
                    a = (np.frombuffer(raw, dtype='<u2').astype(np.uint32) << 16).view(np.float32)
                out[name] = (dt, a.reshape(info['shape']).astype(np.float32))
    return out


LAYER_NAMES = {
    'input_layernorm.weight': 'attn_norm.weight', 'self_attn.q_proj.weight': 'attn_q.weight',
    'self_attn.q_proj.bias': 'attn_q.bias', 'self_attn.k_proj.weight': 'attn_k.weight', 'self_attn.k_proj.bias': 'attn_k.bias',
    'self_attn.v_proj.weight': 'attn_v.weight', 'self_attn.v_proj.bias': 'attn_v.bias',
    'self_attn.o_proj.weight': 'attn_output.weight', 'self_attn.q_norm.weight': 'attn_q_norm.weight',
    'self_attn.k_norm.weight': 'attn_k_norm.weight', 'mlp.gate_proj.weight': 'ffn_gate.weight',
    'mlp.up_proj.weight': 'ffn_up.weight', 'mlp.down_proj.weight': 'ffn_down.weight', 'mlp.gate.weight': 'ffn_gate_inp.weight',
    'mlp.shared_expert.gate_proj.weight': 'ffn_gate_shexp.weight', 'mlp.shared_expert.up_proj.weight': 'ffn_up_shexp.weight',
    'mlp.shared_expert.down_proj.weight': 'ffn_down_shexp.weight', 'mlp.shared_expert_gate.weight': 'ffn_gate_inp_shexp.weight',
    'post_feedforward_layernorm.weight': 'post_ffw_norm.weight',
}

ARCH = {'qwen2': 'qwen2', 'qwen3': 'qwen3', 'qwen2_moe': 'qwen2moe', 'qwen3_moe': 'qwen3moe', 'gemma': 'gemma',
        'gemma2': 'gemma2', 'gemma3': 'gemma3', 'gemma3_text': 'gemma3'}


def hf_tensors(cfg, tensors):
    """HF tensors under canonical names: wrappers stripped, vision dropped, fused expert banks split."""
    out = {}
    for name, (dt, a) in tensors.items():
        for pre, rep in (('model.language_model.', 'model.'), ('language_model.model.', 'model.'), ('language_model.lm_head.', 'lm_head.')):
            if name.startswith(pre):
                name = rep + name[len(pre):]
        if name.startswith(('vision_tower.', 'multi_modal_projector.', 'model.visual.', 'visual.')):
            continue
        if name.endswith('mlp.experts.gate_up_proj') or name.endswith('mlp.experts.down_proj'):
            base = name[:name.index('mlp.experts.') + len('mlp.experts.')]
            inter, hidden = cfg['moe_intermediate_size'], cfg['hidden_size']
            for e in range(a.shape[0]):
                slab = a[e]
                if name.endswith('gate_up_proj'):
                    if slab.shape[0] != 2 * inter:
                        slab = slab.T
                    out[base + '%d.gate_proj.weight' % e] = (dt, slab[:inter])
                    out[base + '%d.up_proj.weight' % e] = (dt, slab[inter:])
                else:
                    if slab.shape[0] != hidden:
                        slab = slab.T
                    out[base + '%d.down_proj.weight' % e] = (dt, slab)
            continue
        out[name] = (dt, a)
    return out


def tokenizer_kvs(tok_path, vocab_size, cfg):
    tj = json.load(open(tok_path, encoding='utf-8'))
    model = tj['model']
    added = {t['id']: t for t in tj.get('added_tokens', [])}
    by_id = {i: t for t, i in model['vocab'].items()}
    for i, t in added.items():
        by_id[i] = t['content']
    n = max(vocab_size, max(by_id) + 1)
    spm = bool(model.get('byte_fallback'))
    tokens, types, scores = [], [], []
    for i in range(n):
        if i not in by_id:
            tokens.append('[PAD%d]' % i)
            types.append(5)  # UNUSED
            scores.append(0.0)
            continue
        t = by_id[i]
        tokens.append(t)
        scores.append(0.0)
        if i in added:
            looks = (t.startswith('<|') and t.endswith('|>')) or t in ('<pad>', '<mask>')
            types.append(3 if added[i]['special'] or looks else 4)  # CONTROL / USER_DEFINED
        elif spm and t == model.get('unk_token'):
            types.append(2)  # UNKNOWN
        elif spm and re.fullmatch(r'<0x[0-9A-F]{2}>', t):
            types.append(6)  # BYTE
        else:
            types.append(1)
            # A SentencePiece BPE model scores its pieces in vocabulary
            # order; the merges are derived from those scores.
            scores[-1] = -float(i)
    kvs = [('tokenizer.ggml.tokens', ARRAY, (STRING, tokens)), ('tokenizer.ggml.token_type', ARRAY, (I32, types))]
    if spm:
        kvs += [('tokenizer.ggml.model', STRING, 'llama'), ('tokenizer.ggml.pre', STRING, 'default'),
                ('tokenizer.ggml.scores', ARRAY, (FLOAT32, scores))]
        if model.get('unk_token') in model['vocab']:
            kvs.append(('tokenizer.ggml.unknown_token_id', U32, model['vocab'][model['unk_token']]))
    else:
        merges = [m if isinstance(m, str) else ' '.join(m) for m in model.get('merges', [])]
        pre = 'qwen2' if json.dumps(tj.get('pre_tokenizer')).find('Split') >= 0 else 'gpt2'
        kvs += [('tokenizer.ggml.model', STRING, 'gpt2'), ('tokenizer.ggml.pre', STRING, pre),
                ('tokenizer.ggml.merges', ARRAY, (STRING, merges))]
    d = os.path.dirname(tok_path)
    tc = {}
    if os.path.exists(os.path.join(d, 'tokenizer_config.json')):
        tc = json.load(open(os.path.join(d, 'tokenizer_config.json'), encoding='utf-8'))
    tmpl = tc.get('chat_template')
    if os.path.exists(os.path.join(d, 'chat_template.jinja')):
        tmpl = open(os.path.join(d, 'chat_template.jinja'), encoding='utf-8').read()
    if isinstance(tmpl, str):
        kvs.append(('tokenizer.chat_template', STRING, tmpl))
    ids = {v: k for k, v in enumerate(tokens)}
    for key in ('add_bos_token', 'add_eos_token'):
        if isinstance(tc.get(key), bool):
            kvs.append(('tokenizer.ggml.' + key, BOOL, tc[key]))
    tc_cfg = cfg
    eos = tc.get('eos_token')
    if isinstance(eos, dict):
        eos = eos.get('content')
    if eos in ids:
        kvs.append(('tokenizer.ggml.eos_token_id', U32, ids[eos]))
    elif isinstance(tc_cfg.get('eos_token_id'), int):
        kvs.append(('tokenizer.ggml.eos_token_id', U32, tc_cfg['eos_token_id']))
    if isinstance(tc_cfg.get('bos_token_id'), int):
        kvs.append(('tokenizer.ggml.bos_token_id', U32, tc_cfg['bos_token_id']))
    if isinstance(tc_cfg.get('pad_token_id'), int):
        kvs.append(('tokenizer.ggml.padding_token_id', U32, tc_cfg['pad_token_id']))
    return kvs


def cmd_from_hf(hf_dir, out, wtype, tok_path):
    cfg_all = json.load(open(os.path.join(hf_dir, 'config.json')))
    cfg = dict(cfg_all.get('text_config', cfg_all))
    for k in ('bos_token_id', 'eos_token_id', 'pad_token_id', 'tie_word_embeddings'):
        if k not in cfg and k in cfg_all:
            cfg[k] = cfg_all[k]
    mt = cfg_all['model_type']
    arch = ARCH[mt]
    gemma = arch.startswith('gemma')
    sandwich = arch in ('gemma2', 'gemma3')
    a = arch + '.'
    H, L, nh = cfg['hidden_size'], cfg['num_hidden_layers'], cfg['num_attention_heads']
    hd = cfg.get('head_dim') or H // nh
    kvs = [('general.architecture', STRING, arch), ('general.alignment', U32, 32),
           (a + 'context_length', U32, cfg['max_position_embeddings']), (a + 'embedding_length', U32, H),
           (a + 'block_count', U32, L), (a + 'feed_forward_length', U32, cfg['intermediate_size']),
           (a + 'attention.head_count', U32, nh), (a + 'attention.head_count_kv', U32, cfg.get('num_key_value_heads', nh)),
           (a + 'attention.layer_norm_rms_epsilon', FLOAT32, cfg.get('rms_norm_eps', 1e-6))]
    if 'head_dim' in cfg:
        kvs += [(a + 'attention.key_length', U32, hd), (a + 'attention.value_length', U32, hd)]
    theta = cfg.get('rope_theta', cfg.get('rope_parameters', {}).get('rope_theta'))
    if theta is not None:
        kvs.append((a + 'rope.freq_base', FLOAT32, theta))
    if 'num_experts' in cfg:
        kvs += [(a + 'expert_count', U32, cfg['num_experts']), (a + 'expert_used_count', U32, cfg['num_experts_per_tok']),
                (a + 'expert_feed_forward_length', U32, cfg['moe_intermediate_size']),
                (a + 'expert_weights_norm', BOOL, bool(cfg.get('norm_topk_prob', False)))]
        if cfg.get('shared_expert_intermediate_size'):
            kvs.append((a + 'expert_shared_feed_forward_length', U32, cfg['shared_expert_intermediate_size']))
    if sandwich:
        if cfg.get('query_pre_attn_scalar'):
            kvs.append((a + 'attention.scale', FLOAT32, 1.0 / cfg['query_pre_attn_scalar'] ** 0.5))
        if cfg.get('sliding_window'):
            kvs.append((a + 'attention.sliding_window', U32, cfg['sliding_window']))
        for k in ('attn_logit_softcapping', 'final_logit_softcapping'):
            if cfg.get(k) is not None:
                kvs.append((a + k, FLOAT32, cfg[k]))
    if arch == 'gemma3':
        if cfg.get('sliding_window_pattern'):
            kvs.append((a + 'attention.sliding_window_pattern', U32, cfg['sliding_window_pattern']))
        if cfg.get('rope_local_base_freq'):
            kvs.append((a + 'rope.freq_base_swa', FLOAT32, cfg['rope_local_base_freq']))
        # As llama.cpp's Gemma 3 converter: the linear scaling of the global layers.
        rs = cfg.get('rope_scaling')
        if rs:
            kvs += [(a + 'rope.scaling.type', STRING, rs.get('rope_type', rs.get('type'))),
                    (a + 'rope.scaling.factor', FLOAT32, rs['factor'])]
    tensors = hf_tensors(cfg, read_safetensors(hf_dir))
    tied = 'lm_head.weight' not in tensors or gemma
    vocab = tensors['model.embed_tokens.weight'][1].shape[0]
    tok = tok_path or os.path.join(hf_dir, 'tokenizer.json')
    if os.path.exists(tok):
        kvs += tokenizer_kvs(tok, vocab, cfg)

    out_t = []

    def put(gname, arr, norm=False):
        arr = np.asarray(arr, dtype=np.float32)
        if gemma and norm:
            arr = arr + np.float32(1)
        dims = list(reversed(arr.shape))
        if arr.ndim >= 2 and dims[0] % BLOCK[wtype][0] == 0:
            t = wtype
        else:
            t = F32  # norms, biases and rows that are not whole blocks, as llama.cpp keeps them
        out_t.append((gname, t, dims, quantize(t, arr)))

    put('token_embd.weight', tensors['model.embed_tokens.weight'][1])
    for i in range(L):
        p = 'model.layers.%d.' % i
        experts = {}
        for name, (dt, arr) in sorted(tensors.items()):
            if not name.startswith(p):
                continue
            role = name[len(p):]
            if role.startswith('mlp.experts.'):
                e, rest = role[len('mlp.experts.'):].split('.', 1)
                experts.setdefault(rest, {})[int(e)] = arr
                continue
            if role == 'post_attention_layernorm.weight':
                g = 'post_attention_norm.weight' if sandwich else 'ffn_norm.weight'
            elif role == 'pre_feedforward_layernorm.weight':
                g = 'ffn_norm.weight'
            else:
                g = LAYER_NAMES[role]
            put('blk.%d.%s' % (i, g), arr, norm=name.endswith('norm.weight'))
        for rest, by_e in sorted(experts.items()):
            stack = np.stack([by_e[e] for e in range(len(by_e))])
            put('blk.%d.ffn_%s_exps.weight' % (i, rest.split('_')[0]), stack)
    put('output_norm.weight', tensors['model.norm.weight'][1], norm=True)
    if not tied:
        put('output.weight', tensors['lm_head.weight'][1])
    write_gguf(out, kvs, out_t)


def main(argv):
    if len(argv) >= 3 and argv[1] == 'blocks':
        cmd_blocks(argv[2])
        if len(argv) >= 5 and argv[3] == '--stamp':
            open(argv[4], 'w').write('blocks\n')
        return 0
    if len(argv) >= 4 and argv[1] == 'from-hf':
        wtype, tok = 'F32', None
        rest = argv[4:]
        while rest:
            if rest[0] == '--type':
                wtype, rest = rest[1], rest[2:]
            elif rest[0] == '--tokenizer':
                tok, rest = rest[1], rest[2:]
            else:
                print('unknown option ' + rest[0], file=sys.stderr)
                return 2
        cmd_from_hf(argv[2], argv[3], TYPES[wtype], tok)
        return 0
    print(__doc__)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv))
