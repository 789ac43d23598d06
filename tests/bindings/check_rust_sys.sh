#!/usr/bin/env bash
# The Rust crate's raw layer (sdk/bindings/rust/src/sys.rs) is what bindgen
# makes of abi/cmf/cmf.h today: regenerate it and compare.
set -euo pipefail
for tool in /usr/bin/bindgen /usr/bin/rustfmt; do
  [ -x "$tool" ] || { echo "skipped: $tool is not installed (apt-get install bindgen rustfmt)"; exit 77; }
done
rust="$(dirname "$0")/../../sdk/bindings/rust"
fresh="$(mktemp)"
trap 'rm -f "$fresh" "$fresh.tmp"' EXIT
"$rust/gen-sys.sh" "$fresh"
if ! diff -u "$rust/src/sys.rs" "$fresh" > "$fresh.tmp"; then
  head -n 60 "$fresh.tmp"
  echo "sdk/bindings/rust/src/sys.rs is out of date with abi/cmf/cmf.h: run sdk/bindings/rust/gen-sys.sh and commit it"
  exit 1
fi
echo "src/sys.rs matches bindgen's output for cmf.h"
