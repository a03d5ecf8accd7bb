#!/usr/bin/env bash
# On the GPU machine: build and run test_cuda_train_qat, whose new case
# uaq_version_0_quantizes_as_the_replica checks the CUDA twin of cf94b40 (QAT at version 0
# under UAQ quantizes (W/s)*s and divides by s, as model_train.c: bit for bit the CPU recipe,
# the replica's nvfp4(W)/s at s = 1.5 and 1.25, the QAT forward near the plain forward on the
# fake-quantized masters: bit-equal on an H200, 3.6e-2 on an H100), plus the file's older cases (the weight kernel's new scale
# argument at 1).  Logs under $OUT when set.  Key numbers, then a pass/fail table, last.
#   bench/run-qat0-gpu.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
source bench/device_env.sh
export NCCL_NVLS_ENABLE=0
if [ -d .device-data ]; then export QRL_DATA_DIR=$PWD/.device-data
elif [ -d .stage-data ]; then export QRL_DATA_DIR=$PWD/.stage-data; fi
t=test_cuda_train_qat
rc=0
t0=$(date +%s)
make -k -j16 BUILD=build-gpu build-gpu/tests/cuda/$t > "$out/qat0-build.log" 2>&1 \
  || { grep -E 'error:|Error [0-9]|undefined reference' "$out/qat0-build.log" | head -30; rc=1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ -x build-gpu/tests/cuda/$t ]; then
  s=$(date +%s)
  timeout 240 build-gpu/tests/cuda/$t --verbose > "$out/$t.log" 2>&1; r=$?
  echo "--- key numbers"
  grep -E "^qat uaq v0|^qat |^guided" "$out/$t.log" | tail -20
  echo "--- failures"
  grep -E "FAIL|Assert|CRASH|Timed out" "$out/$t.log" | head -20
  echo "--- table"
  printf '%-52s %s\n' case result
  grep -E "^\[(PASS|FAIL|SKIP)\]" "$out/$t.log" | sed -E 's/^\[([A-Z]+)\] cuda_train_qat::([^:]*).*/\2 \1/' \
    | awk '{printf "%-52s %s\n", $1, $2}'
  grep -E "Synthesis" "$out/$t.log"
  echo "$t rc=$r ($(( $(date +%s) - s )) s)"; [ $r -eq 0 ] || rc=1
else
  echo "$t: not built"; rc=1
fi
echo "total $(( $(date +%s) - t0 )) s, rc=$rc"
exit $rc
