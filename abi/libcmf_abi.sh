#!/usr/bin/env bash
# libcmf's ABI against the committed baseline (abi/libcmf.abi), with
# libabigail (Debian package abigail-tools):
#
#   abi/libcmf_abi.sh check  LIBCMF.so   compare a build with the baseline (the test suite runs this)
#   abi/libcmf_abi.sh update LIBCMF.so   rewrite the baseline from a build
#
# The ABI is what cmf.h exports: every cmf_* function's signature and the
# layout of every type they reach (opaque handles stay opaque). libcmf's
# entry points are compiled with debug info for this (core/meson.build).
#
# check fails on any difference: a change that breaks callers (a function
# removed, a signature or a public struct changed) or an addition that the
# baseline does not record yet. Additions are recorded with `update`.
# `update` refuses a breaking change unless the soname changed too: a
# deliberate break bumps `soversion` in core/meson.build (and
# CMF_ABI_VERSION in cmf.h) in the same commit (docs/c-api.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
baseline="$here/libcmf.abi"
mode="${1:-}" lib="${2:-}"
case "$mode" in check|update) ;; *) sed -n '2,18p' "$0"; exit 2 ;; esac
[ -f "$lib" ] || { echo "no such library: $lib" >&2; exit 2; }
for tool in abidw abidiff; do
  command -v "$tool" >/dev/null || { echo "skipped: $tool is not installed (apt-get install abigail-tools)"; exit 77; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The exported interfaces only, types reduced to those cmf.h defines.
abidw --headers-dir "$here/cmf" --drop-private-types --exported-interfaces-only \
  --no-show-locs --no-comp-dir-path --no-corpus-path "$lib" > "$work/current.abi"
if ! grep -q "<function-decl name='cmf_abi_version'" "$work/current.abi"; then
  echo "$lib carries no debug info for its entry points: cannot describe its ABI" >&2
  exit 1
fi
soname() { sed -n "1s/.* soname='\([^']*\)'.*/\1/p" "$1"; }

# abidiff's exit status is a bit mask: 1 error, 2 usage, 4 ABI change, 8 incompatible change.
diff_status=0
if [ -f "$baseline" ]; then
  abidiff --no-show-locs "$baseline" "$work/current.abi" > "$work/report" || diff_status=$?
  if [ $((diff_status & 3)) -ne 0 ]; then cat "$work/report"; echo "abidiff failed" >&2; exit 1; fi
fi
# Only additions: every "changes summary" line counts 0 Removed and 0 Changed.
only_additions() {
  ! grep -E 'changes summary:' "$work/report" | grep -oE '[0-9]+ (Removed|Changed)' | grep -qv '^0 '
}

if [ "$mode" = check ]; then
  [ -f "$baseline" ] || { echo "no baseline at $baseline: run abi/libcmf_abi.sh update $lib" >&2; exit 1; }
  if [ "$(soname "$baseline")" != "$(soname "$work/current.abi")" ]; then
    echo "soname $(soname "$work/current.abi") but the baseline is for $(soname "$baseline"): run abi/libcmf_abi.sh update $lib"
    exit 1
  fi
  if [ "$diff_status" -eq 0 ]; then
    echo "libcmf ABI ($(soname "$baseline")): identical to abi/libcmf.abi"
    exit 0
  fi
  cat "$work/report"
  if only_additions; then
    echo "libcmf's ABI grew (compatible): record the additions with abi/libcmf_abi.sh update $lib"
  else
    echo "INCOMPATIBLE change to libcmf's ABI (above): a shipped signature or public struct changed or went away."
    echo "Append instead (new function names, new members at the end of a struct). A deliberate break bumps"
    echo "soversion in core/meson.build and CMF_ABI_VERSION in cmf.h, then runs abi/libcmf_abi.sh update."
  fi
  exit 1
fi

# update
if [ -f "$baseline" ] && [ "$diff_status" -ne 0 ] && ! only_additions &&
   [ "$(soname "$baseline")" = "$(soname "$work/current.abi")" ]; then
  cat "$work/report"
  echo "refusing to record an incompatible change under the same soname $(soname "$baseline"):" >&2
  echo "bump soversion in core/meson.build (and CMF_ABI_VERSION in cmf.h) first" >&2
  exit 1
fi
[ -f "$baseline" ] && [ "$diff_status" -ne 0 ] && cat "$work/report"
cp "$work/current.abi" "$baseline"
echo "wrote $baseline ($(soname "$baseline"))"
