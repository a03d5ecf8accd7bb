#!/usr/bin/env bash
# On the GPU machine: build and run the CUDA QAT tests (kernels bit for bit vs the CPU,
# guided codes = the rollout's at every recorded site, a guided QAT step vs the CPU engine)
# and test_cuda_train (regressions of the engine without QAT), then bench/train_step's QAT
# overhead at the Qwen3-0.6B shape (JSON bench/results/train-qat-h200.json); logs under
# $OUT when set.  Table last.   bench/run-qat-gpu.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what=${1:-all}
out=${OUT:-/tmp}
source bench/device_env.sh
export NCCL_NVLS_ENABLE=0
if [ -d .device-data ]; then export QRL_DATA_DIR=$PWD/.device-data
elif [ -d .stage-data ]; then export QRL_DATA_DIR=$PWD/.stage-data; fi
tests="test_cuda_train_qat test_cuda_train"
rc=0
t0=$(date +%s)
make -k -j16 BUILD=build-gpu $(for t in $tests; do echo build-gpu/tests/cuda/$t; done) \
  build-gpu/bench/train_step > "$out/qat-build.log" 2>&1 \
  || { grep -E 'error:|Error [0-9]|undefined reference' "$out/qat-build.log" | head -30; rc=1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ "$what" != bench ]; then
  for t in $tests; do
    [ -x build-gpu/tests/cuda/$t ] || { echo "$t: not built"; rc=1; continue; }
    s=$(date +%s)
    build-gpu/tests/cuda/$t --verbose > "$out/$t.log" 2>&1; r=$?
    grep -E "^guided|^qat|^train |^recompute|FAIL|Assert|CRASH|Synthesis" "$out/$t.log" | tail -30
    echo "$t rc=$r ($(( $(date +%s) - s )) s)"; [ $r -eq 0 ] || rc=1
  done
fi
if [ "$what" != tests ]; then
  mkdir -p bench/results
  build-gpu/bench/train_step --models qwen3-0.6b --seqs 2048 --gpus 1 --steps 4 \
    --qat off,nvfp4,kv --out bench/results/train-qat-h200.json > "$out/train_qat_bench.log" 2>&1
  r=$?; [ $r -eq 0 ] || rc=1
  cp bench/results/train-qat-h200.json "$out/" 2>/dev/null
  tail -8 "$out/train_qat_bench.log"
fi
echo "total $(( $(date +%s) - t0 )) s, rc=$rc"
exit $rc
