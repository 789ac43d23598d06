#!/usr/bin/env bash
# The model benchmark on real files, end to end, in one run:
#   1. a BF16 checkpoint of the shape SHAPE with random weights, written once
#      by convert_bench --checkpoint-only: 0.6b = Qwen3-0.6B (1.19 GB),
#      gemma3-1b = Gemma3-1B (2.0 GB; sliding-window layers);
#   2. `cmfhost convert` to each dtype, with wall time and peak RSS
#      (/usr/bin/time -v), i.e. convert throughput in MB/s of source;
#   3. the memory read bandwidth of this machine on the same thread count
#      (bench_qwen --bandwidth-only);
#   4. `cmfhost bench` on each file: pp512 (REPS reps), RSS after
#      open+bind, peak RSS; then ROUNDS rounds of (read bandwidth, one tg128
#      in a process of its own) and a last read: each tg128 is set against
#      the mean of the reads just before and just after it, and the median
#      of those shares is decode's share of the read bandwidth. The
#      bandwidth of this shared VM drifts by 20 % over minutes, so a tg run
#      compared with a read a minute away said 82 % in one run and 88 % in
#      the next (2026-12-01, before 6b62301).
# usage: [DTYPES="f16 q8 q4tp q4"] [PP=512] [TG=128] [REPS=3] [ROUNDS=5] [THREADS=2] bench/qwen06b.sh [BUILD_DIR=build-rel] [WORK_DIR=/tmp/cmf-qwen06b]
# Takes 3-5 minutes on the 2-core machine once the checkpoint exists (2026-12-01). Run it on an idle machine.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build-rel}" && pwd)"
shape="${SHAPE:-0.6b}"
case "$shape" in
  0.6b) name=qwen06b ;;
  gemma3-1b) name=gemma3-1b ;;
  *) echo "SHAPE must be 0.6b or gemma3-1b, not $shape" >&2; exit 2 ;;
esac
work="${2:-/tmp/cmf-$name}"
dtypes="${DTYPES:-f16 q8 q4tp q4}"
threads="${THREADS:-2}"
export CMF_PLUGIN_PATH="$build/plugins/codecs:$build/plugins/archs/qwen:$build/plugins/archs:$build/plugins/backends/cpu"
mkdir -p "$work"
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/bench/convert_bench" --shape "$shape" --dir "$work/hf" --checkpoint-only 1
src_bytes=$(stat -c %s "$work/hf/model.safetensors")
"$build/bench/bench_qwen" --threads "$threads" --bandwidth-only | grep bandwidth
# The median prefetching read pass of this machine now, in GB/s; the median
# and the "lo-hi" range of a list of numbers.
read_pass() {
  "$build/bench/bench_qwen" --threads "$threads" --bandwidth-only | grep 'median pass' | sed 's/.*median pass \([0-9.]*\).*/\1/'
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
minmax() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.1f-%.1f", lo, hi }'; }
for q in $dtypes; do
  out="$work/$name-$q.cmf"
  log="$work/convert-$q.log"
  rm -f "$out"
  /usr/bin/time -v "$build/host/cmfhost" convert --model "$work/hf" --output "$out" --quant "$q" --threads "$threads" \
    >"$log" 2>&1
  wall=$(grep 'Elapsed (wall' "$log" | awk '{print $NF}' | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
  rss=$(grep 'Maximum resident' "$log" | awk '{print $NF}')
  printf 'convert %-5s %6.1f s  %6.1f MB/s of source  peak RSS %6.0f MiB  -> %s (%d MB)\n' "$q" "$wall" \
    "$(echo "$src_bytes / $wall / 1000000" | bc -l)" "$(echo "$rss / 1024" | bc -l)" "$(basename "$out")" \
    "$(( $(stat -c %s "$out") / 1000000 ))"
  "$build/host/cmfhost" bench "$out" -p "${PP:-512}" -n 0 -r "${REPS:-3}" --threads "$threads" \
    | tee "$work/bench-$q.txt" | sed "s/^/  $q: /"
  [ "${TG:-128}" -gt 0 ] || continue
  # Decode against the read bandwidth around it: read, tg, read, tg, ...,
  # read. Each tg runs in a fresh process (warmed up by cmfhost bench).
  bws=() tgs=() tgbws=()
  bws+=("$(read_pass)")
  for ((i = 0; i < ${ROUNDS:-5}; i++)); do
    "$build/host/cmfhost" bench "$out" -p 0 -n "${TG:-128}" -r 1 --threads "$threads" >"$work/bench-$q-tg$i.txt"
    tgs+=("$(grep "^tg${TG:-128} " "$work/bench-$q-tg$i.txt" | awk '{print $2}')")
    tgbws+=("$(grep 'tg streams' "$work/bench-$q-tg$i.txt" | awk '{print $3}')")
    bws+=("$(read_pass)")
  done
  shares=()
  for ((i = 0; i < ${#tgs[@]}; i++)); do
    shares+=("$(echo "200 * ${tgbws[$i]} / (${bws[$i]} + ${bws[$((i + 1))]})" | bc -l)")
  done
  printf '  %s: tg%s %.2f tok/s (median of %d rounds, %s); decode reads %.2f GB/s\n' "$q" "${TG:-128}" \
    "$(median "${tgs[@]}")" "${#tgs[@]}" "$(minmax "${tgs[@]}")" "$(median "${tgbws[@]}")"
  printf '  %s: read pass around the rounds %s GB/s; decode = %.0f %% of the read around it (median of rounds; %s %%)\n' \
    "$q" "$(minmax "${bws[@]}")" "$(median "${shares[@]}")" "$(minmax "${shares[@]}")"
  grep -E 'RSS' "$work/bench-$q-tg0.txt" | sed "s/^/  $q (tg): /"
done
