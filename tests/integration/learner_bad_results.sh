#!/usr/bin/env bash
# qrl-learner and bad GroupResults (issue 8): a real Kafka broker, the learner on
# stories260K and a scripted replica (learner_resume_harness feed --bad-first 2) that
# answers groups 1 and 2 first with four bad results each (a response with a log-prob
# missing, a NaN log-prob, a group id this run never dispatched, schema_version 99) and
# then with the good one.  Every bad result goes to the dead-letter topic with its reason,
# the learner keeps serving, and the good results of groups 1..4 train 2 updates.
# The feeder also ignores the first delivery of group 3 (a lost prompt): with
# learner.redispatch_timeout_s 2 the learner sends it again and it trains in update 2
# (alternate mode: update 2 can only be groups 3 and 4).
# Skips (77) without java or the Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" badres
harness=$build/tests/integration/learner_resume_harness
[ -x "$harness" ] || fail "$harness is not built"
need_kafka
t0=$SECONDS
start_broker 1
for i in 0 1 2 3 4 5; do printf '{"prompt":"Once upon a time, Tom","answer":"the"}\n'; done >"$tmp/data.jsonl"
"$harness" feed --bootstrap "$bootstrap" --prompts qrl.prompts --results qrl.results --vocab 512 \
  --bad-first 2 --ignore-first 3 --timeout 100 >"$tmp/feed.log" 2>&1 &
pids+=($!)
QRL_LOG_LEVEL=info timeout 100 "$learner" --learner.model "$model" \
  --learner.tokenizer "$tokenizer" --dataset.chat_template none --dataset.task contains \
  --learner.threads 1 --dataset.path "$tmp/data.jsonl" --kafka.bootstrap "$bootstrap" \
  --learner.group_size 4 --learner.quota 2 --learner.max_updates 2 --learner.run_id 91 \
  --learner.lr 1e-3 --learner.mode alternate --learner.redispatch_timeout_s 2 --metrics.jsonl "$tmp/learner.jsonl" >"$tmp/learner.log" 2>&1 ||
  fail "learner exited $?"
dl() { grep -c "dead letter .*$1" "$tmp/learner.log" || true; }
# the feeder answers groups 1-2 with the four bad variants each time it sees them: twice
# when a slow start makes the learner dispatch them again (redispatch_timeout_s 2)
nb=$(grep -c "answered group [12] (" "$tmp/feed.log" || true)
[ "$nb" -ge 2 ] || fail "the feeder answered groups 1-2 $nb times: $(head -5 "$tmp/feed.log")"
[ "$(dl "behavior_logprobs has")" -eq "$nb" ] || fail "mismatched lengths not dead-lettered: $(grep 'dead letter' "$tmp/learner.log")"
[ "$(dl "not finite\|NaN\|nan")" -eq "$nb" ] || fail "NaN log-prob not dead-lettered: $(grep 'dead letter' "$tmp/learner.log")"
[ "$(dl "NOT_FOUND: group_id 100000[12] was never dispatched")" -eq "$nb" ] && [ "$(dl "NOT_FOUND")" -eq "$nb" ] ||
  fail "unknown group ids not dead-lettered (or another NOT_FOUND): $(grep 'dead letter .*NOT_FOUND' "$tmp/learner.log")"
[ "$(dl "schema_version got 99")" -eq "$nb" ] || fail "wrong schema version not dead-lettered"
[ "$(grep -c "dead letter" "$tmp/learner.log")" -eq $((4 * nb)) ] ||
  fail "expected $((4 * nb)) dead letters: $(grep 'dead letter' "$tmp/learner.log")"
jq -s -e 'map(.version) == [1,2] and ([.[].groups[]] | sort == [1,2,3,4])' "$tmp/learner.jsonl" >/dev/null ||
  fail "updates: $(cat "$tmp/learner.jsonl")"
grep -q "group=3 no result [0-9]* s after it was sent: dispatched again" "$tmp/learner.log" ||
  fail "lost group 3 not dispatched again: $(grep -i 'group=3' "$tmp/learner.log" | head -5)"
grep -q "ignored the first delivery of group 3" "$tmp/feed.log" || fail "the feeder did not drop group 3"
# group 3 once, plus every extra dispatch of groups 1-2 a slow start caused (each answered)
want_rd=$((1 + nb - 2))
grep -q "redispatched=$want_rd\b" "$tmp/learner.log" ||
  fail "redispatch count (want $want_rd): $(grep stopping "$tmp/learner.log")"
grep "dead letter" "$tmp/learner.log" | sed 's/.*dead letter /  /' | cut -c1-150 | sort -u | head -8
echo "8 bad results dead-lettered with their reasons; lost group 3 sent again; groups 1..4 trained in 2 updates; $((SECONDS - t0)) s"
