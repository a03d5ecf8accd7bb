#!/usr/bin/env bash
# TRACE end to end (issue 19; docs/learner-daemon.md "TRACE records"): a real single-node
# Kafka broker, qrl-learner in QAT mode (learner.qat nvfp4, guidance on) and one CPU
# qrl-rollout replica on stories260K with rollout.precision w4a4-nvfp4 and rollout.trace
# on, its TraceChunks cut small (kafka.max_trace_bytes 2048) so that a response spans
# several chunks.  Dynamic sampling is off, so every group is trained.
#   1. T = 4 groups of G = 4, 2 updates: the learner trained guided rows (> 0), the records
#      cost bytes (> 0 per token, in learner.jsonl and the replica's metrics.jsonl), update 1
#      (version-0 tokens, version-0 parameters) gives the rollout's codes (disagree share
#      < 1%, |lp_prox - lp_behav| < 1e-5), and so does update 2 (version-1 tokens: the
#      replica decoded the BF16 weight stream, the learner rounds as it did; < 1e-3), every
#      dispatched group trained exactly once; a garbage record on the trace topic goes to
#      the dead-letter topic.
#   2. the same with rollout.trace_fault mix (each group's first chunk lost, every chunk sent
#      twice, in reverse order, and response 1's first record given an E4M3 NaN block scale
#      with both CRCs recomputed): the responses that lost a chunk train unguided and are
#      counted missing, the NaN records are refused by name and counted corrupt (their
#      responses unguided), the others are still guided, duplicates are counted (in
#      learner.jsonl's trace_store_duplicates, cumulative per update), no optimizer step
#      is skipped, nothing is dropped.
#   3. a site mismatch: the replica on w4a16-nvfp4 with the fp4 KV cache records K and V only,
#      the learner (qat nvfp4, qat_kv false) fake-quantizes the linear inputs: no row counts
#      as guided, the responses are counted (sites_none) and one warning names both sides
#      (before: trace_rows_guided 16, disagree 0 while disc_mean was 1.15).
# Whatever it started is stopped on every exit path.  Skips (77) without java or the
# Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" learner_trace
harness=$build/tests/integration/rollout_harness
[ -x "$harness" ] || fail "$harness is not built (make test builds it)"
t_all=$(date +%s.%N)
need_kafka

start_broker 2
echo "broker at $bootstrap"
printf 'test-token-%s\n' "$$" >"$tmp/token"
words=(the was and she he little girl boy day happy big play)
names=(Lily Tom Sue Ben Max Mia)
: >"$tmp/data.jsonl"
for i in $(seq 0 19); do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "${names[$((i % 6))]}" \
    "${words[$((i % 12))]}" >>"$tmp/data.jsonl"
done

# run NAME FAULT [REPLICA ARGS]: a learner (2 updates, QAT) and one TRACE replica (default
# precision w4a4-nvfp4) until both exit 0
run() {
  local name=$1 fault=$2 t rargs=("${@:3}")
  [ ${#rargs[@]} -gt 0 ] || rargs=(--rollout.precision w4a4-nvfp4)
  t=$(date +%s.%N)
  QRL_LOG_LEVEL=info "$learner" --learner.model "$model" --learner.tokenizer "$tokenizer" \
    --dataset.chat_template none --dataset.task contains --learner.threads 1 --dataset.path "$tmp/data.jsonl" \
    --kafka.bootstrap "$bootstrap" --kafka.group "learner-$name" --learner.group_size 4 --learner.quota 4 \
    --learner.max_updates 2 --learner.max_staleness 0 --learner.mode alternate --learner.lr 1e-3 --learner.seed 7 \
    --learner.dynamic_sampling false --learner.qat nvfp4 --sampling.max_new_tokens 24 \
    --learner.heartbeat_interval_ms 300 --rpc.token_file "$tmp/token" \
    --metrics.jsonl "$tmp/$name-learner.jsonl" >"$tmp/$name-learner.log" 2>&1 &
  pids+=($!)
  local pl=$! port
  port=$(log_port "$tmp/$name-learner.log")
  "$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$bootstrap" \
    --kafka.group "rollout-$name" "${rargs[@]}" --rollout.trace true \
    --rollout.trace_fault "$fault" --kafka.max_trace_bytes 2048 --rollout.replica_id "$name-r0" \
    --rollout.slots 4 --rollout.max_concurrency 2 --rollout.threads 1 --kafka.session_timeout_ms 6000 \
    --rpc.token_file "$tmp/token" --metrics.jsonl "$tmp/$name-r0.jsonl" \
    --learner.addr "127.0.0.1:$port" >"$tmp/$name-r0.log" 2>&1 &
  pids+=($!)
  local pr=$! rc=0
  if [ "$name" = clean ]; then # a record no replica wrote: dead-lettered, not stored
    "$harness" produce --bootstrap "$bootstrap" --topic qrl.trace --first-id 1000 --garbage --groups 0 \
      --tokenizer "$tokenizer" >/dev/null 2>&1 || true
  fi
  timeout 150 tail --pid="$pl" -f /dev/null || fail "$name: learner still running after 150 s"
  wait "$pl" || rc=$?
  [ $rc -eq 0 ] || fail "$name: learner exited $rc: $(tail -5 "$tmp/$name-learner.log")"
  timeout 30 tail --pid="$pr" -f /dev/null || fail "$name: replica did not drain after SHUTDOWN"
  rc=0; wait "$pr" || rc=$?
  [ $rc -eq 0 ] || fail "$name: replica exited $rc: $(tail -5 "$tmp/$name-r0.log")"
  grep -q "training engine device=cpu .*qat=nvfp4" "$tmp/$name-learner.log" || fail "$name: learner not in QAT mode"
  grep -q "serving replica=.* trace=qrl.trace" "$tmp/$name-r0.log" || fail "$name: replica not recording"
  local m=$tmp/$name-learner.jsonl
  [ "$(wc -l <"$m")" -eq 2 ] || fail "$name: expected 2 metrics lines, got $(wc -l <"$m")"
  # nothing dropped: every dispatched group trained exactly once (or listed as dropped)
  jq -s -e '[.[].groups[]] | sort == [range(1;9)]' "$m" >/dev/null ||
    fail "$name: groups not trained exactly once: $(jq -c -s 'map(.groups)' "$m")"
  jq -s -e 'all(.[]; (.dropped | length) == .groups_dropped)' "$m" >/dev/null || fail "$name: dropped accounting"
  jq -s -e 'all(.[]; .trace_rows_guided + .trace_rows_unguided >= 1)' "$m" >/dev/null ||
    fail "$name: rows not counted: $(cat "$m")"
  echo "$name: 2 QAT updates in $(secs "$t") s: $(jq -s -c 'map({guided: .trace_rows_guided,
    unguided: .trace_rows_unguided, disagree: .trace_disagree_share, bpt: .trace_bytes_per_token})' "$m")"
}

# ---- 1. records flow, rows are guided ---------------------------------------------------------
run clean none
m=$tmp/clean-learner.jsonl
jq -s -e 'map(.trace_rows_guided) | add > 0' "$m" >/dev/null || fail "no guided rows: $(cat "$m")"
# update 1 trains version-0 tokens with version-0 parameters: the guided forward must give
# the rollout's codes (the learner runs UAQ-scaled, the replica the unscaled checkpoint: a
# guided share of 0.44 and a mismatch 10^4 times nearest's before the fix)
# Rows whose records came late train unguided, and nearest rounding of the UAQ-scaled
# activations can break an FP4 tie the other way (1.1e-4 seen with 4 unguided rows), so the
# tight bound holds when every row was guided
jq -e -s '.[0] | .trace_disagree_share < 0.01 and (.disc_mean < 1e-5 or
  (.trace_rows_unguided > 0 and .disc_mean < 1e-3))' "$m" >/dev/null ||
  fail "update 1: guided codes are not the rollout's: $(head -1 "$m" | jq -c '{trace_disagree_share, disc_mean, disc_max}')"
# update 2 trains version-1 tokens: the replica decoded the BF16 weight stream, the learner
# must round its F32 masters the same way (qat_set_bf16; without it: a disagree share of
# 0.25 and |lp_prox - lp_behav| 0.03 from update 2 on in deploy/local runs)
# (disc_mean: 5.5e-5 seen twice out of many runs, under load on 2 cores, with a disagree
# share of 2e-6, likely a response whose earlier KV predates the swap; the mismatch this
# guards against gives 0.03, so 1e-3 still catches it)
jq -e -s '.[1] | .version_min >= 1 and .trace_disagree_share < 0.01 and .disc_mean < 1e-3' "$m" >/dev/null ||
  fail "update 2 (version >= 1): guided codes are not the rollout's: $(sed -n 2p "$m" | jq -c '{version_min, trace_disagree_share, disc_mean, disc_max}')"
jq -s -e 'all(.[]; .trace_bytes_per_token > 0 and .trace_record_bytes > 0)' "$m" >/dev/null ||
  fail "no trace bytes: $(cat "$m")"
jq -s -e 'map(.trace_bytes) | add > 0' "$tmp/clean-r0.jsonl" >/dev/null ||
  fail "replica metrics without trace bytes: $(head -2 "$tmp/clean-r0.jsonl")"
jq -s -e 'all(.[]; .trace_bytes_per_token > 0)' "$tmp/clean-r0.jsonl" >/dev/null || fail "replica bytes/token"
# the recorder's cost and the topic's rate: a share of the forward time in (0, 1), bytes/s > 0
jq -s -e 'all(.[]; .trace_capture_share > 0 and .trace_capture_share < 1 and .trace_bytes_per_s > 0)' \
  "$tmp/clean-r0.jsonl" >/dev/null || fail "replica capture share / bytes/s: $(jq -s -c 'map([.trace_capture_share, .trace_bytes_per_s])' "$tmp/clean-r0.jsonl")"
echo "clean: recorder share $(tail -1 "$tmp/clean-r0.jsonl" | jq -c '[.trace_capture_share, .trace_bytes_per_s]')"
jq -s -e 'map(.trace_chunks) | max >= 2' "$tmp/clean-r0.jsonl" >/dev/null ||
  fail "no response spanned several chunks: $(jq -s -c 'map(.trace_chunks)' "$tmp/clean-r0.jsonl")"
grep -q "trace: chunks=[1-9].* dead_letters=1 " "$tmp/clean-learner.log" ||
  fail "garbage trace record not dead-lettered: $(grep 'trace: chunks' "$tmp/clean-learner.log")"
grep -q "dead letter partition=.*PARSE" "$tmp/clean-learner.log" || fail "no dead-letter line"
echo "clean: $(grep -o 'trace: chunks=.*' "$tmp/clean-learner.log")"
grep -q "trace records c" "$tmp/clean-learner.log" && fail "clean: site warning: $(grep 'trace records c' "$tmp/clean-learner.log")"
grep -q " sites_none=0$" "$tmp/clean-learner.log" || fail "clean: sites_none: $(grep -o 'trace: chunks=.*' "$tmp/clean-learner.log")"

# ---- 2. lost, duplicated and reordered chunks --------------------------------------------------
run faults mix
m=$tmp/faults-learner.jsonl
jq -s -e 'map(.trace_rows_unguided) | add > 0' "$m" >/dev/null || fail "lost chunks not counted unguided: $(cat "$m")"
jq -s -e 'map(.trace_rows_guided) | add > 0' "$m" >/dev/null ||
  fail "duplicated + reordered chunks not joined: $(cat "$m")"
line=$(grep -o 'trace: chunks=.*' "$tmp/faults-learner.log")
# the store's counters are in learner.jsonl per update (cumulative: never decreasing)
jq -s -e 'map(.trace_store_duplicates) | max > 0' "$m" >/dev/null ||
  fail "duplicates not seen in learner.jsonl: $(jq -s -c 'map(.trace_store_duplicates)' "$m") ($line)"
jq -s -e '.[0].trace_store_chunks > 0 and .[1].trace_store_chunks >= .[0].trace_store_chunks and
  .[1].trace_store_missing >= .[0].trace_store_missing' "$m" >/dev/null ||
  fail "trace_store counters not cumulative: $(jq -s -c 'map([.trace_store_chunks, .trace_store_missing])' "$m")"
echo "$line" | grep -q " missing=[1-9]" || fail "incomplete responses not counted: $line"
# a CRC-valid record with a NaN block scale poisoned a whole update (every step skipped on a
# non-finite gradient): it must be refused by name, counted, and the update train normally
echo "$line" | grep -q " corrupt=[1-9]" || fail "NaN-scale records not counted corrupt: $line"
grep -q "trace group=[0-9]* response=1 from faults-r0: CORRUPT: trace response: chunk 0: trace record: block scale 0 of \[token 0\]\[site 0 (id 0x0)\] at offset [0-9]* = 0x7f is NaN.*(trained unguided)" \
  "$tmp/faults-learner.log" || fail "no refusal line for the NaN-scale record: $(grep -m3 'trace group=' "$tmp/faults-learner.log")"
! grep -q "event=step_skipped" "$tmp/faults-learner.log" ||
  fail "steps skipped: $(grep -m2 'event=step_skipped' "$tmp/faults-learner.log")"
jq -s -e 'all(.[]; .steps_skipped == 0 and .steps_taken > 0)' "$m" >/dev/null ||
  fail "steps skipped or none taken: $(jq -s -c 'map([.steps_taken, .steps_skipped])' "$m")"
echo "faults: $(grep -m1 -o 'trace group=[0-9]* response=1 .*0x7f is NaN' "$tmp/faults-learner.log")"
echo "faults: $line"
echo "faults: learner.jsonl [trace_store_duplicates, _chunks, _missing] per update: $(jq -s -c 'map([.trace_store_duplicates, .trace_store_chunks, .trace_store_missing])' "$m")"

# ---- 3. records of sites the learner does not fake-quantize -------------------------------------
run sites none --rollout.precision w4a16-nvfp4 --rollout.kv_cache fp4
m=$tmp/sites-learner.jsonl
jq -s -e 'all(.[]; .trace_rows_guided == 0) and (map(.trace_rows_unguided) | add > 0)' "$m" >/dev/null ||
  fail "K/V-only records counted as guiding a linear-QAT learner: $(jq -s -c 'map([.trace_rows_guided, .trace_rows_unguided, .disc_mean])' "$m")"
line=$(grep -o 'trace: chunks=.*' "$tmp/sites-learner.log")
echo "$line" | grep -q " sites_none=[1-9]" || fail "site mismatch not counted: $line"
[ "$(grep -c 'guide none of its sites' "$tmp/sites-learner.log")" -eq 1 ] ||
  fail "expected one site-mismatch warning: $(grep -c 'guide none of its sites' "$tmp/sites-learner.log")"
grep 'guide none of its sites' "$tmp/sites-learner.log" | grep -q "carry k .*v .*fake-quantizes attn_in.*qat_kv false" ||
  fail "the warning does not name both sides: $(grep 'guide none' "$tmp/sites-learner.log")"
echo "sites: $line"
echo "learner trace test passed in $(secs "$t_all") s"
