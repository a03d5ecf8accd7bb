#!/usr/bin/env bash
# On the GPU machine, in one call: build, run make test-cuda (bench/run-gpu.sh), the CUDA
# test logs' measured errors, then the decode benchmark; logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
# the shared data folder is not on the GPU machine: a staged copy travels beside the tree
[ -d .stage-data ] && export QRL_DATA_DIR=$PWD/.stage-data
bench/run-gpu.sh > "$out/run-gpu.log" 2>&1; rc_t=$?
grep -E '^(ok|FAIL|skip) |passed,|summary' "$out/run-gpu.log"
cp build-gpu/test-logs/test_cuda_*.log "$out/" 2>/dev/null
grep -hE '^(rmsnorm|gemm|swiglu|rope_kv|attention|kv store|rescore|random-hd128|stories|qwen|llama|mistral)' build-gpu/test-logs/test_cuda_*.log | sort | uniq | awk '{print}' > "$out/errors.txt"
grep -hE 'worst|greedy equals|rescore' build-gpu/test-logs/test_cuda_forward*.log
grep -hE 'FAIL|Assert|CRASH' build-gpu/test-logs/test_cuda_*.log | head -20
source .device-deps/env.sh
export PATH=/opt/qrl-deps/usr/bin:$PATH
make -j"$(nproc)" BUILD=build-gpu bench > "$out/bench-build.log" 2>&1 || tail -20 "$out/bench-build.log"
mkdir -p bench/results
build-gpu/bench/decode --out "$out/decode-h200.json" 2>&1 | tee "$out/decode.log"
rc_b=${PIPESTATUS[0]}
echo "tests rc=$rc_t bench rc=$rc_b"
