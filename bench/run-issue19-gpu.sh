#!/usr/bin/env bash
# On the GPU machine (issue 19): the FP4 decode engine (w4a4-nvfp4, fp4 KV), the TRACE
# recorder and the CUDA QAT learner in one call, correctness first, then the three
# benchmarks; a summary table last.  Carry .device-deps and .device-data.
#   there:  bench/run-issue19-gpu.sh OUTDIR      (logs in OUTDIR/logs.tgz, JSON beside it,
#           named by the card: fp4-decode-h100.json, trace-h100.json, train-qat-h100.json;
#           trace-sync-harvest-*.json: the recorder's previous host harvest, for A/B)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-/tmp/qrl-issue19}
mkdir -p "$out" /tmp/qrl19
source bench/device_env.sh
export QRL_DATA_DIR=${QRL_DATA_DIR:-$PWD/.device-data}
t0=$SECONDS
b=build-gpu
tests="test_cuda_nvfp4 test_cuda_w4a4 test_cuda_kv test_cuda_forward_kv test_cuda_trace
       test_cuda_train_qat test_cuda_scheduler test_cuda_fp4 test_cuda_graphs test_cuda_train
       test_cuda_w8a8_fused test_cuda_ops"
targets="$b/bench/fp4_decode $b/bench/trace $b/bench/train_step"
for t in $tests; do targets="$targets $b/tests/cuda/$t"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# the JSON names carry the card that measured them (h100, h200, ...)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|a100|b200' | tr A-Z a-z)
card=${card:-gpu}
make -k -j"$(nproc)" BUILD=$b $targets > /tmp/qrl19/build.log 2>&1 ||
  grep -E 'error:|undefined reference' /tmp/qrl19/build.log | head -20
echo "build: $((SECONDS - t0)) s"
declare -A res
run() { # name, timeout, [criterion filter]
  local t=$1 lim=$2 f=${3:-} r s=$SECONDS
  [ -x $b/tests/cuda/$t ] || { res[$t]="not built"; return; }
  [ $((SECONDS - t0)) -lt ${TEST_BUDGET_S:-240} ] || { res[$t]="skipped (time)"; return; }
  timeout "$lim" $b/tests/cuda/$t --jobs=1 ${f:+--filter "$f"} > /tmp/qrl19/$t.log 2>&1; r=$?
  res[$t]="rc=$r $((SECONDS - s))s $(grep -ao 'Tested: [0-9]* | Passing: [0-9]* | Failing: [0-9]* | Crashing: [0-9]*' /tmp/qrl19/$t.log | tail -1)"
  grep -aE 'Assert|CRASH|FAIL' /tmp/qrl19/$t.log | head -6
}
run test_cuda_nvfp4 40
run test_cuda_w4a4 60
run test_cuda_kv 60
run test_cuda_forward_kv 60
run test_cuda_trace 60
run test_cuda_train_qat 60
run test_cuda_scheduler 60 'cuda_scheduler/fp4_kv_greedy'
run test_cuda_fp4 40 'cuda_fp4/forward_*'
run test_cuda_graphs 40
run test_cuda_train 40
run test_cuda_w8a8_fused 30
run test_cuda_ops 30
echo "tests: $((SECONDS - t0)) s"
tar czf "$out/logs.tgz" -C /tmp qrl19
mkdir -p bench/results
timeout 50 $b/bench/fp4_decode --out "$out/fp4-decode-$card.json" > /tmp/qrl19/fp4_decode.txt 2>&1; rf=$?
timeout 50 $b/bench/trace --out "$out/trace-$card.json" > /tmp/qrl19/trace.txt 2>&1; rt=$?
# A/B: the previous harvest (every copy on the decode thread after the step's sync)
QRL_TRACE_SYNC_HARVEST=1 timeout 50 $b/bench/trace --out "$out/trace-sync-harvest-$card.json" \
  > /tmp/qrl19/trace-sync.txt 2>&1; rs=$?
timeout 40 $b/bench/train_step --models qwen3-0.6b --seqs 2048 --gpus 1 --steps 4 --qat off,nvfp4,kv \
  --out "$out/train-qat-$card.json" > /tmp/qrl19/train_qat.txt 2>&1; rq=$?
tar czf "$out/logs.tgz" -C /tmp qrl19
for f in /tmp/qrl19/*.log; do grep -aE '^(cuda trace|qat |guided|scheduler kv|stories260K|random-hd128|rescore|rmsnorm_nvfp4|swiglu_nvfp4|w4a4 linear|worst)' "$f" | sort -u | head -12; done
echo "== fp4_decode rc=$rf"; tail -14 /tmp/qrl19/fp4_decode.txt
echo "== trace rc=$rt"; tail -10 /tmp/qrl19/trace.txt
echo "== trace, previous harvest (QRL_TRACE_SYNC_HARVEST=1) rc=$rs"; tail -8 /tmp/qrl19/trace-sync.txt
echo "== train_step qat rc=$rq"; tail -6 /tmp/qrl19/train_qat.txt
echo "== tests"; for t in $tests; do printf '%-22s %s\n' "$t" "${res[$t]:-not run}"; done
echo "total: $((SECONDS - t0)) s"
