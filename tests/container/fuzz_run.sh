#!/bin/sh
# A short, bounded fuzzing run over open + iterate + verify.
# usage: tests/container/fuzz_run.sh BUILD_DIR [SECONDS]
# BUILD_DIR must be configured with clang and -Dfuzz=true, e.g.
#   CC=clang CXX=clang++ meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false
set -eu
build=$1
secs=${2:-60}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$src"/fuzz_corpus/* "$work"/
CMF_PLUGIN_PATH="$build/plugins/codecs" CMF_FUZZ_PLUGIN="$build/tests/container/cmf-test-container-codecs.so" \
  "$build/tests/container/fuzz_open" -max_total_time="$secs" -max_len=65536 -timeout=10 "$work"
