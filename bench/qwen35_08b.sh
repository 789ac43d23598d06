#!/usr/bin/env bash
# bench/model_bench.sh on a Qwen3.5-shaped hybrid of ~0.8 B parameters (see
# its header; same arguments): hidden 1024, 24 layers, 3 gated delta net
# layers (16 key / 16 value heads of 128, conv 4) to 1 output-gated
# attention layer (8/2 heads of 256, partial rotary 0.25), FFN 3584, vocab
# 248320, tied head, an MTP head: tg runs plain and with MTP drafting.
# Default DTYPES "q8 q4"; work dir /tmp/cmf-qwen35-08b.
case "${1:-}" in -h|--help) exec "$(dirname "${BASH_SOURCE[0]}")/model_bench.sh" --help ;; esac
DTYPES="${DTYPES:-q8 q4}" SHAPE=qwen3.5-0.8b exec "$(dirname "${BASH_SOURCE[0]}")/model_bench.sh" "$@"
