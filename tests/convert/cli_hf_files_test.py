#!/usr/bin/python3
"""A checkpoint whose files are written the way Hugging Face's libraries
write them for many real repositories converts and chats:

  - tokenizer_config.json with "model_max_length": int(1e30) (the
    tokenizers' "no limit"), an integer past 64 bits that strict JSON
    parsers refuse, written by json.dumps as transformers does;
  - generation_config.json and config.json with a UTF-8 byte order mark
    and a NaN in a key nothing uses (json.dumps writes NaN unless told not to).

`cmfhost convert` then `cmfhost run` (a chat turn) and `cmfhost render
--tokenizer-config` on the same file. Then the same model with Qwen's YaRN
recipe in config.json: its logits must differ from the plain model's (the
scaling is applied, not ignored; tests/runtime checks the values against
PyTorch).

usage: cli_hf_files_test.py CMFHOST REPO_ROOT WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

cmfhost, root, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, expect=0):
    p = subprocess.run([cmfhost] + args, capture_output=True, timeout=300)
    if p.returncode != expect:
        print("command:", " ".join([cmfhost] + args))
        print("stdout:", p.stdout.decode(errors="replace")[-2000:])
        print("stderr:", p.stderr.decode(errors="replace")[-2000:])
    check(p.returncode == expect, f"cmfhost {args[0]} exits {expect}")
    return p


src = os.path.join(root, "models", "austen-tiny")
hf = os.path.join(work, "hf")
shutil.copytree(src, hf)

tc = json.load(open(os.path.join(hf, "tokenizer_config.json")))
tc["model_max_length"] = int(1e30)
with open(os.path.join(hf, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    f.write(json.dumps(tc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")  # as transformers saves it
text = open(os.path.join(hf, "tokenizer_config.json")).read()
check('"model_max_length": 1000000000000000019884624838656' in text, "tokenizer_config.json holds int(1e30)")
for name in ("config.json", "generation_config.json"):
    d = json.load(open(os.path.join(hf, name)))
    d["initializer_range_unused"] = float("nan")
    with open(os.path.join(hf, name), "w", encoding="utf-8-sig") as f:  # with a byte order mark
        f.write(json.dumps(d, indent=2) + "\n")

plain = os.path.join(work, "austen.cmf")
run(["convert", "--model", hf, "--output", plain, "--quant", "f32"])
p = run(["run", plain, "-p", "Who is Emma?", "-n", "8", "--greedy"])
check(len(p.stdout.strip()) > 0, "cmfhost run answers a chat turn")

conv = os.path.join(work, "conv.json")
json.dump([{"role": "user", "content": "Who is Emma?"}], open(conv, "w"))
p = run(["render", "--tokenizer-config", os.path.join(hf, "tokenizer_config.json"), "--messages", conv,
         "--add-generation-prompt"])
check(p.stdout.decode().endswith("<|im_start|>assistant\n"), "cmfhost render reads the int(1e30) tokenizer_config.json")

# Qwen's YaRN recipe (v4 spelling): the runtime applies it.
cfg = json.load(open(os.path.join(hf, "config.json"), encoding="utf-8-sig"))
cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
with open(os.path.join(hf, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
yarn = os.path.join(work, "austen-yarn.cmf")
run(["convert", "--model", hf, "--output", yarn, "--quant", "f32"])
info = json.loads(run(["info", yarn, "--json"]).stdout)
check(info["header"]["arch"].get("rope_scaling", {}).get("rope_type") == "yarn", "the arch block records rope_scaling yarn")
ids = "1,2,3,4,5,6,7,8"
logits = []
for model in (plain, yarn):
    out = model + ".logits"
    run(["logits", model, "--ids", ids, "--out", out])
    raw = open(out, "rb").read()
    logits.append(struct.unpack("<%df" % (len(raw) // 4), raw))
diff = max(abs(a - b) for a, b in zip(*logits))
scale = max(abs(a) for a in logits[0])
print(f"max |logit(yarn) - logit(plain)| = {diff:.4f} (logit scale {scale:.2f})")
check(diff > 1e-3 * scale, "YaRN changes the logits (it is applied; ignoring it gives differences ~1e-6)")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
