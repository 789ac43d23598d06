#!/usr/bin/env bash
# The Go package's tests (go test, cgo) with Debian's Go, offline (no module
# proxy: the package has no dependencies), against the build tree through a
# generated cmf.pc, then its examples against the default model.
set -euo pipefail
go=/usr/bin/go
[ -x "$go" ] || { echo "skipped: $go is not installed (apt-get install golang-go)"; exit 77; }
command -v pkg-config >/dev/null || { echo "pkg-config is missing"; exit 1; }
here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/../.." && pwd)"
. "$here/../support/sanitizer_env.sh"
work="$CMF_BINDINGS_BUILD_DIR/go"
mkdir -p "$work/pkgconfig"
cat > "$work/pkgconfig/cmf.pc" <<PC
Name: cmf
Description: cmf host API (build tree)
Version: 0.0.0
Libs: -L$CMF_LIB_DIR -lcmf
Cflags: -I$CMF_INCLUDE_DIR
PC
export PKG_CONFIG_PATH="$work/pkgconfig" GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local
export GOCACHE="$work/cache" GOPATH="$work/gopath" CGO_ENABLED=1
export LD_LIBRARY_PATH="$CMF_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$src/sdk/bindings/go"
"$go" version
unformatted="$("$("$go" env GOROOT)/bin/gofmt" -l .)"
[ -z "$unformatted" ] || { echo "not gofmt-formatted: $unformatted"; exit 1; }
"$go" vet ./...
if [ -n "$SANITIZER_PRELOAD" ]; then
  "$go" test -count=1 -v -exec "env LD_PRELOAD=$SANITIZER_PRELOAD" .
else
  "$go" test -count=1 -v .
fi
"$go" build -o "$work/generate" ./examples/generate
"$go" build -o "$work/inspect" ./examples/inspect
want="$(/usr/bin/python3 -c 'import json,sys; c=[c for c in json.load(open(sys.argv[1]))["cases"] if c["name"]=="raw"][0]; print(c["prompt"]); print(c["max_new_tokens"]); print(c["text"])' "$CMF_TEST_EXPECTED")"
prompt="$(sed -n 1p <<<"$want")"; n="$(sed -n 2p <<<"$want")"; text="$(sed -n 3p <<<"$want")"
got="$(with_sanitizers "$work/generate" -raw -n "$n" "$CMF_TEST_MODEL" "$prompt")"
[ "$got" = "$text" ] || { echo "examples/generate: got '$got', want '$text'"; exit 1; }
with_sanitizers "$work/inspect" -tensor model.norm.weight "$CMF_TEST_MODEL" | grep -q '^verify: ok$' || { echo "examples/inspect failed"; exit 1; }
echo "examples: generate reproduces the reference text, inspect verifies"
