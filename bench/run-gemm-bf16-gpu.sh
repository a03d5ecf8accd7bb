#!/usr/bin/env bash
# On the GPU machine, one device call: build, the BF16 GEMM tests (skinny kernel vs an F64
# reference and cuBLAS) and the forward / graph tests, bench/gemm_bf16 (GEMM tables, tuning
# sweep, decode step with and without QRL_GEMM_BF16_CUBLAS=1), then bench/decode on the
# late replay shape and the grid (bf16 KV) with and without it; summaries last.  Logs and
# JSON under $OUT (logs as one logs.tgz).  DECODE=0 skips bench/decode, GRAPHS=1 adds
# bench/graphs (both ways), PROFILE=1 an Nsight Compute summary of two skinny launches.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
final=${OUT:-/tmp}
out=$(mktemp -d /tmp/gemm-bf16-XXXXXX)
[ -d .stage-data ] && export QRL_DATA_DIR=$PWD/.stage-data
[ -d ../.stage-data ] && export QRL_DATA_DIR=$(cd ../.stage-data && pwd)
if [ -f ../.device-deps/env.sh ]; then source ../.device-deps/env.sh; export PATH=/opt/qrl-deps/usr/bin:$PATH; fi
if [ -f .device-deps/env.sh ]; then source .device-deps/env.sh; export PATH=/opt/qrl-deps/usr/bin:$PATH; fi
export NCCL_NVLS_ENABLE=0
b=build-gpu
t0=$(date +%s)
tests="test_cuda_gemm_bf16 test_cuda_ops test_cuda_forward test_cuda_graphs"
make -j"$(nproc)" BUILD=$b $b/bench/gemm_bf16 $b/bench/decode $b/bench/graphs \
  $(for t in $tests; do echo $b/tests/cuda/$t; done) > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
for t in $tests; do
  timeout ${TEST_S:-120} $b/tests/cuda/$t --jobs=1 --verbose > "$out/$t.log" 2>&1
  echo "$t rc=$? $(grep -a 'Synthesis' "$out/$t.log") $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
  grep -aE "FAIL|Assertion|CRASH" "$out/$t.log" | head -8 | tee -a "$out/summary.txt"
done
grep -a "^gemm n=" "$out/test_cuda_gemm_bf16.log" | awk '{ s = $(NF-4)+0 > s ? $(NF-4)+0 : s; c = $(NF-2)+0 > c ? $(NF-2)+0 : c;
  d = $NF+0 > d ? $NF+0 : d; n++ } END { printf "gemm cases %d: worst err/sum|xw| skinny %g cublas %g skinny-cublas %g\n", n, s, c, d }' |
  tee -a "$out/summary.txt"
timeout ${BENCH_S:-150} $b/bench/gemm_bf16 --out "$out/gemm-bf16-h200.json" > "$out/gemm_bf16.log" 2> "$out/gemm_bf16.err"
echo "gemm_bf16 rc=$? $(( $(date +%s) - t0 )) s"
if [ "${DECODE:-1}" = 1 ]; then
  for ab in 0 1; do
    QRL_GEMM_BF16_CUBLAS=$ab timeout ${DEC_S:-90} $b/bench/decode --grid 1 --from 14 --formats bf16 \
      --out "$out/decode-cublas$ab.json" > "$out/decode-cublas$ab.log" 2>&1
    echo "decode QRL_GEMM_BF16_CUBLAS=$ab rc=$? $(( $(date +%s) - t0 )) s"
  done
fi
if [ "${GRAPHS:-0}" = 1 ]; then
  for ab in 0 1; do
    QRL_GEMM_BF16_CUBLAS=$ab timeout ${GRAPH_S:-120} $b/bench/graphs --out "$out/graphs-cublas$ab.json" \
      > "$out/graphs-cublas$ab.log" 2>&1
    echo "graphs QRL_GEMM_BF16_CUBLAS=$ab rc=$? $(( $(date +%s) - t0 )) s"
  done
fi
if [ "${PROFILE:-0}" = 1 ] && command -v ncu > /dev/null; then
  for shape in lm_head:1 gate_up:64; do
    timeout 60 ncu -k regex:skinny --launch-skip 3 --launch-count 1 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
      $b/bench/gemm_bf16 --profile $shape > "$out/ncu-${shape%%:*}.log" 2>&1
    echo "ncu $shape rc=$? $(( $(date +%s) - t0 )) s"
  done
fi
cat "$out/gemm_bf16.log"
for ab in 0 1; do
  [ -f "$out/decode-cublas$ab.log" ] && { echo "== decode QRL_GEMM_BF16_CUBLAS=$ab"; grep -aE "bf16 .*median|device:" "$out/decode-cublas$ab.log"; }
  [ -f "$out/graphs-cublas$ab.log" ] && { echo "== graphs QRL_GEMM_BF16_CUBLAS=$ab"; grep -a "bf16" "$out/graphs-cublas$ab.log" | grep -v "first steps"; }
done
for f in "$out"/ncu-*.log; do
  [ -f "$f" ] && { echo "== $f"; grep -aE "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issued Warp|L2 Hit|Block Limit" "$f" | head -24; }
done
cat "$out/summary.txt"
cp "$out"/*.json "$final/" 2>/dev/null
tar czf "$final/logs.tgz" -C "$out" $(cd "$out" && ls *.log) 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
