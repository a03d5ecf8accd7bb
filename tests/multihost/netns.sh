#!/usr/bin/env bash
# Multi-host qrl on one machine (issue 21; make test-long): every host is a network
# namespace joined to the others by a veth pair and a bridge (tests/multihost/lib.bash),
# with its own address on 10.213.0.0/24:
#   kafka1..3  .11-.13  a three-node KRaft quorum (broker + controller each; replication
#                       factor 3, min.insync.replicas 2 for the qrl topics and __consumer_offsets)
#   learner    .20      qrl-learner: control 7070 (TLS + token), weights 7071, metrics 9400
#   roll1..3   .31-.33  qrl-rollout r1..r3: control 7080 (TLS + token), metrics 9401
#   roll4      .34      added mid-run (scale up)
#   ops        .100     where qrlctl, curl and Kafka's tools run
# Every daemon binds its host's address (checked with ss: no loopback or wildcard
# listener); TLS certificates come from a CA made here with openssl.  During training:
#   1. scale: roll4 is plugged in and r4 started: it registers, receives the current
#      weights, takes partitions in the consumer group's rebalance and produces results;
#   2. drain: `qrlctl drain r1`: r1 finishes its groups and exits 0, its partitions move;
#   3. link cut: roll2's bridge port goes down past the heartbeat timeout (3 s) and the
#      Kafka session timeout (6 s): the learner drops r2, the others take its partitions
#      and answer its uncommitted groups; the port comes back up and r2 rejoins;
#   4. kill -9 the broker leading most qrl partitions: producers and consumers carry on
#      through the leader change (training goes on); restarted, it rejoins every ISR;
#   5. the learner stops at max_updates: every dispatched group (ids 1..T*U) was trained
#      exactly once or listed as dropped (counted by id in learner.jsonl, and the
#      learner's /metrics dispatch counter agrees), versions 1..U in order.
# Prints the timings (register, weights, rebalance, drop, rejoin, leader change).
# Everything it started is killed and every namespace deleted on every exit path.
# Skips (77) without root, without working `ip netns`, or without java / the Kafka jars
# (unless QRL_REQUIRE_KAFKA=1).  QRL_MH_UPDATES (U, default 45), QRL_KEEP_TMP=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" multihost
source tests/multihost/lib.bash
ctl=$build/bin/qrlctl
t_all=$(date +%s.%N)
[ "$(id -u)" = 0 ] || { echo "skipped: needs root for ip netns"; exit 77; }
need_kafka
for t in jq openssl curl unshare ss; do command -v $t >/dev/null || fail "$t missing (deploy/setup.sh)"; done
[ -x "$ctl" ] || fail "$ctl is not built"

mh_cleanup() {
  local rc=$?
  trap - EXIT
  set +e
  for p in "${pids[@]}"; do { kill -KILL "$p" && wait "$p"; } 2>/dev/null || true; done
  mh_teardown
  if [ $rc -ne 0 ]; then
    for l in "$tmp"/*.log "$tmp"/kafka*.out; do
      [ -f "$l" ] && { echo "--- last lines of $l:"; grep -v ' DEBUG ' "$l" | tail -n 25; }
    done
  fi
  [ "${QRL_KEEP_TMP:-0}" = 1 ] || rm -rf "$tmp"
  exit $rc
}
trap mh_cleanup EXIT
mh_net_init 2>"$tmp/netns.err" || { echo "skipped: ip netns does not work here: $(cat "$tmp/netns.err")"; exit 77; }

T=4 G=4 U=${QRL_MH_UPDATES:-45} P=6
L=$mh_net.20
now_ms() { date +%s%3N; }
# ms timestamp of the first line of FILE matching PATTERN logged at or after AFTER_MS
# (log lines start with an ISO-8601 UTC time in ms, which sorts as text)
log_ms() {
  local iso ts
  iso=$(date -u -d "@$(awk -v m="$3" 'BEGIN { printf "%.3f", m / 1000 }')" +%Y-%m-%dT%H:%M:%S.%3NZ)
  ts=$(grep -a -- "$2" "$1" 2>/dev/null | awk -v t="$iso" '$1 >= t { print $1; exit }')
  [ -n "$ts" ] && date -d "$ts" +%s%3N
}
# wait_for SECONDS WHAT 'CMD': evaluate CMD every 0.2 s until it succeeds
wait_for() {
  local end=$((SECONDS + $1))
  until eval "$3" >/dev/null; do [ $SECONDS -lt $end ] || fail "timed out ($1 s) waiting for $2"; sleep 0.2; done
}
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 1000 }'; }
q() { mh_exec ops "$ctl" --learner "$L:7070" --tls-ca "$tmp/tls/ca.pem" --token-file "$tmp/token" "$@"; }
steps() { wc -l <"$tmp/learner.jsonl" 2>/dev/null || echo 0; }
assigned() { # REPLICA: partitions it holds, from its last "partitions assigned" line
  local v; v=$(sed -n 's/.*partitions assigned=\([0-9]*\) .*/\1/p' "$tmp/$1.log" 2>/dev/null | tail -1); echo "${v:-0}"
}
assigned_sum() { local s=0 r; for r in "$@"; do s=$((s + $(assigned "$r"))); done; [ $s -eq $P ]; }
ids_of() { sed -n "s/.*\[rollout\] $2 group=\([0-9]*\) .*/\1/p" "$tmp/$1.log" | sort -u; }

# ---- 1. the hosts ----------------------------------------------------------------------------
t=$(date +%s.%N)
for h in kafka1:11 kafka2:12 kafka3:13 learner:20 roll1:31 roll2:32 roll3:33 ops:100; do
  mh_host "${h%%:*}" "$mh_net.${h#*:}"
done
for h in learner:20 roll1:31 roll2:32 roll3:33 roll4:34; do
  mh_certs "${h%%:*}" "$mh_net.${h#*:}" || fail "openssl could not make the certificates"
done
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/token"
chmod 600 "$tmp/token"
[ -z "$(ip -o addr show | grep "$mh_net\.")" ] || fail "an address of $mh_net.0/24 is in the test's own namespace"
echo "8 hosts (network namespaces $mh_tag-*) on one bridge, CA and 5 host certificates in $(secs "$t") s"

# ---- 2. the Kafka quorum -----------------------------------------------------------------------
t=$(date +%s.%N)
for i in 1 2 3; do mh_kafka_start $i; done
for i in 1 2 3; do mh_kafka_wait $i || fail "broker $i did not start"; done
B=$(mh_bootstrap)
mh_exec ops "$kafka" create-topics --bootstrap "$B" --partitions $P --replication-factor 3 \
  >"$tmp/topics.out" 2>&1 || { cat "$tmp/topics.out"; fail "creating the topics"; }
echo "3 brokers serving and topics created (RF 3, $P partitions) in $(secs "$t") s"
mh_kjava org.apache.kafka.tools.TopicCommand --bootstrap-server "$B" --describe \
  --topic 'qrl\..*' >"$tmp/describe0.txt" || fail "TopicCommand --describe"
n_rf3=$(grep -cE 'Partition: [0-9]+.*Replicas: [1-3],[1-3],[1-3]\s+Isr: [1-3],[1-3],[1-3]' "$tmp/describe0.txt" || true)
[ "$n_rf3" -eq $((4 * P)) ] || { cat "$tmp/describe0.txt"; fail "$n_rf3 of $((4 * P)) partitions have 3 replicas in sync"; }
n_cfg=$(grep -cE '^Topic: qrl\.[a-z]+\s.*ReplicationFactor: 3\s.*Configs: .*min\.insync\.replicas=2' "$tmp/describe0.txt" || true)
[ "$n_cfg" -eq 4 ] || { cat "$tmp/describe0.txt"; fail "$n_cfg of 4 qrl topics have replication 3 and min.insync.replicas=2"; }
echo "the 4 qrl topics: replication factor 3, min.insync.replicas=2, every partition 3 in sync"

# ---- 3. learner and replicas -----------------------------------------------------------------
names=(Lily Tom Sue Ben Max Mia) words=(the was and she he little girl boy day happy big play)
: >"$tmp/data.jsonl"
for i in $(seq 0 299); do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "${names[$((i % 6))]}" \
    "${words[$((i % 12))]}" >>"$tmp/data.jsonl"
done
tls() { echo --rpc.tls_cert_file "$tmp/tls/$1.pem" --rpc.tls_key_file "$tmp/tls/$1.key"; }
# shellcheck disable=SC2046
QRL_LOG_LEVEL=info mh_spawn learner "$tmp/learner.log" "$learner" --learner.model "$model" \
  --learner.tokenizer "$tokenizer" --dataset.chat_template none --dataset.task contains \
  --learner.threads 1 --dataset.path "$tmp/data.jsonl" --kafka.bootstrap "$B" \
  --learner.group_size $G --learner.quota $T --learner.max_updates "$U" --learner.max_staleness 1 \
  --learner.lr 1e-3 --learner.seed 21 --sampling.max_new_tokens 24 \
  --learner.heartbeat_interval_ms 300 --learner.heartbeat_timeout_ms 3000 \
  --kafka.session_timeout_ms 6000 --rpc.listen "$L:7070" --weights.listen "$L:7071" \
  --metrics.listen "$L:9400" --rpc.token_file "$tmp/token" $(tls learner) \
  --metrics.jsonl "$tmp/learner.jsonl"
pids+=("$mh_pid"); pid_learner=$mh_pid
declare -A rpid
# the replicas are throttled (rollout.step_delay_ms, changed at run time with qrlctl set)
# so that the U updates outlast the scenarios; pace slows them further if a fast machine
# gets too close to U, and after the scenarios they run at full speed
step_delay=${QRL_MH_STEP_DELAY_MS:-40}
pace() { # REPLICA...
  [ "$(steps)" -ge $((U - 20)) ] || return 0
  step_delay=300
  for r in "$@"; do q set "rollout.step_delay_ms=$step_delay" "$r" >/dev/null || fail "qrlctl set on $r"; done
  echo "(pace: update $(steps) of $U: the replicas slowed to rollout.step_delay_ms $step_delay)"
}
start_replica() { # N: replica rN on host rollN
  local n=$1 a=$mh_net.3$1
  # shellcheck disable=SC2046
  QRL_LOG_LEVEL=info mh_spawn "roll$n" "$tmp/r$n.log" "$rollout" --rollout.model "$model" \
    --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$B" --rollout.replica_id "r$n" \
    --rollout.precision w8a8-int8 --rollout.kv_cache int4-protected --rollout.slots 4 \
    --rollout.max_concurrency 2 --rollout.threads 1 --rollout.step_delay_ms "$step_delay" \
    --kafka.session_timeout_ms 6000 --rpc.listen "$a:7080" --metrics.listen "$a:9401" \
    --rpc.token_file "$tmp/token" $(tls "roll$n") --learner.addr "$L:7070" \
    --learner.tls_ca_file "$tmp/tls/ca.pem" --metrics.jsonl "$tmp/r$n.jsonl"
  pids+=("$mh_pid"); rpid[r$n]=$mh_pid
}
t=$(date +%s.%N)
for n in 1 2 3; do start_replica $n; done
wait_for 90 "3 replicas registered" 'test "$(count "$tmp/learner.log" "replica registered id=")" -ge 3'
wait_for 120 "the first update" 'test "$(steps)" -ge 1'
echo "learner + 3 replicas up, first update after $(secs "$t") s"
# every listener on the host's address
# (gRPC binds an IPv4 address on a dual-stack socket: [::ffff:A]:P is A:P)
listeners() { mh_exec "$1" ss -Hltn | awk '{ print $4 }' | sed 's/^\[::ffff:\(.*\)\]:/\1:/' | sort | tr '\n' ' '; }
l_ln=$(listeners learner)
[ "$l_ln" = "$L:7070 $L:7071 $L:9400 " ] || fail "learner listeners: $l_ln"
for n in 1 2 3; do
  l_rn=$(listeners "roll$n")
  [ "$l_rn" = "$mh_net.3$n:7080 $mh_net.3$n:9401 " ] || fail "r$n listeners: $l_rn"
done
echo "listeners: learner $l_ln; r1 $(listeners roll1)(no loopback, no wildcard)"
q status >"$tmp/status0.txt" || fail "qrlctl status over TLS"
grep -qE "^r1 +roll1 +cpu +w8a8-int8 +int4-protected +RUNNING" "$tmp/status0.txt" || fail "status: $(cat "$tmp/status0.txt")"
rc=0; mh_exec ops "$ctl" --learner "$L:7070" --timeout 3 status >/dev/null 2>&1 || rc=$?
[ $rc -eq 3 ] || fail "a plaintext qrlctl got exit $rc from the TLS learner (want 3)"
rc=0; mh_exec ops "$ctl" --learner "$L:7070" --tls-ca "$tmp/tls/ca.pem" pause >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "qrlctl pause without the token: exit $rc (want 2)"
# the learner's metrics, scraped from ops every second until it stops
( while kill -0 "$pid_learner" 2>/dev/null; do
    mh_exec ops curl -sf --max-time 2 "http://$L:9400/metrics" >"$tmp/metrics.new" 2>/dev/null &&
      mv -f "$tmp/metrics.new" "$tmp/metrics.last"
    sleep 1
  done ) &
pid_scrape=$!
pids+=($!)
metric() { awk -v k="$1" '$1 == k { print $2 }' "$tmp/metrics.last"; }

# ---- 4. scale up: a fourth host and replica mid-run ---------------------------------------
wait_for 120 "update 2" 'test "$(steps)" -ge 2'
mh_host roll4 "$mh_net.34"
t_scale=$(now_ms) v_scale=$(jq -s 'last.version' "$tmp/learner.jsonl")
start_replica 4
wait_for 60 "r4 registered" 'log_ms "$tmp/learner.log" "replica registered id=r4 " "$t_scale"'
t_reg=$(log_ms "$tmp/learner.log" "replica registered id=r4 " "$t_scale")
wait_for 60 "r4 received weights" 'log_ms "$tmp/r4.log" "weights received version=" "$t_scale"'
t_w=$(log_ms "$tmp/r4.log" "weights received version=" "$t_scale")
v_w=$(sed -n 's/.*weights received version=\([0-9]*\) .*/\1/p' "$tmp/r4.log" | head -1)
[ "$v_w" -ge "$v_scale" ] || fail "r4 received version $v_w, older than the $v_scale current when it started"
wait_for 60 "r4 assigned partitions" 'test "$(assigned r4)" -ge 1'
t_asg=$(log_ms "$tmp/r4.log" "partitions assigned=[1-9]" "$t_scale")
wait_for 60 "r4's first result" 'test -s "$tmp/r4.jsonl"'
t_first=$(jq -s 'first.unix_ms' "$tmp/r4.jsonl")
echo "scale: r4 registered $(since "$t_scale" "$t_reg") s after its start, weights v$v_w (current v$v_scale)" \
  "after $(since "$t_scale" "$t_w") s, partitions after $(since "$t_scale" "$t_asg") s, first result after $(since "$t_scale" "$t_first") s"
q replicas >"$tmp/replicas4.txt"
[ "$(grep -cE '^r[1-4] .* RUNNING ' "$tmp/replicas4.txt")" -eq 4 ] || fail "not 4 RUNNING replicas: $(cat "$tmp/replicas4.txt")"

pace r1 r2 r3 r4

# ---- 5. drain r1 with qrlctl --------------------------------------------------------------
t_d=$(now_ms)
q drain r1 >"$tmp/drain.txt" || fail "qrlctl drain r1: $(cat "$tmp/drain.txt")"
grep -q "^r1: DRAINING" "$tmp/drain.txt" || fail "drain said: $(cat "$tmp/drain.txt")"
rc=0; timeout 90 tail --pid="${rpid[r1]}" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "r1 still running 90 s after the drain"
rc=0; wait "${rpid[r1]}" || rc=$?
[ $rc -eq 0 ] || fail "r1 exited $rc after the drain"
t_dx=$(now_ms)
wait_for 60 "r2..r4 holding all $P partitions" 'assigned_sum r2 r3 r4'
t_dr=$(now_ms)
echo "drain: r1 exited 0 after $(since "$t_d" "$t_dx") s ($(sed -n 's/.*drained: \(produced=[0-9]*\).*/\1/p' "$tmp/r1.log")), r2..r4 held all $P partitions after $(since "$t_d" "$t_dr") s"

pace r2 r3 r4

# ---- 6. cut roll2's link past the heartbeat and session timeouts ---------------------------
updates_after() { jq -s --argjson t "$1" '[.[] | select(.unix_ms > $t)] | length' "$tmp/learner.jsonl"; }
wait_for 60 "an update after the drain" '[ "$(updates_after "$t_dx")" -ge 1 ]'
# cut while r2 holds groups (consumed, no result yet), so that others must answer them
end=$((SECONDS + 60))
while :; do
  [ $SECONDS -lt $end ] || fail "r2 held no group for 60 s"
  held=$(comm -23 <(ids_of r2 consumed) <(ids_of r2 produced) | tr '\n' ' ')
  [ -n "$held" ] && { t_cut=$(now_ms); mh_link down roll2; break; }
  sleep 0.05
done
held=$(comm -23 <(ids_of r2 consumed) <(ids_of r2 produced) | tr '\n' ' ')
wait_for 30 "r2 dropped by the learner" 'log_ms "$tmp/learner.log" "replica r2 lost" "$t_cut"'
t_lost=$(log_ms "$tmp/learner.log" "replica r2 lost" "$t_cut")
q replicas >"$tmp/replicas-cut.txt" || true
grep -qE '^r2 .* LOST ' "$tmp/replicas-cut.txt" || fail "r2 not LOST: $(cat "$tmp/replicas-cut.txt")"
wait_for 60 "r3, r4 holding all $P partitions" 'assigned_sum r3 r4'
t_cr=$(now_ms)
t_restore=$(now_ms)
mh_link up roll2
wait_for 60 "r2 registered again" 'log_ms "$tmp/learner.log" "replica registered id=r2 " "$t_restore"'
t_rej=$(log_ms "$tmp/learner.log" "replica registered id=r2 " "$t_restore")
r2_result_after() { jq -s -e --argjson t "$t_restore" 'any(.[]; .unix_ms > $t)' "$tmp/r2.jsonl" >/dev/null; }
wait_for 90 "a result of r2 after the restore" 'r2_result_after'
t_rk=$(jq -s --argjson t "$t_restore" '[.[] | select(.unix_ms > $t)] | first.unix_ms' "$tmp/r2.jsonl")
echo "link cut: r2 held groups [ $held] at the cut; LOST after $(since "$t_cut" "$t_lost") s," \
  "its partitions with r3+r4 after $(since "$t_cut" "$t_cr") s; link up after $(since "$t_cut" "$t_restore") s:" \
  "registered again after $(since "$t_restore" "$t_rej") s, its first new result after $(since "$t_restore" "$t_rk") s"

pace r2 r3 r4

# ---- 7. kill -9 a broker ----------------------------------------------------------------------
mh_kjava org.apache.kafka.tools.TopicCommand --bootstrap-server "$B" --describe \
  --topic 'qrl\.(prompts|results)' >"$tmp/describe1.txt" || fail "TopicCommand --describe"
victim=$(sed -n 's/.*Leader: \([0-9]*\).*/\1/p' "$tmp/describe1.txt" | sort | uniq -c | sort -k1,1nr -k2,2n | awk 'NR == 1 { print $2 }')
n_led=$(grep -c "Leader: $victim" "$tmp/describe1.txt")
s_k=$(steps) t_k=$(now_ms)
mh_kafka_kill "$victim"
produced_after() { local r; for r in r2 r3 r4; do log_ms "$tmp/$r.log" "produced group=" "$t_k" || true; done | sort -n | head -1; }
wait_for 120 "a result produced after the kill" 'test -n "$(produced_after)"'
t_kp=$(produced_after)
wait_for 180 "2 updates after the kill" 'test "$(steps)" -ge $((s_k + 2))'
t_ku=$(jq -s --argjson s "$s_k" '.[$s].unix_ms' "$tmp/learner.jsonl")
t_ku2=$(now_ms)
echo "broker $victim (leader of $n_led of $((2 * P)) prompts/results partitions) killed -9 at update $s_k:" \
  "first result produced $(since "$t_k" "$t_kp") s after, next update $(since "$t_k" "$t_ku") s after, 2 updates by $(since "$t_k" "$t_ku2") s"
led_by_others() {
  mh_kjava org.apache.kafka.tools.TopicCommand --bootstrap-server "$B" --describe \
    --topic 'qrl\.(prompts|results)' >"$tmp/describe2.txt" || return 1
  ! grep -q "Leader: $victim" "$tmp/describe2.txt"
}
wait_for 60 "every partition led by another broker than $victim" 'led_by_others'
t_kr=$(now_ms)
mh_kafka_start "$victim"; mh_kafka_wait "$victim" || fail "broker $victim did not restart"
t_ks=$(now_ms)
isr_full() {
  mh_kjava org.apache.kafka.tools.TopicCommand --bootstrap-server "$B" --describe \
    --under-replicated-partitions >"$tmp/urp.txt" || return 1
  [ ! -s "$tmp/urp.txt" ]
}
wait_for 120 "broker $victim back in every ISR" 'isr_full'
t_ki=$(now_ms)
echo "broker $victim restarted after $(since "$t_k" "$t_kr") s down: serving after $(since "$t_kr" "$t_ks") s," \
  "every partition fully in sync after $(since "$t_kr" "$t_ki") s"
s_end=$(steps)
[ "$s_end" -lt "$U" ] || fail "the run ended (update $s_end of $U) before the scenarios did: raise QRL_MH_UPDATES"
for r in r2 r3 r4; do q set rollout.step_delay_ms=0 "$r" >"$tmp/set-$r.txt" || fail "qrlctl set on $r"; done
echo "scenarios done at update $s_end of $U; $(cat "$tmp/set-r2.txt") (and r3, r4): full speed to the end"

# ---- 8. the end: max_updates ---------------------------------------------------------------
rc=0; timeout 300 tail --pid="$pid_learner" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "learner still running 300 s after the scenarios"
rc=0; wait "$pid_learner" || rc=$?
[ $rc -eq 0 ] || fail "learner exited $rc"
for r in r2 r3 r4; do
  rc=0; timeout 60 tail --pid="${rpid[$r]}" -f /dev/null || rc=$?
  [ $rc -eq 0 ] || fail "$r did not stop after the learner's SHUTDOWN"
  rc=0; wait "${rpid[$r]}" || rc=$?
  [ $rc -eq 0 ] || fail "$r exited $rc"
done
m=$tmp/learner.jsonl
jq -s -e "map(.version) == [range(1; $U + 1)] and map(.step) == [range(1; $U + 1)]" "$m" >/dev/null ||
  fail "versions: $(jq -c -s 'map(.version)' "$m")"
jq -s -e '[.[].unix_ms] as $t | all(range(1; $t | length); $t[.] >= $t[. - 1])' "$m" >/dev/null || fail "update times out of order"
jq -s -e "[.[].groups[]] | sort == [range(1; $T * $U + 1)]" "$m" >/dev/null ||
  fail "groups not trained exactly once: $(jq -c -s '[.[].groups[]] | group_by(.) | map(select(length > 1) | .[0])' "$m") twice, missing $(jq -c -s "[range(1; $T * $U + 1)] - [.[].groups[]]" "$m")"
jq -s -e "all(.[]; (.dropped | length) == .groups_dropped and .groups_used + .groups_dropped == $T
  and ((.dropped - .groups) | length) == 0)" "$m" >/dev/null || fail "dropped accounting: $(cat "$m")"
stop_line=$(grep -a "stopping: step=" "$tmp/learner.log" | tail -1)
disp=$(sed -n 's/.* dispatched=\([0-9]*\) .*/\1/p' <<<"$stop_line")
[ "$disp" -eq $((T * U)) ] || fail "learner dispatched $disp groups, trained $((T * U))"
[ "$(metric qrl_learner_groups_dispatched_total)" = $((T * U)) ] ||
  fail "/metrics says $(metric qrl_learner_groups_dispatched_total) dispatched (want $((T * U)))"
trained() { jq -s -e --argjson g "$1" 'any(.[].groups[]; . == $g)' "$m" >/dev/null; }
answered_by_others=0
for g in $held; do
  trained "$g" || fail "group $g (held by r2 at the cut) never trained"
  jq -s -e --argjson g "$g" 'any(.[]; .group_id == $g)' "$tmp/r3.jsonl" "$tmp/r4.jsonl" >/dev/null &&
    answered_by_others=$((answered_by_others + 1))
done
[ "$answered_by_others" -ge 1 ] || fail "none of r2's held groups [ $held] was answered by r3/r4"
r4_groups=$(jq -s 'length' "$tmp/r4.jsonl")
dups=$(count "$tmp/learner.log" "ignored: duplicate")
for g in $(jq -r .group_id "$tmp/r4.jsonl" "$tmp/r1.jsonl"); do trained "$g" || fail "group $g produced by r4/r1 never trained"; done
kill "$pid_scrape" 2>/dev/null || true; wait "$pid_scrape" 2>/dev/null || true
gap=$(jq -s '[.[].unix_ms] as $t | [range(1; $t | length) | $t[.] - $t[. - 1]] | max / 1000' "$m")
mh_teardown
left=$(ip netns list | grep -c "^$mh_tag-" || true)
[ "$left" -eq 0 ] || fail "$left namespaces left"
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && fail "pid $p still alive"; done
echo "end: $U updates, versions 1..$U in order (longest gap between updates ${gap} s);" \
  "groups 1..$((T * U)) each trained exactly once ($(jq -s '[.[].groups_dropped] | add' "$m") of them listed dropped by dynamic sampling);" \
  "learner $(sed 's/.*stopping: //' <<<"$stop_line") (late answers dropped by id: $dups)"
echo "r4 (scaled in) produced $r4_groups results; $answered_by_others of r2's ${held:+$(wc -w <<<"$held")} held groups answered by r3/r4;" \
  "per replica results: $(for r in r1 r2 r3 r4; do printf '%s=%s ' $r "$(wc -l <"$tmp/$r.jsonl")"; done)"
echo "namespaces removed, nothing left running; multihost netns test passed in $(secs "$t_all") s"
