#!/bin/sh
# run_lumina2.sh MAKE_REFERENCE_PY OUT_DIR TEST_BINARY [ARGS...]
# Generates the tiny Lumina-Image 2.0 pipeline and its PyTorch reference
# (skipped when torch is missing), then runs the test binary against it
# (CMF_LUMINA2_DIR).
set -e
py=/usr/bin/python3
if ! "$py" -c 'import torch, numpy' 2>/dev/null; then
  echo "SKIP: $py has no torch/numpy (scripts/setup.sh --tests installs python3-torch)" >&2
  exit 77
fi
gen=$1 out=$2
shift 2
# Regenerated only when the generator (or the decoder reference it imports) is newer.
ref_dir=$(dirname "$gen")/../runtime/make_reference.py
if [ ! -f "$out/done" ] || [ "$gen" -nt "$out/done" ] || [ "$ref_dir" -nt "$out/done" ]; then
  rm -rf "$out"
  "$py" "$gen" "$out"
  touch "$out/done"
fi
CMF_LUMINA2_DIR="$out" exec "$@"
