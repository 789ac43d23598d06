#!/usr/bin/env bash
# Set up, build and run the whole test suite twice: a -Werror release build
# (./build) and an ASan+UBSan build (./build-asan). Exit status is non-zero
# if anything fails. Test logs: build*/meson-logs/testlog.json.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh --tests || exit 1

status=0
meson test -C build --print-errorlogs --num-processes 2 || status=1

if [ ! -f build-asan/build.ninja ]; then
  meson setup build-asan -Dbuildtype=debugoptimized -Dwerror=true \
    -Db_sanitize=address,undefined -Db_lundef=false >/dev/null || exit 1
fi
meson compile -C build-asan || exit 1
meson test -C build-asan --print-errorlogs --num-processes 2 --timeout-multiplier 3 || status=1
exit $status
