#!/usr/bin/python3
"""Reference greedy outputs of a committed Qwen3 checkpoint, for C++ parity tests.

    /usr/bin/python3 tools/train/reference_generate.py [models/austen-tiny]

Loads config.json + model.safetensors into the plain-torch Qwen3
(qwen3_torch.py, f32 compute) and tokenizer.json into the byte-level BPE
(bpe_tokenizer.py), then for two fixed prompts -- one raw text, one chat
message rendered through tokenizer_config.json's chat template with
add_generation_prompt -- runs greedy decoding (argmax, ties -> lowest id,
KV cache) until an eos id from generation_config.json or max_new_tokens.

Writes <model>/expected_greedy.json with, per case: the prompt string,
its token ids, generated ids, the decoded generated text, whether it stopped
on eos, and the 10 largest logits at the first generated position (for a
tolerance check that does not depend on argmax ties). Also recomputes the
held-out perplexity on <model>/heldout.txt and records it with the method.
Exact-id comparisons are meaningful for an f32 (or bf16-exact) run; a
quantised runtime may legitimately diverge after some tokens.
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_tokenizer import ByteLevelBPE  # noqa: E402
from qwen3_torch import greedy_generate, load_checkpoint  # noqa: E402

RAW_PROMPT = "It is a truth universally acknowledged, that"
CHAT_MESSAGES = [{"role": "user", "content": "Tell me about Mr. Darcy."}]
RAW_MAX_NEW = 48
CHAT_MAX_NEW = 64
HELDOUT_CTX = 128  # must match the training context (train_default_model.py --ctx)


def render_chat(template, messages):
    import jinja2  # Debian python3-jinja2; HF renders chat templates with jinja2 too
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


@torch.no_grad()
def heldout_loss(model, ids, ctx):
    # Same method as train_default_model.heldout_loss (kept in sync by hand).
    total, n = 0.0, 0
    for s in range(0, len(ids) - 1, ctx):
        y = torch.tensor(ids[s + 1:s + ctx + 1])
        x = torch.tensor([ids[s:s + len(y)]])
        logits = model(x)[0]
        total += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        n += len(y)
    return total / n, n


@torch.no_grad()
def main():
    here = os.path.dirname(os.path.abspath(__file__))
    mdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "models", "austen-tiny")
    mdir = os.path.abspath(mdir)
    torch.set_num_threads(2)
    model, cfg = load_checkpoint(mdir)
    tok = ByteLevelBPE.from_hf_json(os.path.join(mdir, "tokenizer.json"))
    with open(os.path.join(mdir, "tokenizer_config.json")) as f:
        tcfg = json.load(f)
    with open(os.path.join(mdir, "generation_config.json")) as f:
        gcfg = json.load(f)
    eos = gcfg["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [eos])

    cases = []
    for name, prompt, max_new, extra in (
        ("raw", RAW_PROMPT, RAW_MAX_NEW, {}),
        ("chat", render_chat(tcfg["chat_template"], CHAT_MESSAGES), CHAT_MAX_NEW,
         {"messages": CHAT_MESSAGES, "add_generation_prompt": True}),
    ):
        ids = tok.encode(prompt)
        logits = model(torch.tensor([ids]))[0, -1]
        top = torch.topk(logits, 10)
        margins = []
        gen = greedy_generate(model, ids, max_new, eos_ids=eos, margins=margins)
        stopped = bool(gen) and gen[-1] in eos
        text = tok.decode(gen[:-1] if stopped else gen)
        case = {"name": name, **extra, "prompt": prompt, "prompt_ids": ids,
                "max_new_tokens": max_new, "generated_ids": gen,
                "stopped_on_eos": stopped, "text": text,
                "min_top2_logit_margin": round(min(margins), 5),
                "first_step_top_logits": [[int(i), round(float(v), 5)]
                                          for v, i in zip(top.values, top.indices)]}
        cases.append(case)
        print(f"--- {name}: {prompt!r}\n{text}\n")

    with open(os.path.join(mdir, "heldout.txt"), encoding="utf-8") as f:
        held = f.read()
    hids = tok.encode(held)
    hl, n = heldout_loss(model, hids, HELDOUT_CTX)
    out = {
        "model": os.path.basename(mdir),
        "generator": "tools/train/reference_generate.py (plain-torch Qwen3, f32 compute, greedy)",
        "torch_version": torch.__version__,
        "eos_token_ids": sorted(eos),
        "cases": cases,
        "heldout": {
            "file": "heldout.txt",
            "method": (f"tokenize the whole file (no BOS), score every token but the first; "
                       f"windows of {HELDOUT_CTX} input tokens with stride {HELDOUT_CTX}, "
                       f"each from an empty context"),
            "tokens_scored": n,
            "loss_nats_per_token": round(hl, 5),
            "perplexity": round(math.exp(hl), 4),
        },
    }
    path = os.path.join(mdir, "expected_greedy.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)
    print(f"held-out: loss {hl:.4f} nats/token, perplexity {math.exp(hl):.3f} ({n} tokens)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
