#!/usr/bin/env bash
# bench/model_bench.sh on the Qwen3-0.6B shape (see its header; same arguments).
case "${1:-}" in -h|--help) exec "$(dirname "${BASH_SOURCE[0]}")/model_bench.sh" --help ;; esac
SHAPE=0.6b exec "$(dirname "${BASH_SOURCE[0]}")/model_bench.sh" "$@"
