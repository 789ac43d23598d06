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
echo "cli tasks: ok"
