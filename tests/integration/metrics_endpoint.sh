#!/usr/bin/env bash
# /metrics of both daemons without Kafka (docs/metrics.md): the broker address points at a
# closed port, which the daemons only warn about, so they start, serve and stop cheaply.
#   1. qrl-rollout --metrics.listen 127.0.0.1:0: the picked port is logged; GET /metrics is
#      200 text/plain version=0.0.4 with HELP/TYPE lines and the configured slot count;
#      the info series carries the replica id; / is 404, POST is 405; SIGTERM: exit 0
#      and the port is closed;
#   2. qrl-learner with metrics.listen and metrics.tensorboard_dir: the dispatch window
#      (T x (1 + max_staleness) groups in flight) shows, the event file holds its
#      file_version record;
#   3. bad values: exit 1 naming metrics.listen / metrics.tensorboard_dir.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${BUILD:-build}
rollout=$build/bin/qrl-rollout
learner=$build/bin/qrl-learner
data=${QRL_DATA_DIR:-../shared/data}/llama2c_stories260K
model=$data/stories260K.bin
tok=$data/tok512.bin
for f in "$rollout" "$learner"; do [ -x "$f" ] || { echo "FAIL: $f is not built"; exit 1; }; done
[ -f "$model" ] && [ -f "$tok" ] || { echo "skip: no $model"; exit 77; }
command -v curl >/dev/null || { echo "skip: curl not found"; exit 77; }
tmp=$(mktemp -d /tmp/qrl_metrics_test.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ]; then
    for l in "$tmp"/*.log; do [ -f "$l" ] && { echo "--- last lines of $l:"; tail -n 15 "$l"; }; done
  fi
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
common=(--kafka.bootstrap 127.0.0.1:1 --rpc.listen 127.0.0.1:0)

# wait_port LOG: the port of "metrics listening addr=127.0.0.1:PORT" (10 s at most).
wait_port() {
  for _ in $(seq 100); do
    local p
    p=$(grep -o 'metrics listening addr=127\.0\.0\.1:[0-9]*' "$1" | head -n1 | sed 's/.*://')
    [ -n "$p" ] && { echo "$p"; return 0; }
    sleep 0.1
  done
  return 1
}

# scrape_until PORT LINE: GET /metrics into $tmp/m (headers $tmp/h) until LINE is in it;
# the loop publishes on its first ticks, which a loaded machine may delay (10 s at most).
scrape_until() {
  for _ in $(seq 50); do
    curl -s -D "$tmp/h" -o "$tmp/m" "http://127.0.0.1:$1/metrics" && grep -qx "$2" "$tmp/m" && return 0
    sleep 0.2
  done
  return 1
}

# ---- 1. rollout -------------------------------------------------------------------------
"$rollout" --rollout.model "$model" --rollout.tokenizer "$tok" --rollout.threads 1 --rollout.slots 5 \
  --rollout.replica_id 'r"0' --metrics.listen 127.0.0.1:0 "${common[@]}" >"$tmp/rollout.log" 2>&1 &
rpid=$!
pids+=("$rpid")
port=$(wait_port "$tmp/rollout.log") || fail "rollout: no 'metrics listening' line"
scrape_until "$port" 'qrl_rollout_slots 5' || fail "rollout: no 'qrl_rollout_slots 5' in: $(cat "$tmp/m")"
head -n1 "$tmp/h" | grep -q ' 200' || fail "rollout: status $(head -n1 "$tmp/h")"
grep -qi '^Content-Type: text/plain; version=0.0.4' "$tmp/h" || fail "rollout: content type: $(cat "$tmp/h")"
grep -qx '# TYPE qrl_rollout_tokens_generated_total counter' "$tmp/m" || fail "rollout: TYPE line"
grep -qx '# HELP qrl_rollout_slots Sequence slots of the scheduler (rollout.slots).' "$tmp/m" || fail "rollout: HELP line"
grep -qx 'qrl_rollout_state 2' "$tmp/m" || fail "rollout: state (want 2, running)"
grep -qx 'qrl_rollout_groups_produced_total 0' "$tmp/m" || fail "rollout: groups produced"
grep -qx 'qrl_rollout_info{replica="r\\"0",precision="f32",kv_format="f32"} 1' "$tmp/m" \
  || fail "rollout: info: $(grep info "$tmp/m")"
grep -qx 'qrl_rollout_trace_bytes_total 0' "$tmp/m" || fail "rollout: trace bytes (rollout.trace off)"
[ "$(grep -c '^# TYPE ' "$tmp/m")" -eq 21 ] || fail "rollout: want 21 families, got $(grep -c '^# TYPE ' "$tmp/m")"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")" = 404 ] || fail "rollout: / not 404"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$port/metrics")" = 405 ] \
  || fail "rollout: POST not 405"
kill -TERM "$rpid"
for _ in $(seq 100); do kill -0 "$rpid" 2>/dev/null || break; sleep 0.1; done
wait "$rpid"; rc=$?
[ $rc -eq 0 ] || fail "rollout: exit $rc after SIGTERM"
curl -s -o /dev/null "http://127.0.0.1:$port/metrics" && fail "rollout: port $port still served after exit"

# ---- 2. learner -------------------------------------------------------------------------
printf '{"prompt":"Once upon a time","answer":"1"}\n{"prompt":"Lily had a cat","answer":"2"}\n' >"$tmp/ds.jsonl"
largs=(--learner.model "$model" --learner.tokenizer "$tok" --dataset.path "$tmp/ds.jsonl" --learner.threads 1
       --learner.quota 3 --learner.max_staleness 2)
"$learner" "${largs[@]}" --metrics.listen 127.0.0.1:0 --metrics.tensorboard_dir "$tmp/runs/a" "${common[@]}" \
  --weights.listen 127.0.0.1:0 >"$tmp/learner.log" 2>&1 &
lpid=$!
pids+=("$lpid")
port=$(wait_port "$tmp/learner.log") || fail "learner: no 'metrics listening' line"
scrape_until "$port" 'qrl_learner_groups_in_flight 9' || fail "learner: in flight: $(grep in_flight "$tmp/m")"
grep -qx 'qrl_learner_groups_dispatched_total 9' "$tmp/m" || fail "learner: dispatched"
grep -qx 'qrl_learner_step 0' "$tmp/m" || fail "learner: step"
grep -qx '# TYPE qrl_learner_update_seconds gauge' "$tmp/m" || fail "learner: update_seconds TYPE"
ev=$(ls "$tmp"/runs/a/events.out.tfevents.* 2>/dev/null | head -n1)
[ -n "$ev" ] || fail "learner: no event file in $tmp/runs/a"
[ "$(stat -c %s "$ev")" -eq 40 ] || fail "learner: event file of $(stat -c %s "$ev") bytes (want the 40-byte file_version record)"
grep -q 'brain.Event:2' "$ev" || fail "learner: no file_version in $ev"
{ kill -KILL "$lpid"; wait "$lpid"; } 2>/dev/null # its producer would wait 10 s for the absent broker

# ---- 3. bad values ----------------------------------------------------------------------
"$rollout" --rollout.model "$model" --rollout.tokenizer "$tok" --rollout.threads 1 \
  --metrics.listen 127.0.0.1:99999 "${common[@]}" >"$tmp/bad1.log" 2>&1
[ $? -eq 1 ] || fail "rollout: bad metrics.listen did not exit 1"
grep -q '^qrl-rollout: error: metrics.listen: .*99999' "$tmp/bad1.log" || fail "rollout: error line: $(tail -n1 "$tmp/bad1.log")"
touch "$tmp/file"
"$learner" "${largs[@]}" --metrics.tensorboard_dir "$tmp/file/runs" "${common[@]}" >"$tmp/bad2.log" 2>&1
[ $? -eq 1 ] || fail "learner: bad metrics.tensorboard_dir did not exit 1"
grep -q '^qrl-learner: error: metrics.tensorboard_dir: .*mkdir' "$tmp/bad2.log" || fail "learner: error line: $(tail -n1 "$tmp/bad2.log")"
echo "ok: rollout and learner /metrics, tensorboard file, bad values"
