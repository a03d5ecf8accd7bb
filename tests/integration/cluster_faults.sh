#!/usr/bin/env bash
# Faults in a running cluster (issue 10): a real single-node Kafka broker, qrl-learner and
# two qrl-rollout replicas on stories260K (task `contains`, as learner_cluster.sh).
#   1. after the first update the broker is stopped and started again on the same ports
#      with its data folder kept: the daemons reconnect and training goes on;
#   2. one replica is killed with -9 while it holds groups: the other takes its
#      partitions and answers them;
#   3. at the end every dispatched group (ids 1..T*U) was trained exactly once or listed
#      dropped, versions went 1..U, and the learner exited 0.
# Whatever it started is stopped on every exit path.  Skips (77) without java or the
# Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" faults
need_kafka
t_all=$(date +%s.%N)

start_broker 4
bport=${bootstrap##*:}
cport=$(sed -n 's/^controller.quorum.voters=1@127.0.0.1://p' "$tmp/kafka/server.properties")
printf 'test-token-%s\n' "$$" >"$tmp/token"
: >"$tmp/data.jsonl"
names=(Lily Tom Sue Ben Max Mia) words=(the was and she he little girl boy day happy big play)
for i in $(seq 0 39); do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "${names[$((i % 6))]}" \
    "${words[$((i % 12))]}" >>"$tmp/data.jsonl"
done

T=4 U=6
QRL_LOG_LEVEL=info "$learner" --learner.model "$model" --learner.tokenizer "$tokenizer" \
  --dataset.chat_template none --dataset.task contains --learner.threads 1 \
  --dataset.path "$tmp/data.jsonl" --kafka.bootstrap "$bootstrap" --learner.group_size 4 \
  --learner.quota $T --learner.max_updates $U --learner.max_staleness 1 --learner.lr 1e-3 \
  --learner.seed 5 --sampling.max_new_tokens 32 --learner.heartbeat_interval_ms 300 \
  --kafka.session_timeout_ms 6000 --rpc.token_file "$tmp/token" \
  --metrics.jsonl "$tmp/learner.jsonl" >"$tmp/learner.log" 2>&1 &
pids+=($!)
pid_learner=$!
port=$(log_port "$tmp/learner.log")
for r in r0 r1; do
  QRL_LOG_LEVEL=info "$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" \
    --kafka.bootstrap "$bootstrap" --rollout.replica_id $r --rollout.slots 4 \
    --rollout.max_concurrency 2 --rollout.threads 1 --rollout.step_delay_ms 20 \
    --kafka.session_timeout_ms 6000 --rpc.token_file "$tmp/token" \
    --learner.addr "127.0.0.1:$port" >"$tmp/$r.log" 2>&1 &
  pids+=($!)
  eval "pid_$r=$!"
done

# ---- 1. broker stop / start with its data kept ------------------------------------------
wait_log "$tmp/learner.log" "update step=1 " 1 90
t=$(date +%s.%N)
"$kafka" stop --dir "$tmp/kafka" --timeout 30 >/dev/null 2>&1 || fail "broker stop"
sleep 2
"$kafka" start --dir "$tmp/kafka" --port "$bport" --controller-port "$cport" >/dev/null 2>&1 ||
  fail "broker restart on port $bport"
echo "broker stopped and restarted on $bootstrap in $(secs "$t") s (data kept)"
wait_log "$tmp/learner.log" "update step=3 " 1 120
echo "training went on after the restart: update 3 done $(secs "$t") s after the stop"

# ---- 2. kill -9 a replica that holds groups ---------------------------------------------
ids_of() { sed -n "s/.*\[rollout\] $2 group=\([0-9]*\) .*/\1/p" "$tmp/$1.log" | sort -u; }
held_now() { comm -23 <(ids_of r1 consumed) <(ids_of r1 produced) | wc -l; }
# kill it at a moment it holds groups (consumed, result not yet produced): freeze it
# (SIGSTOP), look, and kill it frozen, so it cannot finish them in between
end=$((SECONDS + 60))
while :; do
  [ $SECONDS -lt $end ] || fail "r1 never held a group for 60 s"
  kill -STOP "$pid_r1"
  [ "$(held_now)" -ge 1 ] && break
  kill -CONT "$pid_r1"
  sleep 0.1
done
kill -KILL "$pid_r1"
wait "$pid_r1" 2>/dev/null || true
t=$(date +%s.%N)
held=$(held_now)
[ "$held" -ge 1 ] || fail "r1 held no group when killed (the test did not exercise takeover)"
echo "r1 killed with -9 holding $held groups"

rc=0; timeout 150 tail --pid="$pid_learner" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "learner still running 150 s after the kill"
rc=0; wait "$pid_learner" || rc=$?
[ $rc -eq 0 ] || fail "learner exited $rc"
echo "r0 finished the run $(secs "$t") s after the kill"
m=$tmp/learner.jsonl
jq -s -e "map(.version) == [range(1; $U + 1)]" "$m" >/dev/null || fail "versions: $(jq -c -s 'map(.version)' "$m")"
jq -s -e "[.[].groups[]] | sort == [range(1; $T * $U + 1)]" "$m" >/dev/null ||
  fail "groups not trained exactly once: $(jq -c -s 'map(.groups)' "$m")"
jq -s -e "all(.[]; .groups_used + .groups_dropped == $T)" "$m" >/dev/null || fail "accounting: $(cat "$m")"
after=$(jq -s '[.[] | select(.step > 3)] | length' "$m")
[ "$after" -ge 1 ] || fail "no update after the replica was killed"
grep -q "partitions assigned=4 " "$tmp/r0.log" || fail "r0 never took r1's partitions"
echo "groups 1..$((T * U)) trained exactly once over versions 1..$U across a broker restart and a replica kill"
echo "cluster faults test passed in $(secs "$t_all") s"
