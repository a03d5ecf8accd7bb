#!/usr/bin/env bash
# Control never starves (docs/rollout-daemon.md "Threads"): a weight transfer far longer
# than the learner's heartbeat timeout must not make the learner take the replica for lost.
# A real Kafka broker, qrl-learner with learner.heartbeat_timeout_ms = 1500 and
# weights.tcp_throttle_ms (fault injection: a sleep before every 64 KiB bucket, so version
# 1 of stories260K takes > 3 x the timeout over TCP), one CPU replica:
#   - the replica receives version 1 (its `weights received` line says ms >= 3 x 1500)
#     and its engine swaps it in;
#   - meanwhile it kept heartbeating: the learner never logs it lost, it registered once,
#     and the replica never logs "the learner forgot this replica";
#   - SIGTERM while a later version may be streaming: the replica exits 0.
# Whatever it started is stopped on every exit path.  Skips (77) without java or the
# Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" weights-slow
t_all=$(date +%s.%N)
timeout_ms=1500
need_kafka

start_broker 2
echo "broker at $bootstrap with topics in $(secs "$t_all") s"
printf 'test-token-%s\n' "$$" >"$tmp/token"
: >"$tmp/data.jsonl"
for w in the was and she he little; do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "$w" "$w" >>"$tmp/data.jsonl"
done

QRL_LOG_LEVEL=info "$learner" --learner.model "$model" --learner.tokenizer "$tokenizer" \
  --dataset.path "$tmp/data.jsonl" --dataset.chat_template none --dataset.task contains \
  --learner.threads 1 --kafka.bootstrap "$bootstrap" --learner.group_size 2 --learner.quota 2 \
  --learner.max_staleness 0 --learner.lr 1e-3 --learner.seed 3 --sampling.max_new_tokens 8 \
  --learner.heartbeat_interval_ms 300 --learner.heartbeat_timeout_ms $timeout_ms \
  --weights.bucket_bytes 65536 --weights.tcp_throttle_ms 700 \
  --rpc.token_file "$tmp/token" >"$tmp/learner.log" 2>&1 &
pids+=($!)
pid_learner=$!
port=$(log_port "$tmp/learner.log")
"$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$bootstrap" \
  --rollout.replica_id r0 --rollout.slots 4 --rollout.max_concurrency 2 --rollout.threads 1 \
  --rollout.step_delay_ms 100 --kafka.session_timeout_ms 6000 --rpc.token_file "$tmp/token" \
  --learner.addr "127.0.0.1:$port" >"$tmp/r0.log" 2>&1 &
pids+=($!)
pid_r0=$!

t=$(date +%s.%N)
wait_log "$tmp/learner.log" "update step=1 " 1 40
echo "update 1 after $(secs "$t") s; version 1 streaming at 700 ms per 64 KiB bucket"
wait_log "$tmp/r0.log" "weights received version=1 " 1 40
wait_log "$tmp/r0.log" "weights swapped version=1 " 1 10
line=$(grep -m1 "weights received version=1 " "$tmp/r0.log")
ms=$(sed -n 's/.* ms=\([0-9.]*\).*/\1/p' <<<"$line")
echo "replica: ${line#*\[control\] }"
awk -v ms="$ms" -v lim=$((3 * timeout_ms)) 'BEGIN { exit !(ms >= lim) }' ||
  fail "the transfer took $ms ms, not >= 3 x the $timeout_ms ms heartbeat timeout: the test proves nothing"
sleep 1 # heartbeats after the transfer: a forgotten replica would hear known=false now

if grep -E "replica r0 (lost|drained and gone)" "$tmp/learner.log"; then
  fail "the learner took r0 for lost during a ${ms} ms transfer"
fi
if grep "forgot this replica" "$tmp/r0.log"; then fail "r0 had to register again"; fi
n=$(count "$tmp/learner.log" "replica registered id=r0 ")
[ "$n" -eq 1 ] || fail "r0 registered $n times"
grep -q "heartbeat:" "$tmp/r0.log" && fail "a heartbeat failed: $(grep -m1 'heartbeat:' "$tmp/r0.log")"
echo "the learner kept r0 (registered once, never lost) through a $ms ms transfer; timeout $timeout_ms ms"

t=$(date +%s.%N)
kill -TERM "$pid_r0"
rc=0; timeout 30 tail --pid="$pid_r0" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "r0 still running 30 s after SIGTERM"
rc=0; wait "$pid_r0" || rc=$?
[ $rc -eq 0 ] || fail "r0 exited $rc after SIGTERM"
echo "r0 stopped (exit 0) $(secs "$t") s after SIGTERM (a stream in progress ends first)"
kill -TERM "$pid_learner"
rc=0; timeout 30 tail --pid="$pid_learner" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "learner still running 30 s after SIGTERM"
rc=0; wait "$pid_learner" || rc=$?
[ $rc -eq 0 ] || fail "learner exited $rc"
echo "weights slow-transfer test passed in $(secs "$t_all") s"
