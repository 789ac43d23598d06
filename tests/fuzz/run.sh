#!/bin/sh
# One bounded run of one fuzz target; registered as `meson test --suite fuzz`
# in a -Dfuzz=true build (scripts/test.sh runs the suite in CI from
# ./build-fuzz; scripts/fuzz_campaign.sh runs long campaigns with it).
# usage: tests/fuzz/run.sh BUILD_DIR TARGET SECONDS [libFuzzer options...]
#   TARGET: open, tokenizer, chat, convert, sections, codecs, gguf or pipeline (fuzz_TARGET)
# BUILD_DIR must be configured with clang and -Dfuzz=true, as scripts/test.sh does:
#   CC=clang CXX=clang++ LDFLAGS=-shared-libasan meson setup build-fuzz -Dbuildtype=plain \
#     -Doptimization=0 -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false
# (-Dfuzz=true also compiles all code with -fsanitize=fuzzer-no-link, so
# coverage of libcmf and the plugins steers the fuzzer, not only the
# harness's. -shared-libasan: the plugins link with --no-undefined, which
# clang's static ASan runtime cannot satisfy in a shared module; so the run
# preloads the shared runtime.)
#
# The corpus starts from the target's seeds (tests/fuzz/make_seeds.py, or
# tests/fuzz/seeds/{open,gguf,pipeline}, or the codecs target's own) and its
# regression inputs (tests/fuzz/regressions/TARGET) in a scratch directory,
# or lives in $CMF_FUZZ_CORPUS when set (seeded when empty; the campaign
# keeps it between runs). The repo is never written. Limits per input:
# 10 s (-timeout), 2 GB RSS and no single allocation over 2 GB.
# Exit status 0: nothing found. 1: libFuzzer found a crash, sanitizer
# report, leak, timeout or OOM (its own status is logged; it is not passed
# on because libFuzzer's 77 for a crash means "skipped" to meson). The input
# is kept as BUILD_DIR/meson-logs/fuzz-TARGET-{crash,leak,timeout,oom}-* and
# named at the end of the log with the command that replays it.
set -u
build=$(cd "$1" && pwd)
target=$2
secs=$3
shift 3
src=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$src/../.." && pwd)
bin="$build/tests/fuzz/fuzz_$target"
[ -x "$bin" ] || { echo "run.sh: $bin not built" >&2; exit 1; }
asan_rt=${CMF_FUZZ_ASAN_RT:-$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)}
if [ ! -f "$asan_rt" ]; then
  echo "run.sh: clang's shared ASan runtime not found ($asan_rt); Debian: apt install libclang-rt-14-dev" >&2
  exit 1
fi
# In memory where the system has a tmpfs: fuzz_open writes every input to a
# file there, and on a disk filesystem each rewrite costs a writeback
# (perf: a fifth of fuzz_open's time in ext4's release of the file).
if [ -d /dev/shm ] && [ -w /dev/shm ]; then work=$(mktemp -d -p /dev/shm); else work=$(mktemp -d); fi
trap 'rm -rf "$work"' EXIT
export TMPDIR="$work"  # fuzz_open writes its input there
export CMF_PLUGIN_PATH="$build/plugins/codecs:$build/plugins/archs/qwen:$build/plugins/archs"
export CMF_FUZZ_PLUGIN="$build/tests/container/cmf-test-container-codecs.so"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

corpus=${CMF_FUZZ_CORPUS:-$work/corpus}
mkdir -p "$corpus"
if [ -z "$(ls -A "$corpus")" ]; then
  case "$target" in
    open|gguf|pipeline) cp "$src/seeds/$target"/* "$corpus/" ;;
    codecs) LD_PRELOAD="$asan_rt" CMF_FUZZ_WRITE_SEEDS="$corpus" \
              CMF_FUZZ_FIXTURES="$root/tests/fixtures/upstream/sample.f32dir" "$bin" || exit 1 ;;
    *) /usr/bin/python3 "$src/make_seeds.py" "$root" "$work/seeds" "$target" "$build/tests/convert/tiny_models" || exit 1
       cp "$work/seeds/$target"/* "$corpus/" ;;
  esac
fi
# Inputs that once found a bug (tests/fuzz/regressions/TARGET) run first in
# every run, the long campaign's too.
if [ -d "$src/regressions/$target" ]; then cp "$src/regressions/$target"/* "$corpus/"; fi
seeds=$(ls "$corpus" | wc -l)
case "$target" in
  chat) max_len=16384 ;;
  *) max_len=65536 ;;
esac
artifacts="$build/meson-logs/fuzz-$target-"
mkdir -p "$build/meson-logs"
touch "$work/start"

# Only the fuzzer gets the ASan runtime preloaded (not python or the shell).
LD_PRELOAD="$asan_rt" "$bin" -max_total_time="$secs" -max_len=$max_len -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$artifacts" "$@" "$corpus"
rc=$?
echo "run.sh: $target: corpus $seeds inputs -> $(ls "$corpus" | wc -l)" >&2
if [ "$rc" -ne 0 ]; then
  echo "run.sh: $target: FAILED, libFuzzer exit status $rc" >&2
  for f in $(find "$build/meson-logs" -maxdepth 1 -name "fuzz-$target-*" -newer "$work/start"); do
    echo "run.sh: reproducer $f" >&2
    echo "run.sh: replay: LD_PRELOAD=$asan_rt CMF_PLUGIN_PATH=$CMF_PLUGIN_PATH CMF_FUZZ_PLUGIN=$CMF_FUZZ_PLUGIN $bin $f" >&2
  done
fi
[ "$rc" -eq 0 ] || exit 1
