#!/usr/bin/env bash
# The rollout-precision comparisons of docs/results.md: the same task, seeds and SFT warm
# start, one deploy/local/launch.sh run per entry of a run set.
#   --set int8 (default; issue 10):
#     bf16          BF16 weights, BF16 KV cache, decoupled loss (the reference)
#     w8a8-int8     W8A8 INT8 weights, BF16 KV, decoupled loss with TIS + ACR
#     int4-kv       W8A8 INT8 weights, int4-protected KV, decoupled loss with TIS + ACR
#     naive         W8A8 INT8 weights, int4-protected KV, loss.mode=naive (behavior = proximal)
#   --set fp4 (issue 19; every fp4-* run: w4a4-nvfp4 weights and activations, fp4 KV cache):
#     bf16          BF16 weights and KV, decoupled + TIS + ACR (the reference)
#     fp4-naive     loss.mode naive (ratio and clip against the FP4 behaviour log-probs)
#     fp4-tis       decoupled + token TIS, ACR off
#     fp4-tis-acr   decoupled + TIS + ACR (QuRL)
#     fp4-seq-tis   decoupled, sequence-level TIS (geometric mean, tis_cap 1.05), ACR
#     fp4-tok-mis   decoupled, token-level masked IS (IcePop band [0.5, 5], no truncation)
#     fp4-seq-mis   decoupled, sequence-level masked IS (geometric band [0.8, 1.25]) + token TIS
#     fp4-qat       decoupled + TIS + ACR, QAT in the learner (learner.qat nvfp4, qat_kv),
#                   nearest rounding (trace_guidance off)
#     fp4-trace     as fp4-qat with the rollout's TRACE records (rollout.trace, trace_guidance)
#   The fp4 set also evaluates the SFT start and each trained policy through the FP4 path
#   (qrl-eval --precision w4a4-nvfp4 --kv_cache fp4: the policy as the replicas run it).
# Per seed (--seeds "1 2": OUT/seed-S/ each; without it OUT/ with the launcher's seed):
# OUT/sft-only/ (the shared SFT start), OUT/<run>/ and OUT/<run>.out, OUT/compare.tsv (one
# row per run, the columns of the header), OUT/curves.tsv (per update: reward, disc_mean,
# kl), OUT/compare.md (the table) and OUT/compare.png (gnuplot: train reward and
# train-rollout discrepancy per update, test avg@k before/after).
#   deploy/local/compare.sh [--set int8|fp4] [--runs "R1 R2 ..."] [--seeds "S1 S2 ..."]
#       [--out DIR] [--dry-run] [launch.sh flags...] [-- daemon flags for every run]
# --runs: a subset of the set, in that order.  --dry-run: print each run's launch.sh command,
# check its launch.sh flags with launch.sh --dry-run (needs OUT[/seed-S]/sft-only/sft to
# exist; the daemon keys after -- are checked only when a run starts) and exit.  launch.sh flags (e.g. --sft-steps 240 --updates 24) go to the SFT and every run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
die() { echo "compare.sh: error: $*" >&2; exit 1; }
out=runs/compare-$(date -u +%Y%m%d-%H%M%S) set=int8 only="" seeds="" dry=0 pass=() extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --out|--set|--runs|--seeds) [ $# -ge 2 ] || die "$1 needs a value" ;;&
    --out) out=$2; shift 2 ;;
    --set) set=$2; shift 2 ;;
    --runs) only=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    --seed) die "use --seeds \"S ...\" (one SFT start per seed)" ;;
    *) pass+=("$1"); shift ;;
  esac
done

# each run: "launcher flags | daemon flags" (after launch.sh's --)
declare -A args=()
case $set in
  int8)
    runs="bf16 w8a8-int8 int4-kv naive"
    args=([bf16]="--precision bf16 --kv-cache bf16 |"
      [w8a8-int8]="--precision w8a8-int8 --kv-cache bf16 |"
      [int4-kv]="--precision w8a8-int8 --kv-cache int4-protected |"
      [naive]="--precision w8a8-int8 --kv-cache int4-protected | --loss.mode naive") ;;
  fp4)
    runs="bf16 fp4-naive fp4-tis fp4-tis-acr fp4-seq-tis fp4-tok-mis fp4-seq-mis fp4-qat fp4-trace"
    fp4="--precision w4a4-nvfp4 --kv-cache fp4"
    qat="--learner.qat nvfp4 --learner.qat_kv true"
    args=([bf16]="--precision bf16 --kv-cache bf16 |"
      [fp4-naive]="$fp4 | --loss.mode naive"
      [fp4-tis]="$fp4 | --loss.acr false"
      [fp4-tis-acr]="$fp4 |"
      [fp4-qat]="$fp4 | $qat --learner.trace_guidance off"
      [fp4-trace]="$fp4 | $qat --learner.trace_guidance on --rollout.trace true"
      [fp4-seq-tis]="$fp4 | --loss.is_level seq --loss.tis_cap 1.05"
      [fp4-tok-mis]="$fp4 | --loss.mis token --loss.mis_low 0.5 --loss.mis_high 5 --loss.tis_cap 1e30"
      [fp4-seq-mis]="$fp4 | --loss.mis seq --loss.mis_low 0.8 --loss.mis_high 1.25") ;;
  *) die "--set must be int8 or fp4, not '$set'" ;;
esac
if [ -n "$only" ]; then
  for r in $only; do [ -n "${args[$r]+x}" ] || die "--runs: '$r' is not a run of --set $set ($runs)"; done
  runs=$only
fi
max_new=48 # launch.sh's arith default, or --max-new-tokens as passed
for ((i = 0; i + 1 < ${#pass[@]}; i++)); do [ "${pass[i]}" != --max-new-tokens ] || max_new=${pass[i + 1]}; done
for s in $seeds; do [[ $s =~ ^[0-9]+$ ]] || die "--seeds: '$s' is not a seed number"; done

# launch RUN_DIR RUN [launch.sh flags...]: one launch.sh run of entry RUN (flags before its
# own).  --dry-run: print the command and have launch.sh --dry-run check it (its options,
# the daemon keys after --), starting nothing.
launch() {
  local dir=$1 run=$2 spec lf df
  shift 2
  spec=${args[$run]}
  read -r -a lf <<<"${spec%%|*}"
  read -r -a df <<<"${spec#*|}"
  if [ $dry = 1 ]; then
    echo "+ deploy/local/launch.sh --task arith --run-dir $dir ${pass[*]} $* ${lf[*]} -- ${df[*]} ${extra[*]}"
    deploy/local/launch.sh --task arith --run-dir "$dir" "${pass[@]}" "$@" "${lf[@]}" --dry-run -- "${df[@]}" \
      "${extra[@]}" >/dev/null 2>"$dry_err" || { cat "$dry_err" >&2; return 1; }
    return
  fi
  deploy/local/launch.sh --task arith --run-dir "$dir" "${pass[@]}" "$@" "${lf[@]}" -- "${df[@]}" "${extra[@]}"
}

# mean FIELD over the updates of learner.jsonl (absent field: "-")
jmean() { jq -s --arg f "$1" 'map(.[$f] | select(. != null)) | if length == 0 then "-" else add / length end' "$2"; }
jmax() { jq -s --arg f "$1" 'map(.[$f] | select(. != null)) | if length == 0 then "-" else max end' "$2"; }

# eval_fp4 MODEL RUN_DIR OUT.json: qrl-eval of MODEL as a w4a4-nvfp4 + fp4-KV replica runs it,
# with the run's own evaluation settings (test set, n, k, seed, max tokens: eval-before.json)
eval_fp4() {
  local e=$2/eval-before.json
  "${BUILD:-build}/bin/qrl-eval" --model "$1" --dataset "$(jq -r .dataset "$e")" --task arith \
    --n "$(jq .n "$e")" --k "$(jq .k "$e")" --temperature "$(jq .temperature "$e")" \
    --seed "$(jq -r '.seed // 1' "$e")" --max_tokens "$max_new" \
    --precision w4a4-nvfp4 --kv_cache fp4 --json >"$3" 2>"${3%.json}.log" || echo "(FP4 evaluation of $1 failed: ${3%.json}.log)"
}

cols="run avg_before avg_after greedy_before greedy_after kl_mean disc_mean disc_p99 disc_max max_w clip_low clip_high tis_frac acr_frac seq_tis_frac mis_frac mis_seq_frac trace_guided trace_unguided trace_disagree reward_first reward_last10 wall_s load fp4_avg_before fp4_avg_after fp4_greedy_before fp4_greedy_after"
compare_one() { # $1 = folder of one seed, $2... = launch.sh flags (the seed)
  local o=$1 run m t0 r
  shift
  mkdir -p "$o"
  o=$(cd "$o" && pwd)
  # one SFT warm start shared by all runs (same weights, same seeds)
  if [ $dry = 1 ]; then
    echo "+ deploy/local/launch.sh --task arith --run-dir $o/sft-only ${pass[*]} $* --updates 1"
  elif [ ! -s "$o/sft-only/sft/model.safetensors" ]; then # kept when the script is re-run
    deploy/local/launch.sh --task arith --run-dir "$o/sft-only" "${pass[@]}" "$@" --updates 1 >"$o/sft-only.out" 2>&1 ||
      { tail -20 "$o/sft-only.out"; return 1; }
  fi
  [ $dry = 1 ] || { tr ' ' '\t' <<<"$cols" >"$o/compare.tsv"; : >"$o/curves.tsv"; }
  for run in $runs; do
    [ $dry = 1 ] || echo "[$(date +%H:%M:%S)] $(basename "$o") $run: ${args[$run]} (load $(cut -d' ' -f1 /proc/loadavg))"
    t0=$SECONDS
    if [ $dry = 1 ]; then launch "$o/$run" "$run" --model "$o/sft-only/sft" "$@" || return 1; continue; fi
    if [ ! -s "$o/$run/eval-after.json" ]; then # a finished run is kept (re-running the script resumes the set)
      rm -rf "${o:?}/$run"
      launch "$o/$run" "$run" --model "$o/sft-only/sft" "$@" >"$o/$run.out" 2>&1 ||
        { tail -20 "$o/$run.out"; echo "[$run failed: $o/$run.out]"; continue; }
      echo "$((SECONDS - t0)) $(cut -d' ' -f1-3 /proc/loadavg)" >"$o/$run/wall"
    fi
    m=$o/$run/learner.jsonl
    r=("$run" "$(jq .avg_at_k "$o/$run/eval-before.json")" "$(jq .avg_at_k "$o/$run/eval-after.json")"
      "$(jq .greedy_accuracy "$o/$run/eval-before.json")" "$(jq .greedy_accuracy "$o/$run/eval-after.json")")
    for f in kl_behav_prox disc_mean disc_p99; do r+=("$(jmean $f "$m")"); done
    r+=("$(jmax disc_max "$m")" "$(jmax max_w "$m")")
    for f in clip_low clip_high tis_frac acr_frac seq_tis_frac mis_frac mis_seq_frac; do r+=("$(jmean $f "$m")"); done
    r+=("$(jq -s 'map(.trace_rows_guided // 0) | add' "$m")" "$(jq -s 'map(.trace_rows_unguided // 0) | add' "$m")"
      "$(jmean trace_disagree_share "$m")" "$(jq -s '.[0].reward_mean' "$m")"
      "$(jq -s '.[-10:] | map(.reward_mean) | add / length' "$m")")
    read -r w l1 _ <"$o/$run/wall" || w=- l1=-
    r+=("$w" "$l1")
    if [ "$set" = fp4 ]; then # the policy as an FP4 replica runs it, before (once per seed) and after
      [ -s "$o/sft-only/eval-fp4.json" ] || eval_fp4 "$o/sft-only/sft" "$o/sft-only" "$o/sft-only/eval-fp4.json"
      [ -s "$o/$run/eval-after-fp4.json" ] || eval_fp4 "$o/$run/final" "$o/$run" "$o/$run/eval-after-fp4.json"
      r+=("$(jq .avg_at_k "$o/sft-only/eval-fp4.json")" "$(jq .avg_at_k "$o/$run/eval-after-fp4.json")"
        "$(jq .greedy_accuracy "$o/sft-only/eval-fp4.json")" "$(jq .greedy_accuracy "$o/$run/eval-after-fp4.json")")
    else r+=(- - - -); fi
    (IFS=$'\t'; echo "${r[*]}") >>"$o/compare.tsv"
    jq -r --arg r "$run" '[$r, .step, .reward_mean, .disc_mean, .kl_behav_prox] | @tsv' "$m" >>"$o/curves.tsv"
  done
  [ $dry = 0 ] || return 0
  {
    echo "| run | test avg@4 before | after | greedy before | after | KL(behav‖prox) | disc mean | disc p99 | disc max | max w | clip low / high | TIS-trunc. | ACR-wid. | seq-TIS seqs | masked tok. / seqs | TRACE guided / unguided rows, disagree | train reward first → last 10 | FP4-path avg@4 before → after |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    tail -n +2 "$o/compare.tsv" | awk -F'\t' 'function g(x) { return x == "-" ? "-" : sprintf("%.2g", x) }
      { tr = ($18 + $19 > 0) ? sprintf("%d / %d, %s", $18, $19, g($20)) : "-"
        fp = ($25 == "-" || $25 == "") ? "-" : sprintf("%.3f → %.3f", $25, $26)
        printf "| %s | %.3f | %.3f | %.3f | %.3f | %s | %s | %s | %s | %s | %s / %s | %s | %s | %s | %s / %s | %s | %.3f → %.3f | %s |\n",
          $1, $2, $3, $4, $5, g($6), g($7), g($8), g($9), g($10), g($11), g($12), g($13), g($14), g($15), g($16), g($17), tr, $21, $22, fp }'
  } >"$o/compare.md"
  cat "$o/compare.md"
  command -v gnuplot >/dev/null || return 0
  local fp4cols="" # the fp4 set: the policy as an FP4 replica runs it, after RL, as a third bar
  [ "$set" != fp4 ] || fp4cols=', "" using 26 title "after RL, FP4 path" lc rgb "#fdae6b"'
  gnuplot <<EOF || true
set terminal pngcairo size 1500,460 font ",9" noenhanced
set output "$o/compare.png"
set multiplot layout 1,3 title "$(basename "$o"): $set run set"
# nine distinguishable lines: colour and dash per run (index in the run list)
array C[9] = ["#000000", "#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00", "#a65628", "#f781bf", "#17becf"]
do for [i=1:9] { set linetype (100 + i) lc rgb C[i] lw (i == 1 ? 2.5 : 1.5) dt 1 }
do for [i=6:9] { set linetype (100 + i) dt 2 }
set grid; set xlabel "update"; set key outside bottom center horizontal maxrows 3 font ",8"
set title "train reward per update (the sampler's policy)"; set ylabel "mean reward"; set yrange [0:1.05]
plot for [i=1:words("$runs")] "< grep '^".word("$runs", i)."	' $o/curves.tsv" using 2:3 with lines \
  lt (100 + (i - 1) % 9 + 1) title word("$runs", i)
set title "train-rollout discrepancy mean |lp_prox - lp_behav| per update"; set ylabel "nats per token (log)"
set logscale y; set yrange [*:*]; set format y "1e%L"
plot for [i=1:words("$runs")] "< grep '^".word("$runs", i)."	' $o/curves.tsv" using 2:(\$4 > 0 ? \$4 : 1/0) \
  with lines lt (100 + (i - 1) % 9 + 1) title word("$runs", i)
unset logscale y; set format y "%g"
set title "test avg@4 before / after RL"; set style data histograms; set style fill solid 0.8
set boxwidth 0.85; set ylabel "avg@4"; unset xlabel; set yrange [0:*]; set xtics rotate by -35 font ",8"
set key inside top right vertical
plot "$o/compare.tsv" using 2:xtic(1) title "before RL" lc rgb "#9ecae1", "" using 3 title "after RL" lc rgb "#08519c"$fp4cols
unset multiplot
EOF
  echo "plot: $o/compare.png"
}

dry_err=$(mktemp)
trap 'rm -f "$dry_err"' EXIT
if [ -z "$seeds" ]; then
  compare_one "$out"
else
  for s in $seeds; do compare_one "$out/seed-$s" --seed "$s"; done
fi
