#!/usr/bin/env bash
# deploy/local/launch.sh from start to end the ways a user ends a run (issue 20), on real
# local clusters (a Kafka broker of its own, one qrl-learner, one qrl-rollout) with a
# tiny random arith model (32 dims, 2 layers; runs of a few seconds):
#   A. `qrlctl shutdown` mid-run is a normal early end: rc 0, this run's final checkpoint
#      exported, the evaluation after RL and the summary written ("run ended early");
#      nothing left running.  Its SFT warm start shows progress lines (step, loss, tok/s,
#      ETA), and so does the wait for the first update;
#   B. a run whose every update trains on no group (all dropped by dynamic sampling) warns
#      on each progress line and in the summary, whose counts add up (groups = trained +
#      dropped);
#   B. is configured by --config FILE.yaml (launcher options by name, daemon keys nested and
#      routed) and trains on --dataset FILE;
#   C. Ctrl-C (SIGINT to the launcher's process group, as a terminal sends it) mid-run: the
#      learner gets one SIGTERM and its drain: no "second signal", its newest checkpoint is
#      the step of its last update; rc 130; a hint to resume; nothing left running;
#   D. `launch.sh --resume C --updates 14` continues C in its folder with C's arguments
#      (T, G, replicas, ...; the first start's task data, model and evaluation reused, its
#      logs kept as *.1.log): the learner resumes from the checkpoint, steps 1..14 once
#      each over both starts, export of step 14, summary of 14 updates.
# Skips (77) without java or the Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
bin=$build/bin
home=${QRL_KAFKA_HOME:-${QRL_DEPS:-$root/.deps}/kafka}
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
fatal() { echo "FAIL: $*"; exit 1; }
if ! command -v java >/dev/null || [ ! -f "$home/libs/.stamp" ]; then
  [ "${QRL_REQUIRE_KAFKA:-0}" = 1 ] && fatal "no java / Kafka jars, and QRL_REQUIRE_KAFKA=1"
  echo "skipped: no java or Kafka jars (run deploy/setup.sh)"; exit 77
fi
for b in qrl-learner qrl-rollout qrl-eval qrl-task qrlctl qrl-kafka-admin; do
  [ -x "$bin/$b" ] || fatal "$bin/$b is not built"
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qrl-lifecycle-test.XXXXXX")
fails=0
# the processes of this test: their command lines name $tmp
ours() { pgrep -f "$tmp" | grep -vx "$$" || true; }
cleanup() {
  local rc=$? p
  for p in $(ours); do kill -KILL "$p" 2>/dev/null || true; done
  if [ $rc -ne 0 ] && [ -z "${QRL_KEEP_TMP:-}" ]; then
    for l in "$tmp"/*.out "$tmp"/*/learner.log "$tmp"/*/r0.log; do
      [ -f "$l" ] && { echo "--- last lines of $l:"; tail -n 15 "$l"; }
    done
  fi
  [ -n "${QRL_KEEP_TMP:-}" ] || rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
t_all=$SECONDS
"$bin/qrl-task" init-model --task arith --seed 1 --dim 32 --layers 2 --heads 2 --out "$tmp/m0" >/dev/null 2>&1 ||
  fatal "init-model"
small=(--replicas 1 --quota 4 --group-size 4 --eval-n 8 --eval-k 1 --seed 2)
common=(--model "$tmp/m0" "${small[@]}")

# launch NAME ARGS...: deploy/local/launch.sh in the background as a terminal runs it: in a
# process group of its own ($lpid), SIGINT not ignored (a script's background jobs start
# with SIGINT ignored, which no trap can undo); output in $tmp/NAME.out
launch() {
  local name=$1
  shift
  BUILD=$build setsid python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' deploy/local/launch.sh "$@" >"$tmp/$name.out" 2>&1 &
  lpid=$!
}
# until FILE has N lines (the learner's metrics: N updates done)
wait_lines() {
  local end=$((SECONDS + $3))
  until [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ]; do
    kill -0 "$lpid" 2>/dev/null || { fail "launch.sh exited before $2 lines in $1"; return 1; }
    [ $SECONDS -lt $end ] || { fail "no $2 lines in $1 after $3 s"; return 1; }
    sleep 0.2
  done
}
# wait_launch SECONDS: the launcher's exit status into $lrc
wait_launch() {
  local end=$((SECONDS + $1))
  while kill -0 "$lpid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
  kill -0 "$lpid" 2>/dev/null && { fail "launch.sh still running after $1 s"; kill -KILL "$lpid"; }
  lrc=0; wait "$lpid" || lrc=$?
}
left_running() { # RUN: processes that still name the run folder
  sleep 0.5
  local p; p=$(pgrep -f "$1" || true)
  [ -z "$p" ] || fail "processes left running: $(ps -o pid,args -p $p | cut -c1-150)"
}
# the checkpoint the export took: its step
exported_step() { sed -n 's/.*exported .*step-0*\([0-9][0-9]*\) (step=.*/\1/p' "$1/export.log"; }

# ---- A. qrlctl shutdown mid-run: a normal early end ------------------------------------------
t=$SECONDS f0=$fails
A=$tmp/A
# (with a short SFT warm start and progress every 0.3 s: the SFT and waiting lines)
QRL_LAUNCH_PROGRESS_S=0.3 launch A "${small[@]}" --sft-steps 30 --updates 200 --run-dir "$A" -- --learner.dynamic_sampling false
if wait_lines "$A/learner.jsonl" 2 90; then
  "$bin/qrlctl" --learner "$(cat "$A/learner.addr")" --token-file "$A/token" --reason "enough" shutdown \
    >"$tmp/A.ctl" 2>&1 || fail "qrlctl shutdown: $(cat "$tmp/A.ctl")"
  wait_launch 90
  n=$(wc -l <"$A/learner.jsonl")
  [ $lrc -eq 0 ] || fail "A: launch.sh exited $lrc after qrlctl shutdown: $(tail -3 "$tmp/A.out")"
  grep -q "stopped early by qrlctl shutdown (reason: enough) after $n of 200 updates" "$tmp/A.out" ||
    fail "A: no early-end line for $n updates: $(tail -5 "$tmp/A.out")"
  grep -q "^run ended early: stopped early by qrlctl shutdown (reason: enough) after $n of 200 updates" "$A/summary.txt" ||
    fail "A: summary: $(cat "$A/summary.txt" 2>/dev/null)"
  [ "$(exported_step "$A")" = "$n" ] || fail "A: exported step '$(exported_step "$A")', the last update is $n"
  [ -s "$A/eval-after.json" ] && jq -e '.n == 8' "$A/eval-after.json" >/dev/null || fail "A: no evaluation after RL"
  grep -q "^updates $n, versions 1..$n" "$A/summary.txt" || fail "A: summary updates: $(cat "$A/summary.txt")"
  # item 6: every long phase shows progress (SFT: step, loss, rate, ETA; RL: a slow update)
  [ "$(grep -cE '^  SFT step [123]0/30 \([0-9]+%\): loss [0-9.]+, [0-9]+ tok/s, [0-9]+ s, ETA [0-9]+ s$' "$tmp/A.out")" -eq 3 ] ||
    fail "A: SFT progress lines: $(grep SFT "$tmp/A.out")"
  grep -qE '^  \.\.\. update 1: [0-9]+ s since the start' "$tmp/A.out" || fail "A: no line while the first update is awaited"
  left_running "$A"
  [ $fails -eq $f0 ] && echo "A: qrlctl shutdown after $n updates: rc 0, step $n exported, evaluated, summarized ($((SECONDS - t)) s)"
fi

# ---- B. a run that trains nothing says so loudly ----------------------------------------------
# (the random model scores 0: every group's rewards are equal, dynamic sampling drops them all)
# (configured from a YAML file, on prompts of our own: --config, --dataset)
t=$SECONDS f0=$fails
B=$tmp/B
"$bin/qrl-task" gen --task arith --split train --n 50 --seed 5 --out "$tmp/train50.jsonl" >/dev/null 2>&1 || fatal "gen"
cat >"$tmp/B.yaml" <<EOF
# deploy/local/launch.sh --config: the launcher's options by name, daemon keys nested
model: $tmp/m0
replicas: 1
updates: 2
quota: 4
group_size: 4     # or group-size
eval-n: 8
eval-k: 1
seed: 2
dataset: $tmp/train50.jsonl
rollout:
  slots: 8        # to the replicas
learner:
  heartbeat_interval_ms: 500
EOF
launch B --config "$tmp/B.yaml" --run-dir "$B"
wait_launch 120
[ $lrc -eq 0 ] || fail "B: launch.sh exited $lrc"
grep -q "model loaded path=$tmp/m0 .* dataset=$tmp/train50.jsonl prompts=50" "$B/learner.log" ||
  fail "B: --dataset not used: $(grep 'model loaded' "$B/learner.log")"
grep -q "config learner.heartbeat_interval_ms=500 origin=--learner.heartbeat_interval_ms" "$B/learner.log" &&
  grep -q "config rollout.slots=8 origin=--rollout.slots" "$B/r0.log" || fail "B: the YAML's daemon keys not routed"
[ "$(grep -c '^ *[0-9]\+ \+[0-9]\+ .*WARNING: trained on no group (all 4 dropped: equal rewards)$' "$tmp/B.out")" -eq 2 ] ||
  fail "B: progress lines do not warn: $(grep '^ *[0-9]\+ \+[0-9]\+ ' "$tmp/B.out")"
grep -q "^updates 2, versions 1..2, groups 8: trained 0, dropped by dynamic sampling 8$" "$B/summary.txt" &&
  grep -q "^WARNING: no update trained on any group" "$B/summary.txt" || fail "B: summary: $(cat "$B/summary.txt")"
[ $fails -eq $f0 ] && echo "B: nothing trained: every progress line and the summary warn ($((SECONDS - t)) s)"

# ---- C. Ctrl-C mid-run: the learner gets its drain and writes its final checkpoint ------------
t=$SECONDS f0=$fails
C=$tmp/C
launch C "${common[@]}" --updates 12 --run-dir "$C" -- --learner.dynamic_sampling false
if wait_lines "$C/learner.jsonl" 3 90; then
  kill -INT -- "-$lpid" # a terminal's Ctrl-C: SIGINT to the foreground process group
  wait_launch 150
  n=$(wc -l <"$C/learner.jsonl")
  [ $lrc -eq 130 ] || fail "C: launch.sh exited $lrc after Ctrl-C (expected 130)"
  grep -q "second signal" "$C/learner.log" && fail "C: the learner got a second signal: $(grep -m2 -E 'SIGTERM|SIGINT|signal' "$C/learner.log")"
  grep -q "no more dispatch; stopping after the running update and a checkpoint" "$C/learner.log" ||
    fail "C: the learner was not asked to drain"
  latest=$(cat "$C/checkpoints/latest" 2>/dev/null)
  [ "$latest" = "$(printf 'step-%08d' "$n")" ] && [ -f "$C/checkpoints/$latest/manifest.json" ] ||
    fail "C: newest checkpoint '$latest', the last update is step $n"
  left_running "$C"
  [ $fails -eq $f0 ] && echo "C: Ctrl-C after $n updates: the learner drained, final checkpoint $latest ($((SECONDS - t)) s)"
  grep -q "continue this run from its newest checkpoint with: deploy/local/launch.sh --resume $C" "$tmp/C.out" ||
    fail "C: no resume hint: $(tail -2 "$tmp/C.out")"

  # ---- D. --resume: the stopped run C goes on in its folder, with its own arguments (T=4,
  # G=4, one replica, ...; --updates 14 given anew wins over the saved 12) -------------------
  t=$SECONDS f0=$fails
  launch D --resume "$C" --updates 14
  wait_launch 150
  [ $lrc -eq 0 ] || fail "D: launch.sh --resume exited $lrc: $(tail -3 "$tmp/D.out")"
  grep -q "resuming $C from its checkpoint of step $n " "$tmp/D.out" || fail "D: no resume line: $(head -5 "$tmp/D.out")"
  grep -q "SFT\|evaluating the starting policy" "$tmp/D.out" && fail "D: the first start's phases ran again"
  grep -q "resumed from $C/checkpoints/step-$(printf %08d "$n"): step=$n " "$C/learner.log" ||
    fail "D: the learner did not resume: $(grep -m3 -E 'resum|serving' "$C/learner.log")"
  grep -q "serving .* G=4 T=4 " "$C/learner.log" || fail "D: not the run's G/T: $(grep serving "$C/learner.log")"
  [ -f "$C/learner.1.log" ] && [ -f "$C/r0.1.log" ] || fail "D: the first start's logs were not kept"
  jq -s -e 'map(.step) == [range(1; 15)] and map(.version) == [range(1; 15)]' "$C/learner.jsonl" >/dev/null ||
    fail "D: steps over both starts: $(jq -c -s 'map(.step)' "$C/learner.jsonl")"
  grep -q "^updates 14, versions 1..14" "$C/summary.txt" || fail "D: summary: $(cat "$C/summary.txt")"
  [ "$(exported_step "$C")" = 14 ] || fail "D: exported step '$(exported_step "$C")', expected 14"
  left_running "$C"
  [ $fails -eq $f0 ] && echo "D: --resume continued C from step $n to 14 with its settings ($((SECONDS - t)) s)"
fi

[ $fails -eq 0 ] || exit 1
echo "launch lifecycle: all passed in $((SECONDS - t_all)) s"
