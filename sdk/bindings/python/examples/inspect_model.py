#!/usr/bin/env python3
"""Inspect a model: facts, its tensors, one tensor's first rows decoded to
f32, and a verify of every hash (with --trusted-key: the signature too).

usage: inspect_model.py MODEL.cmf [--tensor NAME] [--trusted-key HEX]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cmf  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("model")
ap.add_argument("--tensor", default="model.embed_tokens.weight")
ap.add_argument("--trusted-key", action="append", default=[], help="64-hex public key or 16-hex fingerprint")
args = ap.parse_intermixed_args()

with cmf.Runtime() as rt, rt.open(args.model) as model:
    info = model.info()
    print(f"{args.model}: arch {info.arch_name}, {info.quant_type}, {info.tensor_count} tensors, "
          f"{info.shard_count} shard(s)")
    for t in model.tensors():
        print(f"  {t.name:50} dtype {t.dtype:2} {list(t.shape)}")
    t = model.tensor(args.tensor)
    rows = model.dequantize(t, rows=(0, min(2, t.rows)))
    print(f"{t.name} rows 0..2, first values: {[round(float(x), 4) for x in list(rows.flatten() if hasattr(rows, 'flatten') else rows)[:4]]}")
    report = model.verify(trusted_keys=args.trusted_key)
    for p in report.problems:
        print("problem:", p)
    for s in report.signatures:
        print(f"signed by {s.fingerprint} (trusted: {s.trusted})")
    print("verify:", "ok" if report.ok else f"{len(report.problems)} problem(s)")
    sys.exit(0 if report.ok else 1)
