#!/bin/sh
# A short, bounded fuzzing run over open + iterate + verify; registered as
# `meson test --suite fuzz` in a -Dfuzz=true build (scripts/test.sh runs it
# in CI from ./build-fuzz).
# usage: tests/container/fuzz_run.sh BUILD_DIR [SECONDS [TARGET CORPUS_DIR]]
# TARGET (relative to BUILD_DIR) defaults to tests/container/fuzz_open,
# CORPUS_DIR to tests/container/fuzz_corpus (the GGUF reader's target,
# tests/gguf/fuzz_gguf, runs through here with its own corpus).
# BUILD_DIR must be configured with clang and -Dfuzz=true, as scripts/test.sh does:
#   CC=clang CXX=clang++ LDFLAGS=-shared-libasan meson setup build-fuzz -Dbuildtype=debug \
#     -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false
# (-Dfuzz=true also compiles all code with -fsanitize=fuzzer-no-link, so
# coverage of libcmf and the codecs steers the fuzzer, not only the harness's.)
# (-shared-libasan: the plugins link with --no-undefined, which clang's static
# ASan runtime cannot satisfy in a shared module; so the run preloads the
# shared runtime.)
#
# Starts from a copy of the corpus dir (the repo is never
# written). Exit status 0: nothing found in SECONDS. 1: libFuzzer found a
# crash, sanitizer report, leak, timeout or OOM (its own status is logged; it
# is not passed on because libFuzzer's 77 for a crash means "skipped" to
# meson). The input that triggered it is kept as
# BUILD_DIR/meson-logs/fuzz-{crash,leak,timeout,oom}-* and named at the end of
# the log with the command that replays it.
set -u
build=$(cd "$1" && pwd)
secs=${2:-60}
src=$(cd "$(dirname "$0")" && pwd)
target="$build/${3:-tests/container/fuzz_open}"
corpus=${4:-$src/fuzz_corpus}
asan_rt=${CMF_FUZZ_ASAN_RT:-$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)}
if [ ! -f "$asan_rt" ]; then
  echo "fuzz_run: clang's shared ASan runtime not found ($asan_rt); Debian: apt install libclang-rt-14-dev" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp "$corpus"/* "$work/corpus/"
seeds=$(ls "$work/corpus" | wc -l)
artifacts="$build/meson-logs/fuzz-"
mkdir -p "$build/meson-logs"
touch "$work/start"

run() {
  TMPDIR="$work" LD_PRELOAD="$asan_rt" CMF_PLUGIN_PATH="$build/plugins/codecs" \
  CMF_FUZZ_PLUGIN="$build/tests/container/cmf-test-container-codecs.so" \
    "$target" "$@"
}
run -max_total_time="$secs" -max_len=65536 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$artifacts" "$work/corpus"
rc=$?
echo "fuzz_run: corpus $seeds seed inputs -> $(ls "$work/corpus" | wc -l)" >&2
if [ "$rc" -ne 0 ]; then
  echo "fuzz_run: FAILED, libFuzzer exit status $rc" >&2
  for f in $(find "$build/meson-logs" -maxdepth 1 -name 'fuzz-*' -newer "$work/start"); do
    echo "fuzz_run: reproducer $f" >&2
    echo "fuzz_run: replay: LD_PRELOAD=$asan_rt CMF_PLUGIN_PATH=$build/plugins/codecs CMF_FUZZ_PLUGIN=$build/tests/container/cmf-test-container-codecs.so $target $f" >&2
  done
fi
[ "$rc" -eq 0 ] || exit 1
