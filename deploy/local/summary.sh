#!/usr/bin/env bash
# Summary of a finished run folder (deploy/local/launch.sh): a table of the evaluation
# before and after RL and of the training curve, and RUN/curve.png (gnuplot; its script
# RUN/curve.gp) with the per-update reward and accuracy.
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
# RUN/curve.gp: the gnuplot script of RUN/curve.png (kept, to re-draw or restyle the plot).
# Integer ticks on the update axis; accuracy drawn first, thick and light with open circles,
# the reward over it, thin and dark with dots, so that neither hides the other (for 0/1
# rewards they are equal); the test avg@k before/after as dashed lines named in the legend,
# which stands right of the plot (no text over the curves).
before=$(ev eval-before .avg_at_k) after=$(ev eval-after .avg_at_k)
tick=1
for t in 1 2 5 10 20 50 100 200 500 1000 2000 5000 10000; do tick=$t; [ $((n)) -gt $((12 * t)) ] || break; done
cat >"$run/curve.gp" <<EOF
set terminal pngcairo size 1000,520 noenhanced
set output "$run/curve.png"
set title "qrl run $(basename "$run"): training reward and accuracy per update; test avg@k before/after"
set xlabel "update"
set ylabel "reward / accuracy"
set xrange [0.5:$n.5]
set xtics $tick
set format x "%.0f"
set yrange [0:1.1]
set key outside right top vertical Left reverse
set grid
plot "$run/curve.tsv" using 1:3 with linespoints lw 5 lc rgb '#9ecae1' pt 6 ps 1.8 title "train accuracy", \\
     "$run/curve.tsv" using 1:2 with linespoints lw 1.5 lc rgb '#08519c' pt 7 ps 0.7 title "train reward (mean)"$(
  [ "$before" = - ] || printf ', \\\n     %s with lines dt 2 lw 1.5 lc rgb "gray40" title "test avg@k before RL: %s"' "$before" "$before"
  [ "$after" = - ] || printf ', \\\n     %s with lines dt 2 lw 1.5 lc rgb "dark-green" title "test avg@k after RL: %s"' "$after" "$after")
EOF
if command -v gnuplot >/dev/null; then
  gnuplot "$run/curve.gp" 2>"$run/gnuplot.log" || echo "(gnuplot failed: $run/gnuplot.log)"
  [ -s "$run/curve.png" ] && echo "plot: $run/curve.png"
fi
echo "metrics: $m   events: $run/tb   logs: $run/*.log"
