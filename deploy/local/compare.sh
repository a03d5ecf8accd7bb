#!/usr/bin/env bash
# The rollout-precision comparison of docs/results.md (issue 10): the same task, seeds and
# SFT warm start, four runs of deploy/local/launch.sh:
#   bf16        BF16 weights, BF16 KV cache, decoupled loss (the reference)
#   w8a8-int8   W8A8 INT8 weights, BF16 KV, decoupled loss with TIS + ACR
#   int4-kv     W8A8 INT8 weights, int4-protected KV, decoupled loss with TIS + ACR
#   naive       W8A8 INT8 weights, int4-protected KV, loss.mode=naive (behavior = proximal)
# Writes OUT/<run>/ for each, OUT/compare.tsv, OUT/compare.md (the table) and
# OUT/compare.png (test accuracy before/after and training reward per update).
#   deploy/local/compare.sh [--out DIR] [--updates N] [launch.sh flags...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
out=runs/compare-$(date -u +%Y%m%d-%H%M%S) pass=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    *) pass+=("$1"); shift ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

# one SFT warm start shared by all runs (same weights, same seeds)
deploy/local/launch.sh --task arith --run-dir "$out/sft-only" --updates 1 "${pass[@]}" >"$out/sft-only.out" 2>&1 ||
  { tail -20 "$out/sft-only.out"; exit 1; }
sft=$out/sft-only/sft

declare -A args=(
  [bf16]="--precision bf16 --kv-cache bf16"
  [w8a8-int8]="--precision w8a8-int8 --kv-cache bf16"
  [int4-kv]="--precision w8a8-int8 --kv-cache int4-protected"
  [naive]="--precision w8a8-int8 --kv-cache int4-protected -- --loss.mode naive"
)
printf 'run\tavg_before\tavg_after\tgreedy_before\tgreedy_after\tkl_mean\ttis_mean\tacr_mean\treward_last\n' >"$out/compare.tsv"
for run in bf16 w8a8-int8 int4-kv naive; do
  echo "[$(date +%H:%M:%S)] $run: ${args[$run]}"
  # shellcheck disable=SC2086
  deploy/local/launch.sh --task arith --model "$sft" --run-dir "$out/$run" "${pass[@]}" ${args[$run]} \
    >"$out/$run.out" 2>&1 || { tail -20 "$out/$run.out"; exit 1; }
  m=$out/$run/learner.jsonl
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" \
    "$(jq .avg_at_k "$out/$run/eval-before.json")" "$(jq .avg_at_k "$out/$run/eval-after.json")" \
    "$(jq .greedy_accuracy "$out/$run/eval-before.json")" "$(jq .greedy_accuracy "$out/$run/eval-after.json")" \
    "$(jq -s 'map(.kl_behav_prox) | add / length' "$m")" "$(jq -s 'map(.tis_frac) | add / length' "$m")" \
    "$(jq -s 'map(.acr_frac) | add / length' "$m")" "$(jq -s '.[-1].reward_mean' "$m")" >>"$out/compare.tsv"
  jq -r --arg r "$run" '[$r, .step, .reward_mean] | @tsv' "$m" >>"$out/curves.tsv"
done

{
  echo "| run | test avg@k before | after | greedy before | after | mean KL(behav‖prox) | TIS-truncated | ACR-widened | last train reward |"
  echo "|---|---|---|---|---|---|---|---|---|"
  tail -n +2 "$out/compare.tsv" | awk -F'\t' '{ printf "| %s | %.3f | %.3f | %.3f | %.3f | %.2e | %.2e | %.2e | %.3f |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
} >"$out/compare.md"
cat "$out/compare.md"
if command -v gnuplot >/dev/null; then
  gnuplot <<EOF || true
set terminal pngcairo size 1000,480 noenhanced
set output "$out/compare.png"
set multiplot layout 1,2
set title "training reward per update"
set xlabel "update"; set ylabel "mean reward"; set yrange [0:1.05]; set grid; set key bottom right
plot for [r in "bf16 w8a8-int8 int4-kv naive"] "< grep '^".r."\t' $out/curves.tsv" using 2:3 with linespoints title r
set title "test avg@k before / after RL"
set style data histograms; set style fill solid 0.7; set boxwidth 0.8; set ylabel "avg@k"; unset xlabel
set key top left horizontal
plot "$out/compare.tsv" using 2:xtic(1) title "before RL", "" using 3 title "after RL"
unset multiplot
EOF
  echo "plot: $out/compare.png"
fi
