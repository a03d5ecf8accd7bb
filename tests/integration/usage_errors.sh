#!/usr/bin/env bash
# One usage-error convention across qrl's programs (issue 20 item 7; docs/config.md
# "Exit status"): an unknown flag (with or without a value: --foo, --version, --foo bar)
# or an unknown command ends the program with exit status 1 and ONE stderr line
# "<program>: error: ..." that says "unknown" (not "needs a value"), nothing on stdout;
# --help exits 0.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
bin=$build/bin
tmp=$(mktemp -d /tmp/qrl-usage-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# usage PROGRAM-PATH NAME ARGS...: exit 1, empty stdout, one "NAME: error: ...unknown..." line
usage() {
  local prog=$1 name=$2 rc n
  shift 2
  timeout 30 "$prog" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
  rc=$?
  n=$(wc -l <"$tmp/err")
  if [ $rc -ne 1 ] || [ "$n" -ne 1 ] || [ -s "$tmp/out" ] || ! grep -q "^$name: error: .*unknown" "$tmp/err"; then
    fail "$name $*: exit $rc, $n stderr line(s), stdout $(wc -c <"$tmp/out") bytes: $(head -3 "$tmp/err")"
  else
    echo "ok   $name $*: $(cat "$tmp/err")"
  fi
}

for p in qrl-learner qrl-rollout qrl-eval qrl-generate qrl-verify qrl-inspect qrl-kafka-admin qrl-task qrlctl; do
  [ -x "$bin/$p" ] || { fail "$bin/$p is not built"; continue; }
  usage "$bin/$p" "$p" --foo
  usage "$bin/$p" "$p" --version
  usage "$bin/$p" "$p" --foo bar
  "$bin/$p" --help >/dev/null 2>&1 || fail "$p --help: exit $?"
done
usage "$bin/qrlctl" qrlctl frobnicate
usage "$bin/qrl-kafka-admin" qrl-kafka-admin frobnicate
usage "$bin/qrl-task" qrl-task frobnicate
usage "$bin/qrl-task" qrl-task gen --foo
usage "$bin/qrl-task" qrl-task gen --task arith --foo 1
usage deploy/local/launch.sh launch.sh --foo
usage deploy/local/launch.sh launch.sh --version
usage deploy/local/launch.sh launch.sh --foo bar
usage deploy/local/launch.sh launch.sh stray
deploy/local/launch.sh --help >/dev/null || fail "launch.sh --help: exit $?"
# a known option without its value is said so, with the same exit status
for a in "$bin/qrl-generate --max-new-tokens" "$bin/qrlctl --timeout" "deploy/local/launch.sh --updates" \
         "$bin/qrl-task gen --n"; do
  # shellcheck disable=SC2086
  timeout 30 $a >/dev/null 2>"$tmp/err"; rc=$?
  [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "needs a value" "$tmp/err" ||
    fail "$a: exit $rc: $(cat "$tmp/err")"
done

# a value out of range: exit 1, its range named, nothing written
timeout 30 "$bin/qrl-task" gen --task arith --split train --n 0 --seed 1 --out "$tmp/empty.jsonl" 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "^qrl-task: error: --n: '0' is not an integer in \[1," "$tmp/err" && [ ! -e "$tmp/empty.jsonl" ] ||
  fail "qrl-task gen --n 0: exit $rc, $(cat "$tmp/err"), file $(ls "$tmp/empty.jsonl" 2>&1)"

[ $fails -eq 0 ] && echo "ok: one usage-error convention" && exit 0
exit 1
