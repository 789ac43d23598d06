#!/usr/bin/env python3
"""The default model, as the build converted it (f16), verifies and reproduces
the PyTorch reference's greedy continuation (models/austen-tiny/
expected_greedy.json, written by tools/train/reference_generate.py from the
same checkpoint): raw completion, and one chat turn through the file's
template."""
import json
import subprocess
import sys

cmfhost, model, expected = sys.argv[1:4]
subprocess.run([cmfhost, "verify", model], check=True, stdout=subprocess.DEVNULL)
cases = {c["name"]: c for c in json.load(open(expected))["cases"]}
failed = 0
for name, extra in (("raw", ["--raw"]), ("chat", [])):
    case = cases[name]
    prompt = case["prompt"] if name == "raw" else case["messages"][-1]["content"]
    cmd = [cmfhost, "run", model, "--greedy", "-n", str(case["max_new_tokens"]), "-p", prompt] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    want = case["text"]
    got = out[len(prompt):] if name == "raw" and out.startswith(prompt) else out
    got = got.rstrip("\n")
    if got != want:
        failed += 1
        print(f"{name}: greedy continuation differs from the PyTorch reference\n want: {want!r}\n got:  {got!r}")
    else:
        print(f"{name}: {case['max_new_tokens']} greedy tokens identical to the PyTorch reference")
sys.exit(1 if failed else 0)
