#!/usr/bin/env bash
# Render docs/decode-h200.png from bench/results/decode-h200.json (jq + gnuplot, run here,
# not on the GPU machine): ms per decode step per KV format over KV4-RL's 15 replay shapes
# (left) and the speedup over BF16 in the same run (right).
#   bench/plot-decode.sh [JSON] [PNG]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
json=${1:-bench/results/decode-h200.json}
png=${2:-docs/decode-h200.png}
dat=$(mktemp)
trap 'rm -f "$dat"' EXIT
jq -r '.shapes[] | select(.stage != "grid") |
  [(.stage + " " + (.batch|tostring) + "x" + (.context|tostring)),
   (.formats | .["bf16"].ms_per_step, .["int8"].ms_per_step, .["fp8"].ms_per_step,
               .["int4"].ms_per_step, .["int4-protected"].ms_per_step,
               .["int8"].speedup_vs_bf16, .["fp8"].speedup_vs_bf16,
               .["int4"].speedup_vs_bf16, .["int4-protected"].speedup_vs_bf16)] | @tsv' \
  "$json" | sed 's/ /:/' > "$dat"
gnuplot <<GP
set terminal pngcairo size 1400,560 font "sans,10" noenhanced
set output "$png"
set datafile separator "\t"
set multiplot layout 1,2 title "CUDA decode step per KV format, Qwen3-4B shape (36 layers), $(jq -r .device "$json"), bench/decode"
set xtics rotate by 45 right
set grid ytics
set key top left
set ylabel "ms per decode step"
plot "$dat" using 0:2:xtic(1) with linespoints title "bf16", \
     "" using 0:3 with linespoints title "int8", "" using 0:4 with linespoints title "fp8", \
     "" using 0:5 with linespoints title "int4", "" using 0:6 with linespoints title "int4-protected"
set ylabel "speedup over bf16 (same run)"
set yrange [0:2.2]
plot "$dat" using 0:7:xtic(1) with linespoints title "int8", "" using 0:8 with linespoints title "fp8", \
     "" using 0:9 with linespoints title "int4", "" using 0:10 with linespoints title "int4-protected", \
     1.6 with lines dt 2 lc rgb "gray" title "int8/fp8 target", 2.0 with lines dt 3 lc rgb "black" title "int4-protected target"
unset multiplot
GP
echo "wrote $png"
