#!/usr/bin/env bash
# qrl-learner's training-engine keys: refusals a CPU-only machine (or a bad value) gives
# at start, exit 1 with one "qrl-learner: error:" line naming the key:
#   - learner.device cuda where no GPU is visible (or in a build without CUDA);
#   - learner.device gpu: not one of cpu|cuda; learner.cuda_device -1: out of range.
# The CUDA engine itself is tested on a GPU by tests/cuda/test_cuda_learner.c.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
bin=${BUILD:-build}/bin/qrl-learner
[ -x "$bin" ] || { echo "missing $bin (run make)"; exit 1; }
data=${QRL_DATA_DIR:-../shared/data}
model=$data/llama2c_stories260K/stories260K.bin
tmp=$(mktemp -d /tmp/qrl-learner-device-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf '{"prompt":"Once upon a time","answer":"the"}\n' >"$tmp/data.jsonl"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

expect_refused() { # PATTERN ARGS...
  local pat=$1 rc n
  shift
  timeout 60 "$bin" --learner.model "$model" --learner.tokenizer "$data/llama2c_stories260K/tok512.bin" \
    --dataset.path "$tmp/data.jsonl" --dataset.chat_template none --dataset.task contains \
    --kafka.bootstrap 127.0.0.1:1 "$@" >/dev/null 2>"$tmp/err"
  rc=$?
  [ $rc -eq 1 ] || fail "$*: exit $rc (expected 1): $(tail -3 "$tmp/err")"
  n=$(grep -c '^qrl-learner: error:' "$tmp/err")
  [ "$n" -eq 1 ] || fail "$*: $n error lines: $(cat "$tmp/err")"
  grep -qE "$pat" "$tmp/err" || fail "$*: error does not match '$pat': $(grep error: "$tmp/err")"
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "skip of the no-GPU case: a GPU is visible here"
else
  expect_refused 'learner\.device cuda( \(learner\.cuda_device 0\))?: .*(does not exist|no CUDA)' --learner.device cuda
fi
expect_refused "learner\.device: 'gpu' is not one of the allowed values: cpu, cuda" --learner.device gpu
expect_refused "learner\.cuda_device" --learner.cuda_device -1

[ $fails -eq 0 ] && echo "ok: learner.device refusals" && exit 0
exit 1
