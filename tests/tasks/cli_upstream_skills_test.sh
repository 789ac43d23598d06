#!/bin/sh
# Skill files written by the original implementation (tests/fixtures/upstream/
# skills, see its README.md): cmfhost reads them, lists the skill, applies the
# original's skill file to the original's backbone and gets what the original's
# own apply wrote, byte for byte; its export of the original's specialist
# gives the original's skill file back, byte for byte; a wrong base and a damaged payload are
# refused.
# usage: cli_upstream_skills_test.sh CMFHOST FIXTURE_DIR WORK_DIR
set -eu
host=$1 fix=$2 work=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
for f in backbone.cmf specialist.cmf gfx.skill.cmf applied.cmf \
         model.layers.1.mlp.down_proj.weight.f32 model.layers.1.self_attn.o_proj.weight.f32; do
  [ -s "$fix/$f" ] || fail "fixture $fix/$f is missing or empty (written by the original implementation; see $fix/README.md)"
done
rm -rf "$work"
mkdir -p "$work"
out() { cat "$work/$1"; }

# Every hash the original stored checks out.
for f in backbone.cmf specialist.cmf gfx.skill.cmf applied.cmf; do
  "$host" verify "$fix/$f" >"$work/verify.txt" 2>&1 || fail "verify $f: $(out verify.txt)"
done

# The skill file: feature bit 6, the record with its binding keys, the carried mask.
"$host" info "$fix/gfx.skill.cmf" >"$work/info.txt" || fail "info: $(out info.txt)"
grep -q '^version       2   features 0x43 TENSOR_DIR|BINARY_MASKS|SKILL_FILE$' "$work/info.txt" ||
  fail "skill file features: $(out info.txt)"
grep -q '^  "gfx"  (standalone skill file)$' "$work/info.txt" || fail "info skills: $(out info.txt)"
"$host" info --json "$fix/gfx.skill.cmf" >"$work/info.json" || fail "info --json"
grep -q '"skills":\[{"id":"gfx","name":"graphics","layers":\[1\],"base_dir_hash":"066f3d0a8de1a9e5","base_arch":"qwen3","task":"gfx",' \
  "$work/info.json" || fail "skill record: $(out info.json)"
"$host" skill list "$fix/gfx.skill.cmf" >"$work/list.txt" || fail "skill list"
cat >"$work/list.want" <<'EOF'
1 skill(s):
  gfx        graphics                 2 tensor(s), 0.0 MB, layers [1], no selection
      standalone skill file for a base with directory hash "066f3d0a8de1a9e5"
EOF
cmp -s "$work/list.txt" "$work/list.want" || fail "skill list: $(out list.txt)"
"$host" info --json "$fix/backbone.cmf" | grep -q '"dir_hash":"066f3d0a8de1a9e5"' || fail "backbone directory hash"

# apply: the original's skill onto the original's backbone.
"$host" skill apply "$fix/backbone.cmf" "$fix/gfx.skill.cmf" -o "$work/applied.cmf" >"$work/apply.txt" 2>&1 ||
  fail "skill apply: $(out apply.txt)"
grep -q "^applied skill 'gfx': 2 tensor(s) replaced, 1 mask(s) carried -> " "$work/apply.txt" || fail "apply line: $(out apply.txt)"
"$host" verify "$work/applied.cmf" >/dev/null || fail "verify of our applied file"
# ... equals the original's own apply: every tensor by hash, the header, the skill record.
"$host" diff "$fix/applied.cmf" "$work/applied.cmf" >"$work/diff.txt" || fail "diff: $(out diff.txt)"
grep -q '^Header/arch: identical\.$' "$work/diff.txt" || fail "applied header: $(out diff.txt)"
grep -q '^Tensors: 25 shared verbatim (hash matched), +0 new, -0 removed, ~0 changed\.$' "$work/diff.txt" ||
  fail "applied tensors: $(out diff.txt)"
grep -q '^Skills: 1 shared\.$' "$work/diff.txt" || fail "applied skills: $(out diff.txt)"
"$host" info --json "$work/applied.cmf" >"$work/applied.json"
grep -q '"name":"model.layers.1.self_attn.o_proj.weight","dtype":"f16","dtype_id":1,"shape":\[8,8\],"nbytes":128,"offset":[0-9]*,"shard":0,"hash":"1df55fe2bdfe7320"' \
  "$work/applied.json" || fail "applied o_proj: $(out applied.json)"
grep -q '"name":"model.layers.1.mlp.down_proj.weight","dtype":"q8_row","dtype_id":3,"shape":\[8,16\],"nbytes":144,"offset":[0-9]*,"shard":0,"hash":"70217f5d27debc5d"' \
  "$work/applied.json" || fail "applied down_proj: $(out applied.json)"
grep -q '"skills":\[{"id":"gfx","name":"graphics","layers":\[1\],"base_arch":"qwen3","task":"gfx",' "$work/applied.json" ||
  fail "the applied record must drop base_dir_hash: $(out applied.json)"
"$host" masks "$work/applied.cmf" | grep -q '^  gfx  *12%  *unmeasured  *2 ' || fail "carried mask: $("$host" masks "$work/applied.cmf")"
# ... byte for byte: same layout, same header text, same sections.
cmp -s "$fix/applied.cmf" "$work/applied.cmf" || fail "our applied file is not byte-identical to the original's: $(cmp "$fix/applied.cmf" "$work/applied.cmf")"
# ... and decodes to the values the original decoded from its applied file.
for t in model.layers.1.mlp.down_proj.weight model.layers.1.self_attn.o_proj.weight; do
  "$host" dequant "$work/applied.cmf" --name "$t" --out "$work/$t.f32" >/dev/null || fail "dequant $t"
  cmp -s "$work/$t.f32" "$fix/$t.f32" || fail "$t: our values differ from the original's"
done

# export: the original's specialist cut against the original's backbone gives
# the original's skill file (tensors, header and record).
"$host" skill export "$fix/specialist.cmf" --base "$fix/backbone.cmf" --id gfx --name graphics -o "$work/gfx.skill.cmf" \
  >"$work/export.txt" 2>&1 || fail "skill export: $(out export.txt)"
"$host" diff "$fix/gfx.skill.cmf" "$work/gfx.skill.cmf" >"$work/diff2.txt" || fail "diff export: $(out diff2.txt)"
grep -q '^Header/arch: identical\.$' "$work/diff2.txt" || fail "exported header: $(out diff2.txt)"
grep -q '^Tensors: 2 shared verbatim (hash matched), +0 new, -0 removed, ~0 changed\.$' "$work/diff2.txt" ||
  fail "exported tensors: $(out diff2.txt)"
cmp -s "$fix/gfx.skill.cmf" "$work/gfx.skill.cmf" || fail "our skill file is not byte-identical to the original's: $(cmp "$fix/gfx.skill.cmf" "$work/gfx.skill.cmf")"
"$host" info --json "$work/gfx.skill.cmf" | grep -q '"base_dir_hash":"066f3d0a8de1a9e5","base_arch":"qwen3","task":"gfx"' ||
  fail "exported record keys"

# A base of other bytes (the applied file) is refused, and nothing is written.
"$host" skill apply "$fix/applied.cmf" "$fix/gfx.skill.cmf" -o "$work/wrong.cmf" >"$work/err.txt" 2>&1 &&
  fail "a skill applied onto the wrong base"
grep -q 'cut against another base (key 066f3d0a8de1a9e5, this base 83a7e800d815e07d)' "$work/err.txt" ||
  fail "wrong-base message: $(out err.txt)"
[ -e "$work/wrong.cmf" ] && fail "a refused apply left a file"

# A copy of the skill file with one payload byte changed fails verify.
cp "$fix/gfx.skill.cmf" "$work/bad.skill.cmf"
printf '\125' | dd of="$work/bad.skill.cmf" bs=1 seek=4200 conv=notrunc 2>/dev/null
cmp -s "$fix/gfx.skill.cmf" "$work/bad.skill.cmf" && fail "the planted byte did not change the copy"
"$host" verify "$work/bad.skill.cmf" >"$work/bad.txt" 2>&1 && fail "verify accepted a damaged skill file"
grep -q "tensor 'model.layers.1.self_attn.o_proj.weight': hash64 mismatch (directory 1df55fe2bdfe7320, payload " "$work/bad.txt" ||
  fail "damaged-payload message: $(out bad.txt)"
echo "skill files of the original implementation: ok"
