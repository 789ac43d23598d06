#!/usr/bin/env bash
# A long fuzzing campaign: each fuzz target in turn, one process at a time
# (one core), until it has run N inputs or for at most S seconds, on a
# corpus kept between campaigns. Prints one Markdown table row per target
# (the table docs/reliability.md records), with the CPU time the run got:
# on a shared machine wall time says little.
#
# usage: scripts/fuzz_campaign.sh [--build DIR] [--runs N] [--max-time S] [--nice N] [TARGET...]
#   --build DIR   fuzz build to use (default build-fuzz-campaign, set up here
#                 if missing: clang, -O2 with line tables, ASan+UBSan,
#                 -Dfuzz=true; faster per input than CI's -O0 build-fuzz)
#   --runs N      inputs per target (default 10000000)
#   --max-time S  seconds per target at most (default 0: no limit)
#   --nice N      scheduling niceness of the fuzzer (default 19; on a machine
#                 busy with builds 19 gets a few percent of a core)
#   TARGET        open tokenizer chat convert sections codecs gguf pipeline (default: all)
# Corpora: DIR/fuzz-corpus/TARGET; logs: DIR/meson-logs/campaign-TARGET.log;
# findings: DIR/meson-logs/fuzz-TARGET-{crash,leak,timeout,oom}-*.
# Exit status 1 if any target found something.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build=build-fuzz-campaign
runs=10000000
max_time=0
niceness=19
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --max-time) max_time=$2; shift 2 ;;
    --nice) niceness=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz_campaign.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(open tokenizer chat convert sections codecs gguf pipeline)

if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ LDFLAGS=-shared-libasan meson setup "$build" -Dbuildtype=plain -Doptimization=2 \
    -Dc_args=-gline-tables-only -Dcpp_args=-gline-tables-only -Dbenches=false \
    -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false >/dev/null || exit 1
fi
nice -n "$niceness" meson compile -C "$build" $(printf 'fuzz_%s ' "${targets[@]}") \
  cmf-test-container-codecs cmf-codecs cmf-arch-qwen cmf-arch-gemma tiny_models >/dev/null || exit 1

status=0
echo "| target | executions | time | CPU time | exec per CPU s | corpus | peak RSS | result |"
echo "|---|---|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
  log="$build/meson-logs/campaign-$t.log"
  mkdir -p "$build/fuzz-corpus/$t" "$build/meson-logs"
  start=$(date +%s)
  # CPU time of the whole run (seeding, the fuzzer, its exit-time leak check)
  CMF_FUZZ_CORPUS="$build/fuzz-corpus/$t" /usr/bin/time -f '%U %S' -o "$log.cpu" \
    nice -n "$niceness" tests/fuzz/run.sh "$build" "$t" "$max_time" -runs="$runs" >"$log" 2>&1
  rc=$?
  cpu=$(awk '/^[0-9.]+ [0-9.]+$/ {printf "%d", $1 + $2}' "$log.cpu")
  secs=$(( $(date +%s) - start ))
  stat() { grep -o "stat::$1: *[0-9]*" "$log" | tail -1 | grep -o '[0-9]*$'; }
  result="0 crashes, 0 leaks, 0 timeouts"
  if [ "$rc" -ne 0 ]; then
    status=1
    found=$(grep -m1 -o 'ERROR: [A-Za-z]*: [a-z-]*\|ERROR: libFuzzer: [a-z-]*\|runtime error: .*' "$log" | head -1)
    if [ -n "$found" ]; then result="FOUND: $found ($(grep -m1 -o 'reproducer .*' "$log"))"
    else result="FAILED without a finding, see $log"; fi
  fi
  execs=$(stat number_of_executed_units)
  corpus=$(ls "$build/fuzz-corpus/$t" | wc -l)
  printf '| %s | %s | %dh%02dm | %dh%02dm | %s | %s | %s MB | %s |\n' "$t" "$execs" \
    $((secs / 3600)) $((secs % 3600 / 60)) $((cpu / 3600)) $((cpu % 3600 / 60)) "$(( ${execs:-0} / (cpu > 0 ? cpu : 1) ))" \
    "$corpus" "$(stat peak_rss_mb)" "$result"
done
exit $status
