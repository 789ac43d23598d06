#!/bin/sh
# cmfhost moe-mask / moe-defrag from the routing `run --route-stats` records
# on the tiny qwen3_moe checkpoint, and convert --defrag on austen-tiny:
# the mask run and the defragged run print the same text; convert --defrag
# gives the tensors `defrag --keep` gives; refusals leave no output.
# usage: cli_moe_defrag_test.sh CMFHOST TINY_MODELS_DIR SOURCE_ROOT WORK_DIR
set -eu
host=$1 tiny=$2 root=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
m=$work/moe.cmf
"$host" convert --model "$tiny/qwen3_moe" -o "$m" --quant f32 --no-progress >/dev/null || fail "convert qwen3_moe"
prompt="It is a truth universally acknowledged"
run() { "$host" run "$@" --raw --greedy -n 120 -p "$prompt" 2>/dev/null; }
"$host" run "$m" --raw --greedy -n 60 -p "$prompt" --route-stats "$work/stats.json" >/dev/null 2>&1 || fail "run --route-stats"
"$host" moe-mask "$m" --stats "$work/stats.json" --cover 0.6 --name code -o "$work/masked.cmf" >"$work/mask.txt" || fail "moe-mask"
grep -q "^wrote $work/masked.cmf: task 'code' (id 1) routes among \[[0-9,]*\] experts per MoE layer (3 layers" "$work/mask.txt" ||
  fail "moe-mask line: $(cat "$work/mask.txt")"
"$host" masks "$work/masked.cmf" | grep -q "code" || fail "masks does not list the new task"
"$host" moe-defrag "$m" --stats "$work/stats.json" --cover 0.6 -o "$work/cut.cmf" >"$work/cut.txt" || fail "moe-defrag"
grep -q "^wrote $work/cut.cmf: [0-9]* experts kept, [0-9]* dropped in 3 MoE layers (cover 60%)" "$work/cut.txt" ||
  fail "moe-defrag line: $(cat "$work/cut.txt")"
run "$work/masked.cmf" --task code >"$work/task.txt" || fail "run --task code"
run "$work/cut.cmf" >"$work/cut-run.txt" || fail "run the defragged file"
run "$m" >"$work/whole.txt" || fail "run the whole model"
cmp -s "$work/task.txt" "$work/cut-run.txt" || fail "defragged text differs: $(cat "$work/task.txt") | $(cat "$work/cut-run.txt")"
cmp -s "$work/task.txt" "$work/whole.txt" && fail "the cover changed nothing"
[ "$(stat -c %s "$work/cut.cmf")" -lt "$(stat -c %s "$m")" ] || fail "the defragged file is not smaller"
"$host" info "$work/cut.cmf" --json | grep -q '"moe_defrag"' || fail "no provenance.moe_defrag"
# Cut tighter from the file's own routing counts.
"$host" moe-defrag "$work/cut.cmf" --cover 0.3 -o "$work/tighter.cmf" >/dev/null || fail "moe-defrag without --stats"
run "$work/tighter.cmf" >/dev/null || fail "run the tighter file"
# Refusals, each with its reason and no output.
refuse() {
  want=$1
  shift
  "$host" "$@" -o "$work/refused.cmf" >/dev/null 2>"$work/err.txt" && fail "accepted: $*"
  grep -q "$want" "$work/err.txt" || fail "message for $*: $(cat "$work/err.txt")"
  [ -e "$work/refused.cmf" ] && fail "a refused command left an output: $*"
  return 0
}
refuse "cannot read MoE stats" moe-defrag "$m" --stats "$work/none.json"
refuse "carries no routing counts" moe-defrag "$m"
refuse "cover must be in (0, 1\]" moe-defrag "$m" --stats "$work/stats.json" --cover 1.5
refuse "cover must be in (0, 1\]" moe-mask "$m" --stats "$work/stats.json" --cover 0 --name x
refuse "\-\-stats is required" moe-mask "$m" --name x
echo '{"9":[1,1,1,1,1,1,1,1]}' >"$work/far.json"
refuse "layer 9, but the model has 4 layers" moe-defrag "$m" --stats "$work/far.json"
refuse "layer 9, but the model has 4 layers" moe-mask "$m" --stats "$work/far.json" --name x
refuse "task 'code' exists" moe-mask "$work/masked.cmf" --stats "$work/stats.json" --name code
# convert --defrag: the same tensors as defrag --keep of a converted file.
a=$work/austen.cmf
"$host" convert --model "$root/models/austen-tiny" -o "$a" --quant f32 --no-progress >/dev/null || fail "convert austen-tiny"
refuse "not a mixture-of-experts model" moe-defrag "$a" --stats "$work/stats.json"
/usr/bin/python3 - "$work/skill" <<'PY' || fail "write ffn_keep.npy"
import os, random, struct, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
layers, inter = 4, 512
rng = random.Random(5)
h = "{'descr': '|b1', 'fortran_order': False, 'shape': (%d, %d), }" % (layers, inter)
h += ' ' * ((64 - (10 + len(h) + 1) % 64) % 64) + '\n'
with open(os.path.join(d, 'ffn_keep.npy'), 'wb') as f:
    f.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(h)) + h.encode())
    f.write(bytes(rng.random() < 0.5 for _ in range(layers * inter)))
PY
"$host" convert --model "$root/models/austen-tiny" -o "$work/at-convert.cmf" --quant f32 --defrag "$work/skill" --no-progress \
  >/dev/null || fail "convert --defrag"
"$host" defrag "$a" --keep "$work/skill/ffn_keep.npy" -o "$work/after.cmf" >/dev/null || fail "defrag --keep"
"$host" info "$work/at-convert.cmf" --tensors model. >"$work/t1.txt" || fail "info --tensors"
"$host" info "$work/after.cmf" --tensors model. >"$work/t2.txt" || fail "info --tensors"
cmp -s "$work/t1.txt" "$work/t2.txt" || fail "convert --defrag tensors differ from defrag --keep"
"$host" run "$work/at-convert.cmf" --raw --greedy -n 40 -p "$prompt" >"$work/c1.txt" 2>/dev/null || fail "run convert --defrag"
"$host" run "$work/after.cmf" --raw --greedy -n 40 -p "$prompt" >"$work/c2.txt" 2>/dev/null || fail "run defrag --keep"
cmp -s "$work/c1.txt" "$work/c2.txt" || fail "convert --defrag runs differently"
"$host" convert --model "$root/models/austen-tiny" -o "$work/refused.cmf" --defrag "$work/no-such" --no-progress >/dev/null 2>&1 &&
  fail "convert --defrag of a missing dir"
[ -e "$work/refused.cmf" ] && fail "a refused convert left an output"
"$host" convert --model "$tiny/qwen3_moe" -o "$work/refused.cmf" --defrag "$work/skill" --no-progress >/dev/null 2>"$work/err.txt" &&
  fail "convert --defrag of a MoE model"
grep -q "its experts are defragged by moe-defrag" "$work/err.txt" || fail "MoE convert --defrag message: $(cat "$work/err.txt")"
[ -e "$work/refused.cmf" ] && fail "a refused convert left an output"
echo "cli moe-defrag, moe-mask, convert --defrag: ok"
