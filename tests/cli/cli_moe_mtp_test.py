#!/usr/bin/python3
"""cmfhost run / ppl / logits / bench on a mixture-of-experts hybrid with an
MTP head, against the PyTorch reference of tests/runtime/make_reference_moe_hybrid.py.

    cli_moe_mtp_test.py CMFHOST REPO_ROOT WORK_DIR

The model: the tiny qwen3_5_moe case (three gated delta net layers to one
output-gated attention layer, 8 experts top-2 + a shared expert in every
layer) with a draftable MTP head, written as an HF checkpoint with a
byte-level tokenizer of exactly its 128 ids (one token per ASCII byte, no
merges: token id = byte value, so the reference needs no tokenizer), then
`cmfhost convert`ed to f32. Checks:
  logits --ids            == PyTorch at every position (1e-4 of the logit scale),
                             the same with --mtp on and off (the trunk is the trunk);
  run --raw --greedy      == the prompt + PyTorch's greedy continuation (each
                             token from a full recompute), with --mtp on (drafts
                             made and some accepted, on the stats line) and off;
  run --route-stats FILE  == the reference's top-k picks per MoE layer and
                             expert over the forwarded tokens (prompt + all
                             generated but the last), with or without MTP;
  ppl --route-stats FILE  == the reference's perplexity and picks over the text;
  bench --json            a tg-mtp test with drafted/accepted/speedup, the
                             bytes a decode token reads (top_k of 8 experts);
  bench --parallel 3      three sequences batched through the engine (tg8-x3);
  clear errors: --mtp maybe, --route-stats into a missing directory.
Exit 77 (skip) without torch.
"""
import json
import math
import os
import re
import shutil
import sys

try:
    import numpy as np
    import torch
except ImportError:
    print("SKIP: /usr/bin/python3 has no torch/numpy", file=sys.stderr)
    sys.exit(77)

from cli_checks import check, finish, run_cmfhost  # noqa: E402

cmfhost, root, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)  # no output of an earlier run can pass a check
os.makedirs(work)
sys.path.insert(0, os.path.join(root, "tests", "runtime"))
import make_reference_moe_hybrid as ref  # noqa: E402

def run(args, expect=0):
    return run_cmfhost(cmfhost, args, expect=expect)


# ---- the model and its reference ---------------------------------------------
c = dict(ref.CASES["qwen3_5_moe"], mtp=0.3)
PROMPT = "The cat sat on the mat, and then"
prompt_ids = list(PROMPT.encode("ascii"))
N_GEN = 48

# Routing picks of the reference, per layer prefix: recorded around ref.moe
# (decoder_layer looks it up in its module at every call).
picks = None
plain_moe = ref.moe


def recording_moe(c_, w_, p, x):
    if picks is not None and p.startswith("model.layers."):
        probs = torch.softmax(x @ w_[p + "mlp.gate.weight"].T, dim=-1, dtype=torch.float32)
        layer = p.split(".")[2]
        for row in torch.topk(probs, c_["top_k"], dim=-1).indices.tolist():
            for e in row:
                picks.setdefault(layer, [0] * c_["experts"])[e] += 1
    return plain_moe(c_, w_, p, x)


ref.moe = recording_moe


def greedy(w, ids, n):
    """n greedy tokens, each from a full recompute, and the smallest top-1/top-2 margin."""
    ids, margin = list(ids), float("inf")
    for _ in range(n):
        last = ref.forward(c, w, ids)[-1]
        top = torch.topk(last, 2).values
        margin = min(margin, float(top[0] - top[1]))
        ids.append(int(torch.argmax(last)))
    return ids[-n:], margin


with torch.no_grad():
    # A seed whose greedy continuation has no near-tie (f32 sums in another
    # order may not flip it), as the runtime parity cases choose theirs.
    for seed in range(20):
        w = ref.make_weights(c, seed)
        gen, margin = greedy(w, prompt_ids, N_GEN)
        if margin >= 1e-3:
            break
    else:
        sys.exit("no seed in 0..19 gives a greedy margin >= 1e-3")
    seq = prompt_ids + gen
    hidden = []
    logits = ref.forward(c, w, seq, hidden).double().numpy()
    drafts = ref.mtp_forward(c, w, seq, hidden[0]).argmax(-1).tolist()
    # run forwards the prompt and every generated token (the last one too:
    # it is in the context a next turn continues).
    picks = {}
    ref.forward(c, w, seq)
    run_picks = picks
    picks = {}
    ppl_text = PROMPT + bytes(gen).decode("ascii", errors="replace")
    ppl_ids = list(ppl_text.encode("utf-8"))
    ppl_logits = ref.forward(c, w, ppl_ids).double()
    ppl_picks = picks
    picks = None
agree = sum(int(d == t) for d, t in zip(drafts, seq[2:]))
print(f"seed {seed}, greedy margin {margin:.4f}; the MTP head guesses the next-but-one token at {agree}/{len(seq) - 2} positions")

hf = os.path.join(work, "hf")
os.makedirs(hf, exist_ok=True)
with open(os.path.join(hf, "config.json"), "w") as f:
    json.dump(ref.hf_config(c), f, indent=2)
ref.base.write_safetensors(os.path.join(hf, "model.safetensors"), ref.hf_tensors(c, w))


def byte_char(b):
    """GPT-2's byte-to-unicode map for bytes 0..127 (printable ASCII but the space as itself)."""
    return chr(b) if 33 <= b <= 126 else chr(256 + b if b < 33 else 256 + 33 + (b - 127))


byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
tokenizer = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
    "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": {byte_char(b): b for b in range(128)}, "merges": []},
}
with open(os.path.join(hf, "tokenizer.json"), "w") as f:
    json.dump(tokenizer, f, ensure_ascii=False)
with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": None, "add_bos_token": False}, f)

model = os.path.join(work, "moe-mtp.cmf")
run(["convert", "--model", hf, "--output", model, "--quant", "f32"])
if not os.path.exists(model):
    sys.exit("FAIL convert: no model to test")

# ---- logits --------------------------------------------------------------------
V = c["vocab"]
for mtp in ("off", "on"):
    out = os.path.join(work, f"logits-{mtp}.f32")
    run(["logits", model, "--ids", ",".join(map(str, seq)), "--out", out, "--mtp", mtp])
    got = np.fromfile(out, dtype="<f4").astype(np.float64) if os.path.exists(out) else np.zeros(0)
    ok = got.size == len(seq) * V
    rel = np.abs(got.reshape(len(seq), V) - logits).max() / np.abs(logits).max() if ok else math.inf
    check(rel <= 1e-4, f"logits --mtp {mtp} at all {len(seq)} positions vs PyTorch: {rel:.2e} of the logit scale <= 1e-4")

# ---- run ---------------------------------------------------------------------------
expected_text = PROMPT + bytes(gen).decode("ascii") + "\n"


def route_file_picks(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return f"unreadable: {e}"


for mtp in ("on", "off"):
    stats = os.path.join(work, f"route-run-{mtp}.json")
    p = run(["run", model, "--raw", "--greedy", "-n", str(N_GEN), "-p", PROMPT, "--mtp", mtp, "--route-stats", stats])
    out, err = p.stdout.decode("ascii", errors="replace"), p.stderr.decode(errors="replace")
    check(out == expected_text, f"run --mtp {mtp}: prompt + PyTorch's {N_GEN} greedy tokens")
    if out != expected_text:
        print("  got:     ", repr(out))
        print("  expected:", repr(expected_text))
    stat_line = [l for l in err.splitlines() if l.startswith("[prompt ")]
    check(len(stat_line) == 1 and f"generated {N_GEN} tok" in stat_line[0], f"run --mtp {mtp}: one stats line")
    if mtp == "on":
        line = stat_line[0] if stat_line else ""
        m = re.search(r"MTP drafts accepted (\d+)/(\d+)", line)
        acc = [m.group(1), m.group(2)] if m else []
        check(len(acc) == 2 and 0 < int(acc[0]) < int(acc[1]),
              f"run --mtp on: drafts made, some accepted and some rejected ({'/'.join(acc) or line})")
    else:
        check(stat_line and "MTP" not in stat_line[0], "run --mtp off: no drafts")
    got = route_file_picks(stats)
    check(got == run_picks, f"run --mtp {mtp} --route-stats: the reference's picks per layer and expert "
                            f"over the {len(seq)} forwarded tokens")
    if got != run_picks:
        print("  got:     ", got)
        print("  expected:", run_picks)
    check(f"routing statistics -> {stats} (4 MoE layers)" in err, f"run --mtp {mtp}: stderr names the statistics file")

# ---- ppl ------------------------------------------------------------------------------
text = os.path.join(work, "text.txt")
with open(text, "w") as f:
    f.write(ppl_text)
stats = os.path.join(work, "route-ppl.json")
p = run(["ppl", model, "--file", text, "--ctx", "128", "--route-stats", stats])
nll = torch.nn.functional.cross_entropy(ppl_logits[:-1], torch.tensor(ppl_ids[1:]))
want_ppl = math.exp(float(nll))
line = p.stdout.decode(errors="replace").strip()
try:
    got_ppl = float(line.split()[1])
except (IndexError, ValueError):
    got_ppl = math.nan
check(abs(got_ppl - want_ppl) <= 1e-4 * want_ppl, f"ppl {got_ppl} == PyTorch's {want_ppl:.6f}")
check(route_file_picks(stats) == ppl_picks, "ppl --route-stats: the reference's picks over the scored text")

# ---- bench ------------------------------------------------------------------------------
p = run(["bench", model, "-p", "8", "-n", "24", "-r", "1", "--json"])
try:
    b = json.loads(p.stdout)
except ValueError:
    b = {}
tests = {t.get("test"): t for t in b.get("tests", [])}
mtp_row = tests.get("tg24-mtp", {})
check("tg24" in tests and mtp_row.get("median_tok_s", 0) > 0, "bench: tg24 and tg24-mtp rows")
check(mtp_row.get("drafted", 0) > 0 and 0 <= mtp_row.get("accepted", -1) <= mtp_row.get("drafted", 0)
      and mtp_row.get("speedup", 0) > 0 and mtp_row.get("plain_median_tok_s", 0) > 0,
      f"bench: MTP drafted/accepted/speedup/plain_median_tok_s ({mtp_row})")
# A decode token reads everything but the MTP head, the embedding table (one
# row) and 6 of each layer's 8 experts: f32 payloads, 4 bytes a weight.
names = {n: t for n, t in w.items()}
expert = sum(t.numel() for n, t in names.items() if ".mlp.experts." in n and not n.startswith("model.mtp."))
other = sum(t.numel() for n, t in names.items()
            if ".mlp.experts." not in n and not n.startswith("model.mtp.") and n != "model.embed_tokens.weight")
want_read = 4 * (other + expert * c["top_k"] // c["experts"])
check(b.get("decode_read_bytes") == want_read,
      f"bench: decode_read_bytes {b.get('decode_read_bytes')} == {want_read} (top_k of the experts, no MTP head)")
p = run(["bench", model, "-p", "0", "-n", "8", "-r", "1", "--mtp", "off", "--json"])
try:
    names_off = [t.get("test") for t in json.loads(p.stdout).get("tests", [])]
except ValueError:
    names_off = []
check(names_off == ["tg8"], f"bench --mtp off: no tg-mtp row ({names_off})")
# Three sequences decoding together through the batch engine: the hybrid's
# recurrent state and the experts' routing per sequence, one pass per step
# (the MTP head left unbound, as serve binds it).
p = run(["bench", model, "-p", "0", "-n", "8", "-r", "2", "--parallel", "3", "--json"])
try:
    par = {t.get("test"): t for t in json.loads(p.stdout).get("tests", [])}.get("tg8-x3", {})
except ValueError:
    par = {}
check(par.get("batched") is True and par.get("sequences") == 3 and len(par.get("samples_tok_s", [])) == 2
      and par.get("median_tok_s", 0) > 0
      and abs(par.get("per_sequence_median_tok_s", 0) * 3 - par.get("median_tok_s", 0)) < 1e-6 * par.get("median_tok_s", 1),
      f"bench --parallel 3: a batched tg8-x3 row, 2 samples, per-sequence rate a third of the aggregate ({par})")
p = run(["bench", model, "-p", "8", "-n", "0", "--parallel", "3"], expect=2)
check(b"--parallel" in p.stderr, "bench --parallel with -n 0: exit 2 naming --parallel")

# ---- errors -------------------------------------------------------------------------------
p = run(["run", model, "--raw", "-p", "x", "--mtp", "maybe"], expect=None)
check(p.returncode == 2 and b"--mtp" in p.stderr, "run --mtp maybe: exit 2 naming --mtp")
missing = os.path.join(work, "no-such-dir", "stats.json")
p = run(["run", model, "--raw", "--greedy", "-n", "2", "-p", "x", "--route-stats", missing], expect=None)
check(p.returncode != 0 and b"no-such-dir" in p.stderr and not os.path.exists(missing),
      "run --route-stats into a missing directory: an error naming it")

finish()
