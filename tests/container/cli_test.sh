#!/bin/sh
# cmfhost container commands on the original's 4490-byte sample file
# (written by container_tests).
# usage: cli_test.sh CMFHOST CONTAINER_TESTS
set -eu
host=$1 tests=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
CMF_TEST_SAMPLE_COPY=$dir/s.cmf "$tests" --no-version --test-case='*byte for byte*' >/dev/null
fail() { echo "FAIL: $*" >&2; exit 1; }
"$host" info "$dir/s.cmf" | grep -q 'model.layers.0.mlp.gate_proj.weight *q4_tiled *\[1,32\] *18' || fail "info table"
"$host" info "$dir/s.cmf" --json | grep -q '"features":"TENSOR_DIR|BINARY_MASKS"' || fail "info --json"
"$host" verify --no-progress "$dir/s.cmf" | grep -q ': ok (2 tensors' || fail "verify clean"
"$host" masks "$dir/s.cmf" | grep -q 'task 0 layer 1: 1 FFN groups, 2 heads' || fail "masks"
"$host" tensor "$dir/s.cmf" model.norm.weight --out "$dir/n.bin" >/dev/null
[ "$(od -An -tx1 "$dir/n.bin" | tr -d ' \n')" = "0000803f0000c03f00000040000000bf0000803e0000003e00004040000080bf" ] || fail "tensor f32 bytes"
"$host" keygen "$dir/k" >/dev/null
"$host" keygen "$dir/k" >/dev/null 2>&1 && fail "keygen overwrote a key"
"$host" sign "$dir/s.cmf" --key "$dir/k" | grep -q 'signed' || fail "sign"
"$host" verify --no-progress "$dir/s.cmf" --trusted-key "$dir/k.pub" | grep -q 'signature ok: .* (trusted)' || fail "trusted verify"
"$host" keygen "$dir/other" >/dev/null
if "$host" verify --no-progress "$dir/s.cmf" --trusted-key "$dir/other.pub" >/dev/null; then fail "untrusted signer accepted"; fi
"$host" compact "$dir/s.cmf" -o "$dir/c.cmf" >/dev/null
cmp -s "$dir/s.cmf" "$dir/c.cmf" || fail "compact of a clean W1 file is not identical"
# a flipped payload byte: non-zero exit, tensor named
printf '\377' | dd of="$dir/s.cmf" bs=1 seek=4170 conv=notrunc 2>/dev/null
if "$host" verify --no-progress "$dir/s.cmf" > "$dir/out"; then fail "verify passed a corrupt file"; fi
grep -q "PROBLEM: tensor 'model.layers.0.mlp.gate_proj.weight': hash64 mismatch" "$dir/out" || fail "problem not named"
for c in info verify sign keygen compact tensor masks; do "$host" $c --help | grep -q usage || fail "$c --help"; done
echo ok
