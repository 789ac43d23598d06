#!/usr/bin/env bash
# llama.cpp on the same checkpoint that bench/qwen06b.sh (or bench/qwen3_moe.sh,
# with NAME=qwen3-moe and WORK_DIR=/tmp/cmf-qwen3-moe) runs through
# `cmfhost bench`, to compare decode/prefill speed side by side:
#   1. `npm install` here if node_modules is missing (node-llama-cpp, pinned; its
#      @node-llama-cpp/linux-x64 package ships prebuilt llama.cpp CPU libraries,
#      nothing is compiled);
#   2. hf_to_gguf.py: the checkpoint -> NAME-{f16,bf16,q8_0,q4_0,q4_k_m}.gguf in WORK_DIR
#      (skipped when the .gguf exists);
#   3. correctness: (a) llama.cpp's logits on a check GGUF (f16, q_norm/k_norm
#      scaled by 100 so attention is sharp and RoPE matters) against a numpy
#      forward pass of the checkpoint (check_ref.py: same argmax, rel RMS error
#      <= 1e-2 at 6 positions); (b) the quantized files agree with the f16 one on
#      the argmax next token at 4 positions (4-bit files may differ on random weights,
#      where the top logits are close: reported, not fatal);
#   4. bench.mjs on each file, with and without flash attention: pp512 and tg128 as llama-bench measures them (one
#      warm-up, REPS timed runs, KV cache cleared before each), median (min-max)
#      tok/s, with the ggml CPU variant library llama.cpp loaded.
# The checkpoint (WORK_DIR/hf, 1.19 GB BF16, random weights) is made once by
#   build-rel/bench/convert_bench --shape 0.6b --dir WORK_DIR/hf --checkpoint-only 1
# usage: [TYPES="f16 bf16 q8_0 q4_0 q4_k_m"] [PP=512] [TG=128] [REPS=3] [THREADS=2] [FA="0 1"] [NAME=qwen06b]
#        [DEPTH=0] [CACHE=f16|q8_0|f32]   (both tests after DEPTH cached tokens, llama-bench -d;
#                                        the KV cache type, -ctk/-ctv: q8_0 needs FA=1)
#        bench/llamacpp/run.sh [WORK_DIR=/tmp/cmf-qwen06b]
# Takes ~10 minutes on the 2-core machine. Run it on an idle machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="${1:-/tmp/cmf-qwen06b}"
types="${TYPES:-f16 bf16 q8_0 q4_0 q4_k_m}"
threads="${THREADS:-2}"
name="${NAME:-qwen06b}"
case "${1:-}" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac

if [ ! -f "$work/hf/config.json" ] || [ ! -f "$work/hf/model.safetensors" ]; then
  echo "run.sh: no checkpoint in $work/hf; make it with" >&2
  echo "  build-rel/bench/convert_bench --shape 0.6b --dir $work/hf --checkpoint-only 1" >&2
  exit 1
fi
if [ ! -d "$here/node_modules/node-llama-cpp" ]; then
  # No install scripts: node-llama-cpp's postinstall would only try to download or
  # build binaries; the prebuilt ones come with the optional dependency.
  (cd "$here" && npm install --ignore-scripts --no-audit --no-fund)
fi

echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
for t in $types; do
  out="$work/$name-$t.gguf"
  if [ ! -f "$out" ]; then
    /usr/bin/python3 "$here/hf_to_gguf.py" "$work/hf" "$out" "$t"
  fi
done

# Correctness (a): the conversion computes the checkpoint's function.
check="$work/$name-check-f16.gguf"
[ -f "$check" ] || /usr/bin/python3 "$here/hf_to_gguf.py" "$work/hf" "$check" f16 100 >/dev/null
node "$here/bench.mjs" "$check" --threads "$threads" --check-tokens 6 \
  --dump-logits "$work/llamacpp-logits-check.f32" >/dev/null
/usr/bin/python3 "$here/check_ref.py" "$work/hf" "$work/llamacpp-logits-check.f32" 6 100 | tail -1
# Correctness (b): the argmax next token of each quantization must match the first's.
set -- $types
if [ $# -ge 2 ]; then
  ref=""
  for t in $types; do
    node "$here/bench.mjs" "$work/$name-$t.gguf" --threads "$threads" --check-tokens 4 \
      | grep '^check' | sed 's/.*argmax \([0-9]*\).*/\1/' > "$work/llamacpp-check-$t.txt"
    if [ -z "$ref" ]; then ref=$t
    elif cmp -s "$work/llamacpp-check-$ref.txt" "$work/llamacpp-check-$t.txt"; then
      echo "check: $t and $ref agree on the argmax next token at 4 positions ($(paste -sd' ' "$work/llamacpp-check-$t.txt"))"
    else
      echo "check: $t and $ref DISAGREE on the argmax next token: $(paste -sd' ' "$work/llamacpp-check-$t.txt") vs $(paste -sd' ' "$work/llamacpp-check-$ref.txt")"
    fi
  done
fi

# Both attention paths by default: llama-bench's -fa 0, and flash attention
# (llama.cpp's "auto" turns it on for the CPU), measured faster here.
for fa in ${FA:-0 1}; do
  for t in $types; do
    node "$here/bench.mjs" "$work/$name-$t.gguf" -p "${PP:-512}" -n "${TG:-128}" -r "${REPS:-3}" \
      -d "${DEPTH:-0}" --cache-type "${CACHE:-f16}" \
      --threads "$threads" --flash-attn "$fa" | grep -v '^ggml CPU' | sed "s/^/  $t fa$fa: /"
  done
done
echo "# done $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
