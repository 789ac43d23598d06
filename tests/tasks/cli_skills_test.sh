#!/bin/sh
# cmfhost skill list, route, explain, run --skill/--blend, skill add's
# errors, and defrag (a task made physical runs as `run --task`). Files
# from tasks_tests, written into this test's own work dir.
# usage: cli_skills_test.sh CMFHOST TASKS_TESTS WORK_DIR
set -eu
host=$1 tests=$2 work=$3
CMF_TASKS_WORK_DIR=$work "$tests" --no-version --test-case='skills: route*' >/dev/null
CMF_TASKS_WORK_DIR=$work "$tests" --no-version --test-case='defrag: a task mask*' >/dev/null
skills=$work/two-skills.cmf masked=$work/defrag-src-q8.cmf
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# skill list: one line per record.
"$host" skill list "$skills" >"$dir/list.txt" || fail "skill list"
grep -q '^2 skill(s):$' "$dir/list.txt" || fail "skill count: $(cat "$dir/list.txt")"
grep -q '^  prose .* 12 tensor(s), .* layers \[0,1,2,3\], routable$' "$dir/list.txt" || fail "prose row: $(cat "$dir/list.txt")"
grep -q '^  sea .* 3 tensor(s), .* layers \[2\], no selection$' "$dir/list.txt" || fail "sea row: $(cat "$dir/list.txt")"
# route / explain: the routable skill wins, the other says why it cannot route.
"$host" route "$skills" -p "It is a truth universally acknowledged" >"$dir/route.txt" || fail "route"
grep -q '^winner: prose ' "$dir/route.txt" || fail "route winner: $(cat "$dir/route.txt")"
"$host" explain "$skills" -p "It is a truth universally acknowledged" >"$dir/explain.txt" || fail "explain"
grep -q 'prose .*<- chosen' "$dir/explain.txt" || fail "explain choice: $(cat "$dir/explain.txt")"
grep -q 'sea  *cannot route: no selection descriptor' "$dir/explain.txt" || fail "explain skipped: $(cat "$dir/explain.txt")"
# run with a skill, a blend, and without: the skill changes the text.
run() { "$host" run "$@" --raw --greedy -n 24 -p "It is a truth universally acknowledged" 2>/dev/null; }
run "$skills" --skill prose >"$dir/prose.txt" || fail "run --skill prose"
run "$skills" --skill none >"$dir/none.txt" || fail "run --skill none"
run "$skills" --blend "prose:0.5,sea:0.5" >"$dir/blend.txt" || fail "run --blend"
cmp -s "$dir/prose.txt" "$dir/none.txt" && fail "--skill prose had no effect"
run "$skills" --skill poetry >/dev/null 2>&1 && fail "unknown skill accepted"
"$host" run "$skills" --skill poetry --raw -p x -n 1 2>&1 | grep -q "skill 'poetry' is not in the file (its skills: prose, sea)" ||
  fail "unknown skill message"
# skill add: a donor of other shapes is refused and the file is unchanged.
cp "$skills" "$dir/grow.cmf"
"$host" skill add "$dir/grow.cmf" --from "$dir" --id x >/dev/null 2>"$dir/err.txt" && fail "skill add without a checkpoint"
cmp -s "$skills" "$dir/grow.cmf" || fail "a refused skill add changed the file"
# defrag: the task made physical says what `run --task` says.
"$host" defrag "$masked" --task prose -o "$dir/prose.cmf" >"$dir/defrag.txt" || fail "defrag"
grep -q "^wrote $dir/prose.cmf: FFN 512 -> max [0-9]* neurons per layer, [0-9.]*% pruned, kept per layer \[" "$dir/defrag.txt" ||
  fail "defrag line: $(cat "$dir/defrag.txt")"
run "$masked" --task prose >"$dir/task.txt" || fail "run --task"
run "$dir/prose.cmf" >"$dir/defragged.txt" || fail "run defragged"
cmp -s "$dir/task.txt" "$dir/defragged.txt" || fail "defragged text differs: $(cat "$dir/task.txt") | $(cat "$dir/defragged.txt")"
"$host" masks "$dir/prose.cmf" | grep -q '^No masks in ' || fail "the defragged file kept masks"
"$host" defrag "$dir/prose.cmf" -o "$dir/again.cmf" >/dev/null 2>"$dir/err.txt" && fail "defrag of a defragged file"
grep -q "defragged already" "$dir/err.txt" || fail "defragged-already message: $(cat "$dir/err.txt")"
[ -e "$dir/again.cmf" ] && fail "a refused defrag left a file"
echo "cli skills and defrag: ok"
