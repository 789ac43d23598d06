#!/usr/bin/env bash
# cmf and llama.cpp in alternating pairs: for each pair (cmf dtype, GGUF
# type), ROUNDS rounds of `cmfhost bench` then bench.mjs on the same
# checkpoint's files, back to back, the order swapped every round (on this
# VM the first of two runs after a pause was seen 4-15 % faster than the
# second with the same build), and each round's ratios cmf / llama.cpp: pp (tok/s) and tg
# (cmf's tok/s against llama.cpp's own eval timer, which leaves out the
# node wrapper's per-token cost). The read bandwidth of the machine drifts by
# 20-40 % within minutes, so only pairs taken in the same minute compare;
# the last lines give each pair's median ratios over the rounds.
# Needs the .cmf files of bench/qwen06b.sh and the .gguf files of run.sh in
# WORK_DIR (run both once first).
# usage: [PAIRS="f16:f16 bf16:bf16 q8:q8_0 q4:q4_0 q4tp:q4_k_m"] [ROUNDS=3] [REPS=2] [PP=512] [TG=128]
#        [DEPTH=0] [KV=f16|q8] [FA=1] [THREADS=2] [NAME=qwen06b]
#        (DEPTH: both tests after that many cached tokens, cmfhost bench -d and
#        llama-bench -d; KV: the KV cache type of both, cmf's --kv-cache and
#        llama.cpp's -ctk/-ctv: f16 against f16, q8 against q8_0)
#        bench/llamacpp/alternate.sh [BUILD_DIR=build-rel] [WORK_DIR=/tmp/cmf-qwen06b]
# Takes ~30 s per pair and round at depth 0, ~3 minutes at DEPTH=4096, and
# with KV=q8 there (llama.cpp's q8_0 cache) 4 minutes (q8, 2026-12-03) to 15
# (q4, 2026-12-04), 2-core machine.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$root/build-rel}" && pwd)"
work="${2:-/tmp/cmf-qwen06b}"
name="${NAME:-qwen06b}"
pairs="${PAIRS:-f16:f16 bf16:bf16 q8:q8_0 q4:q4_0 q4tp:q4_k_m}"
threads="${THREADS:-2}"
export CMF_PLUGIN_PATH="$build/plugins/codecs:$build/plugins/archs/qwen:$build/plugins/archs:$build/plugins/backends/cpu"
for p in $pairs; do
  for f in "$work/$name-${p%%:*}.cmf" "$work/$name-${p##*:}.gguf"; do
    [ -f "$f" ] || { echo "alternate.sh: $f is missing (bench/qwen06b.sh and bench/llamacpp/run.sh write it)" >&2; exit 1; }
  done
done
case "${KV:-f16}" in f16) llama_kv=f16 ;; q8) llama_kv=q8_0 ;; *) echo "alternate.sh: KV must be f16 or q8" >&2; exit 2 ;; esac
[ -d "$here/node_modules/node-llama-cpp" ] || { echo "alternate.sh: run bench/llamacpp/run.sh once first (npm install)" >&2; exit 1; }

# The tok/s figure of the line matching the extended regex $1 ("pp512 ...",
# "pp512 @ d4096 ...").
rate() { grep -E "$1" | head -1 | awk '{ for (i = 2; i <= NF; i++) if ($i == "tok/s") { print $(i - 1); exit } }'; }
cmf_run() {  # pp tok/s, tg tok/s
  local out
  out=$("$build/host/cmfhost" bench "$1" -p "${PP:-512}" -n "${TG:-128}" -r "${REPS:-2}" -d "${DEPTH:-0}" \
    --kv-cache "${KV:-f16}" --threads "$threads")
  echo "$(rate "^pp${PP:-512}( @ d[0-9]+)? " <<<"$out") $(rate "^tg${TG:-128}( @ d[0-9]+)? " <<<"$out")"
}
llama_run() {  # pp tok/s, tg tok/s by its own eval timer
  local out
  out=$(node "$here/bench.mjs" "$1" -p "${PP:-512}" -n "${TG:-128}" -r "${REPS:-2}" -d "${DEPTH:-0}" \
    --cache-type "$llama_kv" --threads "$threads" --flash-attn "${FA:-1}")
  echo "$(rate "^pp${PP:-512}( @ d[0-9]+)? " <<<"$out") $(grep 'timers: eval' <<<"$out" | awk '{print $4}')"
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# pp${PP:-512} and tg${TG:-128} at depth ${DEPTH:-0}, KV cache ${KV:-f16} (llama.cpp $llama_kv), $threads threads, llama.cpp flash-attn ${FA:-1}, ${REPS:-2} reps a run"
summary=()
for p in $pairs; do
  c="${p%%:*}" g="${p##*:}"
  ppr=() tgr=()
  for ((i = 0; i < ${ROUNDS:-3}; i++)); do
    if ((i % 2 == 0)); then
      read -r cpp ctg < <(cmf_run "$work/$name-$c.cmf"); read -r lpp ltg < <(llama_run "$work/$name-$g.gguf")
    else
      read -r lpp ltg < <(llama_run "$work/$name-$g.gguf"); read -r cpp ctg < <(cmf_run "$work/$name-$c.cmf")
    fi
    ppr+=("$(echo "$cpp / $lpp" | bc -l)") tgr+=("$(echo "$ctg / $ltg" | bc -l)")
    printf '%-6s vs %-7s round %d: pp %8.1f / %8.1f = %.2fx   tg %7.2f / %7.2f = %.2fx\n' "$c" "$g" "$i" \
      "$cpp" "$lpp" "${ppr[-1]}" "$ctg" "$ltg" "${tgr[-1]}"
  done
  summary+=("$(printf '%-6s vs %-7s: pp %.2fx, tg %.2fx (medians of %d rounds)' "$c" "$g" "$(median "${ppr[@]}")" \
    "$(median "${tgr[@]}")" "${ROUNDS:-3}")")
done
printf '%s\n' "${summary[@]}"
echo "# done $(date -u +%FT%TZ)"
