#!/usr/bin/env python3
"""Open a model and generate: one chat turn (or --raw completion), streamed.

usage: generate.py MODEL.cmf [PROMPT] [--raw] [-n N]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cmf  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("model")
ap.add_argument("prompt", nargs="?", default="Tell me about Mr. Darcy.")
ap.add_argument("--raw", action="store_true", help="plain completion, no chat template")
ap.add_argument("-n", type=int, default=64, help="tokens to generate")
args = ap.parse_intermixed_args()

with cmf.Runtime() as rt, rt.open(args.model) as model, model.session() as s:
    prompt = args.prompt if args.raw else model.render_chat([{"role": "user", "content": args.prompt}])
    for piece in s.generate_text(prompt, max_tokens=args.n, temperature=0.0, repetition_penalty=1.0):
        print(piece, end="", flush=True)
    print()
