#!/usr/bin/env bash
# On the GPU machine, one call (issue 22 item 3, W8A8 GEMMs on the tensor cores): build; the
# W8A8 tests against the CPU (test_cuda_w8a8_tc: every GEMM kernel, INT8 bit-exact and FP8
# within its bound; test_cuda_w8a8: the forward; test_cuda_w8a8_fused); bench/w8a8's GEMM
# tables on Qwen3-4B's projections (BF16 anchor in the same process); then bench/decode,
# Qwen3-4B, at the late replay shapes and batch 1..256 x context 1024, for BF16 weights (the
# anchor: KV bf16 and int4-protected), w8a8-fp8 (KV bf16 and int4-protected) and w8a8-int8,
# then the A/B variants (QRL_W8A8_CUBLAS_UNFUSED=1: the cuBLAS path before; and
# QRL_W8A8_SKINNY_MAX_T=0: cuBLAS from one row on) while BUDGET_S (default 280 s) lasts.
# Logs and JSON under $OUT (or /tmp); the short tables last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
t0=$(date +%s)
left() { echo $(( ${BUDGET_S:-280} - ($(date +%s) - t0) )); }
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
source bench/device_env.sh
b=build-gpu
make -j"$(nproc)" BUILD=$b $b/tests/cuda/test_cuda_w8a8_tc $b/tests/cuda/test_cuda_w8a8 \
  $b/tests/cuda/test_cuda_w8a8_fused $b/bench/w8a8 $b/bench/decode > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
at built
w=/tmp/w8a8-run; rm -rf $w; mkdir -p $w
for t in test_cuda_w8a8_tc test_cuda_w8a8 test_cuda_w8a8_fused; do
  ( timeout 120 $b/tests/cuda/$t > "$w/$t.log" 2>&1; echo "rc=$?" >> "$w/$t.log" ) &
done
wait
at tests
timeout 60 $b/bench/w8a8 --model qwen3-4b --decode 0 --out "$out/w8a8-gemm-qwen3-4b.json" > "$w/w8a8-gemm.log" 2>&1
at "w8a8 gemm rc=$?"
G=${GRID:-1x1024,8x1024,16x1024,32x1024,64x1024,128x1024,256x1024}
SMALL=1x1024,8x1024,16x1024,32x1024,64x1024
# dec LABEL ENV-ASSIGNMENT bench/decode-args...: one run, skipped when the budget is short
dec() {
  local label=$1 envs=$2; shift 2
  [ "$(left)" -gt 45 ] || { echo "skip $label (budget)"; return; }
  env $envs timeout $(( $(left) - 25 )) $b/bench/decode "$@" --out "$w/dec-$label.json" > "$w/dec-$label.log" 2>&1
  at "decode $label rc=$?"
}
dec bf16 QRL_AB=none --from 10 --grid-shapes $G --weights bf16 --formats bf16,int4-protected
dec w8a8-fp8 QRL_AB=none --from 10 --grid-shapes $G --weights w8a8-fp8 --formats bf16,int4-protected
dec w8a8-int8 QRL_AB=none --from 10 --grid-shapes $G --weights w8a8-int8 --formats bf16
dec w8a8-fp8-unfused QRL_W8A8_CUBLAS_UNFUSED=1 --from 10 --grid-shapes $G --weights w8a8-fp8 --formats bf16
dec w8a8-int8-unfused QRL_W8A8_CUBLAS_UNFUSED=1 --from 10 --grid-shapes $G --weights w8a8-int8 --formats bf16
dec w8a8-fp8-sk0 QRL_W8A8_SKINNY_MAX_T=0 --from 15 --grid-shapes $SMALL --weights w8a8-fp8 --formats bf16
dec w8a8-int8-sk0 QRL_W8A8_SKINNY_MAX_T=0 --from 15 --grid-shapes $SMALL --weights w8a8-int8 --formats bf16
(cd /tmp && tar czf "$out/logs.tgz" w8a8-run)
echo "== tests"
grep -hE "^rc=|Synthesis|FAIL|Assert|worst ratio over all|worst" $w/test_cuda_w8a8*.log | sort | uniq -c | sort -rn | head -12
echo "== gemm (Qwen3-4B)"
python3 bench/w8a8_gemm_table.py "$out/w8a8-gemm-qwen3-4b.json" 2>&1 | head -14
echo "== decode (Qwen3-4B)"
labels=""
for l in bf16 w8a8-fp8 w8a8-int8 w8a8-fp8-unfused w8a8-int8-unfused w8a8-fp8-sk0 w8a8-int8-sk0; do
  [ -s "$w/dec-$l.json" ] && labels="$labels $l=$w/dec-$l.json"
done
python3 bench/w8a8_decode_table.py --merge "$out/decode-w8a8-h200.json" $labels | tee "$out/table.txt"
at done
