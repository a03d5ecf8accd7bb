#!/usr/bin/env bash
# On the GPU machine: build and run the CUDA attention tests and bench/attn.c (tensor-core
# vs CUDA-core decode attention, same inputs); logs under $OUT when set.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
if [ -f .device-deps/env.sh ]; then
  source .device-deps/env.sh
  export PATH=/opt/qrl-deps/usr/bin:$PATH
fi
make -j"$(nproc)" BUILD=build-gpu build-gpu/tests/cuda/test_cuda_ops build-gpu/bench/attn \
  > "$out/attn-build.log" 2>&1 || { tail -30 "$out/attn-build.log"; exit 1; }
build-gpu/tests/cuda/test_cuda_ops --filter 'cuda_ops/attention*' --verbose > "$out/attn-test.log" 2>&1
rc_t=$?
grep -E 'attention H=|Synthesis|FAIL|Assert|CRASH' "$out/attn-test.log" | tail -40
build-gpu/bench/attn 2>&1 | tee "$out/attn-bench.log"
rc_b=${PIPESTATUS[0]}
# variants "STAGES:VARIANT:CHUNK_MIN" (tensor-core path only)
for v in ${QRL_ATTN_VARIANTS:-}; do
  IFS=: read -r st var cm <<< "$v"
  echo "stages=$st variant=$var chunk_min=$cm"
  QRL_ATTN_STAGES=$st QRL_ATTN_VARIANT=$var QRL_ATTN_CHUNK_MIN=$cm build-gpu/bench/attn --tc-only 2>&1 \
    | tee "$out/attn-bench-$st-$var-$cm.log" | awk '{print $1, $6, $7, $9}' | paste -sd' '
done
echo "attn tests rc=$rc_t bench rc=$rc_b"
