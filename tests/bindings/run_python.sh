#!/usr/bin/env bash
# The Python binding's unittest suite with Debian's python3 (it sees
# Debian's NumPy; the tests also run the no-NumPy path).
set -euo pipefail
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py is not installed"; exit 77; }
cd "$(dirname "$0")/../../sdk/bindings/python"
exec "$py" -B -m unittest discover -s tests -v
