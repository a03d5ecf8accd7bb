#!/usr/bin/env bash
# qrl-learner and bad GroupResults (issue 8): a real Kafka broker, the learner on
# stories260K and a scripted replica (learner_resume_harness feed --bad-first 2) that
# answers groups 1 and 2 first with four bad results each (a response with a log-prob
# missing, a NaN log-prob, a group id this run never dispatched, schema_version 99) and
# then with the good one.  Every bad result goes to the dead-letter topic with its reason,
# the learner keeps serving, and the good results of groups 1..4 train 2 updates.
# Skips (77) without java or the Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
kafka=deploy/kafka/kafka.sh
home=${QRL_KAFKA_HOME:-$root/.deps/kafka}
export QRL_KAFKA_ADMIN=$build/bin/qrl-kafka-admin
learner=$build/bin/qrl-learner
harness=$build/tests/integration/learner_resume_harness
data_dir=${QRL_DATA_DIR:-../shared/data}/llama2c_stories260K
fail() { echo "FAIL: $*"; exit 1; }
for f in "$learner" "$harness" "$QRL_KAFKA_ADMIN"; do [ -x "$f" ] || fail "$f is not built"; done
if ! command -v java >/dev/null || [ ! -f "$home/libs/.stamp" ]; then
  [ "${QRL_REQUIRE_KAFKA:-0}" = 1 ] && fail "no java / Kafka jars, and QRL_REQUIRE_KAFKA=1"
  echo "skipped: no java or Kafka jars (run deploy/setup.sh)"; exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qrl-badres-test.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do { kill -KILL "$p" && wait "$p"; } 2>/dev/null || true; done
  "$kafka" stop --dir "$tmp/kafka" --timeout 20 >/dev/null 2>&1 || true
  if [ $rc -ne 0 ]; then
    for l in "$tmp"/*.log; do [ -f "$l" ] && { echo "--- last lines of $l:"; tail -n 25 "$l"; }; done
  fi
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
t0=$SECONDS
bootstrap=$("$kafka" start --dir "$tmp/kafka" --port 0 | sed -n 's/^BOOTSTRAP=//p')
[ -n "$bootstrap" ] || fail "kafka.sh start printed no BOOTSTRAP"
"$kafka" create-topics --bootstrap "$bootstrap" --partitions 1 >/dev/null 2>&1
for i in 0 1 2 3 4 5; do printf '{"prompt":"Once upon a time, Tom","answer":"the"}\n'; done >"$tmp/data.jsonl"
"$harness" feed --bootstrap "$bootstrap" --prompts qrl.prompts --results qrl.results --vocab 512 \
  --bad-first 2 --timeout 100 >"$tmp/feed.log" 2>&1 &
pids+=($!)
QRL_LOG_LEVEL=info timeout 100 "$learner" --learner.model "$data_dir/stories260K.bin" \
  --learner.tokenizer "$data_dir/tok512.bin" --dataset.chat_template none --dataset.task contains \
  --learner.threads 1 --dataset.path "$tmp/data.jsonl" --kafka.bootstrap "$bootstrap" \
  --learner.group_size 4 --learner.quota 2 --learner.max_updates 2 --learner.run_id 91 \
  --learner.lr 1e-3 --metrics.jsonl "$tmp/learner.jsonl" >"$tmp/learner.log" 2>&1 ||
  fail "learner exited $?"
dl() { grep -c "dead letter .*$1" "$tmp/learner.log" || true; }
[ "$(dl "behavior_logprobs")" -ge 2 ] || fail "mismatched lengths not dead-lettered: $(grep 'dead letter' "$tmp/learner.log")"
[ "$(dl "not finite\|NaN\|nan")" -ge 2 ] || fail "NaN log-prob not dead-lettered: $(grep 'dead letter' "$tmp/learner.log")"
[ "$(dl "NOT_FOUND: group_id 100000[12] was never dispatched")" -eq 2 ] || fail "unknown group id not dead-lettered"
[ "$(dl "schema_version got 99")" -eq 2 ] || fail "wrong schema version not dead-lettered"
[ "$(grep -c "dead letter" "$tmp/learner.log")" -eq 8 ] || fail "expected 8 dead letters: $(grep 'dead letter' "$tmp/learner.log")"
jq -s -e 'map(.version) == [1,2] and ([.[].groups[]] | sort == [1,2,3,4])' "$tmp/learner.jsonl" >/dev/null ||
  fail "updates: $(cat "$tmp/learner.jsonl")"
grep "dead letter" "$tmp/learner.log" | sed 's/.*dead letter /  /' | cut -c1-150 | sort -u | head -8
echo "8 bad results dead-lettered with their reasons; groups 1..4 trained in 2 updates; $((SECONDS - t0)) s"
