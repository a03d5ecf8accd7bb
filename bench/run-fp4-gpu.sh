#!/usr/bin/env bash
# On the GPU machine (issue 19, FP4 on the CUDA engine): build, run the FP4 CUDA tests (the
# NVFP4 quantizer vs the CPU bit for bit, the w4a4 producers / linear / forward / re-score,
# the w4a16 forward tests whose engines now also meet w4a4 models, the fused w8a8 producers
# and the pointwise ops whose kernels share code with the new ones, the scheduler's fp4 KV
# refusal), then bench/fp4_decode (Qwen3-1.7B shapes, batch 1/64/128: bf16 vs w4a16-nvfp4
# vs w4a4-nvfp4 in one run); the table last.  Logs and the JSON under $OUT when set.
# The fp4 KV cache: test_cuda_kv (the store bit-exact vs the CPU's kv_cache fp4 records and
# the recorder's copy, attention vs the CPU over the decoded cache, every quantized format:
# the kernels are shared), test_cuda_forward_kv (the forward with each KV format, fp4
# included, vs the CPU engine, decode-vs-prefill re-score), test_cuda_w4a4 forward_fp4_kv
# (w4a4-nvfp4 + fp4 KV), the scheduler running kv fp4 (formerly refused); the bench adds
# bf16+kv4 and w4a4+kv4 rows.
#   bench/run-fp4-gpu.sh            (with .device-deps carried, as bench/run-gpu.sh)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/device_env.sh
out=${OUT:-/tmp}
# the shared data folder: a staged copy beside the tree; tests want llama2c_stories260K/
data=""
for d in .stage-data .device-data ../shared/data; do [ -d "$d" ] && { data=$(cd "$d" && pwd); break; }; done
if [ -n "$data" ] && [ ! -d "$data/llama2c_stories260K" ] && [ -d "$data/stories260K" ]; then
  mkdir -p /tmp/qrl-fp4-data && ln -sfn "$data/stories260K" /tmp/qrl-fp4-data/llama2c_stories260K
  data=/tmp/qrl-fp4-data
fi
[ -n "$data" ] && export QRL_DATA_DIR=$data
b=build-gpu
tests="test_cuda_nvfp4 test_cuda_w4a4 test_cuda_fp4 test_cuda_w8a8_fused test_cuda_ops test_cuda_scheduler test_cuda_kv test_cuda_forward_kv"
targets="$b/bench/fp4_decode"
for t in $tests; do targets="$targets $b/tests/cuda/$t"; done
rc=0
t0=$(date +%s)
make -k -j16 BUILD=$b $targets > "$out/fp4-build.log" 2>&1 \
  || { grep -E 'error:|Error [0-9]|undefined reference' "$out/fp4-build.log" | head -30; rc=1; }
echo "build: $(( $(date +%s) - t0 )) s"
run() { # $1 = test binary, $2 = Criterion filter (optional)
  local t=$1 f=${2:-} r
  [ -x $b/tests/cuda/$t ] || { echo "FAIL $t: not built"; rc=1; return; }
  if [ -n "$f" ]; then $b/tests/cuda/$t --jobs=1 --filter "$f" > "$out/$t.log" 2>&1; r=$?
  else $b/tests/cuda/$t --jobs=1 > "$out/$t.log" 2>&1; r=$?; fi
  grep -aE '^(rmsnorm_nvfp4|swiglu_nvfp4|w4a4 linear|rescore|stories260K|random-hd128|scheduler kv)' "$out/$t.log" | sort -u | tail -40
  grep -aE '^(attention_q fp4|kv store fp4)' "$out/$t.log" | sort -u | tail -12
  grep -aE '^attention_q ' "$out/$t.log" | awk '{e=$NF+0; f=$2; if (e>m[f]) m[f]=e} END {for (f in m) printf "attention_q %s: worst err %.2e\n", f, m[f]}' 
  grep -aE 'FAIL|Assert|CRASH|\[----\]' "$out/$t.log" | head -20
  echo "$t${f:+ ($f)}: $(grep -a 'Synthesis' "$out/$t.log" | tail -1) rc=$r"
  [ $r -eq 0 ] || rc=1
}
t0=$(date +%s)
run test_cuda_nvfp4
run test_cuda_w4a4
run test_cuda_fp4 'cuda_fp4/forward_*'
run test_cuda_w8a8_fused
run test_cuda_ops
run test_cuda_scheduler 'cuda_scheduler/fp4_kv_greedy'
run test_cuda_kv
run test_cuda_forward_kv
echo "tests: $(( $(date +%s) - t0 )) s"
mkdir -p bench/results
$b/bench/fp4_decode --out bench/results/fp4-decode-h200.json 2> "$out/fp4_decode.log" > "$out/fp4_decode.txt"
r=$?; [ $r -eq 0 ] || { tail -20 "$out/fp4_decode.log"; rc=1; }
cp bench/results/fp4-decode-h200.json "$out/" 2>/dev/null
echo "summary: rc=$rc (bench rc=$r)"
cat "$out/fp4_decode.txt"
exit $rc
