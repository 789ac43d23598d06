#!/usr/bin/env bash
# The SDK as someone outside the tree uses it: install into a scratch
# prefix, then build everything in sdk/examples/ against the installed tree
# only (through pkg-config cmf / cmf-plugin, with no path into the source
# or build tree), and run it:
#  - the C examples (open, list, dequantize, generate) on the installed
#    default model: plugins come from the installed tree, the greedy text is
#    the PyTorch reference's;
#  - the example codec and backend, loaded by the installed cmfhost from
#    CMF_PLUGIN_PATH; the backend generates the reference text.
# usage: installed_sdk_test.sh BUILDDIR SRCDIR EXPECTED_GREEDY_JSON
set -euo pipefail
builddir="$1" src="$2" expected="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
dest="$work/dest"
meson install -C "$builddir" --destdir "$dest" --no-rebuild --quiet >/dev/null
pcdir="$(dirname "$(find "$dest" -name cmf.pc | head -n1)")"
[ -f "$pcdir/cmf-plugin.pc" ] || { echo "cmf-plugin.pc is not installed next to cmf.pc"; exit 1; }
libdir="$(dirname "$(find "$dest" -name 'libcmf.so.1' | head -n1)")"
host="$(find "$dest" -path '*/bin/cmfhost' -type f | head -n1)"
model="$(find "$dest" -path '*/cmf/models/default.cmf' | head -n1)"
[ -x "$host" ] && [ -f "$model" ] || { echo "cmfhost or the default model is not installed"; exit 1; }
# pkg-config sees only the scratch install (PKG_CONFIG_LIBDIR replaces the
# system's search path); the sysroot maps its /usr/local/... paths into it.
export PKG_CONFIG_LIBDIR="$pcdir" PKG_CONFIG_PATH="" PKG_CONFIG_SYSROOT_DIR="$dest"
# Nothing from the build tree: meson test puts it on LD_LIBRARY_PATH.
unset CMF_PLUGIN_PATH CMF_THREADS LD_LIBRARY_PATH
for pc in cmf cmf-plugin; do
  inc="$(pkg-config --cflags "$pc")"
  case "$inc" in *"$dest"*) ;; *) echo "pkg-config --cflags $pc does not point into the install: $inc"; exit 1 ;; esac
done
[ -f "$(pkg-config --variable=includedir cmf-plugin)/cmf/plugin.hpp" ] || { echo "cmf/plugin.hpp is not installed"; exit 1; }
read_case() { /usr/bin/python3 -c 'import json,sys; c=[c for c in json.load(open(sys.argv[1]))["cases"] if c["name"]==sys.argv[2]][0]; print(c[sys.argv[3]])' "$expected" "$@"; }
prompt="$(read_case raw prompt)" n="$(read_case raw max_new_tokens)" text="$(read_case raw text)"

build() {  # build DIR NAME: a meson project from sdk/examples, out of tree
  cp -r "$src/sdk/examples/$1" "$work/$2-src"
  meson setup "$work/$2" "$work/$2-src" --buildtype=release >"$work/$2.log" 2>&1 &&
    meson compile -C "$work/$2" >>"$work/$2.log" 2>&1 || { cat "$work/$2.log"; echo "building sdk/examples/$1 failed"; exit 1; }
}

# ---- the C examples ------------------------------------------------------------
build c c
CMF_LIBRARY="$libdir/libcmf.so.1"
. "$(dirname "$0")/../support/sanitizer_env.sh"
run() { LD_LIBRARY_PATH="$libdir" with_sanitizers "$work/c/$@"; }
out="$(run list "$model")"
echo "$out" | grep -q "^plugin  .*$dest" || { echo "list: plugins did not come from the install"; echo "$out"; exit 1; }
echo "$out" | grep -q '^backend cpu$' || { echo "list: no cpu backend"; exit 1; }
[ "$(echo "$out" | grep -c '^tensor  ')" = 46 ] || { echo "list: expected 46 tensors"; exit 1; }
run open "$model" | grep -q '^arch qwen3, quant F16, 46 tensors, 1 shard(s)$' || { echo "open: wrong model facts"; exit 1; }
cp "$model" "$work/signed.cmf"
"$host" keygen "$work/me.key" >/dev/null
"$host" sign "$work/signed.cmf" --key "$work/me.key" >/dev/null
run open "$work/signed.cmf" "$(cat "$work/me.key.pub")" | grep -q '^verify: ok' || { echo "open: signed copy did not verify"; exit 1; }
if run open "$work/signed.cmf" "$(printf '%064d' 0)" >/dev/null 2>&1; then echo "open: verify passed with an untrusted key"; exit 1; fi
# dequantize: rows 7..9 of the embedding equal what cmfhost tensor writes.
run dequantize "$model" model.embed_tokens.weight 7 10 > "$work/rows.txt"
"$host" tensor "$model" model.embed_tokens.weight --out "$work/emb.f32" >/dev/null
/usr/bin/python3 - "$work/rows.txt" "$work/emb.f32" <<'PY'
import array, sys
# %.9g round-trips an f32: compare as f32.
rows = array.array("f", [float(v) for line in open(sys.argv[1]) for v in line.split()])
emb = array.array("f", open(sys.argv[2], "rb").read())
assert rows.tolist() == emb[7 * 192:10 * 192].tolist(), "dequantize rows differ from cmfhost tensor"
PY
if run dequantize "$model" model.norm.weight 0 2 2>"$work/err.txt"; then echo "dequantize: rows past the end accepted"; exit 1; fi
grep -q 'rows \[0, 2) outside \[0, 1)' "$work/err.txt" || { echo "dequantize: unexpected error: $(cat "$work/err.txt")"; exit 1; }
got="$(run generate "$model" "$prompt" "$n" --raw)"
[ "$got" = "$text" ] || { echo "generate: got '$got', want '$text'"; exit 1; }
echo "C examples: built with pkg-config cmf against the install; list/open/verify/dequantize/generate as expected"

# ---- plugins out of tree: the example codec and backend --------------------------
build codec-example codec
build backend-example backend
export CMF_PLUGIN_PATH="$work/codec:$work/backend"
plugins="$("$host" plugins)"
echo "$plugins" | grep -q '^codec    i8_sym ' || { echo "installed cmfhost did not load the example codec"; echo "$plugins"; exit 1; }
echo "$plugins" | grep -q '^backend  example ' || { echo "installed cmfhost did not load the example backend"; echo "$plugins"; exit 1; }
echo "$plugins" | grep -q '^backend  cpu ' || { echo "the installed cpu backend is missing"; exit 1; }
out="$("$host" run "$model" --backend example --kv-cache f32 --greedy --raw -n "$n" -p "$prompt")"
out="${out#"$prompt"}"
[ "$out" = "$text" ] || { echo "cmfhost run --backend example: got '$out', want '$text'"; exit 1; }
if "$host" run "$model" --backend no-such-backend --greedy -n 1 -p hi >/dev/null 2>"$work/err.txt"; then
  echo "cmfhost run --backend no-such-backend succeeded"; exit 1
fi
grep -q 'no-such-backend' "$work/err.txt" || { echo "the error does not name the backend: $(cat "$work/err.txt")"; exit 1; }
echo "plugins: example codec and backend built with pkg-config cmf-plugin, loaded by the installed cmfhost; the backend generates the reference text"
