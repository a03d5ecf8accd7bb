#!/usr/bin/env bash
# On the GPU machine, one call (issue 22 item 3: the W8A8 epilogue of o and down deferred
# into the norm that reads their output, no separate pass): build; the W8A8 CUDA tests
# (test_cuda_w8a8_epi: deferred == pass, kernels and forward, bit for bit;
# test_cuda_w8a8_fused, test_cuda_w8a8 against the CPU, test_cuda_w8a8_tc); then
# bench/decode, Qwen3-4B, batch 1/64/128/256 x context 1024 (QRL_DECODE_REPEATS=5), w8a8-fp8
# (KV bf16 and int4-protected) and w8a8-int8 (KV bf16), each with the deferred epilogue and
# with QRL_W8A8_EPILOGUE_PASS=1 (the separate pass, A/B), while BUDGET_S (default 150 s)
# lasts.  PROFILE=1 adds one Nsight Compute step profile of each variant (w8a8-fp8, bf16 KV,
# 128 x 1024) when the budget allows.  Logs and JSON under $OUT (or /tmp); the tables last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
t0=$(date +%s)
left() { echo $(( ${BUDGET_S:-150} - ($(date +%s) - t0) )); }
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
b=build-gpu
T="test_cuda_w8a8_epi test_cuda_w8a8_fused test_cuda_w8a8 test_cuda_w8a8_tc"
make -j"$(nproc)" BUILD=$b $(for t in $T; do echo $b/tests/cuda/$t; done) $b/bench/decode \
  > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
at built
w=/tmp/epi-run; rm -rf $w; mkdir -p $w
for t in $T; do
  ( timeout 120 $b/tests/cuda/$t > "$w/$t.log" 2>&1; echo "rc=$?" >> "$w/$t.log" ) &
done
wait
at tests
G=1x1024,64x1024,128x1024,256x1024
# dec LABEL ENV-ASSIGNMENT bench/decode-args...: one run, skipped when the budget is short
dec() {
  local label=$1 envs=$2; shift 2
  [ "$(left)" -gt 20 ] || { echo "skip $label (budget)"; return; }
  env QRL_DECODE_REPEATS=5 $envs timeout $(( $(left) - 8 )) $b/bench/decode "$@" \
    --out "$w/dec-$label.json" > "$w/dec-$label.log" 2>&1
  at "decode $label rc=$?"
}
dec fp8 QRL_AB=none --from 10 --grid-shapes $G --weights w8a8-fp8 --formats bf16,int4-protected
dec fp8-pass QRL_W8A8_EPILOGUE_PASS=1 --from 10 --grid-shapes $G --weights w8a8-fp8 --formats bf16,int4-protected
dec int8 QRL_AB=none --from 10 --grid-shapes $G --weights w8a8-int8 --formats bf16
dec int8-pass QRL_W8A8_EPILOGUE_PASS=1 --from 10 --grid-shapes $G --weights w8a8-int8 --formats bf16
if [ -n "${PROFILE:-}" ]; then
  for v in deferred pass; do
    [ "$(left)" -gt 30 ] || { echo "skip profile $v (budget)"; continue; }
    e=QRL_AB=none; [ $v = pass ] && e=QRL_W8A8_EPILOGUE_PASS=1
    env $e QRL_DECODE_REPEATS=1 timeout $(( $(left) - 5 )) ncu --clock-control none \
      --cache-control none --graph-profiling node --csv --page raw --print-units base \
      --metrics gpu__time_duration.sum $b/bench/decode --shape 128x1024 --weights w8a8-fp8 \
      --formats bf16 > "$w/ncu-$v.csv" 2> "$w/ncu-$v.err"
    at "profile $v rc=$?"
  done
fi
(cd /tmp && tar czf "$out/logs.tgz" epi-run)
echo "== tests"
for t in $T; do
  printf '%-22s %s\n' "$t" "$(grep -h '^rc=' $w/$t.log) $(grep -h 'Synthesis' $w/$t.log | sed 's/.*Synthesis: //')"
done
grep -hE "FAIL|Assert|worst|differ" $w/test_cuda_w8a8*.log | sort | uniq -c | sort -rn | head -12
grep -hE "bit-identical deferred" $w/test_cuda_w8a8_epi.log | head -8
grep -hE "defer=1: bit-identical" $w/test_cuda_w8a8_epi.log | wc -l | sed 's/^/kernel cases deferred and bit-identical: /'
echo "== decode ms/step (Qwen3-4B): deferred epilogue vs QRL_W8A8_EPILOGUE_PASS=1"
python3 - "$w" <<'EOF' | tee "$out/table.txt"
import json, os, sys
w = sys.argv[1]
def load(label):
    try:
        d = json.load(open(os.path.join(w, "dec-%s.json" % label)))
    except (OSError, ValueError):
        return {}
    return {(s["stage"], s["batch"], s["context"], kv): v["ms_per_step"]
            for s in d["shapes"] for kv, v in s["formats"].items()}
print("%-6s %-15s %-8s %6s %5s %10s %10s %7s" % ("wts", "kv", "stage", "batch", "ctx",
                                                  "deferred", "pass", "pass/def"))
for wt in ("fp8", "int8"):
    a, b = load(wt), load(wt + "-pass")
    for k in sorted(set(a) | set(b), key=lambda k: (k[3], k[1], k[2], str(k[0]))):
        x, y = a.get(k), b.get(k)
        r = "%7.3f" % (y / x) if x and y else "      -"
        f = lambda v: "%10.3f" % v if v else "         -"
        print("%-6s %-15s %-8s %6d %5d %s %s %s" % (wt, k[3], k[0], k[1], k[2], f(x), f(y), r))
EOF
if [ -n "${PROFILE:-}" ]; then
  args=""
  for v in deferred pass; do [ -s "$w/ncu-$v.csv" ] && args="$args $v=$w/ncu-$v.csv"; done
  [ -n "$args" ] && python3 bench/step_profile.py $args | tee -a "$out/table.txt"
fi
at done
