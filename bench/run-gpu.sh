#!/usr/bin/env bash
# On the GPU machine: prepare the carried Debian libraries, build, run `make test-cuda`
# and the GPU checks, printing a short summary last.
#   here:   ../shared/tools/device-deps.sh .device-deps protobuf-c-compiler libprotoc32
#   there:  bench/run-gpu.sh            (with .device-deps carried)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
build=${BUILD:-build-gpu}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
make -j"$(nproc)" BUILD="$build" test-cuda > "$build.log" 2>&1; rc_cuda=$?
grep -E '^(ok|FAIL|skip) |passed,' "$build.log"
nvcc -O2 -arch=sm_90 -Xcompiler -fopenmp -Icommon -Ikernels tests/reference/check_cvt.cu \
  kernels/cpu/quant_scalar.c kernels/base/status.c -o "/tmp/check_cvt" -lgomp && /tmp/check_cvt | tail -2
rc_cvt=${PIPESTATUS[0]}
echo "summary: test-cuda rc=$rc_cuda check_cvt rc=$rc_cvt"
[ $rc_cuda -eq 0 ] && [ $rc_cvt -eq 0 ]
