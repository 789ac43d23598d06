#!/usr/bin/env bash
# The issue-6/7 benchmark on real files, end to end, in one run:
#   1. a Qwen3-0.6B-shaped BF16 checkpoint with random weights (1.19 GB,
#      written once by convert_bench --checkpoint-only);
#   2. `cmfhost convert` to each dtype, with wall time and peak RSS
#      (/usr/bin/time -v), i.e. convert throughput in MB/s of source;
#   3. the memory read bandwidth of this machine on the same thread count
#      (bench_qwen --bandwidth-only);
#   4. `cmfhost bench` (pp512, tg128, 3 reps) on each file: tok/s, weight
#      GB/s in decode, RSS after open+bind, peak RSS; then the read
#      bandwidth again, and decode's share of it.
# usage: [DTYPES="f16 q8 q4tp q4"] [PP=512] [TG=128] [REPS=3] [THREADS=2] bench/qwen06b.sh [BUILD_DIR=build-rel] [WORK_DIR=/tmp/cmf-qwen06b]
# Takes ~10 minutes on the 2-core machine. Run it on an idle machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build-rel}" && pwd)"
work="${2:-/tmp/cmf-qwen06b}"
dtypes="${DTYPES:-f16 q8 q4tp q4}"
threads="${THREADS:-2}"
export CMF_PLUGIN_PATH="$build/plugins/codecs:$build/plugins/archs/qwen:$build/plugins/archs:$build/plugins/backends/cpu"
mkdir -p "$work"
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/bench/convert_bench" --shape 0.6b --dir "$work/hf" --checkpoint-only 1
src_bytes=$(stat -c %s "$work/hf/model.safetensors")
"$build/bench/bench_qwen" --threads "$threads" --bandwidth-only | grep bandwidth
for q in $dtypes; do
  out="$work/qwen06b-$q.cmf"
  log="$work/convert-$q.log"
  rm -f "$out"
  /usr/bin/time -v "$build/host/cmfhost" convert --model "$work/hf" --output "$out" --quant "$q" --threads "$threads" \
    >"$log" 2>&1
  wall=$(grep 'Elapsed (wall' "$log" | awk '{print $NF}' | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
  rss=$(grep 'Maximum resident' "$log" | awk '{print $NF}')
  printf 'convert %-5s %6.1f s  %6.1f MB/s of source  peak RSS %6.0f MiB  -> %s (%d MB)\n' "$q" "$wall" \
    "$(echo "$src_bytes / $wall / 1000000" | bc -l)" "$(echo "$rss / 1024" | bc -l)" "$(basename "$out")" \
    "$(( $(stat -c %s "$out") / 1000000 ))"
  "$build/host/cmfhost" bench "$out" -p "${PP:-512}" -n "${TG:-128}" -r "${REPS:-3}" --threads "$threads" \
    | tee "$work/bench-$q.txt" | sed "s/^/  $q: /"
  # The bandwidth of this shared VM drifts by 20 % over minutes: each
  # dtype's decode rate is compared with a read measured right after it.
  bw=$("$build/bench/bench_qwen" --threads "$threads" --bandwidth-only | grep 'median pass' | sed 's/.*median pass \([0-9.]*\).*/\1/')
  tgbw=$(grep 'tg streams' "$work/bench-$q.txt" | awk '{print $3}' || true)
  [ -n "$tgbw" ] && printf '  %s: decode reads %s GB/s = %.0f %% of the median read pass just after (%s GB/s)\n' \
    "$q" "$tgbw" "$(echo "100 * $tgbw / $bw" | bc -l)" "$bw"
done
