#!/bin/sh
# cmfhost with task masks: the masks table, --task on run/ppl/logits/bench,
# the one warning line of an unmeasured mask, and the errors (unknown task
# listing the file's, a file without masks). Files from tasks_tests.
# usage: cli_tasks_test.sh CMFHOST TASKS_TESTS WORK_DIR
set -eu
host=$1 tests=$2 work=$3
CMF_TASKS_WORK_DIR=$work "$tests" --no-version --test-case='*selection errors*' >/dev/null
two=$work/two-tasks.cmf plain=$work/austen-q8.cmf
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$host" masks "$two" >"$dir/masks.txt"
grep -q '^  Name  *Sparsity  *Quality Layers  *Hot$' "$dir/masks.txt" || fail "masks header"
grep -q '^  code  .* unmeasured      3 ' "$dir/masks.txt" || fail "masks row: $(cat "$dir/masks.txt")"
grep -q '^  prose ' "$dir/masks.txt" || fail "masks second row"
"$host" masks "$plain" | grep -q '^No masks in ' || fail "masks on a file without"
# A run with the task: one warning line (no quality), then the text.
"$host" run "$two" --task code --raw --greedy -p "It is a truth" -n 8 >"$dir/out.txt" 2>"$dir/err.txt" || fail "run --task: $(cat "$dir/err.txt")"
[ "$(grep -c 'warning' "$dir/err.txt")" = 1 ] || fail "one warning line: $(cat "$dir/err.txt")"
grep -q "task 'code': the mask has no measured quality" "$dir/err.txt" || fail "warning text"
# The mask changes what the model says (the masked run differs from the plain one).
"$host" logits "$two" --task code --raw -p "It is a truth" --out "$dir/a.f32" 2>/dev/null || fail "logits --task"
"$host" logits "$two" --raw -p "It is a truth" --out "$dir/b.f32" 2>/dev/null || fail "logits"
cmp -s "$dir/a.f32" "$dir/b.f32" && fail "--task had no effect on the logits"
printf 'It is a truth universally acknowledged, that a single man in possession of a good fortune.\n' >"$dir/t.txt"
"$host" ppl "$two" --task prose --file "$dir/t.txt" --ctx 32 2>/dev/null | grep -q '^perplexity ' || fail "ppl --task"
"$host" bench "$two" --task prose -p 8 -n 4 -r 1 --profile 2>/dev/null | grep -q 'decode reads .* MiB of weights per token' || fail "bench --task --profile"
# Errors: exit 1, the message names the problem.
"$host" run "$two" --task poetry --raw -p x -n 1 >/dev/null 2>"$dir/err.txt" && fail "unknown task accepted"
grep -q "NotFound: task 'poetry' is not in the file (its tasks: code, prose)" "$dir/err.txt" || fail "unknown task message: $(cat "$dir/err.txt")"
"$host" logits "$plain" --task code --raw -p x --out "$dir/c.f32" >/dev/null 2>"$dir/err.txt" && fail "--task on a file without masks"
grep -q "task 'code': the file has no task masks" "$dir/err.txt" || fail "no-masks message: $(cat "$dir/err.txt")"
# serve --task: every request runs the task (a greedy completion is what
# run --task generates); an unknown task ends the server with the same message;
# per-prompt routing is refused.
"$host" serve "$two" --task code --port 0 --parallel 2 >"$dir/serve.out" 2>"$dir/serve.err" &
spid=$!
/usr/bin/python3 - "$dir/serve.out" >"$dir/served.txt" 2>"$dir/client.err" <<'PY' || { kill "$spid"; fail "serve --task: $(cat "$dir/serve.err" "$dir/client.err")"; }
import json, re, sys, time, urllib.error, urllib.request
port = None
for _ in range(600):
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", open(sys.argv[1]).read())
    if m:
        port = m.group(1)
        break
    time.sleep(0.1)
base = "http://127.0.0.1:%s" % port
for _ in range(600):
    try:
        if urllib.request.urlopen(base + "/health").status == 200:
            break
    except (urllib.error.HTTPError, urllib.error.URLError):  # 503 while loading
        pass
    time.sleep(0.1)
body = json.dumps({"prompt": "It is a truth", "max_tokens": 8, "temperature": 0}).encode()
req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req))["choices"][0]["text"], end="")
PY
kill -TERM "$spid"
wait "$spid" || fail "serve --task did not exit 0 on SIGTERM: $(cat "$dir/serve.err")"
# (run prints the prompt before what it generates)
[ "It is a truth$(cat "$dir/served.txt")" = "$(cat "$dir/out.txt")" ] || fail "serve --task answered '$(cat "$dir/served.txt")', run --task '$(cat "$dir/out.txt")'"
"$host" serve "$two" --task poetry --port 0 >/dev/null 2>"$dir/err.txt" && fail "serve: unknown task accepted"
grep -q "NotFound: task 'poetry' is not in the file (its tasks: code, prose)" "$dir/err.txt" || fail "serve unknown task message: $(cat "$dir/err.txt")"
st=0; "$host" serve "$two" --skill auto --port 0 >/dev/null 2>"$dir/err.txt" || st=$?
[ "$st" = 2 ] || fail "serve --skill auto: exit $st"
grep -q "route each prompt" "$dir/err.txt" || fail "serve --skill auto message: $(cat "$dir/err.txt")"
echo "cli tasks: ok"
