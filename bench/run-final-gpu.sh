#!/usr/bin/env bash
# On the GPU machine, in one call within the device tool's 10 minutes: build everything,
# the decode benchmark over all shapes and KV formats (bench/results/decode-h200.json),
# the CUDA-graph benchmark (graphs-h200.json), then `make test-cuda`; summaries last.  Logs under $OUT.
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
timeout ${BENCH_S:-220} $b/bench/decode --out "$out/decode-h200.json" > "$out/decode.log" 2>&1; echo "decode rc=$? $(( $(date +%s) - t0 )) s"
timeout ${GRAPHS_S:-120} $b/bench/graphs --out "$out/graphs-h200.json" > "$out/graphs.log" 2>&1; echo "graphs rc=$? $(( $(date +%s) - t0 )) s"
timeout ${TEST_S:-300} make BUILD=$b test-cuda > "$out/test-cuda.log" 2>&1; rc=$?
grep -E '^(FAIL|skip) |passed,' "$out/test-cuda.log"; echo "test-cuda rc=$rc $(( $(date +%s) - t0 )) s"
cp $b/test-logs/test_cuda_*.log "$out/" 2>/dev/null
tail -8 "$out/decode.log"
tail -18 "$out/graphs.log"
