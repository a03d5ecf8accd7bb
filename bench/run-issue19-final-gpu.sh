#!/usr/bin/env bash
# On the GPU machine (issue 19), one call: the recorder's harvest A/B (bench/trace, the
# side-stream harvest against QRL_TRACE_SYNC_HARVEST=1), the CUDA TRACE and QAT tests, then
# the real cluster with TRACE (bench/run-e2e-trace-gpu.sh: Kafka, qrl-learner with CUDA
# QAT + guidance, a qrl-rollout replica recording w4a4-nvfp4 + fp4 KV) in what is left.
#   here:   .device-deps, .device-kafka and a data dir carried (stories260K, qwen_tokenizer,
#           gsm8k/test.jsonl: 6 MB; the three with the tree fit the 64 MiB carry)
#   there:  DATA=.device-data-e2e bench/run-issue19-final-gpu.sh OUTDIR
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-/tmp/qrl-issue19-final}   # the JSON and logs.tgz (everything else under $w)
w=/tmp/q19
mkdir -p "$out" "$w"
t0=$SECONDS
data=${DATA:-.device-data}
[ -e .device-data ] || ln -sfn "$data" .device-data
export QRL_DATA_DIR=$PWD/.device-data
source bench/device_env.sh
b=build-gpu
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr A-Z a-z)
card=${card:-gpu}
echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
make -j"$(nproc)" BUILD=$b all bench $b/tests/cuda/test_cuda_trace $b/tests/cuda/test_cuda_train_qat \
  > "$w/build.log" 2>&1 || { grep -E 'error:|undefined' "$w/build.log" | head -20; }
echo "build: $((SECONDS - t0)) s"
for t in test_cuda_trace test_cuda_train_qat; do
  timeout 90 $b/tests/cuda/$t --jobs=1 > "$w/$t.log" 2>&1
  echo "$t rc=$? $(grep -ao 'Tested: [0-9]* | Passing: [0-9]* | Failing: [0-9]*' "$w/$t.log" | tail -1)"
  grep -aE 'Assert|FAIL|qat vs|qat step|qat after|cuda trace forward' "$w/$t.log" | head -14
done
timeout 60 $b/bench/trace --out "$out/trace-$card.json" > "$w/trace-new.txt" 2>&1
QRL_TRACE_SYNC_HARVEST=1 timeout 60 $b/bench/trace --out "$out/trace-sync-harvest-$card.json" \
  > "$w/trace-sync.txt" 2>&1
echo "== trace, side-stream harvest"; tail -6 "$w/trace-new.txt"
echo "== trace, previous harvest (QRL_TRACE_SYNC_HARVEST=1)"; tail -5 "$w/trace-sync.txt"
left=$((570 - (SECONDS - t0)))
echo "e2e gets $left s"
E2E_NAME=e2e-trace-$card E2E_TOTAL_S=$left BUILD=$b bench/run-e2e-trace-gpu.sh $w/e2e > "$w/e2e.txt" 2>&1
echo "e2e rc=$?"
cp $w/e2e/*.json "$out/" 2>/dev/null
(cd /tmp && find q19 -type f \( -name '*.log' -o -name '*.txt' -o -name '*.json' -o -name '*.jsonl' \) \
  -size -20M -print0 | tar czf "$out/logs.tgz" --null -T -) 2>/dev/null
tail -25 "$w/e2e.txt"
echo "total: $((SECONDS - t0)) s"
