#!/bin/sh
# A short, bounded fuzzing run over open + iterate + verify; registered as
# `meson test --suite fuzz` in a -Dfuzz=true build (scripts/test.sh runs it
# in CI from ./build-fuzz).
# usage: tests/container/fuzz_run.sh BUILD_DIR [SECONDS]
# BUILD_DIR must be configured with clang and -Dfuzz=true, e.g.
#   CC=clang CXX=clang++ LDFLAGS=-shared-libasan meson setup build-fuzz -Dfuzz=true \
#     -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false \
#     -Dc_args=-fsanitize=fuzzer-no-link -Dcpp_args=-fsanitize=fuzzer-no-link
# (the *_args give coverage feedback from libcmf and the codecs too; without
# them only the harness is coverage-instrumented, the library is still
# checked by ASan/UBSan on every input).
# (-shared-libasan: the plugins link with --no-undefined, which clang's static
# ASan runtime cannot satisfy in a shared module; so the run preloads the
# shared runtime.)
#
# Starts from a copy of tests/container/fuzz_corpus/ (the repo is never
# written). Exit status 0: nothing found in SECONDS. Otherwise libFuzzer's
# status (crash, sanitizer report, leak, timeout, OOM), and the input that
# triggered it is kept as BUILD_DIR/meson-logs/fuzz-{crash,leak,timeout,oom}-*
# and named at the end of the log with the command that replays it.
set -u
build=$(cd "$1" && pwd)
secs=${2:-60}
src=$(cd "$(dirname "$0")" && pwd)
asan_rt=${CMF_FUZZ_ASAN_RT:-$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)}
if [ ! -f "$asan_rt" ]; then
  echo "fuzz_run: clang's shared ASan runtime not found ($asan_rt); Debian: apt install libclang-rt-14-dev" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp "$src"/fuzz_corpus/* "$work/corpus/"
seeds=$(ls "$work/corpus" | wc -l)
artifacts="$build/meson-logs/fuzz-"
mkdir -p "$build/meson-logs"
touch "$work/start"

run() {
  TMPDIR="$work" LD_PRELOAD="$asan_rt" CMF_PLUGIN_PATH="$build/plugins/codecs" \
  CMF_FUZZ_PLUGIN="$build/tests/container/cmf-test-container-codecs.so" \
    "$build/tests/container/fuzz_open" "$@"
}
run -max_total_time="$secs" -max_len=65536 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$artifacts" "$work/corpus"
rc=$?
echo "fuzz_run: corpus $seeds seed inputs -> $(ls "$work/corpus" | wc -l) after ${secs} s"
if [ "$rc" -ne 0 ]; then
  echo "fuzz_run: FAILED, libFuzzer exit status $rc"
  for f in $(find "$build/meson-logs" -maxdepth 1 -name 'fuzz-*' -newer "$work/start"); do
    echo "fuzz_run: reproducer $f"
    echo "fuzz_run: replay: LD_PRELOAD=$asan_rt CMF_PLUGIN_PATH=$build/plugins/codecs CMF_FUZZ_PLUGIN=$build/tests/container/cmf-test-container-codecs.so $build/tests/container/fuzz_open $f"
  done
fi
exit "$rc"
