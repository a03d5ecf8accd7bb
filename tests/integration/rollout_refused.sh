#!/usr/bin/env bash
# A broker that refuses what a replica produces (docs/rollout-daemon.md "When the broker
# refuses"): a real single-node Kafka broker and CPU qrl-rollout replicas on stories260K
# with rollout.precision w4a4-nvfp4 and rollout.trace on.
#   1. refused at start, naming the key: a trace topic that does not exist, an empty one,
#      one equal to the results topic, a results topic that does not exist; the learner
#      names an empty kafka.trace_topic too;
#   2. a trace topic whose max.message.bytes (4096) is below the chunks (the default
#      kafka.max_trace_bytes): every result still arrives, nothing is dead-lettered, the
#      replica gives the TraceChunks up once per group (trace_failed counts the responses,
#      in metrics.jsonl and the stopped line), logs the cause once and does not spin;
#   3. SIGTERM while those deliveries are refused (drain_timeout_ms 0, groups in flight):
#      the replica drains and exits 0 within seconds, its consumed groups answered.
# Whatever it started is stopped on every exit path.  Skips (77) without java or the
# Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" rollout_refused
harness=$build/tests/integration/rollout_harness
[ -x "$harness" ] || fail "$harness is not built (make test builds it)"
t_all=$(date +%s.%N)
need_kafka

start_broker 2
"$kafka" create-topics --bootstrap "$bootstrap" --partitions 1 --topics qrl.trace.small \
  --max-message-bytes 4096 >/dev/null 2>&1 || fail "creating qrl.trace.small"
echo "broker at $bootstrap"

# replica NAME [options]: a TRACE replica in the background (pid in $pid)
replica() {
  local name=$1; shift
  QRL_LOG_LEVEL=info "$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" \
    --kafka.bootstrap "$bootstrap" --kafka.group "rollout-$name" --rollout.precision w4a4-nvfp4 \
    --rollout.trace true --rollout.replica_id "$name" --rollout.slots 4 --rollout.max_concurrency 2 \
    --rollout.threads 1 --kafka.session_timeout_ms 6000 --metrics.jsonl "$tmp/$name.jsonl" "$@" \
    >"$tmp/$name.log" 2>&1 &
  pid=$!
  pids+=($pid)
}
# exits NAME SECONDS: the replica exits within SECONDS; its status in $rc
exits() {
  timeout "$2" tail --pid="$pid" -f /dev/null || fail "$1: still running after $2 s"
  rc=0
  wait "$pid" || rc=$?
}

# ---- 1. refused at start ---------------------------------------------------------------
refused() { # NAME KEY PATTERN [options]: exits non-zero, the error names KEY and PATTERN
  local name=$1 key=$2 pat=$3; shift 3
  local t
  t=$(date +%s.%N)
  replica "$name" "$@"
  exits "$name" 20
  [ "$rc" -ne 0 ] || fail "$name: started (exit 0)"
  grep -q "qrl-rollout: error: $key: .*$pat" "$tmp/$name.log" ||
    fail "$name: error does not name $key / $pat: $(grep -v DEBUG "$tmp/$name.log" | tail -3)"
  [ "$(count "$tmp/$name.log" 'delivery to')" -eq 0 ] || fail "$name: produced before refusing"
  echo "$name: refused in $(secs "$t") s: $(grep -o 'error: .*' "$tmp/$name.log")"
}
refused missing kafka.trace_topic "topic qrl.trace.missing does not exist" --kafka.trace_topic qrl.trace.missing
refused empty kafka.trace_topic "the topic name is empty" --kafka.trace_topic ""
refused same kafka.trace_topic "is also kafka.results_topic" --kafka.trace_topic qrl.results
refused results kafka.results_topic "topic qrl.results.missing does not exist" --kafka.results_topic qrl.results.missing

printf '{"prompt":"Once upon a time, Lily","answer":"the"}\n' >"$tmp/data.jsonl"
rc=0
"$learner" --learner.model "$model" --learner.tokenizer "$tokenizer" --dataset.chat_template none \
  --dataset.task contains --dataset.path "$tmp/data.jsonl" --kafka.bootstrap "$bootstrap" \
  --learner.qat nvfp4 --kafka.trace_topic "" >"$tmp/learner.log" 2>&1 || rc=$?
[ $rc -ne 0 ] || fail "learner started with an empty kafka.trace_topic"
grep -q "error: kafka.trace_topic: the topic name is empty" "$tmp/learner.log" ||
  fail "learner error does not name kafka.trace_topic: $(tail -2 "$tmp/learner.log")"
echo "learner: $(grep -o 'error: .*' "$tmp/learner.log")"

# ---- 2. chunks over the trace topic's max.message.bytes --------------------------------
t=$(date +%s.%N)
replica small --kafka.trace_topic qrl.trace.small
"$harness" produce --bootstrap "$bootstrap" --first-id 1 --groups 3 --group-size 4 --max-new-tokens 16 \
  --tokenizer "$tokenizer" >/dev/null
out=$("$harness" consume --bootstrap "$bootstrap" --group-size 4 --timeout 60 --expect 3 --expect-dlq 0) ||
  fail "small: results missing: $out"
wait_log "$tmp/small.log" "produced group=" 3 20
kill -TERM "$pid"
exits small 20
[ "$rc" -eq 0 ] || fail "small: exited $rc"
grep -q "kafka.trace_topic qrl.trace.small: max.message.bytes 4096 is below" "$tmp/small.log" ||
  fail "small: no start-up warning about max.message.bytes"
[ "$(count "$tmp/small.log" 'TraceChunks of group=.* given up')" -eq 1 ] ||
  fail "small: the give-up is not logged exactly once"
grep -q "stopped rc=0 .* produced=3 dead_letters=0 .* trace_chunks=0 .* trace_failed=12" "$tmp/small.log" ||
  fail "small: stopped line: $(grep -o 'stopped .*' "$tmp/small.log")"
jq -s -e 'length == 3 and all(.[]; .trace_failed == 4 and .trace_chunks == 0)' "$tmp/small.jsonl" >/dev/null ||
  fail "small: metrics.jsonl: $(cat "$tmp/small.jsonl")"
failures=$(count "$tmp/small.log" "delivery to qrl.trace.small failed")
[ "$failures" -le 3 ] || fail "small: $failures 'delivery failed' lines (spinning?)"
echo "small: 3 results, 12 responses without records, $failures failure line(s) in $(secs "$t") s"

# ---- 3. SIGTERM while deliveries are refused -------------------------------------------
# a fresh consumer group: the 3 prompts again, decoded slowly so that some are in flight
replica term --kafka.trace_topic qrl.trace.small --rollout.step_delay_ms 40
wait_log "$tmp/term.log" "consumed group=" 2 60
t=$(date +%s.%N)
kill -TERM "$pid"
exits term 30
[ "$rc" -eq 0 ] || fail "term: exited $rc"
grep -q "draining (SIGTERM): in_flight=[1-9]" "$tmp/term.log" || fail "term: nothing in flight at SIGTERM"
consumed=$(count "$tmp/term.log" "consumed group=")
grep -q "stopped rc=0 consumed=$consumed produced=$consumed " "$tmp/term.log" ||
  fail "term: consumed groups not all answered: $(grep -o 'stopped .*' "$tmp/term.log")"
echo "term: SIGTERM with $consumed group(s) in flight: exit 0 after $(secs "$t") s"

echo "rollout refused-delivery test passed in $(secs "$t_all") s"
