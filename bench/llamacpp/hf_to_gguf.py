#!/usr/bin/python3
"""Convert a Qwen3 or Qwen3-MoE HF checkpoint (config.json + one model.safetensors,
BF16/F16/F32) into a GGUF v3 file that llama.cpp's qwen3 / qwen3moe loader accepts, so
that llama.cpp can be benchmarked on exactly the weights `cmfhost bench` runs.

usage: /usr/bin/python3 hf_to_gguf.py HF_DIR OUT.gguf {f16|bf16|q8_0|q4_0|q4_k_m} [QK_NORM_SCALE]

QK_NORM_SCALE (for check_ref.py only, never for benchmarks) multiplies the q_norm
and k_norm weights: convert_bench's random norms (std 0.02) make attention almost
uniform, so positions, RoPE and q/k would go unchecked without it.

Only for benchmarking: written from the GGUF spec (ggml docs/gguf.md) with Debian's
numpy; it does not use the `gguf` PyPI package (no PyPI on this machine). The
checkpoints made by convert_bench have no tokenizer, so the file gets a dummy
byte-level "gpt2" vocabulary with vocab_size entries and a single merge: the bench
feeds token ids directly, tokenization never runs on real text.

2-D weights are stored as F16, Q8_0 (blocks of 32: f16 scale d = amax/127, int8
q = round(x/d)) or Q4_0 (blocks of 32: f16 d = -(the value of largest |x|)/8,
nibbles min(15, trunc(x/d + 8.5)), as ggml's reference quantizer), BF16, or
llama.cpp's Q4_K_M mix of Q4_K and Q6_K (encode_q4_k, encode_q6_k, q4_k_m_type); 1-D norms
stay F32, as llama.cpp's own converter does. Tensors are
streamed one at a time (the embedding in row chunks) so peak memory stays ~100 MB.
The output is written to OUT.gguf.tmp and renamed only when complete.

Qwen3-MoE (model_type qwen3_moe): llama.cpp keeps each layer's experts in three
stacked tensors, ffn_{gate,up,down}_exps of GGUF dims [cols, rows, n_expert] (expert
e's HF matrix is slice e), and the router as ffn_gate_inp; its qwen3moe graph always
renormalises the top-k weights, so only norm_topk_prob = true checkpoints are
accepted, and every layer must be sparse (decoder_sparse_step 1, no mlp_only_layers).
"""
import json
import os
import struct
import sys

import numpy as np

ALIGN = 32  # GGUF default alignment (no general.alignment key written)

# GGUF metadata value types
T_UINT32, T_INT32, T_FLOAT32, T_STRING, T_ARRAY = 4, 5, 6, 8, 9
# ggml tensor types
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_Q4_K, GGML_Q6_K, GGML_BF16 = 0, 1, 2, 8, 12, 14, 30
# llama_ftype for general.file_type
FILE_TYPE = {"f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_k_m": 15}
WEIGHT_TYPE = {"f16": GGML_F16, "bf16": GGML_BF16, "q8_0": GGML_Q8_0, "q4_0": GGML_Q4_0, "q4_k_m": GGML_Q4_K}
QK8_0 = 32
QK4_0 = 32
QK_K = 256
# (values per block, bytes per block) of the block formats
BLOCK = {GGML_Q8_0: (QK8_0, 2 + QK8_0), GGML_Q4_0: (QK4_0, 2 + QK4_0 // 2),
         GGML_Q4_K: (QK_K, 144), GGML_Q6_K: (QK_K, 210)}


def fail(msg):
    sys.exit(f"hf_to_gguf: {msg}")


# ---- safetensors ---------------------------------------------------------------

class SafeTensors:
    """Reads tensors from one .safetensors file by name (header parsed once)."""

    DTYPES = {"BF16": 2, "F16": 2, "F32": 4}

    def __init__(self, path):
        self.f = open(path, "rb")
        raw = self.f.read(8)
        if len(raw) != 8:
            fail(f"{path}: too short for a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            fail(f"{path}: header length {n} is implausible")
        self.header = json.loads(self.f.read(n))
        self.header.pop("__metadata__", None)
        self.base = 8 + n
        for name, t in self.header.items():
            if t["dtype"] not in self.DTYPES:
                fail(f"{path}: tensor {name} has unsupported dtype {t['dtype']}")

    def shape(self, name):
        if name not in self.header:
            fail(f"checkpoint has no tensor {name}")
        return list(self.header[name]["shape"])

    def rows_f32(self, name, row0, nrows):
        """Rows [row0, row0+nrows) of a tensor (first dim = rows) as float32."""
        t = self.header[name]
        shape = t["shape"]
        row_elems = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        esize = self.DTYPES[t["dtype"]]
        begin, end = t["data_offsets"]
        total = int(np.prod(shape))
        if end - begin != total * esize:
            fail(f"tensor {name}: {end - begin} bytes for shape {shape} {t['dtype']}")
        if len(shape) == 1:
            row0, nrows, row_elems = 0, 1, shape[0]
        self.f.seek(self.base + begin + row0 * row_elems * esize)
        count = nrows * row_elems
        raw = self.f.read(count * esize)
        if len(raw) != count * esize:
            fail(f"tensor {name}: file truncated")
        if t["dtype"] == "BF16":
            # bf16 is the top half of an f32: widen exactly.
            return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        if t["dtype"] == "F16":
            return np.frombuffer(raw, dtype="<f2").astype(np.float32)
        return np.frombuffer(raw, dtype="<f4").copy()


# ---- encoders ------------------------------------------------------------------

def round_half_away(v):
    """Round half away from zero (C roundf), not numpy's half-to-even."""
    return np.trunc(v + np.copysign(0.5, v))


def div0(a, b):
    """a / b elementwise (broadcast), 0 where b == 0."""
    a, b = np.broadcast_arrays(a, b)
    return np.divide(a, b, out=np.zeros(a.shape, dtype=np.result_type(a, b)), where=b != 0)


def encode_q8_0(x):
    """Q8_0 blocks: per 32 values an f16 scale d = amax/127 and 32 int8 round(x/d)."""
    b = x.reshape(-1, QK8_0)
    amax = np.abs(b).max(axis=1)
    d = amax / 127.0
    inv = div0(np.float32(1.0), d)
    v = b * inv[:, None]
    q = round_half_away(v).clip(-127, 127).astype(np.int8)
    out = np.empty(b.shape[0], dtype=[("d", "<f2"), ("qs", "i1", QK8_0)])
    out["d"] = d.astype(np.float16)
    out["qs"] = q
    return out.tobytes()


def encode_q4_0(x):
    """Q4_0 blocks as ggml's quantize_row_q4_0_ref: per 32 values the value m of
    largest |x| (the first such), d = m / -8, nibble q = min(15, trunc(x/d + 8.5));
    byte j holds element j (low nibble) and element 16 + j (high nibble)."""
    b = x.reshape(-1, QK4_0).astype(np.float32)
    m = b[np.arange(b.shape[0]), np.abs(b).argmax(axis=1)]
    d = (m / np.float32(-8.0)).astype(np.float32)
    inv = div0(np.float32(1.0), d)
    q = np.minimum(15, np.trunc(b * inv[:, None] + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
    out = np.empty(b.shape[0], dtype=[("d", "<f2"), ("qs", "u1", QK4_0 // 2)])
    out["d"] = d.astype(np.float16)
    out["qs"] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def encode_q4_k(x):
    """Q4_K super-blocks of 256 = 8 sub-blocks of 32, value = d*sc*q - dmin*m with q in
    0..15 and 6-bit sc, m per sub-block. Layout (ggml's block_q4_K, 144 bytes): f16 d,
    f16 dmin, 12 bytes of packed scales (sub-blocks 0-3: sc and m in the low 6 bits of
    bytes 0-3 and 4-7; sub-blocks 4-7: low nibbles in bytes 8-11, top 2 bits in the top
    of bytes 0-7), then 128 bytes where byte 32c+l holds sub-block 2c's value l (low
    nibble) and sub-block 2c+1's (high nibble). Scales from each sub-block's min/max
    (one pass, not ggml's iterative search: the benchmark needs the format, and random
    weights have no outliers for a search to find)."""
    b = x.reshape(-1, QK_K // 32, 32).astype(np.float32)
    lo = np.minimum(b.min(axis=2), 0.0)
    scale = (b.max(axis=2) - lo) / 15.0
    mins = -lo
    d = scale.max(axis=1) / 63.0
    dmin = mins.max(axis=1) / 63.0
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    dq, dminq = d16.astype(np.float32), dmin16.astype(np.float32)
    sc = np.clip(round_half_away(div0(scale, dq[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(round_half_away(div0(mins, dminq[:, None])), 0, 63).astype(np.uint8)
    step = dq[:, None] * sc
    off = dminq[:, None] * m
    q = div0(b + off[:, :, None], step[:, :, None])
    q = np.clip(round_half_away(q), 0, 15).astype(np.uint8)
    scales = np.empty((b.shape[0], 12), dtype=np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(b.shape[0], 128)
    out = np.empty(b.shape[0], dtype=[("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
    out["d"], out["dmin"], out["scales"], out["qs"] = d16, dmin16, scales, qs
    return out.tobytes()


def encode_q6_k(x):
    """Q6_K super-blocks of 256 = 16 sub-blocks of 16, value = d*sc*(q - 32) with q in
    0..63 and an int8 sc per sub-block. Layout (ggml's block_q6_K, 210 bytes): ql[128]
    low nibbles, qh[64] top 2 bits, scales[16], f16 d; per half n of 128 values, value
    32k+l (k = 0..3) has its low nibble in ql[64n + 32(k&1) + l] (k < 2 low, else high
    nibble) and its top bits at bit 2k of qh[32n + l]."""
    b = x.reshape(-1, QK_K // 16, 16).astype(np.float32)
    amax_i = np.abs(b).argmax(axis=2)
    mval = np.take_along_axis(b, amax_i[:, :, None], axis=2)[:, :, 0]
    scale = mval / -32.0  # as Q4_0: the largest |x| maps to the end with -32
    smax_i = np.abs(scale).argmax(axis=1)
    d = np.take_along_axis(scale, smax_i[:, None], axis=1)[:, 0] / -128.0
    d16 = d.astype(np.float16)
    dq = d16.astype(np.float32)
    sc = np.clip(round_half_away(div0(scale, dq[:, None])), -128, 127).astype(np.int8)
    step = dq[:, None] * sc
    q = div0(b, step[:, :, None])
    q = (np.clip(round_half_away(q), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    lo, hi = q & 0xF, q >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    out = np.empty(b.shape[0], dtype=[("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])
    out["ql"], out["qh"], out["scales"], out["d"] = ql.reshape(-1, 128), qh.reshape(-1, 64), sc, d16
    return out.tobytes()


def encode_bf16(x):
    """bf16 by round-to-nearest-even of the f32 (exact for a BF16 checkpoint)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def encoded_size(gtype, n):
    if gtype == GGML_F32:
        return 4 * n
    if gtype in (GGML_F16, GGML_BF16):
        return 2 * n
    per, size = BLOCK[gtype]
    return n // per * size


ENCODERS = {GGML_F32: lambda x: x.astype("<f4").tobytes(), GGML_F16: lambda x: x.astype("<f2").tobytes(),
            GGML_BF16: encode_bf16, GGML_Q8_0: encode_q8_0, GGML_Q4_0: encode_q4_0,
            GGML_Q4_K: encode_q4_k, GGML_Q6_K: encode_q6_k}


def encode(gtype, x):
    return ENCODERS[gtype](x)


def q4_k_m_type(gname, n_layer, tied):
    """The tensor types of llama.cpp's Q4_K_M mix for a qwen3 model (llama-quant.cpp):
    Q6_K for the output matrix (the embedding when tied), for attn_v and ffn_down in
    the first and last eighth of the layers and every third layer between, Q4_K
    elsewhere."""
    if gname == "output.weight" or (tied and gname == "token_embd.weight"):
        return GGML_Q6_K
    if gname.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")):
        i = int(gname.split(".")[1])
        if i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2:
            return GGML_Q6_K
    return GGML_Q4_K


# ---- GGUF writer ---------------------------------------------------------------

def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


class KV:
    def __init__(self):
        self.items = []

    def u32(self, k, v):
        self.items.append(gguf_str(k) + struct.pack("<II", T_UINT32, v))

    def f32(self, k, v):
        self.items.append(gguf_str(k) + struct.pack("<If", T_FLOAT32, v))

    def str(self, k, v):
        self.items.append(gguf_str(k) + struct.pack("<I", T_STRING) + gguf_str(v))

    def str_array(self, k, vs):
        self.items.append(gguf_str(k) + struct.pack("<IIQ", T_ARRAY, T_STRING, len(vs))
                          + b"".join(gguf_str(v) for v in vs))

    def i32_array(self, k, vs):
        self.items.append(gguf_str(k) + struct.pack("<IIQ", T_ARRAY, T_INT32, len(vs))
                          + np.asarray(vs, dtype="<i4").tobytes())


def byte_level_alphabet():
    """The 256 single-character tokens of GPT-2's byte-level BPE: printable bytes map
    to themselves, the others to U+0100 upwards, in byte order."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(0x100 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[3] not in FILE_TYPE:
        fail("usage: hf_to_gguf.py HF_DIR OUT.gguf {f16|bf16|q8_0|q4_0|q4_k_m} [QK_NORM_SCALE]")
    hf, out_path, kind = sys.argv[1:4]
    qk_scale = float(sys.argv[4]) if len(sys.argv) == 5 else 1.0
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    model_type = cfg.get("model_type")
    if model_type not in ("qwen3", "qwen3_moe"):
        fail(f"config.json model_type is {model_type!r}, expected 'qwen3' or 'qwen3_moe'")
    moe = model_type == "qwen3_moe"
    arch = "qwen3moe" if moe else "qwen3"
    if moe:
        if not cfg.get("norm_topk_prob", False):
            fail("qwen3_moe with norm_topk_prob false: llama.cpp's qwen3moe graph always renormalises")
        if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
            fail("qwen3_moe with dense layers (decoder_sparse_step/mlp_only_layers): not expressible in qwen3moe GGUF")
    st = SafeTensors(os.path.join(hf, "model.safetensors"))
    n_embd, n_layer = cfg["hidden_size"], cfg["num_hidden_layers"]
    n_vocab = cfg["vocab_size"]
    head_dim = cfg.get("head_dim", n_embd // cfg["num_attention_heads"])
    tied = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in st.header
    wtype = WEIGHT_TYPE[kind]

    # (gguf name, hf names, ggml type): one HF tensor, or several stacked along a
    # new leading dimension (the experts of an MoE layer).
    plan = [("token_embd.weight", ["model.embed_tokens.weight"], wtype)]
    for i in range(n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", p + "input_layernorm.weight", GGML_F32),
            (b + "attn_q.weight", p + "self_attn.q_proj.weight", wtype),
            (b + "attn_k.weight", p + "self_attn.k_proj.weight", wtype),
            (b + "attn_v.weight", p + "self_attn.v_proj.weight", wtype),
            (b + "attn_output.weight", p + "self_attn.o_proj.weight", wtype),
            (b + "attn_q_norm.weight", p + "self_attn.q_norm.weight", GGML_F32),
            (b + "attn_k_norm.weight", p + "self_attn.k_norm.weight", GGML_F32),
            (b + "ffn_norm.weight", p + "post_attention_layernorm.weight", GGML_F32),
        ]
        if moe:
            experts = range(cfg["num_experts"])
            # The router stays F32, as llama.cpp's converter leaves ffn_gate_inp.
            plan.append((b + "ffn_gate_inp.weight", p + "mlp.gate.weight", GGML_F32))
            for g, h in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                plan.append((b + f"ffn_{g}_exps.weight", [p + f"mlp.experts.{e}.{h}.weight" for e in experts], wtype))
        else:
            plan += [
                (b + "ffn_gate.weight", p + "mlp.gate_proj.weight", wtype),
                (b + "ffn_up.weight", p + "mlp.up_proj.weight", wtype),
                (b + "ffn_down.weight", p + "mlp.down_proj.weight", wtype),
            ]
    plan.append(("output_norm.weight", "model.norm.weight", GGML_F32))
    if not tied:
        plan.append(("output.weight", "lm_head.weight", wtype))
    plan = [(g, [h] if isinstance(h, str) else h, t) for g, h, t in plan]
    if kind == "q4_k_m":
        plan = [(g, h, q4_k_m_type(g, n_layer, tied) if t == GGML_Q4_K else t) for g, h, t in plan]

    kv = KV()
    kv.str("general.architecture", arch)
    kv.str("general.name", f"cmf-bench-{arch}-random")
    kv.u32("general.file_type", FILE_TYPE[kind])
    kv.u32(f"{arch}.context_length", cfg.get("max_position_embeddings", 4096))
    kv.u32(f"{arch}.embedding_length", n_embd)
    kv.u32(f"{arch}.block_count", n_layer)
    kv.u32(f"{arch}.feed_forward_length", cfg["intermediate_size"])
    kv.u32(f"{arch}.attention.head_count", cfg["num_attention_heads"])
    kv.u32(f"{arch}.attention.head_count_kv", cfg["num_key_value_heads"])
    kv.u32(f"{arch}.attention.key_length", head_dim)
    kv.u32(f"{arch}.attention.value_length", head_dim)
    kv.f32(f"{arch}.rope.freq_base", float(cfg.get("rope_theta", 1e6)))
    kv.f32(f"{arch}.attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps", 1e-6)))
    if moe:
        kv.u32(f"{arch}.expert_count", cfg["num_experts"])
        kv.u32(f"{arch}.expert_used_count", cfg["num_experts_per_tok"])
        kv.u32(f"{arch}.expert_feed_forward_length", cfg["moe_intermediate_size"])
    # Dummy vocabulary: the 256 byte tokens (llama.cpp needs "\n" to tokenize to
    # something) then unique placeholders up to vocab_size.
    # The last one is "<|endoftext|>" (type 3 = control), bos = eos, so that
    # llama.cpp finds its end-of-generation token by name and does not warn.
    tokens = byte_level_alphabet() + [f"<dummy{i}>" for i in range(256, n_vocab - 1)]
    tokens.append("<|endoftext|>")
    kv.str("tokenizer.ggml.model", "gpt2")
    kv.str("tokenizer.ggml.pre", "qwen2")
    kv.str_array("tokenizer.ggml.tokens", tokens)
    kv.i32_array("tokenizer.ggml.token_type", [1] * (n_vocab - 1) + [3])  # 1 = normal
    kv.str_array("tokenizer.ggml.merges", ["\u0120 \u0120"])
    kv.u32("tokenizer.ggml.bos_token_id", n_vocab - 1)
    kv.u32("tokenizer.ggml.eos_token_id", n_vocab - 1)

    # Tensor infos: GGUF dims are ne[0] = fastest-moving, i.e. HF's shape reversed.
    infos, offsets, off = [], [], 0
    for gname, hnames, gtype in plan:
        shape = st.shape(hnames[0])
        for h in hnames[1:]:
            if st.shape(h) != shape:
                fail(f"{h}: shape {st.shape(h)} differs from {hnames[0]}'s {shape}")
        if len(hnames) > 1:
            shape = [len(hnames)] + shape
        n = int(np.prod(shape))
        if gtype in BLOCK and shape[-1] % BLOCK[gtype][0]:
            fail(f"{hnames[0]}: row length {shape[-1]} is not a multiple of {BLOCK[gtype][0]}")
        off = (off + ALIGN - 1) // ALIGN * ALIGN
        offsets.append(off)
        infos.append(gguf_str(gname) + struct.pack("<I", len(shape))
                     + b"".join(struct.pack("<Q", d) for d in reversed(shape))
                     + struct.pack("<IQ", gtype, off))
        off += encoded_size(gtype, n)
    data_size = off

    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(plan), len(kv.items)))
        for item in kv.items:
            f.write(item)
        for info in infos:
            f.write(info)
        pad = (-f.tell()) % ALIGN
        f.write(b"\0" * pad)
        base = f.tell()
        for (gname, hnames, gtype), toff in zip(plan, offsets):
            f.write(b"\0" * (base + toff - f.tell()))
            for hname in hnames:  # stacked experts: slice after slice
                shape = st.shape(hname)
                rows = shape[0] if len(shape) > 1 else 1
                chunk = max(1, (1 << 22) // int(np.prod(shape[1:]) if len(shape) > 1 else shape[0]))
                scale = qk_scale if hname.endswith(("q_norm.weight", "k_norm.weight")) else 1.0
                for r in range(0, rows, chunk):
                    f.write(encode(gtype, scale * st.rows_f32(hname, r, min(chunk, rows - r))))
        if f.tell() != base + data_size:
            fail(f"internal: wrote {f.tell() - base} data bytes, planned {data_size}")
    os.replace(tmp, out_path)
    print(f"hf_to_gguf: {out_path}: {len(plan)} tensors, {kind}, "
          f"{os.path.getsize(out_path) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
