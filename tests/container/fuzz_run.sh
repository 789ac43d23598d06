#!/bin/sh
# A short, bounded fuzzing run over open + iterate + verify.
# usage: tests/container/fuzz_run.sh BUILD_DIR [SECONDS]
# BUILD_DIR must be configured with clang and -Dfuzz=true, e.g.
#   CC=clang CXX=clang++ LDFLAGS=-shared-libasan meson setup build-fuzz -Dfuzz=true \
#     -Db_sanitize=address,undefined -Db_lundef=false
# Add CXXFLAGS=-fsanitize=fuzzer-no-link for coverage feedback from libcmf itself
# (without it only the harness is coverage-instrumented; the library is still
# checked by ASan/UBSan on every input).
# (-shared-libasan: the plugins link with --no-undefined, which clang's static
# ASan runtime cannot satisfy in a shared module.)
set -eu
asan_dir=$(dirname "$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)")
build=$1
secs=${2:-60}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$src"/fuzz_corpus/* "$work"/
LD_PRELOAD="$asan_dir/libclang_rt.asan-x86_64.so" CMF_PLUGIN_PATH="$build/plugins/codecs" CMF_FUZZ_PLUGIN="$build/tests/container/cmf-test-container-codecs.so" \
  "$build/tests/container/fuzz_open" -max_total_time="$secs" -max_len=65536 -timeout=10 "$work"
