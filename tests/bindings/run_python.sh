#!/usr/bin/env bash
# The Python binding's unittest suite with Debian's python3 (it sees
# Debian's NumPy; the tests also run the no-NumPy path).
set -euo pipefail
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py is not installed"; exit 77; }
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../support/sanitizer_env.sh"
cd "$here/../../sdk/bindings/python"
with_sanitizers "$py" -B -m unittest discover -s tests -v
