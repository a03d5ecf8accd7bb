#!/usr/bin/env bash
# deploy/local/summary.sh on made-up run folders (no cluster; issue 20 items 4 and 10):
#   - the counts add up: "groups N: trained U, dropped by dynamic sampling D";
#   - a run whose updates trained on no group says so (all of them / some of them);
#   - a run ended early (RUN/early-end) says so;
#   - RUN/curve.gp, the script of curve.png: integer ticks on the update axis (1 up to 12
#     updates, then 2, 5, 10, ...), accuracy and reward drawn so that neither hides the
#     other (accuracy first, thick with open circles; reward over it, thin with dots), the
#     test avg@k before/after as dashed lines named in a legend outside the plot (no label
#     over the curves); curve.png written when gnuplot is installed.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d /tmp/qrl-summary-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# run DIR N USED...: N updates of 32 groups, update i trained on USED[i] (default 31)
run() {
  local d=$1 n=$2 i u
  shift 2
  mkdir -p "$d"
  : >"$d/learner.jsonl"
  for ((i = 1; i <= n; i++)); do
    u=${1:-31}
    [ $# -gt 0 ] && shift
    jq -cn --argjson i "$i" --argjson u "$u" '{step: $i, version: $i, groups: [range(32)], groups_used: $u,
      groups_dropped: (32 - $u), reward_mean: (0.3 + $i / 200), accuracy: (0.3 + $i / 200),
      kl_behav_prox: 5e-4, tis_frac: 0, acr_frac: 0}' >>"$d/learner.jsonl"
  done
  echo '{"avg_at_k": 0.35, "pass_at_k": 0.7, "greedy_accuracy": 0.8}' >"$d/eval-before.json"
  echo '{"avg_at_k": 0.44, "pass_at_k": 0.8, "greedy_accuracy": 0.9}' >"$d/eval-after.json"
  deploy/local/summary.sh "$d" >"$d/summary.txt" 2>&1 || fail "summary.sh $d: exit $?: $(cat "$d/summary.txt")"
}

run "$tmp/a" 48
grep -q "^updates 48, versions 1..48, groups 1536: trained 1488, dropped by dynamic sampling 48$" "$tmp/a/summary.txt" ||
  fail "counts: $(cat "$tmp/a/summary.txt")"
grep -q "WARNING\|ended early" "$tmp/a/summary.txt" && fail "a normal run warns: $(cat "$tmp/a/summary.txt")"
gp=$tmp/a/curve.gp
[ -s "$gp" ] || fail "no curve.gp"
grep -qx 'set xtics 5' "$gp" && grep -qx 'set format x "%.0f"' "$gp" && grep -qx 'set xrange \[0.5:48.5\]' "$gp" ||
  fail "48 updates: not integer ticks every 5: $(grep -E 'xtics|format x|xrange' "$gp")"
grep -q '^set key outside' "$gp" || fail "the legend is not outside the plot: $(grep key "$gp")"
grep -q '^set label' "$gp" && fail "text drawn over the plot: $(grep '^set label' "$gp")"
acc=$(grep -n 'using 1:3 with linespoints' "$gp" | cut -d: -f1) rew=$(grep -n 'using 1:2 with linespoints' "$gp" | cut -d: -f1)
[ -n "$acc" ] && [ -n "$rew" ] && [ "$acc" -lt "$rew" ] || fail "accuracy is not drawn under the reward: $(grep using "$gp")"
grep 'using 1:3' "$gp" | grep -q 'lw 5 .*pt 6' && grep 'using 1:2' "$gp" | grep -q 'lw 1.5 .*pt 7' ||
  fail "accuracy and reward not drawn distinctly: $(grep using "$gp")"
grep -q 'title "test avg@k before RL: 0.35"' "$gp" && grep -q 'title "test avg@k after RL: 0.44"' "$gp" ||
  fail "the avg@k lines are not in the legend: $(grep avg "$gp")"
if command -v gnuplot >/dev/null; then
  [ -s "$tmp/a/curve.png" ] || fail "no curve.png: $(cat "$tmp/a/gnuplot.log")"
  [ -s "$tmp/a/gnuplot.log" ] && fail "gnuplot complained: $(cat "$tmp/a/gnuplot.log")"
fi
run "$tmp/b" 7
grep -qx 'set xtics 1' "$tmp/b/curve.gp" || fail "7 updates: $(grep xtics "$tmp/b/curve.gp")"

# nothing trained, at all or in some updates
run "$tmp/c" 3 0 0 0
grep -q "^updates 3, versions 1..3, groups 96: trained 0, dropped by dynamic sampling 96$" "$tmp/c/summary.txt" &&
  grep -q "^WARNING: no update trained on any group: dynamic sampling dropped every group" "$tmp/c/summary.txt" ||
  fail "nothing trained: $(cat "$tmp/c/summary.txt")"
run "$tmp/d" 3 31 0 30
grep -q "^WARNING: 1 of 3 updates trained on no group" "$tmp/d/summary.txt" || fail "one idle update: $(cat "$tmp/d/summary.txt")"

# an early end
mkdir -p "$tmp/e"
echo "stopped early by qrlctl shutdown after 2 of 48 updates" >"$tmp/e/early-end"
run "$tmp/e" 2
grep -q "^run ended early: stopped early by qrlctl shutdown after 2 of 48 updates$" "$tmp/e/summary.txt" ||
  fail "early end: $(cat "$tmp/e/summary.txt")"

[ $fails -eq 0 ] && echo "ok: summary counts, warnings and plot script" && exit 0
exit 1
