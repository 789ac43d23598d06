#!/usr/bin/env bash
# The default model, as the build converted it, verifies and reproduces the
# PyTorch reference's greedy continuation (models/austen-tiny/
# expected_greedy.json, written by tools/train/reference_generate.py from
# the same checkpoint).
set -euo pipefail
cmfhost="$1"; model="$2"; expected="$3"
"$cmfhost" verify "$model" >/dev/null
read -r prompt n want < <(/usr/bin/python3 - "$expected" <<'PY'
import json, sys
case = next(c for c in json.load(open(sys.argv[1]))["cases"] if c["name"] == "raw")
print(json.dumps(case["prompt"]), case["max_new_tokens"], json.dumps(case["text"]))
PY
)
prompt=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1]))' "$prompt")
want=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1]), end="")' "$want")
got=$("$cmfhost" run "$model" --raw --greedy -n "$n" -p "$prompt" 2>/dev/null)
if [ "$got" != "$want" ]; then
  echo "greedy continuation differs from the PyTorch reference"
  echo "want: $want"
  echo "got:  $got"
  exit 1
fi
echo "greedy continuation of $n tokens identical to the PyTorch reference"
