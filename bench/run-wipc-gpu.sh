#!/usr/bin/env bash
# On the GPU machine (issue 18): build, run the device weight-path tests (test_cuda_wipc)
# and the CUDA tests of the engines it touches, then bench/wipc at Qwen3-1.7B and 4B.
#   here:   ../shared/tools/device-deps.sh .device-deps protobuf-c-compiler libprotoc32
#   there:  bench/run-wipc-gpu.sh [OUTDIR]     (with .device-deps carried)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-/tmp}
source bench/device_env.sh
build=${BUILD:-build}
make -j"$(nproc)" BUILD="$build" all bench $(ls tests/cuda/test_*.c | sed "s|tests/\(.*\)\.c|$build/tests/\1|") \
  > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
rc=0
for t in test_cuda_wipc test_cuda_scheduler test_cuda_learner test_cuda_forward; do
  "$build/tests/cuda/$t" > "$out/$t.log" 2>&1 || rc=1
  echo "$t: $(grep -E 'Synthesis' "$out/$t.log")"
  grep -E "FAIL|fail|Assertion|step [0-9]|differs|status" "$out/$t.log" | head -8
done
"$build/bench/wipc" --model qwen3-1.7b --json bench/results/wipc-h200.json | tee "$out/wipc.txt" || rc=1
"$build/bench/wipc" --model qwen3-4b --json bench/results/wipc-qwen3-4b-h200.json | tee -a "$out/wipc.txt" || rc=1
cp bench/results/wipc*-h200.json "$out/" 2>/dev/null
echo "summary: rc=$rc"
exit $rc
