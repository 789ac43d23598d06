#!/bin/sh
# run_parity.sh MAKE_REFERENCE_PY OUT_DIR RUNTIME_TESTS
# Generates the PyTorch reference (skipped when torch is missing), then runs
# the parity cases against it.
set -e
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "SKIP: $py has no torch (scripts/setup.sh --tests installs python3-torch)" >&2
  exit 77
fi
# The reference is regenerated only when a script of its directory (it may
# import its sibling) is newer than it.
stale=no
[ -f "$2/done" ] || stale=yes
for f in "$(dirname "$1")"/*.py; do
  [ "$f" -nt "$2/done" ] && stale=yes
done
if [ "$stale" = yes ]; then
  "$py" "$1" "$2"
  touch "$2/done"
fi
CMF_PARITY_DIR="$2" exec "$3" --test-case='parity*' --no-version --success=false
