#!/usr/bin/env bash
# bench/model_bench.sh on a small Qwen3-MoE shape (see its header; same
# arguments): hidden 1024, 16 layers, 16/4 heads of 128, 32 experts of width
# 768 in every layer, top-4, vocab 151936, untied head; 1.6 B parameters of
# which a decode token reads ~0.39 B (the 4 experts each layer picks, the
# attention, the head). Default DTYPES "q8 q4"; work dir /tmp/cmf-qwen3-moe.
case "${1:-}" in -h|--help) exec "$(dirname "${BASH_SOURCE[0]}")/model_bench.sh" --help ;; esac
DTYPES="${DTYPES:-q8 q4}" SHAPE=qwen3-moe exec "$(dirname "${BASH_SOURCE[0]}")/model_bench.sh" "$@"
