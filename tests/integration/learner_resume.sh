#!/usr/bin/env bash
# qrl-learner checkpoints, resume and export, end to end (docs/learner-daemon.md
# "Checkpoints", "Resume", "Export"), on a real single-node Kafka broker and stories260K:
#   1. scripted replica (learner_resume_harness feed: a GroupResult per PromptGroup whose
#      content depends on the group id only; 1-partition topics, so the order of results
#      is the order of ids), T = 2, G = 4, 4 updates, a checkpoint after every update:
#      run A uninterrupted; run B holds the results of groups > 4, is killed -9 after its
#      checkpoint of step 2, restarted with only --resume auto and its checkpoint folder
#      (every other setting restored from the manifest's "settings"), then the results flow.
#      B continues at step 3 / version 3; every group id 1..8 trained exactly once over
#      both processes; params.safetensors and optimizer.bin of steps 3 and 4 are
#      byte-identical to A's (CPU, deterministic update, same quota composition);
#      Learner.Checkpoint (qrlctl checkpoint [TAG]) on the idle resumed learner answers
#      with the folder, step and version;
#   2. export of A's newest checkpoint -> qrl-generate --dump_logits over 12 prompt ids ==
#      the learner's policy logits (harness logits: base model + checkpoint parameters,
#      UAQ-scaled as trained) within 1e-4; the base model's logits differ by more; the
#      llama2.c tokenizer is copied as tokenizer.bin;
#   3. damaged checkpoints: a garbled manifest, a truncated params file, a missing named
#      folder: the learner exits 1 naming the file/field; a partial newer folder is
#      skipped with a WARN by --resume auto; SIGTERM on an idle learner writes a
#      checkpoint with its 4 dispatched groups pending;
#   4. a real qrl-rollout replica: T = 4, G = 4, 4 updates; the learner is killed -9
#      right after its step-2 checkpoint and restarted on the same rpc port with
#      --resume auto: the replica re-registers, gets version >= 3 over TCP, the learner
#      ends at version 4, and the groups of the surviving metrics lines (the killed
#      process's up to its checkpoint, all of the restarted one's) are 1..16, each once.
# Skips (77) without java or the Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" resume
generate=$build/bin/qrl-generate
harness=$build/tests/integration/learner_resume_harness
for f in "$generate" "$harness"; do [ -x "$f" ] || fail "$f is not built (make test builds it)"; done
need_kafka
stop() { { kill -KILL "$1" && wait "$1"; } 2>/dev/null || true; } # no job-control noise
wait_exit() { # pid seconds: fails unless it exits 0 within the time
  local rc=0
  timeout "$2" tail --pid="$1" -f /dev/null || fail "pid $1 ($3) still running after $2 s"
  wait "$1" || rc=$?
  [ $rc -eq 0 ] || fail "$3 exited $rc"
}
t_all=$(date +%s.%N)

t=$(date +%s.%N)
start_broker 4
"$kafka" create-topics --bootstrap "$bootstrap" --partitions 1 \
  --topics fa.prompts,fa.results,fb.prompts,fb.results >/dev/null 2>&1
echo "broker at $bootstrap with topics in $(secs "$t") s"
printf 'test-token-%s\n' "$$" >"$tmp/token"
: >"$tmp/data.jsonl"
words=(the was and she he little girl boy day happy big play)
names=(Lily Tom Sue Ben Max Mia)
for i in $(seq 0 19); do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "${names[$((i % 6))]}" \
    "${words[$((i % 12))]}" >>"$tmp/data.jsonl"
done
common=(--learner.model "$model" --learner.tokenizer "$tokenizer" --dataset.chat_template none
        --dataset.task contains --learner.threads 1 --dataset.path "$tmp/data.jsonl"
        --kafka.bootstrap "$bootstrap" --rpc.token_file "$tmp/token" --learner.lr 1e-3 --learner.seed 7
        --learner.checkpoint_every 1 --learner.checkpoint_keep 10)
feeder_args=(--learner.group_size 4 --learner.quota 2 --learner.max_updates 4 --learner.max_staleness 1
             --learner.run_id 77 --kafka.session_timeout_ms 6000)

# ---- 1. scripted replica: A uninterrupted, B killed after step 2 and resumed ------------
t=$(date +%s.%N)
"$harness" feed --bootstrap "$bootstrap" --prompts fa.prompts --results fa.results --vocab 512 \
  >"$tmp/feedA.log" 2>&1 &
pids+=($!); pid_fa=$!
QRL_LOG_LEVEL=info "$learner" "${common[@]}" "${feeder_args[@]}" --kafka.prompts_topic fa.prompts \
  --kafka.results_topic fa.results --kafka.group ga --learner.checkpoint_dir "$tmp/ckA" \
  --metrics.jsonl "$tmp/A.jsonl" >"$tmp/A.log" 2>&1 &
pids+=($!)
wait_exit $! 90 "learner A"
stop $pid_fa
jq -s -e 'map(.version) == [1,2,3,4] and ([.[].groups[]] | sort == [range(1;9)])' "$tmp/A.jsonl" >/dev/null ||
  fail "run A metrics: $(jq -c -s 'map({version, groups})' "$tmp/A.jsonl")"
for s in 1 2 3 4; do [ -f "$tmp/ckA/step-0000000$s/manifest.json" ] || fail "A: no checkpoint of step $s"; done
ckpt_line=$(grep -m1 "checkpoint step=4 " "$tmp/A.log")
echo "run A: 4 updates in $(secs "$t") s; ${ckpt_line#*\] }"

t=$(date +%s.%N)
"$harness" feed --bootstrap "$bootstrap" --prompts fb.prompts --results fb.results --vocab 512 \
  --hold-after 4 --go "$tmp/go" >"$tmp/feedB.log" 2>&1 &
pids+=($!); pid_fb=$!
fb_args=("${common[@]}" "${feeder_args[@]}" --kafka.prompts_topic fb.prompts --kafka.results_topic fb.results
         --kafka.group gb --learner.checkpoint_dir "$tmp/ckB")
fa_args=("${common[@]}" "${feeder_args[@]}" --kafka.prompts_topic fa.prompts --kafka.results_topic fa.results
         --kafka.group ga)
QRL_LOG_LEVEL=info "$learner" "${fb_args[@]}" --metrics.jsonl "$tmp/B1.jsonl" >"$tmp/B1.log" 2>&1 &
pids+=($!); pid_b1=$!
wait_log "$tmp/B1.log" "checkpoint step=2 " 1 60
wait_log "$tmp/feedB.log" "holding group 5" 1 20
stop $pid_b1
[ "$(wc -l <"$tmp/B1.jsonl")" -eq 2 ] || fail "B1 trained $(wc -l <"$tmp/B1.jsonl") updates, expected 2"
t_resume=$(date +%s.%N)
# resumed with only the checkpoint folder: model, dataset, G, T, topics, seeds, ... are the
# run's settings as its manifest records them (before, T came back as the default 128)
QRL_LOG_LEVEL=info "$learner" --learner.checkpoint_dir "$tmp/ckB" --resume auto --metrics.jsonl "$tmp/B2.jsonl" \
  >"$tmp/B2.log" 2>&1 &
pids+=($!); pid_b2=$!
pb2=$(log_port "$tmp/B2.log")
wait_log "$tmp/B2.log" "resumed from" 1 30
# Learner.Checkpoint while idle: untagged = the current one (nothing trained since the
# resume); tagged = a new folder at the same step
ctl=("$build/bin/qrlctl" --learner "127.0.0.1:$pb2" --token-file "$tmp/token")
out=$("${ctl[@]}" checkpoint 2>&1) || fail "qrlctl checkpoint: $out"
[ "$out" = "checkpoint $tmp/ckB/step-00000002 step 2 version 2" ] || fail "qrlctl checkpoint: $out"
out=$("${ctl[@]}" checkpoint manual 2>&1) || fail "qrlctl checkpoint manual: $out"
[ "$out" = "checkpoint $tmp/ckB/step-00000002-manual step 2 version 2" ] || fail "qrlctl checkpoint manual: $out"
[ -f "$tmp/ckB/step-00000002-manual/manifest.json" ] || fail "tagged checkpoint not written"
touch "$tmp/go"
wait_exit $pid_b2 90 "learner B2"
stop $pid_fb
grep -q "resumed from $tmp/ckB/step-00000002: step=2 version=2 run_id=77 " "$tmp/B2.log" ||
  fail "resume line: $(grep resumed "$tmp/B2.log")"
for kv in learner.quota=2 learner.group_size=4 learner.max_updates=4 kafka.results_topic=fb.results \
    "learner.model=$model" dataset.task=contains; do # (strings may be logged quoted)
  grep -qE "config ${kv%%=*}=\"?${kv#*=}\"? origin=checkpoint" "$tmp/B2.log" ||
    fail "B2: $kv not restored: $(grep -F "config ${kv%%=*}=" "$tmp/B2.log")"
done
grep -qE "config metrics.jsonl=\"?$tmp/B2.jsonl\"? origin=--metrics.jsonl" "$tmp/B2.log" || fail "B2: a given key was overridden"
grep -q "serving run_id=77 .* G=4 T=2 " "$tmp/B2.log" || fail "B2 serving line: $(grep serving "$tmp/B2.log")"
jq -s -e 'map(.version) == [3,4] and map(.step) == [3,4]' "$tmp/B2.jsonl" >/dev/null ||
  fail "B2 versions: $(jq -c -s 'map({step, version})' "$tmp/B2.jsonl")"
cat "$tmp/B1.jsonl" "$tmp/B2.jsonl" | jq -s -e '[.[].groups[]] | sort == [range(1;9)]' >/dev/null ||
  fail "groups over B1+B2 not 1..8 once each: $(cat "$tmp/B1.jsonl" "$tmp/B2.jsonl" | jq -c -s 'map(.groups)')"
for s in 3 4; do
  for f in params.safetensors optimizer.bin; do
    cmp -s "$tmp/ckA/step-0000000$s/$f" "$tmp/ckB/step-0000000$s/$f" ||
      fail "step $s $f: resumed run B differs from run A"
  done
done
cmp -s "$tmp/ckA/step-00000002/params.safetensors" "$tmp/ckA/step-00000003/params.safetensors" &&
  fail "update 3 did not change the parameters (the comparison would prove nothing)"
echo "run B: killed -9 after step 2, resumed at version 2 in $(secs "$t_resume") s to version 4;" \
     "groups 1..8 once each; steps 3, 4 params + AdamW byte-identical to run A ($(secs "$t") s)"

# ---- 2. export -> qrl-generate logits == the learner's policy ----------------------------
t=$(date +%s.%N)
"$learner" export --checkpoint "$tmp/ckA" --out "$tmp/hf" >"$tmp/export.log" 2>&1 || fail "export failed"
grep -q "exported $tmp/ckA/step-00000004 (step=4 version=4 uaq_scale=1.5 undone)" "$tmp/export.log" ||
  fail "export log: $(cat "$tmp/export.log")"
[ -f "$tmp/hf/config.json" ] && [ -f "$tmp/hf/model.safetensors" ] || fail "export wrote no HF folder"
cmp -s "$tmp/hf/tokenizer.bin" "$tokenizer" || fail "tokenizer.bin not copied"
ids=1,403,407,261,378,275,305,271,0,87,265,307
"$generate" --model "$tmp/hf" --prompt_ids "$ids" --max_new_tokens 1 --temperature 0 \
  --dump_logits "$tmp/gen.npy" >"$tmp/gen.log" 2>&1 || fail "qrl-generate on the export failed"
"$generate" --model "$model" --tokenizer "$tokenizer" --prompt_ids "$ids" --max_new_tokens 1 --temperature 0 \
  --dump_logits "$tmp/base.npy" >>"$tmp/gen.log" 2>&1 || fail "qrl-generate on the base model failed"
QRL_LOG_LEVEL=warn "$harness" logits --checkpoint "$tmp/ckA" --ids "$ids" --out "$tmp/policy.npy" || fail "harness logits"
diff_line=$("$harness" compare "$tmp/gen.npy" "$tmp/policy.npy" --tol 1e-4) ||
  fail "exported logits differ from the learner's policy: $diff_line"
base_line=$("$harness" compare "$tmp/base.npy" "$tmp/policy.npy" --tol 1e-4) &&
  fail "the policy equals the base model ($base_line): training changed nothing"
echo "export: qrl-generate logits vs learner policy: $diff_line (base model: ${base_line%% *}) in $(secs "$t") s"

# ---- 3. damaged checkpoints are refused by name ------------------------------------------
cp -r "$tmp/ckA" "$tmp/ckD"
sed -i 's/"next_group_id"/"next_group"/' "$tmp/ckD/step-00000004/manifest.json"
out=$("$learner" "${fa_args[@]}" --resume "$tmp/ckD" 2>&1) && fail "garbled manifest accepted"
echo "$out" | grep -q "qrl-learner: error: $tmp/ckD/step-00000004/manifest.json: field \"next_group_id\"" ||
  fail "garbled manifest: $out"
rm -rf "$tmp/ckD/step-00000004"
head -c 5000 "$tmp/ckA/step-00000003/params.safetensors" >"$tmp/ckD/step-00000003/params.safetensors"
out=$("$learner" "${fa_args[@]}" --learner.checkpoint_dir "$tmp/ckD" --resume auto 2>&1) &&
  fail "truncated params accepted"
echo "$out" | grep -q "qrl-learner: error: $tmp/ckD/step-00000003/params.safetensors: .* bytes, the manifest says" ||
  fail "truncated params: $out"
out=$("$learner" "${fa_args[@]}" --resume "$tmp/nope" 2>&1) && fail "missing checkpoint accepted"
echo "$out" | grep -q "qrl-learner: error: learner.resume: checkpoint $tmp/nope" || fail "missing: $out"
mkdir "$tmp/ckA/step-00000009"
out=$(QRL_LOG_LEVEL=info timeout 20 "$learner" "${fa_args[@]}" --learner.checkpoint_dir "$tmp/ckA" --resume auto \
  --learner.max_updates 4 2>&1) || fail "resume of a finished run with a partial folder failed: $out"
echo "$out" | grep -q "WARN.*step-00000009 has no manifest.json (partial, ignored)" || fail "partial: $out"
echo "$out" | grep -q "resumed from $tmp/ckA/step-00000004: step=4 version=4" || fail "partial resume: $out"
# SIGTERM on an idle learner writes a checkpoint (its dispatched groups pending) and exits 0
QRL_LOG_LEVEL=info "$learner" "${fa_args[@]}" --kafka.group gs --learner.run_id 78 \
  --learner.checkpoint_dir "$tmp/ckS" >"$tmp/S.log" 2>&1 &
pids+=($!); pid_s=$!
wait_log "$tmp/S.log" "serving run_id=78" 1 30
sleep 1
kill -TERM $pid_s
wait_exit $pid_s 30 "learner on SIGTERM"
jq -e '.step == 0 and .version == 0 and .run_id == 78 and (.pending | length) == 4 and .next_group_id == 5' \
  "$tmp/ckS/step-00000000/manifest.json" >/dev/null || fail "SIGTERM checkpoint: $(cat "$tmp/ckS/step-00000000/manifest.json")"
echo "damaged checkpoints refused with the file named; a partial folder skipped; SIGTERM checkpoint written"

# ---- 4. real replica: kill -9 after a checkpoint, resume, the replica follows -----------
t=$(date +%s.%N)
# 160 new tokens per response: an update then takes ~1 s on 2 cores, so the kill after the
# step-2 checkpoint lands before step 4 (at 16 tokens steps 2..4 took ~0.1 s and R1 could
# finish before the log poll saw step 2: a flake seen once)
rargs=("${common[@]}" --learner.group_size 4 --learner.quota 4 --learner.max_updates 4 --learner.max_staleness 1
       --sampling.max_new_tokens 160 --learner.heartbeat_interval_ms 300 --learner.checkpoint_dir "$tmp/ckR")
QRL_LOG_LEVEL=info "$learner" "${rargs[@]}" --metrics.jsonl "$tmp/R1.jsonl" >"$tmp/R1.log" 2>&1 &
pids+=($!); pid_r1=$!
port=$(log_port "$tmp/R1.log")
"$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$bootstrap" \
  --rollout.replica_id r0 --rollout.slots 4 --rollout.max_concurrency 2 --rollout.threads 1 \
  --kafka.session_timeout_ms 6000 --rpc.token_file "$tmp/token" \
  --learner.addr "127.0.0.1:$port" >"$tmp/r0.log" 2>&1 &
pids+=($!); pid_r0=$!
wait_log "$tmp/R1.log" "checkpoint step=2 " 1 90
stop $pid_r1
# the kill lands after the step-2 checkpoint; on a loaded machine R1 may have written the
# step-3 one too (perhaps before logging it): the newest complete folder (manifest.json is
# written last) is what the restart must take
last=$(for d in "$tmp/ckR"/step-*; do [ -f "$d/manifest.json" ] && basename "$d" || true; done |
       sed 's/^step-0*\([0-9]*\).*/\1/' | sort -n | tail -1)
QRL_LOG_LEVEL=info "$learner" "${rargs[@]}" --rpc.listen "127.0.0.1:$port" --resume auto \
  --metrics.jsonl "$tmp/R2.jsonl" >"$tmp/R2.log" 2>&1 &
pids+=($!); pid_r2=$!
wait_exit $pid_r2 100 "the restarted learner"
wait_exit $pid_r0 30 "the replica (drain on SHUTDOWN)"
resumed=$(sed -n 's/.*resumed from [^ ]*step-0*\([0-9]*\): step=.*/\1/p' "$tmp/R2.log")
[ "$resumed" = "$last" ] || fail "R2 resumed from step '$resumed', R1's newest checkpoint is step $last"
[ "$last" -lt 4 ] || fail "R1 finished all 4 updates before the kill (the test did not exercise resume)"
grep -q "update step=$((last + 1)) version=$((last + 1)) " "$tmp/R2.log" || fail "R2 did not continue with version $((last + 1))"
jq -s -e --argjson l "$last" 'map(.version) == [range($l + 1; 5)]' "$tmp/R2.jsonl" >/dev/null ||
  fail "R2 versions: $(cat "$tmp/R2.jsonl")"
grep -q "weights received version=[34] " "$tmp/r0.log" || fail "the replica never received version 3 or 4"
{ jq -c --argjson l "$last" 'select(.step <= $l)' "$tmp/R1.jsonl"; cat "$tmp/R2.jsonl"; } |
  jq -s -e '[.[].groups[]] | sort == [range(1;17)]' >/dev/null ||
  fail "groups not 1..16 once each: R1 $(jq -c -s 'map({step, groups})' "$tmp/R1.jsonl") R2 $(jq -c -s 'map({step, groups})' "$tmp/R2.jsonl")"
echo "real replica: learner killed -9 after step $last, resumed; version 4 reached, groups 1..16 once each," \
     "replica re-registered and followed ($(secs "$t") s)"
echo "learner resume test passed in $(secs "$t_all") s"
