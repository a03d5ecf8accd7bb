#!/usr/bin/env bash
# Soak (make test-long; issue 10): a real Kafka broker, qrl-learner and 3 qrl-rollout
# replicas on stories260K run for QRL_SOAK_MINUTES (default 30); every
# QRL_SOAK_RESTART_MINUTES (default 5) one replica (round robin) is sent SIGTERM and
# started again.  Every 10 s the RSS of every daemon is sampled.  Passes when:
#   - no group is lost: no id is trained twice, and every id below the highest trained one
#     was trained, except those still in flight when the learner stopped (the last
#     window: at most T x (1 + max_staleness) = 16, all within 32 of the highest);
#   - the RSS of every daemon after warm-up grows < 5% (each daemon incarnation: from the
#     sample a third into its life to its last sample);
#   - the learner exits 0 when told to stop (SIGTERM) and the replicas drain.
# Prints a table: per daemon RSS at warm-up / end and growth; updates and groups done.
# QRL_KEEP_TMP=1 keeps the run folder (logs, rss.tsv).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" soak
minutes=${QRL_SOAK_MINUTES:-30}
duration=$(awk -v m="$minutes" 'BEGIN { print int(m * 60) }')
restart_every=$(awk -v m="${QRL_SOAK_RESTART_MINUTES:-5}" 'BEGIN { print int(m * 60) }')
rss_kb() { local v; v=$(awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null); echo "${v:-0}"; }
need_kafka
start_broker 6
printf 'soak-token-%s\n' "$$" >"$tmp/token"
: >"$tmp/data.jsonl"
names=(Lily Tom Sue Ben Max Mia) words=(the was and she he little girl boy day happy big play)
for i in $(seq 0 299); do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "${names[$((i % 6))]}" \
    "${words[$((i % 12))]}" >>"$tmp/data.jsonl"
done
"$learner" --learner.model "$model" --learner.tokenizer "$tokenizer" --dataset.chat_template none \
  --dataset.task contains --learner.threads 1 --dataset.path "$tmp/data.jsonl" \
  --kafka.bootstrap "$bootstrap" --learner.group_size 4 --learner.quota 8 --learner.lr 1e-4 \
  --learner.seed 11 --sampling.max_new_tokens 48 --learner.heartbeat_interval_ms 500 \
  --rpc.token_file "$tmp/token" --metrics.jsonl "$tmp/learner.jsonl" >"$tmp/learner.log" 2>&1 &
pid_learner=$!
pids+=($pid_learner)
port=$(log_port "$tmp/learner.log")
declare -A rpid incarnation
start_replica() { # $1 = name
  local n=${incarnation[$1]:-0}
  incarnation[$1]=$((n + 1))
  "$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$bootstrap" \
    --rollout.replica_id "$1" --rollout.slots 8 --rollout.max_concurrency 4 --rollout.threads 1 \
    --rollout.precision w8a8-int8 --rollout.kv_cache int4-protected --kafka.session_timeout_ms 6000 \
    --rollout.step_delay_ms "${QRL_SOAK_STEP_DELAY_MS:-0}" \
    --rpc.token_file "$tmp/token" --learner.addr "127.0.0.1:$port" >>"$tmp/$1.log" 2>&1 &
  rpid[$1]=$!
  pids+=($!)
}
for r in r0 r1 r2; do start_replica $r; done

t0=$SECONDS end=$((SECONDS + duration)) next_restart=$((SECONDS + restart_every))
k=0
: >"$tmp/rss.tsv"
while [ $SECONDS -lt $end ]; do
  sleep 10
  el=$((SECONDS - t0))
  printf '%d\tlearner\t0\t%s\n' "$el" "$(rss_kb $pid_learner)" >>"$tmp/rss.tsv"
  for r in r0 r1 r2; do printf '%d\t%s\t%d\t%s\n' "$el" "$r" "${incarnation[$r]}" "$(rss_kb "${rpid[$r]}")" >>"$tmp/rss.tsv"; done
  kill -0 $pid_learner 2>/dev/null || fail "the learner died"
  if [ $SECONDS -ge $next_restart ]; then
    r=r$((k % 3)); k=$((k + 1))
    kill -TERM "${rpid[$r]}"
    wait "${rpid[$r]}" || fail "$r exited $? on SIGTERM"
    echo "[$(date +%H:%M:%S)] restarted $r after $((SECONDS - t0)) s (updates so far $(wc -l <"$tmp/learner.jsonl"))"
    start_replica "$r"
    next_restart=$((SECONDS + restart_every))
  fi
done
kill -TERM $pid_learner
wait $pid_learner || fail "learner exited $? on SIGTERM"
for r in r0 r1 r2; do kill -TERM "${rpid[$r]}" 2>/dev/null || true; wait "${rpid[$r]}" 2>/dev/null || true; done

m=$tmp/learner.jsonl
U=$(wc -l <"$m")
[ "$U" -ge 3 ] || fail "only $U updates in $minutes minutes"
jq -s -e '[.[].groups[]] as $g | ($g | length) == ($g | unique | length)' "$m" >/dev/null || fail "a group trained twice"
# groups below the highest trained id that were not trained must be ones still buffered or
# generating when the learner stopped (their offsets are not committed): the last window
missing=$(jq -s -c '[.[].groups[]] | sort | . as $s | [range(1; ($s[-1] + 1))] - $s' "$m")
jq -n -e --argjson miss "$missing" --argjson top "$(jq -s '[.[].groups[]] | max' "$m")" \
  '($miss | length) <= 16 and all($miss[]; . > $top - 32)' >/dev/null ||
  fail "groups lost (not in the final in-flight window): $missing"
echo
printf '%-8s %5s %12s %12s %8s\n' daemon inc "RSS warm kB" "RSS end kB" growth
# per daemon incarnation: RSS after its first third of samples (warm-up) vs its last
awk -F'\t' '
  $4 > 0 { key = $2 " " $3; n[key]++; v[key, n[key]] = $4 }
  END {
    w = 0
    for (k in n) {
      if (n[k] < 3) continue
      a0 = v[k, int(n[k] / 3) + 1]; a1 = v[k, n[k]]
      split(k, nm, " "); g = (a1 - a0) / a0 * 100
      printf "%-8s %5s %12d %12d %7.2f%%\n", nm[1], nm[2], a0, a1, g
      if (g > w) w = g
    }
    printf "WORST %.2f\n", w
  }' "$tmp/rss.tsv" >"$tmp/rss-table.txt"
grep -v '^WORST' "$tmp/rss-table.txt" | sort
worst=$(sed -n 's/^WORST //p' "$tmp/rss-table.txt")
echo "updates $U, groups trained $(jq -s '[.[].groups[]] | length' "$m"), replica restarts $k, worst RSS growth after warm-up ${worst}%"
awk -v w="$worst" 'BEGIN { exit !(w < 5) }' || fail "RSS grew ${worst}% (>= 5%)"
echo "soak passed ($minutes min)"
