#!/usr/bin/env bash
# The operator's guide, run for real (docs/operations.md quotes its output): a namespace
# cluster as in netns.sh (three KRaft brokers, the learner with checkpoints, replicas r1, r2,
# TLS + token), then every qrlctl command of the guide from the ops host, printed as typed
# ("$ ...") with its output: status, replicas, metrics, /metrics, set, pause/resume, scale
# up, drain, checkpoint, a lost replica, a broker down, a learner upgrade (SIGTERM, new
# process with learner.resume auto) that is also a token rotation, and shutdown.  Paths of
# its temporary folder are printed as /etc/qrl.  Not a test tier script (no .sh): run it by
# hand as root:  BUILD=build tests/multihost/ops_transcript.bash >transcript.txt
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" ops
source tests/multihost/lib.bash
ctl=$build/bin/qrlctl
[ "$(id -u)" = 0 ] || { echo "needs root"; exit 77; }
need_kafka
ops_cleanup() {
  local rc=$?; trap - EXIT; set +e
  for p in "${pids[@]}"; do { kill -KILL "$p" && wait "$p"; } 2>/dev/null; done
  mh_teardown
  [ $rc -eq 0 ] || tail -n 20 "$tmp"/*.log
  [ "${QRL_KEEP_TMP:-0}" = 1 ] || rm -rf "$tmp"
  exit $rc
}
trap ops_cleanup EXIT
mh_net_init
L=$mh_net.20
for h in kafka1:11 kafka2:12 kafka3:13 learner:20 roll1:31 roll2:32 roll3:33 ops:100; do mh_host "${h%%:*}" "$mh_net.${h#*:}"; done
for h in learner:20 roll1:31 roll2:32 roll3:33; do mh_certs "${h%%:*}" "$mh_net.${h#*:}"; done
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/token"
for i in 1 2 3; do mh_kafka_start $i; done
for i in 1 2 3; do mh_kafka_wait $i; done
B=$(mh_bootstrap)
mh_exec ops "$kafka" create-topics --bootstrap "$B" --partitions 6 --replication-factor 3 >/dev/null 2>&1
names=(Lily Tom Sue Ben Max Mia) words=(the was and she he little girl boy day happy big play)
for i in $(seq 0 299); do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "${names[$((i % 6))]}" "${words[$((i % 12))]}"
done >"$tmp/data.jsonl"
start_learner() {
  QRL_LOG_LEVEL=info mh_spawn learner "$tmp/learner.log" "$learner" --learner.model "$model" \
    --learner.tokenizer "$tokenizer" --dataset.chat_template none --dataset.task contains \
    --learner.threads 1 --dataset.path "$tmp/data.jsonl" --kafka.bootstrap "$B" --learner.group_size 4 \
    --learner.quota 4 --learner.lr 1e-3 --learner.seed 5 --sampling.max_new_tokens 24 \
    --learner.heartbeat_interval_ms 300 --learner.heartbeat_timeout_ms 3000 --kafka.session_timeout_ms 6000 \
    --learner.checkpoint_dir "$tmp/checkpoints" --learner.checkpoint_every 5 --learner.resume auto \
    --rpc.listen "$L:7070" --weights.listen "$L:7071" --metrics.listen "$L:9400" \
    --rpc.token_file "$tmp/token" --rpc.tls_cert_file "$tmp/tls/learner.pem" \
    --rpc.tls_key_file "$tmp/tls/learner.key" --metrics.jsonl "$tmp/learner.jsonl"
  pids+=("$mh_pid"); pid_learner=$mh_pid
}
declare -A rpid
start_replica() {
  local n=$1 a=$mh_net.3$1
  QRL_LOG_LEVEL=info mh_spawn "roll$n" "$tmp/r$n.log" "$rollout" --rollout.model "$model" \
    --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$B" --rollout.replica_id "r$n" \
    --rollout.precision w8a8-int8 --rollout.kv_cache int4-protected --rollout.slots 4 \
    --rollout.max_concurrency 2 --rollout.threads 1 --rollout.step_delay_ms 40 \
    --kafka.session_timeout_ms 6000 --rpc.listen "$a:7080" --metrics.listen "$a:9401" \
    --rpc.token_file "$tmp/token" --rpc.tls_cert_file "$tmp/tls/roll$n.pem" --rpc.tls_key_file "$tmp/tls/roll$n.key" \
    --learner.addr "$L:7070" --learner.tls_ca_file "$tmp/tls/ca.pem" --metrics.jsonl "$tmp/r$n.jsonl"
  pids+=("$mh_pid"); rpid[r$n]=$mh_pid
}
steps() { wc -l <"$tmp/learner.jsonl" 2>/dev/null || echo 0; }
until_() { local end=$((SECONDS + $1)); until eval "$2"; do [ $SECONDS -lt $end ] || fail "timed out: $2"; sleep 0.3; done; }
show() { # CMD...: run on the ops host and print it as the operator typed it
  local line rc=0
  if [ "$1" = sh ] && [ "$2" = -c ]; then line=$3; else line=$(words "$@"); fi
  line=${line//$ctl/qrlctl}; line=${line//$tmp//etc/qrl}; line=${line//$root\//}; line=${line//$build\/bin\//}
  echo "\$ $line"
  mh_exec ops env QRL_LEARNER="$L:7070" QRL_RPC_TOKEN_FILE="$tmp/token" "$@" >"$tmp/out" 2>&1 || rc=$?
  sed "s|$tmp|/etc/qrl|g" "$tmp/out"
  [ $rc -eq 0 ] || echo "(exit $rc)"
  echo
}
words() { # the command line, quoted only where a shell needs it
  local w out=""
  for w in "$@"; do
    if [[ $w =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then out+="$w "; else out+="$(printf '%q' "$w") "; fi
  done
  echo "${out% }"
}
ca=(--tls-ca "$tmp/tls/ca.pem")
section() { printf '### %s\n\n' "$*"; }

start_learner; start_replica 1; start_replica 2
until_ 120 '[ "$(steps)" -ge 2 ]'
echo "(environment on the ops host: QRL_LEARNER=$L:7070 QRL_RPC_TOKEN_FILE=/etc/qrl/token)"
echo
section "status, replicas, metrics"
show "$ctl" "${ca[@]}" status
show "$ctl" "${ca[@]}" replicas
show "$ctl" "${ca[@]}" metrics
show sh -c "curl -s http://$L:9400/metrics | grep -E '^qrl_learner_(step|version|replicas|replicas_synced|groups_in_flight|groups_dispatched_total|duplicates_total|steps_skipped_total) '"
show sh -c "curl -s http://$mh_net.31:9401/metrics | grep -E '^qrl_rollout_(version|state|slots_in_use|tokens_per_second|groups_produced_total) '"
show "$ctl" "${ca[@]}" --json status
section "access: TLS and the token"
show env -u QRL_RPC_TOKEN_FILE "$ctl" "${ca[@]}" pause
show "$ctl" --timeout 3 status
section "set at run time"
show "$ctl" "${ca[@]}" set learner.lr=5e-4
show "$ctl" "${ca[@]}" set rollout.max_concurrency=1 r1
show "$ctl" "${ca[@]}" set rollout.kv_cache=int8 r1
show "$ctl" "${ca[@]}" set learner.quota=8
section "pause and resume"
show "$ctl" "${ca[@]}" pause
show "$ctl" "${ca[@]}" resume
show "$ctl" "${ca[@]}" pause r2
show "$ctl" "${ca[@]}" resume r2
section "scale up: a third replica"
start_replica 3
until_ 60 'grep -q "replica registered id=r3 " "$tmp/learner.log" && [ -s "$tmp/r3.jsonl" ]'
show "$ctl" "${ca[@]}" replicas
section "scale down: drain"
show "$ctl" "${ca[@]}" drain r3
until_ 90 '! kill -0 "${rpid[r3]}" 2>/dev/null'
wait "${rpid[r3]}" || fail "r3 exited $? after the drain"
echo "(r3 exited 0: $(grep -o 'drained: .*' "$tmp/r3.log"))"
echo
show "$ctl" "${ca[@]}" replicas
section "checkpoint"
show "$ctl" "${ca[@]}" checkpoint manual-1
show sh -c "ls $tmp/checkpoints; cat $tmp/checkpoints/latest"
section "a replica lost (kill -9 r2), started again"
kill -KILL "${rpid[r2]}"; wait "${rpid[r2]}" 2>/dev/null || true
until_ 30 'grep -q "replica r2 lost" "$tmp/learner.log"'
show "$ctl" "${ca[@]}" replicas
show "$ctl" "${ca[@]}" pause r2
start_replica 2
until_ 60 '[ "$(grep -c "replica registered id=r2 " "$tmp/learner.log")" -ge 2 ]'
sleep 1
show "$ctl" "${ca[@]}" replicas
section "a broker down (kill -9 kafka2), started again"
s0=$(steps); mh_kafka_kill 2
until_ 120 '[ "$(steps)" -ge $((s0 + 2)) ]'
echo "(updates $s0 -> $(steps) with broker 2 down)"
echo
show java -cp ".deps/kafka/libs/*" org.apache.kafka.tools.TopicCommand --bootstrap-server "$B" --describe --topic qrl.results
mh_kafka_start 2; mh_kafka_wait 2
section "upgrade the learner (and rotate the token): SIGTERM, a new process resumes"
s1=$(steps)
kill -TERM "$pid_learner"; wait "$pid_learner" || fail "learner exited $? on SIGTERM"
echo "(learner stopped at update $s1: $(grep -o 'checkpoint step=[0-9]* version=[0-9]*' "$tmp/learner.log" | tail -1))"
cp "$tmp/token" "$tmp/token.old"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/token"
start_learner
until_ 60 'grep -q "resumed from" "$tmp/learner.log"'
echo "($(grep -o 'resumed from .*' "$tmp/learner.log" | sed "s|$tmp|/etc/qrl|g" | cut -c1-160))"
echo
show "$ctl" "${ca[@]}" --token-file "$tmp/token.old" set learner.lr=1e-3
for r in r1 r2; do
  kill -TERM "${rpid[$r]}"; wait "${rpid[$r]}" || fail "$r exited $? on SIGTERM"; start_replica "${r#r}"
done
until_ 90 '[ "$(grep -c "replica registered id=r[12] " <(sed -n "/resumed from/,\$p" "$tmp/learner.log"))" -ge 2 ] && [ "$(steps)" -ge $((s1 + 2)) ]'
show "$ctl" "${ca[@]}" status
section "shutdown"
show "$ctl" "${ca[@]}" shutdown --checkpoint
wait "$pid_learner" || fail "learner exited $?"
for r in r1 r2; do wait "${rpid[$r]}" || fail "$r exited $?"; done
show "$learner" export --checkpoint "$tmp/checkpoints" --out "$tmp/export"
show sh -c "ls $tmp/export"
m=$tmp/learner.jsonl
echo "(after shutdown: $(steps) updates, versions $(jq -s -c 'map(.version) | [first, last]' "$m"), $(jq -s '[.[].groups[]] | length' "$m") groups trained, $(jq -s '[.[].groups[]] | length - (unique | length)' "$m") of them twice)"
