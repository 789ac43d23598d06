#!/usr/bin/env bash
# Decode's share of the memory read bandwidth for several dtypes measured in
# the same minutes: ROUNDS rounds, each going through every dtype in DTYPES
# with a read pass (bench_qwen --bandwidth-only, its median pass) before and
# after each tg run, so every tg128 is set against the reads just around it
# and every dtype sees the machine of every round. bench/model_bench.sh
# measures one dtype's rounds after another's: on this VM the read moves by
# 20-40 % within minutes, and two dtypes measured five minutes apart could
# not be told apart by their shares.
# Prints, per round, each dtype's decode GB/s (tok/s x weight bytes) and
# share, then per dtype the median share and its range over the rounds,
# and the median of each dtype's GB/s over q4's in the same round (the
# ratio of two runs a few seconds apart, the steadiest figure here).
# A dtype written D+copy runs D's file with --decode-copy (every decode
# copy, whatever the budget), D+nocopy with --no-decode-copy (the file's
# bytes as they are; docs/runtime.md, "Decode copies"), so the forms share
# every round.
# Needs the .cmf files bench/qwen06b.sh writes (run it once first).
# usage: [DTYPES="q4 q4+nocopy q4tp q4t vbit q2tp q8 f16"] [ROUNDS=5] [TG=128] [THREADS=2] [NAME=qwen06b]
#        bench/decode_shares.sh [BUILD_DIR=build-rel] [WORK_DIR=/tmp/cmf-qwen06b]
# Takes ~4 s per dtype and round (0.6B shape, 2-core machine). Run it on an idle machine.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build-rel}" && pwd)"
name="${NAME:-qwen06b}"
work="${2:-/tmp/cmf-$name}"
dtypes="${DTYPES:-q4 q4tp q4t vbit q2tp q8 f16}"
threads="${THREADS:-2}"
tg="${TG:-128}"
rounds="${ROUNDS:-5}"
export CMF_PLUGIN_PATH="$build/plugins/codecs:$build/plugins/archs/qwen:$build/plugins/archs:$build/plugins/backends/cpu"
# D+copy, D+nocopy: D's file, run with --decode-copy / --no-decode-copy.
file_of() { local d="${1%+copy}"; echo "$work/$name-${d%+nocopy}.cmf"; }
flags_of() { case "$1" in *+copy) echo --decode-copy ;; *+nocopy) echo --no-decode-copy ;; esac; }
for q in $dtypes; do
  [ -f "$(file_of "$q")" ] || { echo "decode_shares: no $(file_of "$q") (run bench/qwen06b.sh with DTYPES including $(basename "$(file_of "$q")" .cmf | sed "s/^$name-//") first)" >&2; exit 2; }
done
read_pass() {
  "$build/bench/bench_qwen" --threads "$threads" --bandwidth-only | grep 'median pass' | sed 's/.*median pass \([0-9.]*\).*/\1/'
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
minmax() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.2f-%.2f", lo, hi }'; }
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
declare -A shares gbs gbs_ratio
reads=()
for ((i = 0; i < rounds; i++)); do
  before="$(read_pass)"
  reads+=("$before")
  line="round $i:"
  declare -A round_gbs=()
  for q in $dtypes; do
    out="$work/bench-shares-$q.txt"
    # shellcheck disable=SC2046
    "$build/host/cmfhost" bench "$(file_of "$q")" $(flags_of "$q") -p 0 -n "$tg" -r 1 --threads "$threads" >"$out"
    g="$(grep 'tg streams' "$out" | awk '{print $3}')"
    after="$(read_pass)"
    reads+=("$after")
    s="$(echo "200 * $g / ($before + $after)" | bc -l)"
    shares[$q]+="$s "
    gbs[$q]+="$g "
    round_gbs[$q]="$g"
    line+="$(printf '  %s %.1f GB/s %.0f %%' "$q" "$g" "$s")"
    before="$after"
  done
  echo "$line"
  if [ -n "${round_gbs[q4]:-}" ]; then
    for q in $dtypes; do gbs_ratio[$q]+="$(echo "${round_gbs[$q]} / ${round_gbs[q4]}" | bc -l) "; done
  fi
done
for q in $dtypes; do
  # shellcheck disable=SC2086
  printf '%-8s decode %s GB/s (median %.1f); share of the read around it: median %.0f %%, rounds %s %%' "$q" \
    "$(minmax ${gbs[$q]})" "$(median ${gbs[$q]})" "$(median ${shares[$q]})" "$(minmax ${shares[$q]})"
  # shellcheck disable=SC2086
  [ -z "${gbs_ratio[$q]:-}" ] || printf '; GB/s over q4 in the same round: median %.2f (%s)' "$(median ${gbs_ratio[$q]})" "$(minmax ${gbs_ratio[$q]})"
  echo
done
echo "read passes $(minmax "${reads[@]}") GB/s"
echo "# done $(date -u +%FT%TZ)"
