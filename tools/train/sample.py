#!/usr/bin/python3
"""Sampled continuations from a checkpoint (generation_config.json settings, fixed seed).

    /usr/bin/python3 tools/train/sample.py [models/austen-tiny] [--seed N] [--chat] PROMPT...

Produces the sample outputs quoted in the model README.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_tokenizer import ByteLevelBPE  # noqa: E402
from qwen3_torch import load_checkpoint, sample_generate  # noqa: E402
from reference_generate import render_chat  # noqa: E402


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(here, "..", "..", "models", "austen-tiny"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new", type=int, default=80)
    ap.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn")
    ap.add_argument("prompts", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(2)
    model, _ = load_checkpoint(a.model)
    tok = ByteLevelBPE.from_hf_json(os.path.join(a.model, "tokenizer.json"))
    tcfg = json.load(open(os.path.join(a.model, "tokenizer_config.json")))
    g = json.load(open(os.path.join(a.model, "generation_config.json")))
    eos = set(g["eos_token_id"] if isinstance(g["eos_token_id"], list) else [g["eos_token_id"]])
    for p in a.prompts:
        text = render_chat(tcfg["chat_template"], [{"role": "user", "content": p}]) if a.chat else p
        gen = torch.Generator().manual_seed(a.seed)
        with torch.no_grad():
            ids = sample_generate(model, tok.encode(text), a.max_new, eos, g["temperature"],
                                  g["top_k"], g["top_p"], g["repetition_penalty"], gen)
        if ids and ids[-1] in eos:
            ids = ids[:-1]
        print(f"### {'chat' if a.chat else 'raw'} (seed {a.seed}): {p}\n{tok.decode(ids)}\n")


if __name__ == "__main__":
    main()
