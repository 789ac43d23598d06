#!/usr/bin/env bash
# Where each dtype's decode matmul stands against a plain stream that carries
# the same amount of arithmetic per byte, measured in the same minutes:
#   1. bench_qwen --overlap: streams with K vpdpbusd per 64-byte line (K = 0
#      to 32), each K's rate in L2 on both cores (its ceiling) and streamed
#      from memory in loops of LOOP_KIB (a decode matmul's size), as a share
#      of the wall read passes just around it: the share any code with that
#      ceiling keeps on this machine;
#   2. per dtype: its row kernel on one core with the weights in L2
#      (--gemm 1024x1024 --pp 1 --threads 1; 256 rows for f16 and bf16, 512
#      for q8), times two = its ceiling; its
#      one-token matmul streamed from memory (--gemm ROWSxCOLS --pp 1, 200
#      copies in rotation in 2 MiB pages, --read-around) as a share of the
#      reads around each rep;
#   3. per dtype, the share the synthetic streams reach at the dtype's
#      ceiling (interpolated between the two K around it), beside its own.
# A dtype below the synthetic share at its ceiling loses something of its
# own to the memory (its access pattern, its rows' ends); at it, what its
# arithmetic per byte allows.
# usage: [DTYPES="q4 q4tp q4_tiled q8_row f16"] [LOOP_KIB=1728] [SHAPE=3072x1024] [ROUNDS=3]
#        bench/stream_overlap.sh [BUILD_DIR=build-rel]
# Needs AVX-512 VNNI (the synthetic work). Takes ~2 minutes for five dtypes
# on the 2-core machine. Run it on an idle machine.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build-rel}" && pwd)"
dtypes="${DTYPES:-q4 q4tp q4_tiled q8_row f16}"
loop="${LOOP_KIB:-1728}"
shape="${SHAPE:-3072x1024}"
bq="$build/bench/bench_qwen"
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
synth="$(mktemp)"
trap 'rm -f "$synth"' EXIT
"$bq" --overlap "${ROUNDS:-3}" --overlap-loop-kib "$loop" | tail -n +2 | tee "$synth"
for q in $dtypes; do
  # A matrix of at most ~0.6 MB, so that it stays in a 1 MiB L2.
  case "$q" in f16|bf16) l2shape=256x1024 ;; q8|q8_row) l2shape=512x1024 ;; *) l2shape=1024x1024 ;; esac
  l2=$("$bq" --gemm "$l2shape" --dtype "$q" --pp 1 --threads 1 --reps 3000 | grep 'weight bytes' | sed 's/.*median \([0-9.]*\) GB\/s wall.*/\1/')
  out=$("$bq" --gemm "$shape" --dtype "$q" --pp 1 --threads 2 --reps 5 --matrices 200 --read-around)
  streamed=$(grep 'weight bytes' <<<"$out" | sed 's/.*median \([0-9.]*\) GB\/s wall.*/\1/')
  share=$(grep 'share of the reads' <<<"$out" | sed 's/.*median \([0-9]*\) % (\([0-9-]*\)).*/\1 % (\2)/')
  reads=$(grep 'read passes around' <<<"$out" | sed 's/.*around the reps \([0-9.-]*\) GB\/s.*/\1/')
  ceiling=$(echo "2 * $l2" | bc -l)
  # The synthetic share at this ceiling: between the two K whose ceilings
  # bracket it (their rows: ops, ops/B, ceiling, streamed, share %, ...).
  at=$(awk -v c="$ceiling" '$1 ~ /^[0-9]+$/ { n++; cl[n] = $3; sh[n] = $5 }
    END { for (i = 1; i < n; i++) if (cl[i] >= c && cl[i + 1] <= c) {
            f = (cl[i] - c) / (cl[i] - cl[i + 1]); printf "%.0f %%", sh[i] + f * (sh[i + 1] - sh[i]); exit }
          print "beyond the sweep" }' "$synth")
  printf '%-9s kernel in L2, one core %6.1f GB/s (ceiling on 2: %6.1f); %s streamed %6.1f GB/s = %s of the read (reads %s); the synthetic at that ceiling: %s\n' \
    "$q" "$l2" "$ceiling" "$shape" "$streamed" "$share" "$reads" "$at"
done
