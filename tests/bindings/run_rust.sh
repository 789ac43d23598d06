#!/usr/bin/env bash
# The Rust crate's tests (unit, integration, doctests, and bindgen's layout
# tests of the raw layer) with Debian's rustc/cargo 1.63, offline, then its
# examples against the default model. Debian's toolchain is used by path:
# a newer rustup toolchain earlier on PATH must not stand in for it.
set -euo pipefail
for tool in /usr/bin/cargo /usr/bin/rustc /usr/bin/rustdoc; do
  [ -x "$tool" ] || { echo "skipped: $tool is not installed (apt-get install rustc cargo)"; exit 77; }
done
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../support/sanitizer_env.sh"
[ -z "$SANITIZER_PRELOAD" ] || export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="env LD_PRELOAD=$SANITIZER_PRELOAD"
cd "$here/../../sdk/bindings/rust"
export PATH="/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_DIR="$CMF_BINDINGS_BUILD_DIR/rust-target" CARGO_HOME="$CMF_BINDINGS_BUILD_DIR/cargo-home"
export LD_LIBRARY_PATH="$CMF_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
/usr/bin/rustc --version
/usr/bin/cargo test --offline --locked
/usr/bin/cargo build --offline --locked --examples
ex="$CARGO_TARGET_DIR/debug/examples"
want="$(/usr/bin/python3 -c 'import json,sys; c=[c for c in json.load(open(sys.argv[1]))["cases"] if c["name"]=="raw"][0]; print(c["prompt"]); print(c["max_new_tokens"]); print(c["text"])' "$CMF_TEST_EXPECTED")"
prompt="$(sed -n 1p <<<"$want")"; n="$(sed -n 2p <<<"$want")"; text="$(sed -n 3p <<<"$want")"
got="$(with_sanitizers "$ex/generate" "$CMF_TEST_MODEL" --raw "$prompt" -n "$n")"
[ "$got" = "$text" ] || { echo "examples/generate: got '$got', want '$text'"; exit 1; }
with_sanitizers "$ex/inspect" "$CMF_TEST_MODEL" --tensor model.norm.weight | grep -q '^verify: ok$' || { echo "examples/inspect failed"; exit 1; }
echo "examples: generate reproduces the reference text, inspect verifies"
