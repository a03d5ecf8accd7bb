#!/usr/bin/env bash
# On the GPU machine, one call (issue 22: the decode step's small kernels and the same-run
# A/B of each change): build; the CUDA tests named in TESTS (default: the ones these changes
# touch) in parallel; bench/decode (QRL_DECODE_REPEATS, default 5) at the late replay shapes
# and GRID, for each entry of RUNS "LABEL:ENV,ENV:WEIGHTS:FORMATS" (ENV "-" for none); then
# PROFILES "WEIGHTS/KV@BxC" kernel by kernel under Nsight Compute (bench/step_profile.py);
# FULL=1: the whole bench/decode (every shape and KV format, BF16 weights, 10 steps) into
# $OUT/decode-full.json; NCU=1: one Nsight Compute line per attention kernel at NCU_SHAPE
# (default 88x4767, KV4-RL's last late shape halved as the H100's 80 GB need).  The runs
# labelled bf16 / w8a8-fp8 / w8a8-int8 also make the W8A8 table (bench/w8a8_decode_table.py).
# Every step runs under what is left of BUDGET_S (default 300 s).  JSON, tables, logs: $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
t0=$(date +%s)
left() { echo $(( ${BUDGET_S:-300} - ($(date +%s) - t0) )); }
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
b=build-gpu
TESTS=${TESTS:-test_cuda_ops test_cuda_forward_kv test_cuda_kv test_cuda_forward test_cuda_graphs test_cuda_w8a8_fused}
make -j"$(nproc)" BUILD=$b $(for t in $TESTS; do echo $b/tests/cuda/$t; done) $b/bench/decode > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
at built
w=/tmp/i22; rm -rf $w; mkdir -p $w
for t in $TESTS; do
  ( timeout ${TEST_S:-150} $b/tests/cuda/$t > "$w/$t.log" 2>&1; echo "rc=$?" >> "$w/$t.log" ) &
done
wait
at tests
G=${GRID:-1x1024,64x1024,128x1024}
export QRL_DECODE_REPEATS=${QRL_DECODE_REPEATS:-5}
for r in ${RUNS:-default:-:bf16:bf16,int8,fp8,int4,int4-protected}; do
  IFS=: read -r label envs wt fm <<< "$r"
  [ "$(left)" -gt 50 ] || { echo "skip $label (budget)"; continue; }
  [ "$envs" = "-" ] && envs=""
  env ${envs//,/ } timeout $(( $(left) - 30 )) $b/bench/decode --from 10 --grid-shapes $G --weights $wt \
    --formats $fm --out "$w/dec-$label.json" > "$w/dec-$label.log" 2>&1
  at "decode $label rc=$?"
done
if [ -n "${NCU:-}" ]; then
  for f in bf16 int8 fp8 int4 int4-protected; do
    [ "$(left)" -gt 25 ] || break
    k=attnq_tc_kernel; [ $f = bf16 ] && k=attn_tc_kernel
    QRL_DECODE_REPEATS=1 timeout $(( $(left) - 5 )) ncu --clock-control none --graph-profiling node -k regex:$k -s 40 -c 1 \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__inst_issued.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      $b/bench/decode --shape ${NCU_SHAPE:-88x4767} --formats $f > "$w/ncuattn-$f.log" 2>&1
    at "ncu attention $f rc=$?"
  done
fi
if [ -n "${FULL:-}" ] && [ "$(left)" -gt 90 ]; then
  QRL_DECODE_REPEATS=10 timeout $(( $(left) - 30 )) $b/bench/decode --out "$out/decode-full.json" > "$w/decode-full.log" 2>&1
  at "decode full rc=$?"
fi
for p in ${PROFILES:-}; do
  [ "$(left)" -gt 30 ] || { echo "skip profile $p (budget)"; continue; }
  wt=${p%%/*}; rest=${p#*/}; kv=${rest%@*}; sh=${rest#*@}
  QRL_DECODE_REPEATS=1 timeout $(( $(left) - 10 )) ncu --clock-control none --cache-control none \
    --graph-profiling node --csv --page raw --print-units base --metrics gpu__time_duration.sum \
    $b/bench/decode --shape $sh --weights $wt --formats $kv > "$w/ncu-${wt}-${kv}-${sh}.csv" 2> "$w/ncu-${wt}-${kv}-${sh}.err"
  at "profile $p rc=$?"
done
(cd /tmp && tar czf "$out/logs.tgz" i22)
echo "== tests"
for t in $TESTS; do
  echo "$t: $(grep -E '^rc=' $w/$t.log) $(grep -E 'Synthesis' $w/$t.log | tail -1)"
  grep -E 'FAIL|Assert|bit-identical|worst' $w/$t.log | head -${TEST_LINES:-6}
done
echo "== decode (ms per step, QRL_DECODE_REPEATS=$QRL_DECODE_REPEATS)"
python3 - "$w" <<'EOF' | tee "$out/table.txt"
import glob, json, os, sys
runs = []
for p in sorted(glob.glob(os.path.join(sys.argv[1], "dec-*.json")), key=os.path.getmtime):
    try:
        runs.append((os.path.basename(p)[4:-5], json.load(open(p))))
    except Exception as e:
        print("skip", p, e)
cells = {}
shapes = []
for label, d in runs:
    for s in d["shapes"]:
        k = f"{s['batch']}x{s['context']}"
        if k not in shapes:
            shapes.append(k)
        for f, v in s["formats"].items():
            cells.setdefault((d["weights"], f), {}).setdefault(label, {})[k] = v["ms_per_step"]
base = next(iter(cells.get(("bf16", "bf16"), {}).values()), {})
print("weights/kv run " + " ".join(f"{k:>16}" for k in shapes))
for (wt, f), by in cells.items():
    for label, ms in by.items():
        print(f"{wt}/{f} {label} " + " ".join(
            f"{ms[k]:8.2f} ({base[k] / ms[k]:.2f}x)" if k in ms and k in base else f"{'':>16}" for k in shapes))
EOF
labels=""
for l in bf16 w8a8-fp8 w8a8-int8; do [ -s "$w/dec-$l.json" ] && labels="$labels $l=$w/dec-$l.json"; done
if [ -n "$labels" ]; then echo "== W8A8"; python3 bench/w8a8_decode_table.py --merge "$out/decode-w8a8.json" $labels | tee -a "$out/table.txt"; fi
if [ -s "$out/decode-full.json" ]; then
  echo "== full decode"; python3 bench/decode_tables.py "$out/decode-full.json" | head -40 | tee -a "$out/table.txt"
  python3 bench/decode_bf16_bound.py "$out/decode-full.json" | tee -a "$out/table.txt"
fi
for f in "$w"/ncuattn-*.log; do [ -f "$f" ] && { echo "== $(basename $f)"; grep -E "^ +(gpu__|dram__|sm__|smsp__)" "$f" | head -6; }; done | tee -a "$out/table.txt"
args=""
for f in "$w"/ncu-*.csv; do [ -s "$f" ] && args="$args $(basename "$f" .csv | sed 's/^ncu-//')=$f"; done
[ -n "$args" ] && python3 bench/step_profile.py $args --json "$out/step-profile.json" | tee -a "$out/table.txt"
at done
