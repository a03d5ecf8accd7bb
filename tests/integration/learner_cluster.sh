#!/usr/bin/env bash
# qrl-learner end to end: a real single-node Kafka broker, qrl-learner and two qrl-rollout
# replicas on stories260K (r1 quantized: w8a8-int8 weights, int4-protected KV; r0 chunks
# its results at 1 KiB, which the learner joins), with a synthetic JSONL dataset made here ("Once upon a time"
# variants, task `contains`: a response is correct when it contains the reference word).
#   0. bad datasets are refused with file:line (no broker needed);
#   1. T = 4 groups of G = 4, 24 new tokens, 3 updates: versions 1, 2, 3 in the metrics
#      JSONL; every dispatched group (ids 1..12) trained exactly once (dropped ones are
#      the all-equal-reward groups the update reports); a garbage record on the results
#      topic goes to the DLQ; both replicas receive version 1 over the TCP stream and the
#      results of the last update carry tokens of version >= 1; the learner exits 0 after
#      max_updates and its SHUTDOWN event drains both replicas (exit 0).
#   2. --learner.mode alternate, 3 updates, a replica joining after update 1 (weight
#      stream throttled): every update trains only its version's tokens; the replicas are
#      held (PAUSE event, and the late joiner until it has the version) while the
#      learner trains.
# Whatever it started is stopped on every exit path.  Skips (77) without java or the
# Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" learner
harness=$build/tests/integration/rollout_harness
[ -x "$harness" ] || fail "$harness is not built (make test builds it)"
t_all=$(date +%s.%N)

# ---- 0. dataset errors name file:line ---------------------------------------------------
common=(--learner.model "$model" --learner.tokenizer "$tokenizer" --dataset.chat_template none
        --dataset.task contains --learner.threads 1)
printf '{"prompt":"Once upon a time","answer":"the"}\n\n{"prompt":"x","answer":"y"\n' >"$tmp/bad1.jsonl"
printf '{"prompt":"Once upon a time","answer":"the"}\n{"question":"x","answer":"y"}\n' >"$tmp/bad2.jsonl"
out=$("$learner" "${common[@]}" --dataset.path "$tmp/bad1.jsonl" 2>&1) && fail "bad JSON accepted"
echo "$out" | grep -q "qrl-learner: error: $tmp/bad1.jsonl:3: " || fail "bad JSON: $out"
out=$("$learner" "${common[@]}" --dataset.path "$tmp/bad2.jsonl" 2>&1) && fail "missing field accepted"
echo "$out" | grep -q "bad2.jsonl:2: field \"prompt\" (dataset.prompt_field) missing" || fail "missing field: $out"
out=$("$learner" "${common[@]}" --dataset.path "$tmp/bad2.jsonl" --dataset.task nope 2>&1) &&
  fail "unknown task accepted"
echo "$out" | grep -q "unknown verifier 'nope'" || fail "unknown task: $out"
out=$("$learner" "${common[@]}" --dataset.path "$tmp/bad2.jsonl" --learner.qat_kv true 2>&1) && fail "qat_kv without qat accepted"
echo "$out" | grep -q "learner.qat_kv true needs learner.qat nvfp4" || fail "qat_kv without qat: $out"
out=$("$learner" "${common[@]}" --dataset.path "$tmp/bad2.jsonl" --learner.lr 1e-4 --learner.min_lr 1e-3 2>&1) &&
  fail "min_lr above lr accepted"
echo "$out" | grep -q "learner.min_lr 0.001 is above learner.lr 0.0001" || fail "min_lr > lr: $out"
echo "bad datasets refused with file:line"

need_kafka

# ---- 1. the cluster --------------------------------------------------------------------
t=$(date +%s.%N)
start_broker 4
echo "broker at $bootstrap with topics in $(secs "$t") s"
printf 'test-token-%s\n' "$$" >"$tmp/token"

words=(the was and she he little girl boy day happy big play)
names=(Lily Tom Sue Ben Max Mia)
: >"$tmp/data.jsonl"
for i in $(seq 0 19); do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "${names[$((i % 6))]}" \
    "${words[$((i % 12))]}" >>"$tmp/data.jsonl"
done

t=$(date +%s.%N)
QRL_LOG_LEVEL=info "$learner" "${common[@]}" --dataset.path "$tmp/data.jsonl" \
  --kafka.bootstrap "$bootstrap" --learner.group_size 4 --learner.quota 4 --learner.max_updates 3 \
  --learner.max_staleness 0 --learner.lr 1e-3 --learner.seed 7 --sampling.max_new_tokens 24 \
  --learner.heartbeat_interval_ms 300 --rpc.token_file "$tmp/token" \
  --metrics.jsonl "$tmp/learner.jsonl" >"$tmp/learner.log" 2>&1 &
pids+=($!)
pid_learner=$!
port=$(log_port "$tmp/learner.log")
fmt_r0=(--kafka.max_result_bytes 1024) fmt_r1=(--rollout.precision w8a8-int8 --rollout.kv_cache int4-protected --rollout.kv_recent 8)
for r in r0 r1; do
  eval "fmt=(\"\${fmt_$r[@]}\")"
  "$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$bootstrap" "${fmt[@]}" \
    --rollout.replica_id $r --rollout.slots 4 --rollout.max_concurrency 2 --rollout.threads 1 \
    --rollout.step_delay_ms 30 --kafka.session_timeout_ms 6000 --rpc.token_file "$tmp/token" \
    --learner.addr "127.0.0.1:$port" >"$tmp/$r.log" 2>&1 &
  pids+=($!)
  eval "pid_$r=$!"
done
# a record no replica wrote: the learner must dead-letter it, not train on it
"$harness" produce --bootstrap "$bootstrap" --topic qrl.results --first-id 1000 --garbage --groups 0 \
  --tokenizer "$tokenizer" >/dev/null 2>&1 || true

rc=0; timeout 100 tail --pid="$pid_learner" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "learner still running after 100 s"
rc=0; wait "$pid_learner" || rc=$?
[ $rc -eq 0 ] || fail "learner exited $rc"
echo "learner: 3 updates and exit in $(secs "$t") s"
for r in r0 r1; do
  eval "p=\$pid_$r"
  rc=0; timeout 30 tail --pid="$p" -f /dev/null || rc=$?
  [ $rc -eq 0 ] || fail "$r did not drain after the learner's SHUTDOWN"
  rc=0; wait "$p" || rc=$?
  [ $rc -eq 0 ] || fail "$r exited $rc"
  grep -q "learner announced shutdown" "$tmp/$r.log" || fail "$r never saw SHUTDOWN"
  grep -q "weights received version=1 " "$tmp/$r.log" || fail "$r never received version 1"
done
grep -q "model loaded .*precision=w8a8-int8 kv_cache=int4-protected" "$tmp/r1.log" || fail "r1 not quantized"
chunked=$(count "$tmp/r0.log" "result chunked into")
joined=$(count "$tmp/learner.log" "chunked result group=.* joined from .*: OK")
[ "$chunked" -ge 1 ] && [ "$joined" -ge 1 ] || fail "no chunked result went through (r0 chunked $chunked, learner joined $joined)"
echo "r0 chunked $chunked results (kafka.max_result_bytes 1024), the learner joined $joined"
echo "both replicas received version 1 and drained on SHUTDOWN"

m=$tmp/learner.jsonl
[ "$(wc -l <"$m")" -eq 3 ] || fail "expected 3 metrics lines, got $(wc -l <"$m")"
jq -s -e 'map(.version) == [1,2,3] and map(.step) == [1,2,3]' "$m" >/dev/null || fail "versions: $(cat "$m")"
jq -s -e '[.[].groups[]] | sort == [range(1;13)]' "$m" >/dev/null ||
  fail "groups not trained exactly once: $(jq -c -s 'map(.groups)' "$m")"
jq -s -e 'all(.[]; (.dropped | length) == .groups_dropped and .groups_used + .groups_dropped == 4
  and ((.dropped - .groups) | length) == 0)' "$m" >/dev/null || fail "dropped accounting: $(cat "$m")"
jq -s -e 'all(.[]; (.reward_mean | type) == "number" and (.kl_behav_prox | type) == "number")' "$m" \
  >/dev/null || fail "stats missing"
jq -s -e '.[2].version_max >= 1' "$m" >/dev/null || fail "update 3 trained only version-0 tokens: $(cat "$m")"
jq -s -e 'map(.steps_taken) | add >= 1' "$m" >/dev/null || fail "no optimizer step in 3 updates: $(cat "$m")"
grep -q "dead letter partition=.*PARSE" "$tmp/learner.log" || fail "garbage result not dead-lettered"
[ "$(count "$tmp/learner.log" "update step=")" -eq 3 ] || fail "progress lines"
echo "metrics: $(jq -s -c 'map({version, reward: .reward_mean, acc: .accuracy, used: .groups_used,
  dropped: .groups_dropped, vmax: .version_max, kl: .kl_behav_prox, update_s})' "$m")"

# ---- 2. alternate mode: the replicas idle while the learner trains -----------------------
# a1 joins late (after update 1, version 1 published) while the weight stream is throttled
# (4 s per version): it must hold its prompts until it has version 1, or update 2 would
# train version-0 tokens
t=$(date +%s.%N)
QRL_LOG_LEVEL=info "$learner" "${common[@]}" --dataset.path "$tmp/data.jsonl" \
  --kafka.bootstrap "$bootstrap" --learner.group_size 4 --learner.quota 4 --learner.max_updates 3 \
  --learner.mode alternate --learner.lr 1e-3 --learner.seed 8 --sampling.max_new_tokens 24 \
  --learner.heartbeat_interval_ms 300 --weights.tcp_throttle_ms 4000 --rpc.token_file "$tmp/token" \
  --metrics.jsonl "$tmp/alt.jsonl" >"$tmp/learner-alt.log" 2>&1 &
pids+=($!)
pid_learner=$!
port=$(log_port "$tmp/learner-alt.log")
start_alt() {
  "$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$bootstrap" \
    --rollout.replica_id "$1" --rollout.slots 4 --rollout.max_concurrency 2 --rollout.threads 1 \
    --kafka.session_timeout_ms 6000 --rpc.token_file "$tmp/token" \
    --learner.addr "127.0.0.1:$port" >"$tmp/$1.log" 2>&1 &
  pids+=($!)
  eval "pid_$1=$!"
}
start_alt a0
for _ in $(seq 600); do [ -s "$tmp/alt.jsonl" ] && break; sleep 0.1; done
[ -s "$tmp/alt.jsonl" ] || fail "alternate mode: no update 1 after 60 s"
start_alt a1
rc=0; timeout 120 tail --pid="$pid_learner" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "alternate-mode learner still running after 120 s"
rc=0; wait "$pid_learner" || rc=$?
[ $rc -eq 0 ] || fail "alternate-mode learner exited $rc"
for r in a0 a1; do eval "p=\$pid_$r"; timeout 30 tail --pid="$p" -f /dev/null || fail "$r did not drain"; done
jq -s -e 'map(.version) == [1,2,3] and ([.[].groups[]] | sort == [range(1;13)])' "$tmp/alt.jsonl" \
  >/dev/null || fail "alternate mode updates: $(cat "$tmp/alt.jsonl")"
# synchronous: update k trains only tokens generated with version k-1, the late joiner's too
jq -s -e 'all(.[]; .version_min == .version - 1 and .version_max == .version - 1)' "$tmp/alt.jsonl" >/dev/null ||
  fail "alternate mode: an update saw tokens of other versions: $(jq -c -s 'map([.version, .version_min, .version_max])' "$tmp/alt.jsonl")"
held=$(cat "$tmp/a0.log" "$tmp/a1.log" | grep -c "holding until version=1" || true)
[ "$held" -ge 1 ] || fail "no replica was held for update 1"
grep -q "late join: weights version=0 behind the learner's [1-9].*holding until version=[1-9]" "$tmp/a1.log" ||
  fail "the late joiner was not held: $(grep -m1 'registered' "$tmp/a1.log")"
echo "alternate mode: 3 updates in $(secs "$t") s, each trained only its version's tokens (a1 joined at" \
  "version $(grep -o -m1 'current_version=[0-9]*' "$tmp/a1.log"), produced $(grep -c 'produced group=' "$tmp/a1.log") groups)"
echo "learner cluster test passed in $(secs "$t_all") s"
