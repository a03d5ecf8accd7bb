#!/usr/bin/env bash
# Summary of a finished run folder (deploy/local/launch.sh): a table of the evaluation
# before and after RL and of the training curve, and RUN/curve.png (gnuplot) with the
# per-update reward and accuracy.
#   deploy/local/summary.sh RUN_DIR
set -euo pipefail
run=${1:?usage: summary.sh RUN_DIR}
m=$run/learner.jsonl
[ -s "$m" ] || { echo "summary.sh: $m is empty or missing" >&2; exit 1; }

ev() { jq -r "$2 // \"-\"" "$run/$1.json" 2>/dev/null || echo -; }
n=$(wc -l <"$m")
first=$(head -1 "$m") last=$(tail -1 "$m")
printf '\n%-30s %12s %12s\n' "" "before RL" "after RL"
for k in avg_at_k pass_at_k greedy_accuracy; do
  printf '%-30s %12s %12s\n' "test $k" "$(ev eval-before ".$k")" "$(ev eval-after ".$k")"
done
printf '%-30s %12s %12s\n' "train reward (first/last upd.)" "$(jq -r '.reward_mean' <<<"$first")" \
  "$(jq -r '.reward_mean' <<<"$last")"
[ -s "$run/early-end" ] && echo "run ended early: $(cat "$run/early-end")"
# groups taken = trained + dropped by dynamic sampling (a group whose rewards are all equal
# has no advantage to learn from)
jq -s -r '"updates \(length), versions \(.[0].version)..\(.[-1].version), groups \(map(.groups | length) | add): trained \(map(.groups_used) | add), dropped by dynamic sampling \(map(.groups_dropped) | add)",
  "mean KL(behav||prox) \(map(.kl_behav_prox) | add / length), TIS-truncated \(map(.tis_frac) | add / length), ACR-widened \(map(.acr_frac) | add / length)",
  (map(select(.groups_used == 0)) | length) as $idle |
  if $idle == length then "WARNING: no update trained on any group: dynamic sampling dropped every group (the rewards of each were all equal: a start that never, or always, solves the task), so the policy did not change; start from a stronger model (e.g. more --sft-steps)"
  elif $idle > 0 then "WARNING: \($idle) of \(length) updates trained on no group (every group dropped by dynamic sampling)"
  else empty end' "$m"

# the curve: reward and accuracy per update
jq -r '[.step, .reward_mean, .accuracy] | @tsv' "$m" >"$run/curve.tsv"
if command -v gnuplot >/dev/null; then
  before=$(ev eval-before .avg_at_k) after=$(ev eval-after .avg_at_k)
  gnuplot <<EOF 2>"$run/gnuplot.log" || echo "(gnuplot failed: $run/gnuplot.log)"
set terminal pngcairo size 900,520 noenhanced
set output "$run/curve.png"
set title "qrl run $(basename "$run"): training reward per update; test avg@k before/after"
set xlabel "update"
set ylabel "reward / accuracy"
set yrange [0:1.05]
set key bottom right
set grid
$( [ "$before" != - ] && echo "set arrow from graph 0, first $before to graph 1, first $before nohead dt 2 lc rgb 'gray40'
set label 'test avg@k before RL $before' at graph 0.02, first $before offset 0,0.7" )
$( [ "$after" != - ] && echo "set arrow from graph 0, first $after to graph 1, first $after nohead dt 2 lc rgb 'dark-green'
set label 'test avg@k after RL $after' at graph 0.55, first $after offset 0,0.7" )
plot "$run/curve.tsv" using 1:2 with linespoints title "train reward (mean)", \
     "$run/curve.tsv" using 1:3 with linespoints title "train accuracy"
EOF
  [ -s "$run/curve.png" ] && echo "plot: $run/curve.png"
fi
echo "metrics: $m   events: $run/tb   logs: $run/*.log"
