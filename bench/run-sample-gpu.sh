#!/usr/bin/env bash
# On the GPU machine, in one call: build and run the device-sampler tests
# (tests/cuda/test_cuda_sample, tests/cuda/test_cuda_scheduler) and bench/sample; logs and
# the benchmark JSON under $OUT.  From a copy staged inside the repository (the carried
# .device-deps and .stage-data one folder up) or from the root itself.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
for d in .device-deps ../.device-deps; do [ -f "$d/env.sh" ] && { source "$d/env.sh"; break; }; done
export PATH=/opt/qrl-deps/usr/bin:$PATH NCCL_NVLS_ENABLE=0
for d in .stage-data ../.stage-data; do [ -d "$d" ] && { export QRL_DATA_DIR=$(cd "$d" && pwd); break; }; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
b=build-gpu
t0=$SECONDS
make -j"$(nproc)" BUILD=$b $b/tests/cuda/test_cuda_sample $b/tests/cuda/test_cuda_scheduler \
  $b/bench/sample > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "build $((SECONDS - t0))s"
summary() { grep -aE "$1|Synthesis|\[FAIL\]|\[----\]|CRASH" "$2" | head -40; }
t0=$SECONDS
timeout 60 $b/tests/cuda/test_cuda_sample --jobs=1 > "$out/test_cuda_sample.log" 2>&1
echo "test_cuda_sample rc=$? $((SECONDS - t0))s"
summary "^(philox|sampler|forward)" "$out/test_cuda_sample.log"
t0=$SECONDS
timeout 45 $b/tests/cuda/test_cuda_scheduler --jobs=1 --filter='*/device_sampling*' \
  > "$out/test_cuda_scheduler_dev.log" 2>&1
echo "test_cuda_scheduler device_sampling rc=$? $((SECONDS - t0))s"
summary "^scheduler" "$out/test_cuda_scheduler_dev.log"
t0=$SECONDS
timeout 40 $b/bench/sample --out "$out/sample-h200.json" > "$out/bench.log" 2>&1
echo "bench rc=$? $((SECONDS - t0))s"
cat "$out/bench.log"
t0=$SECONDS
timeout "${REST_S:-60}" $b/tests/cuda/test_cuda_scheduler --jobs=1 \
  > "$out/test_cuda_scheduler.log" 2>&1
echo "test_cuda_scheduler (all) rc=$? $((SECONDS - t0))s"
summary "^(sampled|greedy|swap|scheduler)" "$out/test_cuda_scheduler.log"
