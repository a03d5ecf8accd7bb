#!/usr/bin/env bash
# The main job, reduced (issue 10): deploy/local/launch.sh on the arithmetic task with a
# short SFT warm start, a real Kafka broker, one qrl-learner and two qrl-rollout replicas
# decoding with w8a8-int8 weights and an int4-protected KV cache.  Checks:
#   - every prompt group dispatched (ids 1..T*updates) is trained exactly once, or
#     reported dropped by dynamic sampling in the update that took it;
#   - versions advance 1..updates, reward and KL(behav||prox) are logged per update;
#   - both replicas ran with the requested formats and received new weights;
#   - the evaluation before and after RL, the summary and the plot were written;
#   - nothing the launcher started is left running.
# Skips (77) without java or the Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
fail() { echo "FAIL: $*"; exit 1; }
home=${QRL_KAFKA_HOME:-${QRL_DEPS:-$root/.deps}/kafka}
if ! command -v java >/dev/null || [ ! -f "$home/libs/.stamp" ]; then
  [ "${QRL_REQUIRE_KAFKA:-0}" = 1 ] && fail "no java / Kafka jars, and QRL_REQUIRE_KAFKA=1"
  echo "skipped: no java or Kafka jars (run deploy/setup.sh)"; exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qrl-demo-test.XXXXXX")
run=$tmp/run
cleanup() {
  local rc=$?
  pkill -KILL -f "$tmp" 2>/dev/null || true
  if [ $rc -ne 0 ]; then
    for l in "$run"/*.log; do [ -f "$l" ] && { echo "--- last lines of $l:"; tail -n 20 "$l"; }; done
  fi
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
T=4 G=4 U=3
t0=$SECONDS
deploy/local/launch.sh --task arith --replicas 2 --precision w8a8-int8 --kv-cache int4-protected \
  --updates $U --quota $T --group-size $G --sft-steps 120 --eval-n 24 --eval-k 2 --seed 3 \
  --run-dir "$run" >"$tmp/launch.out" 2>&1 || { cat "$tmp/launch.out"; fail "launch.sh failed"; }
echo "launch.sh finished in $((SECONDS - t0)) s"

m=$run/learner.jsonl
[ "$(wc -l <"$m")" -eq $U ] || fail "expected $U updates, got $(wc -l <"$m")"
jq -s -e "map(.version) == [range(1; $U + 1)]" "$m" >/dev/null || fail "versions: $(jq -c -s 'map(.version)' "$m")"
jq -s -e "[.[].groups[]] | sort == [range(1; $T * $U + 1)]" "$m" >/dev/null ||
  fail "groups not trained exactly once: $(jq -c -s 'map(.groups)' "$m")"
jq -s -e "all(.[]; .groups_used + .groups_dropped == $T and (.dropped | length) == .groups_dropped
  and ((.dropped - .groups) | length) == 0)" "$m" >/dev/null || fail "dropped accounting: $(cat "$m")"
jq -s -e 'all(.[]; (.reward_mean | type) == "number" and (.kl_behav_prox | type) == "number"
  and .reward_mean >= 0 and .reward_mean <= 1)' "$m" >/dev/null || fail "reward/KL not logged: $(cat "$m")"
echo "groups 1..$((T * U)) trained exactly once over versions 1..$U"

for r in r0 r1; do
  grep -q "model loaded .*precision=w8a8-int8 kv_cache=int4-protected" "$run/$r.log" || fail "$r did not run w8a8-int8: $(grep -m3 precision "$run/$r.log")"
  grep -q "weights received version=" "$run/$r.log" || fail "$r never received new weights"
done
for f in eval-before.json eval-after.json summary.txt curve.png; do
  [ -s "$run/$f" ] || fail "$f missing"
done
jq -e '(.avg_at_k | type) == "number" and .n == 24' "$run/eval-before.json" >/dev/null ||
  fail "eval-before.json: $(cat "$run/eval-before.json")"
grep -q "test avg_at_k" "$run/summary.txt" || fail "summary table: $(cat "$run/summary.txt")"
[ "$(grep -c '^ *[0-9]\+ \+[0-9]\+ ' "$tmp/launch.out")" -ge $U ] || fail "no per-update progress lines"
sleep 0.5
left=$(pgrep -f "$run" || true)
[ -z "$left" ] || fail "processes left running: $(ps -o pid,args -p $left)"
echo "demo cluster test passed in $((SECONDS - t0)) s"
