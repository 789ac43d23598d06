#!/usr/bin/env bash
# bench/model_bench.sh on the Gemma3-1B shape (see its header; same arguments):
# hidden 1152, 26 layers, 4 heads / 1 KV head of 256, FFN 6912, vocab 262144
# (the tied 262144 x 1152 head is a large part of each token's bytes), window
# 512 on 5 of every 6 layers; work dir /tmp/cmf-gemma3-1b.
case "${1:-}" in -h|--help) exec "$(dirname "${BASH_SOURCE[0]}")/model_bench.sh" --help ;; esac
SHAPE=gemma3-1b exec "$(dirname "${BASH_SOURCE[0]}")/model_bench.sh" "$@"
