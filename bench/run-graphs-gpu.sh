#!/usr/bin/env bash
# On the GPU machine, one device call: build, the CUDA-graph tests (graph vs eager), the
# graph benchmark (bench/results/graphs-h200.json), then `make test-cuda`; summaries last.
# Logs under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
[ -d .stage-data ] && export QRL_DATA_DIR=$PWD/.stage-data
if [ -f .device-deps/env.sh ]; then source .device-deps/env.sh; export PATH=/opt/qrl-deps/usr/bin:$PATH; fi
export NCCL_NVLS_ENABLE=0
b=build-gpu
t0=$(date +%s)
make -j"$(nproc)" BUILD=$b all bench $(ls tests/cuda/test_*.c | sed "s|tests/|$b/tests/|; s|\.c$||") > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
timeout 200 $b/tests/cuda/test_cuda_graphs --verbose > "$out/test_cuda_graphs.log" 2>&1; echo "test_cuda_graphs rc=$? $(( $(date +%s) - t0 )) s"
grep -E "graphs |Synthesis|FAIL|assert|passed" "$out/test_cuda_graphs.log" | head -20
timeout ${BENCH_S:-150} $b/bench/graphs --out "$out/graphs-h200.json" > "$out/graphs.log" 2>&1; echo "graphs bench rc=$? $(( $(date +%s) - t0 )) s"
timeout ${TEST_S:-280} make BUILD=$b test-cuda > "$out/test-cuda.log" 2>&1; rc=$?
grep -E '^(FAIL|skip) |passed,' "$out/test-cuda.log"; echo "test-cuda rc=$rc $(( $(date +%s) - t0 )) s"
cp $b/test-logs/test_cuda_*.log "$out/" 2>/dev/null
cat "$out/graphs.log" | grep -v "^qwen.*first steps" | tail -20
