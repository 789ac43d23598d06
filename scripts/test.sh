#!/usr/bin/env bash
# Set up, build and run the whole test suite twice: a -Werror release build
# (./build) and an ASan+UBSan build (./build-asan); then run every fuzz
# target briefly (./build-fuzz: clang, ASan+UBSan, libFuzzer; only the fuzz
# targets and the plugins they load are compiled; skipped if clang++ is
# missing; docs/reliability.md). Exit status is non-zero if anything fails.
# Test logs: build*/meson-logs/testlog.json. The files a build's tests write
# (converted models, skills, defrag outputs: about 0.6 GB a build) are removed
# once all of that build's tests pass, and kept for a look when one fails.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh --tests || exit 1

# The work directories the tests of build $1 write into.
prune_test_work() {
  find "$1/tests" -mindepth 2 -maxdepth 2 -type d \( -name work -o -name '*-work' -o -name hf_files \) \
    -exec rm -rf {} +
}

status=0
if meson test -C build --print-errorlogs --num-processes 2; then prune_test_work build; else status=1; fi

if [ ! -f build-asan/build.ninja ]; then
  # Line tables only (-g1): sanitizer reports keep file:line, and the objects
  # are half the size (a small CI disk).
  meson setup build-asan -Dbuildtype=debugoptimized -Dwerror=true -Dbenches=false -Dc_args=-g1 -Dcpp_args=-g1 \
    -Db_sanitize=address,undefined -Db_lundef=false >/dev/null || exit 1
fi
meson compile -C build-asan || exit 1
if meson test -C build-asan --print-errorlogs --num-processes 2 --timeout-multiplier 3; then
  prune_test_work build-asan
else
  status=1
fi

if command -v clang++ >/dev/null 2>&1; then
  if [ ! -f build-fuzz/build.ninja ]; then  # -O0, line tables only: compiling is most of this step's time
    CC=clang CXX=clang++ LDFLAGS=-shared-libasan meson setup build-fuzz -Dbuildtype=plain -Doptimization=0 \
      -Dc_args=-gline-tables-only -Dcpp_args=-gline-tables-only -Dbenches=false \
      -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false >/dev/null || exit 1
  fi
  meson compile -C build-fuzz fuzz_open fuzz_tokenizer fuzz_chat fuzz_convert fuzz_sections fuzz_codecs fuzz_gguf fuzz_pipeline \
    cmf-test-container-codecs cmf-codecs cmf-arch-qwen cmf-arch-gemma tiny_models || exit 1
  meson test -C build-fuzz --no-rebuild --suite fuzz --print-errorlogs || status=1
else
  echo "test.sh: clang++ not found, fuzz run skipped (scripts/setup.sh --tests installs clang)" >&2
  rm -f build-fuzz/meson-logs/testlog.json  # not counted from an older run
fi
exit $status
