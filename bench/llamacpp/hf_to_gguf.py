#!/usr/bin/python3
"""Convert a Qwen3 or Qwen3-MoE HF checkpoint (config.json + one model.safetensors,
BF16/F16/F32) into a GGUF v3 file that llama.cpp's qwen3 / qwen3moe loader accepts, so
that llama.cpp can be benchmarked on exactly the weights `cmfhost bench` runs.

usage: /usr/bin/python3 hf_to_gguf.py HF_DIR OUT.gguf {f16|q8_0|q4_0} [QK_NORM_SCALE]

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
nibbles min(15, trunc(x/d + 8.5)), as ggml's reference quantizer); 1-D norms
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
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8
# llama_ftype for general.file_type
FILE_TYPE = {"f16": 1, "q8_0": 7, "q4_0": 2}
WEIGHT_TYPE = {"f16": GGML_F16, "q8_0": GGML_Q8_0, "q4_0": GGML_Q4_0}
QK8_0 = 32
QK4_0 = 32


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

def encode_q8_0(x):
    """Q8_0 blocks: per 32 values an f16 scale d = amax/127 and 32 int8 round(x/d)."""
    b = x.reshape(-1, QK8_0)
    amax = np.abs(b).max(axis=1)
    d = amax / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    v = b * inv[:, None]
    # round half away from zero (C roundf), not numpy's half-to-even
    q = np.trunc(v + np.copysign(0.5, v)).clip(-127, 127).astype(np.int8)
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
    inv = np.divide(np.float32(1.0), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, np.trunc(b * inv[:, None] + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
    out = np.empty(b.shape[0], dtype=[("d", "<f2"), ("qs", "u1", QK4_0 // 2)])
    out["d"] = d.astype(np.float16)
    out["qs"] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def encoded_size(gtype, n):
    if gtype == GGML_F32:
        return 4 * n
    if gtype == GGML_F16:
        return 2 * n
    if gtype == GGML_Q4_0:
        return n // QK4_0 * (2 + QK4_0 // 2)
    return n // QK8_0 * (2 + QK8_0)


def encode(gtype, x):
    if gtype == GGML_F32:
        return x.astype("<f4").tobytes()
    if gtype == GGML_F16:
        return x.astype("<f2").tobytes()
    if gtype == GGML_Q4_0:
        return encode_q4_0(x)
    return encode_q8_0(x)


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
        fail("usage: hf_to_gguf.py HF_DIR OUT.gguf {f16|q8_0|q4_0} [QK_NORM_SCALE]")
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
        if gtype in (GGML_Q8_0, GGML_Q4_0) and shape[-1] % QK8_0:
            fail(f"{hnames[0]}: row length {shape[-1]} is not a multiple of {QK8_0}")
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
