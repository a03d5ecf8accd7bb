#!/usr/bin/env bash
# Runs a tier of qrl's tests and ends with one line "N passed, N failed, N skipped".
#   tests/run.sh TIER...   TIER = unit | fuzz | integration | cuda | long | multihost
# unit/cuda: Criterion binaries in $BUILD/tests/<tier>/ (their Synthesis lines are summed).
# fuzz: each replay binary over tests/fuzz/corpus/<target>/ (one test per target).
# integration/long/multihost: scripts tests/<tier>/*.sh, one test each; exit 77 means skipped.
# QRL_TEST_FILTER=substring runs only the binaries/scripts whose name contains it.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${BUILD:-build}
pass=0; fail=0; skip=0; failed_names=()
log_dir="$build/test-logs"; mkdir -p "$log_dir"

note_fail() { fail=$((fail + $1)); failed_names+=("$2"); }

run_criterion() {  # $1 = binary
  local b=$1 name out rc line
  name=$(basename "$b")
  out="$log_dir/$name.log"
  "$b" --jobs=1 >"$out" 2>&1; rc=$?
  line=$(grep -a 'Synthesis:' "$out" | tail -1)
  if [ -z "$line" ]; then
    echo "FAIL $name (exit $rc, no Criterion summary; see $out)"; tail -20 "$out"; note_fail 1 "$name"; return
  fi
  # Synthesis: Tested: N | Passing: N | Failing: N | Crashing: N   (failing includes crashing)
  local t p f
  t=$(sed -E 's/.*Tested: ([0-9]+).*/\1/' <<<"$line")
  p=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$line")
  f=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<<"$line")
  local s; s=$(grep -ac '\[SKIP\]' "$out")
  # Criterion forks each test: a sanitizer report in a child does not fail it, so look for one.
  if grep -aqE 'ERROR: (Address|Leak|Memory)Sanitizer|runtime error:' "$out"; then
    echo "FAIL $name: sanitizer report"; grep -aE -A5 'ERROR: |runtime error:' "$out" | head -30
    note_fail 1 "$name"; pass=$((pass + p)); return
  fi
  pass=$((pass + p)); skip=$((skip + s))
  if [ "$f" -gt 0 ] || [ $rc -ne 0 ]; then
    [ "$f" -eq 0 ] && f=1
    echo "FAIL $name: $p/$t passed"; grep -a -E 'FAIL|CRASH|Assertion|\[----\]' "$out" | head -30
    note_fail "$f" "$name"
  else
    echo "ok   $name ($p tests)"
  fi
}

run_script() {  # $1 = script
  local s=$1 name out rc
  name=$(basename "$s" .sh)
  out="$log_dir/$name.log"
  BUILD=$build "$s" >"$out" 2>&1; rc=$?
  case $rc in
    0)  echo "ok   $name"; pass=$((pass + 1)) ;;
    77) echo "skip $name: $(tail -1 "$out")"; skip=$((skip + 1)) ;;
    *)  echo "FAIL $name (exit $rc; see $out)"; tail -30 "$out"; note_fail 1 "$name" ;;
  esac
}

run_fuzz_replay() {  # $1 = replay binary
  local b=$1 name target out rc
  name=$(basename "$b"); target=${name%-replay}
  out="$log_dir/$name.log"
  "$b" "tests/fuzz/corpus/$target" >"$out" 2>&1; rc=$?
  if [ $rc -eq 0 ]; then echo "ok   $name ($(tail -1 "$out"))"; pass=$((pass + 1));
  else echo "FAIL $name (exit $rc)"; tail -20 "$out"; note_fail 1 "$name"; fi
}

want() { [ -z "${QRL_TEST_FILTER:-}" ] || [[ "$1" == *"$QRL_TEST_FILTER"* ]]; }

for tier in "$@"; do
  case $tier in
    unit|cuda)
      for b in "$build/tests/$tier"/test_*; do [ -x "$b" ] && want "$b" && run_criterion "$b"; done ;;
    fuzz)
      for b in "$build/tests/fuzz"/*-replay; do [ -x "$b" ] && want "$b" && run_fuzz_replay "$b"; done ;;
    integration|long|multihost)
      for s in "tests/$tier"/*.sh; do [ -x "$s" ] && want "$s" && run_script "$s"; done ;;
    *) echo "run.sh: unknown tier $tier" >&2; exit 2 ;;
  esac
done

[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
