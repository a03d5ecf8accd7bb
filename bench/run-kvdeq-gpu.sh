#!/usr/bin/env bash
# On the GPU machine, one call (issue 22 item 1, the quantized-KV decoders): build; the
# decode step at the late-stage replay shapes for every KV format with the default kernel,
# then each A/B variant of VARIANTS (env settings separated by spaces, ',' between the
# settings of one variant, e.g. "QRL_ATTNQ_DEQ=0 QRL_ATTNQ_DEQ=2,QRL_ATTNQ_STAGES=4") for
# the quantized formats in the same call (the default run's BF16 step is the reference of
# all); then, with the variant of the lowest summed late-stage time (BEST=1) or the default,
# the quantized-KV attention tests against the CPU (test_cuda_kv, test_cuda_forward_kv),
# the full benchmark (FULL=1: every shape, bench/results/decode-h200.json's format) and one
# Nsight Compute line per attention kernel (NCU=1: duration, DRAM % of peak, issue-slot
# use, warps active) at NCU_SHAPE.  Every step runs under what is left of BUDGET_S
# (default 285 s).  Logs and JSON under $OUT (or /tmp); the short table last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
t0=$(date +%s)
left() { echo $(( ${BUDGET_S:-285} - ($(date +%s) - t0) )); }
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
source bench/device_env.sh
b=build-gpu
make -j"$(nproc)" BUILD=$b $b/tests/cuda/test_cuda_kv $b/tests/cuda/test_cuda_forward_kv $b/bench/decode \
  > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
at built
w=/tmp/kvdeq-v; rm -rf $w; mkdir -p $w
timeout $(( $(left) - 30 )) $b/bench/decode --from 10 --grid 0 --out "$w/late-default.json" > "$w/late-default.log" 2>&1
at "decode late (default) rc=$?"
for v in ${VARIANTS:-}; do
  [ "$(left)" -gt 60 ] || break
  env ${v//,/ } timeout $(( $(left) - 30 )) $b/bench/decode --from 10 --grid 0 --formats int8,fp8,int4,int4-protected \
    --out "$w/late-$v.json" > "$w/late-$v.log" 2>&1
  at "decode late ($v) rc=$?"
done
best=""
if [ -n "${BEST:-}" ]; then
  best=$(python3 - "$w" <<'EOF'
import glob, json, os, sys
score = {}
for p in glob.glob(os.path.join(sys.argv[1], "late-*.json")):
    try:
        d = json.load(open(p))
    except Exception:
        continue
    ms = [v["ms_per_step"] for s in d["shapes"] for f, v in s["formats"].items() if f != "bf16"]
    if len(ms) == 20:
        score[os.path.basename(p)[5:-5]] = sum(ms)
b = min(score, key=score.get) if score else "default"
print("" if b == "default" else b)
EOF
)
fi
echo "chosen variant: ${best:-default}"
[ -n "$best" ] && export ${best//,/ }
timeout $(( $(left) > 60 ? 60 : $(left) )) $b/tests/cuda/test_cuda_kv > "$w/test_cuda_kv.log" 2>&1
at "test_cuda_kv rc=$?"
timeout $(( $(left) > 30 ? 30 : $(left) )) $b/tests/cuda/test_cuda_forward_kv > "$w/test_cuda_forward_kv.log" 2>&1
at "test_cuda_forward_kv rc=$?"
if [ -n "${FULL:-}" ] && [ "$(left)" -gt 80 ]; then
  timeout $(( $(left) - 10 )) $b/bench/decode --out "$out/decode-h200.json" > "$w/decode-full.log" 2>&1
  at "decode full rc=$?"
fi
if [ -n "${NCU:-}" ]; then
  for f in bf16 int8 fp8 int4 int4-protected; do
    [ "$(left)" -gt 25 ] || break
    k=attnq_tc_kernel; [ $f = bf16 ] && k=attn_tc_kernel
    timeout $(( $(left) - 5 )) ncu --clock-control none --graph-profiling node -k regex:$k -s 40 -c 1 \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__inst_issued.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      $b/bench/decode --shape ${NCU_SHAPE:-176x4767} --grid 0 --formats $f > "$w/ncu-$f.log" 2>&1
    at "ncu $f rc=$?"
  done
fi
tar czf "$out/logs.tgz" -C /tmp kvdeq-v
echo "== test_cuda_kv"; grep -E "attention_q .*hd=128 .*(max_len=3001|max_len=1025)|FAIL|Assert|Synthesis" "$w/test_cuda_kv.log" | sort | uniq | tail -8
echo "== test_cuda_forward_kv"; grep -E "worst|FAIL|Assert|Synthesis" "$w/test_cuda_forward_kv.log" | tail -8
for f in "$w"/ncu-*.log; do [ -f "$f" ] && { echo "== $(basename $f)"; grep -E "^ +(gpu__|dram__|sm__|smsp__)" "$f" | head -6; }; done
[ -f "$out/decode-h200.json" ] && python3 bench/kvdeq_table.py "$out/decode-h200.json" | head -6
for j in "$w"/late-*.json; do
  [ "$j" = "$w/late-default.json" ] && continue
  echo "== $(basename $j .json) vs default"; python3 bench/kvdeq_table.py "$w/late-default.json" "$j" | head -6
done | tee "$out/table.txt"
at done
