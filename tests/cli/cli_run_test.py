#!/usr/bin/python3
"""cmfhost run / bench / ppl / logits against the austen-tiny Qwen3 (models/).

    cli_run_test.py CMFHOST MAKE_CLI_MODEL REPO_ROOT WORK_DIR

Builds WORK_DIR/austen.cmf (f32) with the native converter + container
writer, then checks:
  logits  == the PyTorch model of tools/train/qwen3_torch.py (1e-3 relative)
             and the recorded first-step top logits of expected_greedy.json;
  run --greedy --raw -n 16  == prompt + text of the recorded greedy ids;
  run -p (chat)             == the ChatML prompt, stats line on stderr;
  run interactive (stdin)   two turns, two stats lines;
  ppl                       == perplexity computed here from PyTorch logits;
  q8, q4, q4tp files        logits close to PyTorch f32 (cosine, top-1);
  bench --json              parses, with positive rates and peak RSS; -d runs at depth;
  bench --profile           per-op backend times: calls per forward, depth excluded;
  --kv-cache f16 / f32      logits with an f16 cache within 1e-3 of PyTorch, run's
                            greedy text the same with either cache, a bad value refused;
  --kv-cache q8             logits within 2e-2 of PyTorch, the same top-1 everywhere;
  clear errors for bad arguments and a missing default model.
Exit 77 (skip) without torch.
"""
import json
import math
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
except ImportError:
    print("SKIP: /usr/bin/python3 has no torch/numpy", file=sys.stderr)
    sys.exit(77)

from cli_checks import check, finish, run_cmfhost  # noqa: E402

cmfhost, make_model, root, work = sys.argv[1:5]
os.makedirs(work, exist_ok=True)
hf = os.path.join(root, "models", "austen-tiny")
sys.path.insert(0, os.path.join(root, "tools", "train"))
from qwen3_torch import load_checkpoint  # noqa: E402

torch.set_num_threads(1)
model_path = os.path.join(work, "austen.cmf")
def run(args, stdin=None, expect=0):
    return run_cmfhost(cmfhost, args, stdin, expect)


subprocess.run([make_model, hf, model_path, "f32"], check=True)
torch_model, cfg = load_checkpoint(hf)
V = cfg["vocab_size"]
ref = json.load(open(os.path.join(hf, "expected_greedy.json")))
case = next(c for c in ref["cases"] if c["name"] == "raw")
prompt, prompt_ids, gen_ids = case["prompt"], case["prompt_ids"], case["generated_ids"]


def torch_logits(ids):
    with torch.no_grad():
        return torch_model(torch.tensor([ids]))[0].double().numpy()


# ---- logits ------------------------------------------------------------------
ids = prompt_ids + gen_ids[:15]
out = os.path.join(work, "logits.f32")
run(["logits", model_path, "--ids", ",".join(map(str, ids)), "--out", out])
got = np.fromfile(out, dtype="<f4").astype(np.float64)
check(got.size == len(ids) * V, f"logits file holds {len(ids)} x {V} floats (got {got.size})")
if got.size == len(ids) * V:
    got = got.reshape(len(ids), V)
    want = torch_logits(ids)
    rel = np.abs(got - want).max() / np.abs(want).max()
    check(rel <= 1e-3, f"logits vs PyTorch: max |diff| / max |ref| = {rel:.2e} <= 1e-3")
    last = len(prompt_ids) - 1
    top = [(i, v) for i, v in case["first_step_top_logits"]]
    err = max(abs(got[last, i] - v) / max(1.0, abs(v)) for i, v in top)
    check(err <= 1e-3, f"recorded first-step top logits: max relative error {err:.2e}")

    # The f16 KV cache: still within 1e-3 of PyTorch, and not bit-identical
    # to the f32 cache (it is in use).
    out16 = os.path.join(work, "logits16.f32")
    run(["logits", model_path, "--ids", ",".join(map(str, ids)), "--out", out16, "--kv-cache", "f16"])
    g16 = np.fromfile(out16, dtype="<f4").astype(np.float64)
    if g16.size == got.size:
        rel16 = np.abs(g16.reshape(got.shape) - want).max() / np.abs(want).max()
        check(0 < np.abs(g16.reshape(got.shape) - got).max() and rel16 <= 1e-3,
              f"logits --kv-cache f16 vs PyTorch: max |diff| / max |ref| = {rel16:.2e} <= 1e-3")
    else:
        check(False, "logits --kv-cache f16 writes the same number of floats")

    # The q8 KV cache (blocks of 32 int8 values and an f16 scale; this
    # model's 48-dim heads start mid-block): close to PyTorch, in use, and
    # the same top-1 token at every position.
    out8 = os.path.join(work, "logits8.f32")
    run(["logits", model_path, "--ids", ",".join(map(str, ids)), "--out", out8, "--kv-cache", "q8"])
    g8 = np.fromfile(out8, dtype="<f4").astype(np.float64)
    if g8.size == got.size:
        g8 = g8.reshape(got.shape)
        rel8 = np.abs(g8 - want).max() / np.abs(want).max()
        check(0 < np.abs(g8 - got).max() and rel8 <= 2e-2,
              f"logits --kv-cache q8 vs PyTorch: max |diff| / max |ref| = {rel8:.2e} <= 2e-2")
        check((g8.argmax(1) == want.argmax(1)).all(), "logits --kv-cache q8: the same top-1 token at every position")
    else:
        check(False, "logits --kv-cache q8 writes the same number of floats")

# logits -p (chat template) == logits --raw of the ChatML text
a, b = os.path.join(work, "chat_a.f32"), os.path.join(work, "chat_b.f32")
run(["logits", model_path, "-p", "Hello", "--out", a])
run(["logits", model_path, "--raw", "-p", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "--out", b])
check(open(a, "rb").read() == open(b, "rb").read(), "logits -p renders the ChatML template of the file")

# ---- run ---------------------------------------------------------------------
p = run(["run", model_path, "--greedy", "--raw", "-n", "16", "-p", prompt])
d = run(["detokenize", "--tokenizer", os.path.join(hf, "tokenizer.json")] + [str(i) for i in gen_ids[:16]])
expected_text = prompt + d.stdout.decode().rstrip("\n") + "\n"
check(p.stdout.decode() == expected_text, "run --greedy --raw -n 16 prints the reference greedy continuation")
check(case["text"].startswith(d.stdout.decode().rstrip("\n")), "the 16-token text is a prefix of the recorded text")
err = p.stderr.decode()
check("prompt 11 tok, generated 16 tok" in err and "stop: max-tokens" in err and "decode" in err,
      "run prints the stats line on stderr: " + err.strip().splitlines()[-1] if err.strip() else "(none)")

p = run(["run", model_path, "--greedy", "--raw", "-n", "16", "-p", prompt, "--kv-cache", "f32"])
check(p.stdout.decode() == expected_text, "run --kv-cache f32 (the default is f16) prints the same continuation")

p = run(["run", model_path, "--greedy", "-n", "8", "-p", "Hello"])
check("stop:" in p.stderr.decode(), "run -p (chat) finishes with a stats line")
p = run(["run", model_path, "--greedy", "-n", "6"], stdin=b"Hello there\nAnd then?\n")
check(p.stderr.decode().count("stop:") == 2, "interactive chat on stdin answers two turns")

# ---- ppl ---------------------------------------------------------------------
text = open(os.path.join(hf, "heldout.txt"), encoding="utf-8").read()[:1200]
tf = os.path.join(work, "ppl.txt")
open(tf, "w", encoding="utf-8").write(text)
p = run(["ppl", model_path, "--file", tf, "--ctx", "64"])
line = p.stdout.decode()
try:
    got_ppl = float(line.split()[1])
    n_tok = int(line.split("(")[1].split()[0])
except (IndexError, ValueError):
    got_ppl, n_tok = float("nan"), 0
tk = run(["tokenize", "--tokenizer", os.path.join(hf, "tokenizer.json"), "--json", text])
toks = json.loads(tk.stdout)["ids"]
check(n_tok == len(toks), f"ppl tokenized {n_tok} tokens, tokenize gives {len(toks)}")
nll, cnt = 0.0, 0
for w0 in range(0, len(toks) - 1, 64):
    w = toks[w0:w0 + 64]
    if len(w) < 2:
        break
    lg = torch_logits(w)
    mx = lg.max(axis=1, keepdims=True)
    lse = (np.log(np.exp(lg - mx).sum(axis=1, keepdims=True)) + mx)[:, 0]
    for i in range(len(w) - 1):
        nll += lse[i] - lg[i, w[i + 1]]
        cnt += 1
want_ppl = math.exp(nll / cnt)
check(math.isfinite(got_ppl) and abs(got_ppl - want_ppl) / want_ppl < 1e-3,
      f"ppl {got_ppl:.4f} vs PyTorch {want_ppl:.4f} (windows of 64)")

# ---- quantized files of the trained model vs PyTorch f32 ------------------------
# The project's target for q8 and q4 files: cosine >= 0.99 per position,
# same top-1 on most. On random-weight fixtures q4 cannot (tests/runtime);
# this is the trained model, 64 held-out tokens, every position.
qids = toks[:64]
want = torch_logits(qids)
for quant, min_cos_floor, top1_floor in (("q8", 0.999, 0.95), ("q4", 0.99, 0.85), ("q4tp", 0.99, 0.85),
                                         ("vbit", 0.99, 0.85)):
    qpath = os.path.join(work, f"austen-{quant}.cmf")
    subprocess.run([make_model, hf, qpath, quant], check=True)
    qout = os.path.join(work, f"logits-{quant}.f32")
    run(["logits", qpath, "--ids", ",".join(map(str, qids)), "--out", qout])
    q = np.fromfile(qout, dtype="<f4").astype(np.float64)
    if q.size != len(qids) * V:
        check(False, f"{quant}: logits file holds {len(qids)} x {V} floats")
        continue
    q = q.reshape(len(qids), V)
    cos = (q * want).sum(1) / (np.linalg.norm(q, axis=1) * np.linalg.norm(want, axis=1))
    top1 = float((q.argmax(1) == want.argmax(1)).mean())
    print(f"     {quant}: cosine min {cos.min():.5f} mean {cos.mean():.5f}, top-1 {top1:.3f} over {len(qids)} positions")
    check(cos.min() >= min_cos_floor, f"{quant} vs PyTorch f32: min cosine {cos.min():.5f} >= {min_cos_floor}")
    check(top1 >= top1_floor, f"{quant} vs PyTorch f32: top-1 agreement {top1:.3f} >= {top1_floor}")
    # Fewer than 16 positions go through the decode matmuls (int8
    # activations, each dtype's row kernels) instead of the prefill GEMM:
    # for vbit the trained model's rows of mixed widths (3 to 6 bits).
    dout = os.path.join(work, f"logits-{quant}-decode.f32")
    run(["logits", qpath, "--ids", ",".join(map(str, qids[:12])), "--out", dout])
    d = np.fromfile(dout, dtype="<f4").astype(np.float64).reshape(12, V)
    dcos = (d * want[:12]).sum(1) / (np.linalg.norm(d, axis=1) * np.linalg.norm(want[:12], axis=1))
    check(dcos.min() >= min_cos_floor, f"{quant} decode matmuls vs PyTorch f32: min cosine {dcos.min():.5f} >= {min_cos_floor}")
    # Against the same file's prefill (the same weights, another path):
    # what is left between the two is the activations' rounding.
    pcos = (d * q[:12]).sum(1) / (np.linalg.norm(d, axis=1) * np.linalg.norm(q[:12], axis=1))
    print(f"     {quant}: decode matmuls against the prefill GEMM, cosine min {pcos.min():.7f}")
    check(pcos.min() >= 0.99999, f"{quant} decode matmuls vs its prefill GEMM: min cosine {pcos.min():.7f} >= 0.99999")

# Decode copies (q4_block weights copied into q4_rows when loaded, by default
# within a memory budget): the same logits and the same greedy text with
# every copy, with none, and by default; the two flags together refused.
q4path = os.path.join(work, "austen-q4.cmf")
copy_logits, copy_text = {}, {}
for flag in ("--decode-copy", "--no-decode-copy", None):
    o = os.path.join(work, f"logits-q4-{flag or 'default'}.f32")
    extra = [flag] if flag else []
    run(["logits", q4path, "--ids", ",".join(map(str, qids[:20])), "--out", o] + extra)
    copy_logits[flag] = open(o, "rb").read()
    copy_text[flag] = run(["run", q4path, "--greedy", "--raw", "-n", "12", "-p", prompt] + extra).stdout
check(copy_logits["--decode-copy"] == copy_logits["--no-decode-copy"] == copy_logits[None],
      "q4 logits: the same bits with every decode copy, with none and by default")
check(copy_text["--decode-copy"] == copy_text["--no-decode-copy"] == copy_text[None] and copy_text[None],
      "q4 run --greedy: the same text with every decode copy, with none and by default")
# q1, q1t and q1s copy their 512-column matrices (the MLP's down
# projection here) into pass masks where the codecs' AVX-512 kernels run
# (q1s its outliers one row a lane besides): the same products, summed in
# another order for q1t and q1s (and for q1 without BITALG), so the decode
# logits agree to f32 rounding, not bit for bit.
for quant in ("q1", "q1t", "q1s"):
    qpath = os.path.join(work, f"austen-{quant}.cmf")
    subprocess.run([make_model, hf, qpath, quant], check=True)
    got = {}
    for flag in ("--decode-copy", "--no-decode-copy"):
        o = os.path.join(work, f"logits-{quant}-{flag}.f32")
        run(["logits", qpath, "--ids", ",".join(map(str, qids[:12])), "--out", o, flag])
        got[flag] = np.fromfile(o, dtype="<f4").astype(np.float64)
    a, b = got["--decode-copy"], got["--no-decode-copy"]
    ok = a.size == b.size == 12 * V
    drift = float(np.abs(a - b).max() / np.abs(b).max()) if ok else float("inf")
    print(f"     {quant}: decode logits with and without decode copies, max difference {drift:.2e} of the largest")
    check(ok and drift <= 1e-4, f"{quant} logits with and without decode copies agree to f32 rounding ({drift:.2e})")
p = run(["bench", q4path, "-p", "8", "-n", "0", "--decode-copy", "--no-decode-copy"], expect=2)
check("contradict" in p.stderr.decode(), "bench --decode-copy --no-decode-copy: clear error")
# The file's q4 weights have a decode layout: a budget of 0 MiB stops the
# copies at the first one, and -v shows the line that says so.
os.environ["CMF_CPU_DECODE_COPY_BUDGET_MIB"] = "0"
p = run(["bench", q4path, "-p", "8", "-n", "0", "-v"])
del os.environ["CMF_CPU_DECODE_COPY_BUDGET_MIB"]
check("decode copies stop at 0 MiB" in p.stderr.decode(), "q4 weights are decode-copied: a 0 MiB budget stops them, said once")

# ---- bench -------------------------------------------------------------------
p = run(["bench", model_path, "-p", "32", "-n", "8", "-r", "2", "--json"])
try:
    bj = json.loads(p.stdout)
    tests = {t["test"]: t for t in bj["tests"]}
    ok = (set(tests) == {"pp32", "tg8"} and all(t["median_tok_s"] > 0 and len(t["samples_tok_s"]) == 2
                                                for t in tests.values()) and bj["peak_rss_bytes"] > 0
          and 0 <= bj["file_pmd_mapped_bytes"] <= bj["peak_rss_bytes"] and bj["kv_cache"] == "f16"
          and bj["warmup"] is True)
except (ValueError, KeyError):
    ok = False
check(ok, "bench --json parses: pp32 and tg8 with 2 samples each, peak RSS, 2 MiB-mapped bytes within it, f16 KV cache, "
          "warmed up")
p = run(["bench", model_path, "-p", "8", "-n", "4", "-r", "1", "--no-warmup", "--json"])
try:
    bj = json.loads(p.stdout)
    ok = bj["warmup"] is False and len(bj["tests"]) == 2
except (ValueError, KeyError):
    ok = False
check(ok, "bench --no-warmup runs the tests without the warm-up and says so")
p = run(["bench", model_path, "-p", "8", "-n", "4", "-r", "1", "-d", "40", "--json"])
try:
    bj = json.loads(p.stdout)
    tests = {t["test"]: t for t in bj["tests"]}
    ok = set(tests) == {"pp8 @ d40", "tg4 @ d40"} and all(t["n_depth"] == 40 for t in tests.values())
except (ValueError, KeyError):
    ok = False
check(ok, "bench -d 40: both tests run after 40 tokens of context and say so")
# --profile: the backend calls of the timed tests only (the 40 depth tokens
# prefilled before each test are not in it), one row per op and weight shape.
info = json.loads(run(["info", model_path, "--json"]).stdout)
layers = sum(1 for t in info["tensors"] if t["name"].endswith(".mlp.down_proj.weight"))
p = run(["bench", model_path, "-p", "8", "-n", "4", "-r", "2", "-d", "40", "--profile", "--json"])
try:
    pr = json.loads(p.stdout)["profile"]

    def calls(phase, op):
        return sum(o["calls"] for o in pr["ops"] if o["phase"] == phase and o["op"] == op)
    per_forward = 2 * layers + 1  # o and down per layer, and the head
    fused_per_forward = 2 * layers  # q/k/v and gate/up, one matmul_multi each
    ok = (layers > 0 and pr["decode_tokens"] == 8 and pr["prefill_tokens"] == 16
          and calls("decode", "matmul") == 8 * per_forward and calls("prefill", "matmul") == 2 * per_forward
          and calls("decode", "matmul_multi") == 8 * fused_per_forward
          and calls("prefill", "matmul_multi") == 2 * fused_per_forward
          and 0 < sum(o["seconds"] for o in pr["ops"] if o["phase"] == "decode") <= pr["decode_seconds"]
          and all(o["weight"] for o in pr["ops"] if o["op"] in ("matmul", "matmul_multi")))
except (ValueError, KeyError):
    ok = False
check(ok, "bench --profile --json: per forward 2 x layers + 1 matmul and 2 x layers matmul_multi calls, "
          "depth prefill excluded, "
          "backend time within the measured time")
p = run(["bench", model_path, "-p", "0", "-n", "4", "-r", "1", "--profile"])
out_text = p.stdout.decode()
check("profile, decode: 4 tokens" in out_text and "\n  matmul " in out_text and "GB/s" in out_text,
      "bench --profile prints the decode table")

# ---- errors ------------------------------------------------------------------
p = run(["run", "-p", "x"], expect=2)
check("no MODEL given and no default model installed" in p.stderr.decode(), "run without MODEL and default: clear error")
p = run(["logits", model_path, "-p", "x", "--ids", "1", "--out", out], expect=2)
check("exactly one of" in p.stderr.decode(), "logits with -p and --ids: clear error")
p = run(["logits", model_path, "--ids", "1,x", "--out", out], expect=2)
check("not a token id" in p.stderr.decode(), "logits --ids with a bad id: clear error")
p = run(["run", os.path.join(work, "missing.cmf"), "-p", "x"], expect=1)
check("missing.cmf" in p.stderr.decode(), "run on a missing file names it")
p = run(["bench", model_path, "-p", "8", "-n", "0", "--kv-cache", "q4"], expect=2)
check("--kv-cache must be f32, f16 or q8" in p.stderr.decode(), "bench --kv-cache q4: clear error")
p = run(["ppl", model_path], expect=2)
check("file" in p.stderr.decode(), "ppl without --file: clear error")
# ---- default model hook ---------------------------------------------------------
import shutil  # noqa: E402
prefix = os.path.join(work, "prefix")
os.makedirs(os.path.join(prefix, "bin"), exist_ok=True)
os.makedirs(os.path.join(prefix, "share", "cmf", "models"), exist_ok=True)
shutil.copy2(cmfhost, os.path.join(prefix, "bin", "cmfhost"))
shutil.copy2(model_path, os.path.join(prefix, "share", "cmf", "models", "default.cmf"))
p = subprocess.run([os.path.join(prefix, "bin", "cmfhost"), "run", "--greedy", "--raw", "-n", "16", "-p", prompt],
                   capture_output=True, timeout=300)
check(p.returncode == 0 and p.stdout.decode() == expected_text and
      "using the default model " + os.path.join(prefix, "share", "cmf", "models", "default.cmf") in p.stderr.decode(),
      "run without MODEL uses <bin>/../share/cmf/models/default.cmf and says so")

for c in ("run", "bench", "ppl", "logits"):
    check("usage: cmfhost " + c in run([c, "--help"]).stdout.decode(), c + " --help")

finish()
