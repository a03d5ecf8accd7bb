#!/usr/bin/env bash
# On the GPU machine (issue 19 item 2): build and run the CUDA TRACE recorder's tests
# (tests/cuda/test_cuda_trace.c: capture kernel, fp4 KV records, the w4a4 quantizers' TRACE
# sink, the recorder in bf16 / w4a4-nvfp4 forwards, scheduler CPU vs CUDA on w4a4; the shared
# NVFP4 quantizer's test_cuda_nvfp4, the w4a4 producers of test_cuda_w4a4 (they carry the
# sink) and the decode graphs' test_cuda_graphs beside it) and bench/trace (the recorder's
# share of the w4a4-nvfp4 + fp4 KV decode step at Qwen3-1.7B shapes, JSON to
# bench/results/trace-h200.json); a short table last.  Logs under $OUT (or
# /tmp).  About 60-90 s on an H200 (build included).
#   there:  bench/run-trace-gpu.sh            (.device-data carried: stories260K)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
out=${OUT:-/tmp}
source bench/device_env.sh
build=build-gpu
for d in .device-data ../shared/data; do
  [ -f "$d/llama2c_stories260K/stories260K.bin" ] && { export QRL_DATA_DIR=$PWD/$d; break; }
done
[ -z "${QRL_DATA_DIR:-}" ] && [ -f .device-data/stories260K/stories260K.bin ] && {
  mkdir -p /tmp/qrl-data && ln -sfn "$PWD/.device-data/stories260K" /tmp/qrl-data/llama2c_stories260K
  export QRL_DATA_DIR=/tmp/qrl-data; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tests="test_cuda_trace test_cuda_nvfp4 test_cuda_w4a4 test_cuda_graphs"
# test name -> Criterion filter (empty: all)
declare -A filt=([test_cuda_w4a4]='cuda_w4a4/*_nvfp4_vs_cpu_quantizer')
targets="$build/bench/trace"
for t in $tests; do [ -f tests/cuda/$t.c ] && targets="$targets $build/tests/cuda/$t"; done
rc=0
make -k -j16 BUILD=$build $targets > "$out/trace-build.log" 2>&1 \
  || { grep -E 'error|Error [0-9]|undefined reference' "$out/trace-build.log" | head -30; rc=1; }
echo "build: $((SECONDS - t0)) s"
declare -A res
for t in $tests; do
  [ -x $build/tests/cuda/$t ] || { res[$t]="not built"; rc=1; continue; }
  f=${filt[$t]:-}
  if [ -n "$f" ]; then timeout 60 $build/tests/cuda/$t --verbose --filter "$f" > "$out/$t.log" 2>&1; r=$?
  else timeout 60 $build/tests/cuda/$t --verbose > "$out/$t.log" 2>&1; r=$?; fi
  grep -E "^cuda trace|FAIL|Assert|CRASH|Synthesis|SKIP|[Ss]kip" "$out/$t.log" | tail -25
  res[$t]="rc=$r $(grep -o 'Tested: [0-9]* | Passing: [0-9]* | Failing: [0-9]* | Crashing: [0-9]*' "$out/$t.log" | tail -1)"
  [ $r -eq 0 ] || rc=1
done
echo "tests: $((SECONDS - t0)) s"
if [ -x $build/bench/trace ]; then
  timeout 150 $build/bench/trace --out bench/results/trace-h200.json > "$out/trace-bench.log" 2> "$out/trace-bench.err"
  rb=$?; [ $rb -eq 0 ] || { tail -5 "$out/trace-bench.err"; rc=1; }
  cp bench/results/trace-h200.json "$out/" 2>/dev/null
else
  rb="not built"; rc=1
fi
echo "---- summary ($((SECONDS - t0)) s)"
for t in $tests; do printf '%-18s %s\n' "$t" "${res[$t]}"; done
echo "bench/trace rc=$rb"
cat "$out/trace-bench.log" 2>/dev/null | tail -8
exit $rc
