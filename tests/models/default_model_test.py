#!/usr/bin/env python3
"""The default model, as the build converted it (f16), verifies and reproduces
the PyTorch reference's greedy continuation (models/austen-tiny/
expected_greedy.json, written by tools/train/reference_generate.py from the
same checkpoint): raw completion, and one chat turn through the file's
template."""
import json
import os
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
# The file's own tokenizer and chat template (cmfhost tokenize/render MODEL)
# give the reference's prompt ids and prompt text.
raw = cases["raw"]
ids = subprocess.run([cmfhost, "tokenize", model, raw["prompt"]], check=True, capture_output=True, text=True).stdout
if [int(x) for x in ids.split()] != raw["prompt_ids"]:
    failed += 1
    print(f"tokenize MODEL: {ids.strip()} != {raw['prompt_ids']}")
chat = cases["chat"]
conv = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"cmf-default-model-conv-{os.getpid()}.json")
with open(conv, "w") as f:
    json.dump(chat["messages"], f)
try:
    rendered = subprocess.run([cmfhost, "render", model, "--messages", conv, "--add-generation-prompt"],
                              check=True, capture_output=True, text=True).stdout
finally:
    os.remove(conv)
if rendered != chat["prompt"]:
    failed += 1
    print(f"render MODEL: {rendered!r} != {chat['prompt']!r}")
else:
    print("tokenize/render MODEL: prompt ids and chat prompt identical to the reference")
sys.exit(1 if failed else 0)
