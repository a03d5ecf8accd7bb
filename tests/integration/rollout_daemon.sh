#!/usr/bin/env bash
# qrl-rollout end to end on a real single-node Kafka broker (deploy/kafka/kafka.sh) with
# the stories260K model:
#   1. two replicas (r0, r1) share qrl.prompts (4 partitions); 12 groups + a garbage record
#      + a prompt longer than the context: every group answered once (after dedup by
#      group id), G responses each with equal token/logprob/version lengths, the garbage
#      in the DLQ, PROMPT_TOO_LONG for the long prompt, both replicas serving;
#   2. r1 is throttled (rollout.step_delay_ms) and killed with SIGKILL while it holds
#      groups: r0 takes its partitions and every group still completes;
#   3. r0 is slowed through Rollout.Set, gets a batch, and is sent SIGTERM mid-batch: it
#      finishes what it holds, exits 0; a fresh replica r2 answers the rest; no group of
#      that batch is answered twice (the drained replica committed what it produced);
#   4. r2 registers with a stand-in learner (rollout_learner_stub), which announces CUDA IPC
#      with a handle nobody can map: r2 (a CPU replica) falls back to the TCP address,
#      refuses a weight stream with a corrupted bucket (CRC-32C), takes the next one
#      (version 1, BF16 over TCP) and swaps at a step boundary; a later batch is answered with every token at
#      version 1; heartbeats report version 1; r2 is stopped through Rollout.Drain (exit 0);
#   5. r3 (slowed) is sent SIGTERM with rollout.drain_timeout_ms = 1000 while it holds
#      groups: it aborts them at the timeout and exits 0; r4 answers them.
# Whatever it started is stopped on every exit path.  Skips (77) without java or the
# Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
kafka=deploy/kafka/kafka.sh
home=${QRL_KAFKA_HOME:-${QRL_DEPS:-$root/.deps}/kafka}
export QRL_KAFKA_ADMIN=$build/bin/qrl-kafka-admin
daemon=$build/bin/qrl-rollout
harness=$build/tests/integration/rollout_harness
stub=$build/tests/integration/rollout_learner_stub
data_dir=${QRL_DATA_DIR:-../shared/data}/llama2c_stories260K
model=$data_dir/stories260K.bin
tokenizer=$data_dir/tok512.bin

unavailable() {
  if [ "${QRL_REQUIRE_KAFKA:-0}" = 1 ]; then
    echo "FAIL: $1, and QRL_REQUIRE_KAFKA=1"; exit 1
  fi
  echo "skipped: $1 (run deploy/setup.sh)"; exit 77
}
command -v java >/dev/null || unavailable "java not found"
[ -f "$home/libs/.stamp" ] || unavailable "no Kafka jars in $home/libs"
for f in "$daemon" "$harness" "$stub" "$QRL_KAFKA_ADMIN"; do
  [ -x "$f" ] || { echo "FAIL: $f is not built (make test builds it)"; exit 1; }
done
[ -f "$model" ] && [ -f "$tokenizer" ] || { echo "FAIL: $model or $tokenizer missing"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qrl-rollout-test.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  "$kafka" stop --dir "$tmp/kafka" --timeout 20 >/dev/null 2>&1 || true
  if [ $rc -ne 0 ]; then
    for l in "$tmp"/r*.log "$tmp"/stub.log; do
      [ -f "$l" ] && { echo "--- last lines of $l:"; tail -n 25 "$l"; }
    done
  fi
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
fail() { echo "FAIL: $*"; exit 1; }
count() { local n; n=$(grep -c -- "$2" "$1" 2>/dev/null); echo "${n:-0}"; }
# wait_log FILE PATTERN N TIMEOUT_S: until PATTERN occurs N times in FILE
wait_log() {
  local end=$((SECONDS + $4))
  while [ "$(count "$1" "$2")" -lt "$3" ]; do
    [ $SECONDS -lt $end ] || fail "timed out waiting for '$2' x$3 in $1"
    sleep 0.1
  done
}
t_all=$(date +%s.%N)

t=$(date +%s.%N)
bootstrap=$("$kafka" start --dir "$tmp/kafka" --port 0 | sed -n 's/^BOOTSTRAP=//p')
[ -n "$bootstrap" ] || fail "kafka.sh start printed no BOOTSTRAP"
"$kafka" create-topics --bootstrap "$bootstrap" --partitions 4 >/dev/null 2>&1
echo "broker at $bootstrap with topics in $(secs "$t") s"
printf 'test-token-%s\n' "$$" >"$tmp/token"

# start_replica NAME [extra options]: starts it, records its pid, waits for its rpc port
start_replica() {
  local name=$1; shift
  QRL_LOG_LEVEL=info "$daemon" --rollout.model "$model" --rollout.tokenizer "$tokenizer" \
    --kafka.bootstrap "$bootstrap" --rollout.replica_id "$name" --rollout.slots 4 \
    --rollout.max_concurrency 4 --rollout.threads 1 --kafka.session_timeout_ms 6000 \
    --rpc.token_file "$tmp/token" --metrics.jsonl "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
  wait_log "$tmp/$name.log" "rpc listening port=[0-9]" 1 30
  sleep 0.2 # the line may still be half written when grep first sees it
  eval "port_$name=$(sed -n 's/.*rpc listening port=\([0-9]*\).*/\1/p' "$tmp/$name.log")"
}
rpc() { local port=$1; shift; "$harness" rpc --addr "127.0.0.1:$port" --token-file "$tmp/token" "$@"; }
consume() { "$harness" consume --bootstrap "$bootstrap" --group-size 4 --timeout 60 "$@"; }
# ids of batch groups NAME consumed / produced, from its log
ids_of() { sed -n "s/.*\[rollout\] $2 group=\($3[0-9]*\) .*/\1/p" "$tmp/$1.log" | sort -u; }

# ---- 1. two replicas, garbage, too-long prompt ----------------------------------------
t=$(date +%s.%N)
start_replica r0
start_replica r1 --rollout.step_delay_ms 25
wait_log "$tmp/r0.log" "partitions assigned=2 " 1 30
wait_log "$tmp/r1.log" "partitions assigned=2 " 1 30
echo "two replicas up, 2 partitions each, in $(secs "$t") s"
"$harness" produce --bootstrap "$bootstrap" --first-id 1 --groups 12 --group-size 4 \
  --max-new-tokens 12 --tokenizer "$tokenizer" --garbage --too-long 600
t=$(date +%s.%N)
out=$(consume --expect 13 --expect-dlq 1) || fail "batch 1: $out"
echo "batch 1 (12 groups + too long + garbage) answered in $(secs "$t") s: $(echo "$out" |
  jq -c '{distinct, raw_results, duplicates, by_replica, finish, dlq, dlq_errors,
  lengths: .response_lengths[0]}')"
echo "$out" | jq -e '.finish.prompt_too_long == 4 and .dlq == 1 and .duplicates == 0
  and (.dlq_errors[0] | startswith("PARSE")) and .by_replica.r0 > 0 and .by_replica.r1 > 0' \
  >/dev/null || fail "batch 1 summary"

# ---- 2. kill -9 r1 while it holds groups ----------------------------------------------
"$harness" produce --bootstrap "$bootstrap" --first-id 101 --groups 16 --group-size 4 \
  --max-new-tokens 24 --tokenizer "$tokenizer"
wait_log "$tmp/r1.log" "consumed group=1[0-9][0-9] " 2 30
kill -KILL "$pid_r1"
wait "$pid_r1" 2>/dev/null || true
r1_held=$(comm -23 <(ids_of r1 consumed "1[0-9][0-9]") <(ids_of r1 produced "1[0-9][0-9]") | wc -l)
echo "r1 killed holding $r1_held unacknowledged groups of batch 2"
[ "$r1_held" -ge 1 ] || fail "r1 held nothing when killed (test did not exercise takeover)"
t=$(date +%s.%N)
out=$(consume --expect 29 --expect-dlq 1) || fail "after kill -9: $out"
echo "batch 2 complete $(secs "$t") s after the kill (session timeout 6 s): $(echo "$out" |
  jq -c '{distinct, raw_results, duplicates, duplicate_ids, by_replica}')"
took=$(count "$tmp/r0.log" "partitions assigned=4 ")
[ "$took" -ge 1 ] || fail "r0 never took all 4 partitions"

# ---- 3. SIGTERM r0 mid-batch, r2 answers the rest, r2 drained by rpc -------------------
set_out=$(rpc "$port_r0" set rollout.step_delay_ms 20) || fail "Rollout.Set: $set_out"
echo "$set_out" | jq -e '.new == "20"' >/dev/null || fail "Set reply $set_out"
"$harness" produce --bootstrap "$bootstrap" --first-id 201 --groups 12 --group-size 4 \
  --max-new-tokens 24 --tokenizer "$tokenizer"
wait_log "$tmp/r0.log" "consumed group=2[0-9][0-9] " 2 30
rpc "$port_r0" status | jq -e '.state == 2 and .slots_total == 4' >/dev/null || fail "status"
t=$(date +%s.%N)
kill -TERM "$pid_r0"
rc=0; wait "$pid_r0" || rc=$?
[ $rc -eq 0 ] || fail "r0 exited $rc after SIGTERM"
held=$(ids_of r0 consumed "2[0-9][0-9]")
lost=$(comm -23 <(echo "$held") <(ids_of r0 produced "2[0-9][0-9]"))
[ -z "$lost" ] || fail "r0 drained without producing groups $lost"
echo "r0 drained $(echo "$held" | wc -l) groups and exited 0 in $(secs "$t") s"
grep -q "drained: " "$tmp/r0.log" || fail "no drain line in r0.log"
"$stub" --port-file "$tmp/learner.addr" --token-file "$tmp/token" --model "$model" \
  --stats-file "$tmp/learner.json" --corrupt-first --announce-ipc --push-after-ms 300 --lifetime 100 \
  >"$tmp/stub.log" 2>&1 &
pids+=($!)
pid_stub=$!
for _ in $(seq 100); do [ -s "$tmp/learner.addr" ] && break; sleep 0.1; done
[ -s "$tmp/learner.addr" ] || fail "learner stub did not start"
start_replica r2 --learner.addr "$(cat "$tmp/learner.addr")"
out=$(consume --expect 41 --expect-dlq 1) || fail "after drain: $out"
echo "$out" | jq -e '[.duplicate_ids[] | select(. > 200)] | length == 0' >/dev/null ||
  fail "batch 3 answered twice: $out"
echo "$out" | jq -e '.lengths_equal and .invalid == 0' >/dev/null || fail "invalid results"
echo "all 40 groups + too-long answered: $(echo "$out" |
  jq -c '{distinct, raw_results, duplicates, by_replica, finish, dlq}')"

# ---- 4. weight sync: r2 registered, refused the corrupt stream, swapped to version 1 ----
t=$(date +%s.%N)
wait_log "$tmp/r2.log" "weights swapped version=1 " 1 30
grep -q "CRC-32C mismatch" "$tmp/r2.log" || fail "r2 accepted or never saw the corrupted stream"
grep -q "cuda ipc.*falling back to TCP" "$tmp/r2.log" || fail "r2 did not fall back from CUDA IPC to TCP"
echo "r2: corrupted stream refused, version 1 received and swapped: $(sed -n \
  's/.*\(weights received version=1 .*\)/\1/p' "$tmp/r2.log")"
"$harness" produce --bootstrap "$bootstrap" --first-id 301 --groups 4 --group-size 4 \
  --max-new-tokens 16 --tokenizer "$tokenizer"
out=$(consume --expect 45 --expect-dlq 1 --version-from 301 --version 1) ||
  fail "after the swap: $out"
echo "$out" | jq -e '.version_checked == 16' >/dev/null || fail "version check: $out"
echo "batch 4 answered at version 1 in $(secs "$t") s"
sleep 0.7 # one more heartbeat
jq -e '.registers >= 1 and .heartbeats >= 1 and .last_status_version == 1 and .weight_sends == 2
  and .replica == "r2"' "$tmp/learner.json" >/dev/null || fail "learner saw $(cat "$tmp/learner.json")"
rpc "$port_r2" status | jq -e '.groups_produced >= 4' >/dev/null || fail "r2 status"
rpc "$port_r2" drain | jq -e '.state == 5' >/dev/null || fail "Drain reply"
rc=0; wait "$pid_r2" || rc=$?
[ $rc -eq 0 ] || fail "r2 exited $rc after Rollout.Drain"
kill -TERM "$pid_stub"; wait "$pid_stub" || fail "learner stub exited $?"

# ---- 5. drain timeout: r3 (slow) is sent SIGTERM holding groups, gives up on them after
# 1 s and exits 0 without producing them; r4 answers them (they were never committed) ----
start_replica r3 --rollout.step_delay_ms 400 --rollout.drain_timeout_ms 1000
wait_log "$tmp/r3.log" "partitions assigned=4 " 1 30
"$harness" produce --bootstrap "$bootstrap" --first-id 401 --groups 4 --group-size 4 \
  --max-new-tokens 24 --tokenizer "$tokenizer"
wait_log "$tmp/r3.log" "consumed group=4[0-9][0-9] " 1 30
t=$(date +%s.%N)
kill -TERM "$pid_r3"
rc=0; wait "$pid_r3" || rc=$?
[ $rc -eq 0 ] || fail "r3 exited $rc after SIGTERM with a drain timeout"
grep -q "drain timeout: aborting" "$tmp/r3.log" || fail "r3 did not abort on its drain timeout"
took=$(secs "$t")
awk -v s="$took" 'BEGIN { exit !(s < 6) }' || fail "r3 took $took s to exit (drain timeout 1 s)"
[ -z "$(ids_of r3 produced "4[0-9][0-9]")" ] || fail "r3 produced groups though it was slowed to a crawl"
start_replica r4
out=$(consume --expect 49 --expect-dlq 1) || fail "after the drain timeout: $out"
echo "r3 aborted its groups at the 1 s drain timeout and exited 0 in $took s; r4 answered them"
rpc "$port_r4" drain | jq -e '.state == 5' >/dev/null || fail "r4 Drain reply"
rc=0; wait "$pid_r4" || rc=$?
[ $rc -eq 0 ] || fail "r4 exited $rc after Rollout.Drain"
lat=$(cat "$tmp"/r*.jsonl | jq -s 'map(.consumed_to_acked_us) | sort | .[length/2|floor] / 1000')
echo "median consumed->acked latency ${lat} ms over $(cat "$tmp"/r*.jsonl | wc -l) results"
echo "rollout daemon test passed in $(secs "$t_all") s"
