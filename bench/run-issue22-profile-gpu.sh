#!/usr/bin/env bash
# On the GPU machine, one call (issue 22, where the step's time goes): build; bench/decode
# with the committed W8A8 AUTO rule at the late replay shapes and batch 1..256 x 1024
# (BF16 weights with BF16 and int4-protected KV: the anchor; w8a8-fp8 with both; w8a8-int8
# with BF16 KV), then one decode step kernel by kernel under Nsight Compute (duration only,
# caches and clocks left alone, graph nodes profiled one by one; bench/step_profile.py finds
# the last step and groups it) for each PROFILES entry "WEIGHTS/KV@BxC".  Every step runs
# under what is left of BUDGET_S (default 330 s).  JSON, tables and logs under $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
t0=$(date +%s)
left() { echo $(( ${BUDGET_S:-330} - ($(date +%s) - t0) )); }
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
b=build-gpu
make -j"$(nproc)" BUILD=$b $b/bench/decode > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
at built
w=/tmp/i22-prof; rm -rf $w; mkdir -p $w
G=${GRID:-1x1024,8x1024,32x1024,64x1024,128x1024,256x1024}
dec() {
  local label=$1; shift
  [ "$(left)" -gt 60 ] || { echo "skip $label (budget)"; return; }
  timeout $(( $(left) - 40 )) $b/bench/decode "$@" --out "$w/dec-$label.json" > "$w/dec-$label.log" 2>&1
  at "decode $label rc=$?"
}
[ -n "${NODEC:-}" ] || {
  dec bf16 --from 10 --grid-shapes $G --weights bf16 --formats bf16,int4-protected
  dec w8a8-fp8 --from 10 --grid-shapes $G --weights w8a8-fp8 --formats bf16,int4-protected
  dec w8a8-int8 --from 10 --grid-shapes $G --weights w8a8-int8 --formats bf16
}
for p in ${PROFILES:-bf16/int4-protected@200x2568 w8a8-fp8/int4-protected@200x2568 bf16/bf16@128x1024 w8a8-fp8/bf16@128x1024 bf16/bf16@100x2568}; do
  [ "$(left)" -gt 30 ] || { echo "skip profile $p (budget)"; continue; }
  wt=${p%%/*}; rest=${p#*/}; kv=${rest%@*}; sh=${rest#*@}
  QRL_DECODE_REPEATS=1 timeout $(( $(left) - 10 )) ncu --clock-control none --cache-control none \
    --graph-profiling node --csv --page raw --print-units base --metrics gpu__time_duration.sum \
    $b/bench/decode --shape $sh --weights $wt --formats $kv > "$w/ncu-${wt}-${kv}-${sh}.csv" 2> "$w/ncu-${wt}-${kv}-${sh}.err"
  at "profile $p rc=$?"
done
(cd /tmp && tar czf "$out/logs.tgz" i22-prof)
echo "== decode (committed AUTO rule)"
labels=""
for l in bf16 w8a8-fp8 w8a8-int8; do [ -s "$w/dec-$l.json" ] && labels="$labels $l=$w/dec-$l.json"; done
[ -n "$labels" ] && python3 bench/w8a8_decode_table.py --merge "$out/decode-w8a8.json" $labels | tee "$out/table.txt"
echo "== step profiles"
args=""
for f in "$w"/ncu-*.csv; do [ -s "$f" ] && args="$args $(basename "$f" .csv | sed 's/^ncu-//')=$f"; done
[ -n "$args" ] && python3 bench/step_profile.py $args --json "$out/step-profile.json" | tee -a "$out/table.txt"
at done
