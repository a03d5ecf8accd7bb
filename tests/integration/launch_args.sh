#!/usr/bin/env bash
# deploy/local/launch.sh's argument handling, without a GPU and without starting anything:
#   - bad --device / --gpus / --gpu-memory-utilization values refused at once (exit 1, one
#     "launch.sh: error:" line naming the flag, no run folder made); a used (non-empty)
#     --run-dir refused before anything is written;
#   - --device cuda where no GPU can be used refused before the task data, SFT or Kafka;
#   - --dry-run: the commands it would run; flags after -- routed (--rollout.* to every
#     replica, the rest to the learner, "--key value" pairs kept together); GPU placement
#     round-robin over --gpus; rollout.gpu_memory_utilization when processes share a GPU;
#     --device cpu commands carry no device flag (the CPU demo is unchanged);
#   - qrl-eval / qrl-generate --device cuda and qrl-rollout rollout.gpu_memory_utilization
#     refused with a clear error where no GPU can be used.
# The GPU run itself: docs/demo.md "On a GPU".
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
bin=$build/bin
for b in qrl-learner qrl-rollout qrl-eval qrl-generate qrl-task qrl-kafka-admin; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b (run make)"; exit 1; }
done
data=${QRL_DATA_DIR:-../shared/data}
model=$data/llama2c_stories260K/stories260K.bin
tmp=$(mktemp -d /tmp/qrl-launch-args-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
launch() { BUILD=$build timeout 60 deploy/local/launch.sh "$@"; }

# refused PATTERN ARGS...: launch.sh exits 1 with one error line matching PATTERN, makes no
# run folder and starts nothing
refused() {
  local pat=$1 rc n
  shift
  rm -rf "$tmp/run"
  launch --run-dir "$tmp/run" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc -eq 1 ] || fail "$*: exit $rc (expected 1): $(tail -3 "$tmp/err")"
  n=$(grep -c '^launch.sh: error:' "$tmp/err")
  [ "$n" -eq 1 ] || fail "$*: $n error lines: $(cat "$tmp/err")"
  grep -qE -e "$pat" "$tmp/err" || fail "$*: error does not match '$pat': $(cat "$tmp/err")"
  [ ! -e "$tmp/run" ] || fail "$*: made the run folder $(ls "$tmp/run")"
}

refused "--device must be cpu or cuda, not 'gpu'" --device gpu
refused "unknown --task 'foo' \(arith, story, gsm8k, math500\)" --task foo
refused "unknown key learner.bogus .*a qrl-learner key given after --" -- --learner.bogus 1
refused "unknown key rollout.bogus .*a qrl-rollout key given after --" -- --rollout.bogus 1
refused "--gpus must be a comma-separated list of GPU ordinals .*not '0,x'" --device cuda --gpus 0,x
refused "--gpus must be a comma-separated list .*not ''" --device cuda --gpus ""
refused "--gpus must be a comma-separated list .*not '-1'" --device cuda --gpus -1
refused "--gpus must be a comma-separated list .*not '0,,1'" --device cuda --gpus 0,,1
refused "--gpus lists GPU 1 twice" --device cuda --gpus 1,0,01
refused "--gpus: GPU ordinal 65 is out of range" --device cuda --gpus 0,65
refused "--gpus needs --device cuda" --gpus 0
refused "--gpu-memory-utilization needs --device cuda" --gpu-memory-utilization 0.5
refused "--gpu-memory-utilization must be a fraction in \(0, 1\], not '1.5'" --device cuda --gpu-memory-utilization 1.5
refused "--gpu-memory-utilization must be a fraction in \(0, 1\], not '0'" --device cuda --gpu-memory-utilization 0
refused "--gpu-memory-utilization must be a fraction in \(0, 1\], not 'half'" --device cuda --gpu-memory-utilization half
refused "--gpu-memory-utilization 0.6 x 2 replicas on GPU 0 is more than the whole GPU" \
  --device cuda --replicas 2 --gpu-memory-utilization 0.6
# a used run folder is refused before anything runs or is written (its learner.jsonl,
# checkpoints and tb/ events would mix with the new run's, the export take the old one)
mkdir -p "$tmp/used/checkpoints/step-00000002"
echo '{"step":1}' >"$tmp/used/learner.jsonl"
for a in "" "--dry-run"; do
  t0=$SECONDS
  # shellcheck disable=SC2086
  launch --run-dir "$tmp/used" $a >"$tmp/out" 2>"$tmp/err"; rc=$?
  [ $rc -eq 1 ] && [ "$(grep -c '^launch.sh: error:' "$tmp/err")" -eq 1 ] &&
    grep -q "^launch.sh: error: --run-dir $tmp/used is not empty (it holds checkpoints learner.jsonl): give a new folder" "$tmp/err" ||
    fail "used run folder $a: exit $rc: $(cat "$tmp/err")"
  [ "$(ls -A "$tmp/used")" = "$(printf 'checkpoints\nlearner.jsonl')" ] && [ "$(cat "$tmp/used/learner.jsonl")" = '{"step":1}' ] ||
    fail "used run folder $a: changed: $(ls -A "$tmp/used")"
  [ $((SECONDS - t0)) -lt 10 ] || fail "used run folder $a: refused only after $((SECONDS - t0)) s"
done
mkdir -p "$tmp/empty"
launch --run-dir "$tmp/empty" --dry-run >/dev/null 2>"$tmp/err" || fail "an empty run folder refused: $(cat "$tmp/err")"
grep -q -- "--resume $tmp/used to continue that run" <(launch --run-dir "$tmp/used" 2>&1) || fail "no --resume hint"
# --resume needs a folder this launcher started (its launch.args), the same as --run-dir
launch --resume "$tmp/used" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "^launch.sh: error: --resume $tmp/used: not a launch.sh run folder (no $tmp/used/launch.args" "$tmp/err" ||
  fail "--resume of a folder without launch.args: exit $rc: $(cat "$tmp/err")"
printf -- '--replicas\n3\n--\n--rollout.slots\n8\n' >"$tmp/used/launch.args"
launch --resume "$tmp/used" --run-dir "$tmp/empty" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "name different folders" "$tmp/err" || fail "--resume with another --run-dir: exit $rc: $(cat "$tmp/err")"
launch --device cuda --gpus >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "^launch.sh: error: option '--gpus' needs a value" "$tmp/err" || fail "--gpus without a value: $(cat "$tmp/err")"

gpu=0
"$bin/qrl-eval" --device cuda --check-device >/dev/null 2>&1 && gpu=1
if [ $gpu = 1 ]; then
  echo "skip of the no-GPU refusals: a GPU is usable here"
else
  # refused before anything: the task data, SFT and the broker come later (in well under
  # the seconds any of them would take)
  t0=$SECONDS
  refused "--device cuda: GPU 0 cannot be used: .*(does not exist|no CUDA)" --device cuda
  refused "--device cuda: GPU 1 cannot be used: .*(does not exist|no CUDA)" --device cuda --gpus 1,0
  [ $((SECONDS - t0)) -lt 20 ] || fail "the GPU refusals took $((SECONDS - t0)) s"

  # one "<tool>: error:" line, exit 1 (CUDA build: no device; CPU build: no CUDA)
  tool_refused() { # TOOL PATTERN ARGS...
    local tool=$1 pat=$2 rc n
    shift 2
    timeout 60 "$bin/$tool" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 1 ] || fail "$tool $*: exit $rc (expected 1): $(tail -3 "$tmp/err")"
    n=$(grep -c "^$tool: error:" "$tmp/err")
    [ "$n" -eq 1 ] || fail "$tool $*: $n error lines: $(cat "$tmp/err")"
    grep -qE -e "$pat" "$tmp/err" || fail "$tool $*: error does not match '$pat': $(cat "$tmp/err")"
    [ ! -s "$tmp/out" ] || fail "$tool $*: wrote to stdout: $(head -3 "$tmp/out")"
  }
  printf '{"prompt":"1+2=","answer":"3"}\n' >"$tmp/test.jsonl"
  nogpu='--device cuda \(--device-id [0-9]+\): CUDA device [0-9]+( does not exist|: UNSUPPORTED: this build has no CUDA)'
  tool_refused qrl-eval "$nogpu" --device cuda --model "$model" --dataset "$tmp/test.jsonl" --task arith
  tool_refused qrl-eval "$nogpu" --device cuda --device-id 3 --model "$model" --dataset "$tmp/test.jsonl" --task arith
  tool_refused qrl-eval "$nogpu" --device cuda --check-device
  tool_refused qrl-generate "$nogpu" --device cuda --model "$model" --prompt "Once upon a time"
  tool_refused qrl-rollout 'rollout\.(gpu_memory_utilization 0\.3: CUDA device 0 does not exist|device cuda: UNSUPPORTED: this build has no CUDA)' \
    --rollout.model "$model" --rollout.device cuda --rollout.gpu_memory_utilization 0.3 --kafka.bootstrap 127.0.0.1:1
fi
printf '{"prompt":"1+2=","answer":"3"}\n' >"$tmp/test.jsonl"
n=$("$bin/qrl-eval" --check-device 2>&1 >/dev/null | grep -c 'check-device applies to --device cuda only')
[ "$n" -eq 1 ] || fail "qrl-eval --check-device without --device cuda not refused"
"$bin/qrl-generate" --model "$model" --prompt x --gpu-memory-utilization 0.5 2>&1 >/dev/null |
  grep -q 'gpu-memory-utilization applies to --device cuda only' || fail "qrl-generate --gpu-memory-utilization on the CPU not refused"
"$bin/qrl-rollout" --rollout.model "$model" --rollout.gpu_memory_utilization 0.3 --kafka.bootstrap 127.0.0.1:1 2>&1 >/dev/null |
  grep -q '^qrl-rollout: error: rollout.gpu_memory_utilization applies to rollout.device cuda only' ||
  fail "qrl-rollout rollout.gpu_memory_utilization on the CPU not refused"

# ---- --dry-run ---------------------------------------------------------------------------
dry() { # ARGS...: the "+ " command lines into $tmp/cmds
  rm -rf "$tmp/run"
  launch --dry-run --run-dir "$tmp/run" "$@" >"$tmp/cmds" 2>"$tmp/err" || fail "--dry-run $*: exit $?: $(cat "$tmp/err")"
  [ ! -e "$tmp/run" ] || fail "--dry-run $*: made the run folder"
}
line() { grep -E "^\+ $bin/$1" "$tmp/cmds"; } # qrl-learner --learner.model | qrl-rollout | qrl-eval
replica() { line qrl-rollout | grep -e "--rollout.replica_id r$1 "; }
has() { # WHAT LINE PATTERN: LINE contains the fixed string PATTERN
  grep -qF -e "$3" <<<"$2" || fail "$1 lacks '$3': $2"
}
hasnt() { ! grep -qF -e "$3" <<<"$2" || fail "$1 has '$3': $2"; }

# the CPU default: every step shown, no device flag anywhere, the learner's flags last
dry -- --loss.mode naive --rollout.foo=1 --rollout.bar 2 --learner.x 3 --rollout.enforce_eager \
  --rollout.baz --sampling.temperature=0.7
[ "$(grep -c '^+ ' "$tmp/cmds")" -eq 13 ] || fail "--dry-run: $(grep -c '^+ ' "$tmp/cmds") commands, expected 13: $(cat "$tmp/cmds")"
for what in "qrl-task gen --task arith --split train" "qrl-task init-model" "qrl-learner --mode sft" \
    "deploy/kafka/kafka.sh start" "qrl-learner export" "deploy/local/summary.sh"; do
  grep -qF -e "$what" "$tmp/cmds" || fail "--dry-run does not show $what"
done
L=$(line "qrl-learner --learner.model")
[ "$(wc -l <<<"$L")" -eq 1 ] || fail "not one learner command: $L"
[ "$(line qrl-rollout | wc -l)" -eq 2 ] || fail "not 2 replica commands: $(line qrl-rollout)"
[ "$(line qrl-eval | wc -l)" -eq 2 ] || fail "not 2 evaluations: $(line qrl-eval)"
[[ $L == *" --loss.mode naive --learner.x 3 --sampling.temperature=0.7 >"* ]] ||
  fail "the learner's flags are not its last ones, in order: $L"
for f in "--rollout.foo" "--rollout.bar" "--rollout.enforce_eager" "--rollout.baz" "--learner.device" "--weights.nccl_device"; do
  hasnt learner "$L" "$f"
done
for i in 0 1; do
  R=$(replica $i)
  [[ $R == *" --rollout.foo=1 --rollout.bar 2 --rollout.enforce_eager --rollout.baz >"* ]] ||
    fail "r$i: the --rollout.* flags are not its last ones, in order: $R"
  for f in "--learner.x" "--loss.mode" "--sampling.temperature" "--rollout.device" "--rollout.cuda_device" \
      "--rollout.gpu_memory_utilization"; do
    hasnt "r$i" "$R" "$f"
  done
done
while read -r E; do hasnt qrl-eval "$E" "--device"; done < <(line qrl-eval)

# one GPU shared by the learner and two replicas: 0.5 of it split over the replicas
dry --device cuda --replicas 2
L=$(line "qrl-learner --learner.model")
has learner "$L" "--learner.device cuda --learner.cuda_device 0 --weights.nccl_device 0"
for i in 0 1; do
  has "r$i" "$(replica $i)" "--rollout.device cuda --rollout.cuda_device 0 --rollout.nccl_device 0 --rollout.gpu_memory_utilization 0.250"
done
while read -r E; do has qrl-eval "$E" "--device cuda --device_id 0"; done < <(line qrl-eval)
grep -qF "# GPU placement: learner on GPU 0, r0 on GPU 0 (gpu_memory_utilization 0.250), r1 on GPU 0 (gpu_memory_utilization 0.250)" \
  "$tmp/cmds" || fail "no placement line: $(grep '^#' "$tmp/cmds")"
has "SFT" "$(line "qrl-learner --mode sft")" "--mode sft" # SFT stays on the CPU
hasnt "SFT" "$(line "qrl-learner --mode sft")" "--learner.device"

# round-robin: process k (0 = learner, 1 + i = ri) on GPU k mod 2 of --gpus 3,1
dry --device cuda --gpus 3,1 --replicas 4 -- --rollout.slots 64 --learner.lr=1e-5
has learner "$(line "qrl-learner --learner.model")" "--learner.cuda_device 3 "
want=(1 3 1 3)
mem=(0.450 0.250 0.450 0.250) # GPU 1: two replicas share 0.9; GPU 3: the learner + two sharing 0.5
for i in 0 1 2 3; do
  R=$(replica $i)
  has "r$i" "$R" "--rollout.cuda_device ${want[i]} --rollout.nccl_device ${want[i]} --rollout.gpu_memory_utilization ${mem[i]} --rollout.slots 64 >"
  hasnt "r$i" "$R" "--learner.lr"
done
while read -r E; do has qrl-eval "$E" "--device cuda --device_id 3"; done < <(line qrl-eval)

# a replica alone on its GPU keeps today's sizing; an explicit fraction goes to every replica
dry --device cuda --gpus 0,1 --replicas 1
hasnt r0 "$(replica 0)" "--rollout.gpu_memory_utilization"
has r0 "$(replica 0)" "--rollout.cuda_device 1 "
dry --device cuda --gpus 0,1 --replicas 3 --gpu-memory-utilization 0.3
for i in 0 1 2; do has "r$i" "$(replica $i)" "--rollout.gpu_memory_utilization 0.3 "; done

# the story task's commands, and --print-commands as a synonym
dry --task story --device cuda --print-commands
grep -qF "qrl-task gen --task story-name --split train --n 2000" "$tmp/cmds" || fail "story: no train split: $(cat "$tmp/cmds")"
has qrl-eval "$(line qrl-eval | head -1)" "--stop_token_ids 1 --device cuda --device_id 0 --json"

# --config: the launcher's options by name, daemon keys routed; the command line wins
printf 'replicas: 3\nupdates: 7\nrollout:\n  slots: 8\nloss.mode: naive\n' >"$tmp/run.yaml"
dry --config "$tmp/run.yaml" --updates 5
[ "$(line qrl-rollout | wc -l)" -eq 3 ] || fail "--config replicas: $(line qrl-rollout | wc -l) replicas"
has learner "$(line "qrl-learner --learner.model")" "--learner.max_updates 5 "
has learner "$(line "qrl-learner --learner.model")" " --loss.mode naive >"
has r0 "$(replica 0)" " --rollout.slots 8 >"
printf 'replicas: 3\nbogus: 1\n' >"$tmp/bad.yaml"
launch --config "$tmp/bad.yaml" --dry-run >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q "unknown launcher option 'bogus'" "$tmp/err" || fail "--config with a bad key: exit $rc: $(cat "$tmp/err")"

launch --help | grep -qE -- "--dry-run" || fail "--help does not name --dry-run"
# the help speaks of the project (docs/demo.md), not of the issue a flag came from
launch --help | grep -qiE "issue [0-9]" && fail "--help names an issue: $(launch --help | grep -iE 'issue [0-9]')"
for f in --resume --config --dataset --testset; do launch --help | grep -q -- "$f" || fail "--help does not name $f"; done
launch --help | grep -qE -- "--rollout\.\* keys go to every qrl-rollout replica" || fail "--help does not explain the flag routing"

[ $fails -eq 0 ] && echo "ok: launch.sh argument handling" && exit 0
exit 1
