#!/usr/bin/env bash
# Task masks on the Qwen3-0.6B shape: decode speed and the weight bytes a
# decoded token reads, at 0 %, 50 % and 75 % FFN sparsity.
#   1. the random-weight 0.6B checkpoint of bench/qwen06b.sh (written once);
#   2. `cmfhost convert --quant $QUANT`, then bench/task_masks adds masks
#      s0, s50, s75 (whole groups of 32 neurons dropped per layer, heads and
#      layers all live);
#   3. ROUNDS rounds of: the read bandwidth, then `cmfhost bench --task T
#      -p 0 -n TG --profile` for each mask in its own process (alternating,
#      so drift of this shared machine hits every mask alike). The profile
#      gives what decode reads per token (matmul weight bytes x calls).
# usage: [QUANT=q8] [TG=64] [ROUNDS=3] [THREADS=2] bench/tasks06b.sh [BUILD_DIR=build-rel] [WORK_DIR=/tmp/cmf-qwen06b]
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build-rel}" && pwd)"
work="${2:-/tmp/cmf-qwen06b}"
quant="${QUANT:-q8}" tg="${TG:-64}" rounds="${ROUNDS:-3}" threads="${THREADS:-2}"
export CMF_PLUGIN_PATH="$build/plugins/codecs:$build/plugins/archs/qwen:$build/plugins/archs:$build/plugins/backends/cpu"
mkdir -p "$work"
echo "# $(date -u +%FT%TZ) $(git -C "$root" rev-parse --short HEAD) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
[ -f "$work/hf/model.safetensors" ] || "$build/bench/convert_bench" --shape 0.6b --dir "$work/hf" --checkpoint-only 1
base="$work/qwen06b-$quant.cmf" masked="$work/qwen06b-$quant-tasks.cmf"
[ -f "$base" ] || "$build/host/cmfhost" convert --model "$work/hf" --output "$base" --quant "$quant" --threads "$threads" --no-progress >/dev/null
[ -f "$masked" ] || "$build/bench/task_masks" "$base" "$masked" 0 0.5 0.75
"$build/host/cmfhost" masks "$masked"
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
declare -A tok mib
bws=()
for ((r = 0; r < rounds; r++)); do
  bws+=("$("$build/bench/bench_qwen" --threads "$threads" --bandwidth-only | grep 'median pass' | sed 's/.*median pass \([0-9.]*\).*/\1/')")
  for t in s0 s50 s75; do
    out="$("$build/host/cmfhost" bench "$masked" --task "$t" -p 0 -n "$tg" -r 1 --threads "$threads" --profile 2>/dev/null)"
    tok[$t]+="$(grep "^tg$tg " <<<"$out" | awk '{print $2}') "
    mib[$t]="$(grep 'decode reads' <<<"$out" | awk '{print $3}')"
  done
done
echo "read bandwidth (median pass) per round: ${bws[*]} GB/s"
for t in s0 s50 s75; do
  # shellcheck disable=SC2086
  printf '%-4s tg%s %6.2f tok/s (median of %d; rounds: %s)  decode reads %s MiB of weights per token\n' "$t" "$tg" \
    "$(median ${tok[$t]})" "$rounds" "$(echo ${tok[$t]} | tr ' ' ',')" "${mib[$t]}"
done
