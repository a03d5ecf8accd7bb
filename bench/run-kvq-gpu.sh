#!/usr/bin/env bash
# On the GPU machine: the quantized-KV attention in one call: build, its correctness tests
# (test_cuda_kv, test_cuda_forward_kv), then the decode step at the late-stage replay
# shapes for every KV format, then A/B variants (env VARIANTS, e.g. "QRL_ATTNQ_STAGES=2
# QRL_ATTNQ_KERNEL=1") for bf16, int8 and int4-protected.  Logs and JSON under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
[ -d .stage-data ] && export QRL_DATA_DIR=$PWD/.stage-data
source .device-deps/env.sh
export PATH=/opt/qrl-deps/usr/bin:$PATH
b=build-gpu
make -j"$(nproc)" BUILD=$b $b/tests/cuda/test_cuda_kv $b/tests/cuda/test_cuda_forward_kv bench > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
$b/tests/cuda/test_cuda_kv > "$out/test_cuda_kv.log" 2>&1; echo "test_cuda_kv rc=$?"
grep -E "attention_q .*hd=(64|128)|FAIL|Assert|Synthesis" "$out/test_cuda_kv.log" | sort | uniq | tail -40
if [ -z "${SKIP_FWD:-}" ]; then
  $b/tests/cuda/test_cuda_forward_kv > "$out/test_cuda_forward_kv.log" 2>&1; echo "test_cuda_forward_kv rc=$?"
  grep -E "rescore|worst|FAIL|Assert|Synthesis" "$out/test_cuda_forward_kv.log" | tail -30
fi
$b/bench/decode --from ${FROM:-10} --grid 0 --out "$out/decode-late.json" > "$out/decode-late.log" 2>&1
grep -E "^kv|^late" "$out/decode-late.log"
for v in ${VARIANTS:-}; do
  env $v $b/bench/decode --from ${FROM:-10} --grid 0 --formats bf16,int8,int4-protected --out "$out/ab.json" > "$out/ab.log" 2>&1
  echo "== $v"; grep -E "^late " "$out/ab.log" | tail -1
done
