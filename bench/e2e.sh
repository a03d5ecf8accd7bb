#!/usr/bin/env bash
# bench/e2e.sh: the RL loop end to end on one machine (issue 18 item 4; docs/performance.md
# "End-to-end loop").  The real cluster as separate processes: a single-node Kafka broker
# (deploy/kafka/kafka.sh, started once), and per configuration one qrl-learner and
# --replicas qrl-rollout replicas (their own topics, consumer groups and run id), a
# random-weight Qwen3-shaped model with the real Qwen tokenizer, GSM8K prompts, T groups x G
# responses per update, --updates updates (learner.max_updates), dynamic sampling off (random
# weights score 0 everywhere).  Then per model shape the engine alone on the same work
# (build/bench/e2e_engine: every update's groups, at most 2T in flight as a replica's
# max_concurrency, the same scheduler settings, prompts and KV budget), and a report
# (bench/e2e_report.py): per update rollout / wait / prox / train / snapshot / transfer / swap
# seconds and each process's idle share; per configuration end-to-end rollout tokens/s, the
# engine-alone tokens/s, loop efficiency = their ratio, weight sync seconds per billion
# parameters, and every format's end-to-end speedup over BF16 beside its engine-alone one.
#
#   bench/e2e.sh [--device cuda|cpu] [--quick | --full | --configs LIST] [--updates N]
#       [--quota T] [--group-size G] [--slots D] [--replicas N] [--data-dir DIR]
#       [--build DIR] [--work DIR] [--model-dir DIR] [--out FILE] [--budget-s S]
#       [--gpu-mem F] [--learner-arg ARG]... [--rollout-arg ARG]... [--no-anchor] [--dry-run]
#
# A configuration is SHAPE/FORMAT/LENGTH/MODE, e.g. qwen3-1.7b/w8a8-int8/early/overlap:
#   SHAPE   qwen3-0.6b | qwen3-1.7b | qwen3-4b (--device cpu: qwen3-tiny)
#   FORMAT  bf16 | w8a8-int8 | w8a8-fp8 | int4kv (BF16 weights, int4-protected KV) |
#           w4a16-nvfp4 | w4a4-nvfp4 | fp4 (= w4a4-nvfp4+fp4), or PRECISION+KV (e.g.
#           w8a8-int8+int4-protected); a w4a4-nvfp4 format may end in +trace or +qat
#           (issue 19, SPEC §6; the fp4-trace / fp4-qat runs of deploy/local/compare.sh):
#     +trace  the replicas record TRACE (rollout.trace true, TraceChunks on the config's own
#             trace topic) and the learner trains QAT with guidance (learner.qat nvfp4,
#             learner.qat_kv true with an fp4 KV cache, learner.trace_guidance on,
#             learner.trace_store_mb sized for two quotas of records); its engine-alone
#             anchor runs with the recorder on.  E.g. qwen3-0.6b/fp4+trace/early/overlap
#     +qat    the same learner with nearest rounding (trace_guidance off), no records
#   LENGTH  early (512 new tokens; cpu 16) | late (4096; cpu 48) | a number
#   MODE    overlap | alternate (learner.mode)
# --configs takes a comma list; a '*' in an entry matches every value of that field of the
# full grid (qwen3-1.7b/*/early/overlap; the grid has the five formats above, not w4a4-nvfp4,
# fp4 or +trace / +qat, which are named).  --quick (the default) is qwen3-1.7b at the early
# length: bf16, w8a8-int8 overlap, bf16 alternate, w8a8-fp8, int4kv, w4a16-nvfp4 overlap (in
# that order), about 6 minutes on one H200 with model creation; --full is every shape x
# format x length x mode (an hour and more).
# --budget-s (default 450): a configuration starts only when its time estimate fits what is
# left, every process runs under a timeout, and the report is written on every exit path; what
# did not run is listed as skipped.  Every process started is stopped on exit (Ctrl-C too).
# --device cpu runs the same pipeline on the CPU with qwen3-tiny (hidden 64, Qwen's
# vocabulary and tokenizer), T=2 x G=4, 2 updates: the plumbing and the report, in ~2 min.
# Defaults: --data-dir ../shared/data (gsm8k/test.jsonl or gsm8k-test.jsonl; qwen_tokenizer/
# or qwen_tokenizer.tar.xz), --build build, --work runs/e2e-<UTC time>, --model-dir
# /tmp/qrl-e2e-models (models are kept and reused), --out bench/results/e2e-h200.json (cuda)
# or WORK/e2e-cpu.json (cpu).  Kafka: deploy/kafka/kafka.sh's QRL_KAFKA_HOME / JAVA (on the
# GPU machine: source .device-kafka/env.sh first; bench/run-e2e-gpu.sh does it all).
# --gpu-mem F: rollout.gpu_memory_utilization of all replicas together (default per shape);
# --learner-arg / --rollout-arg ARG: one more argument for every learner / replica (repeat:
# --learner-arg --weights.cuda_ipc --learner-arg false); --no-anchor: no engine-alone runs;
# --dry-run: print the commands.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

device=cuda mode_sel=quick configs="" updates="" quota="" gsize="" slots="" replicas=1
data_dir="$root/../shared/data" build=build work="" model_dir=/tmp/qrl-e2e-models out=""
budget=450 gpu_mem="" learner_args=() rollout_args=() anchor=1 dry=0
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }
die() { echo "e2e.sh: error: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case $1 in
    --quick|--full|--no-anchor|--dry-run|-h|--help) ;;
    --*) [ $# -ge 2 ] || die "option '$1' needs a value (--help lists them)" ;;
  esac
  case $1 in
    --device) device=$2; shift 2 ;;
    --quick) mode_sel=quick; shift ;;
    --full) mode_sel=full; shift ;;
    --configs) configs=$2; mode_sel=list; shift 2 ;;
    --updates) updates=$2; shift 2 ;;
    --quota) quota=$2; shift 2 ;;
    --group-size) gsize=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --model-dir) model_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget-s) budget=$2; shift 2 ;;
    --gpu-mem) gpu_mem=$2; shift 2 ;;
    --learner-arg) learner_args+=("$2"); shift 2 ;;
    --rollout-arg) rollout_args+=("$2"); shift 2 ;;
    --no-anchor) anchor=0; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ $device = cuda || $device = cpu ]] || die "--device must be cuda or cpu"
[[ $replicas =~ ^[1-9][0-9]*$ ]] || die "--replicas must be a positive integer"
[[ $budget =~ ^[0-9]+$ ]] || die "--budget-s must be a whole number of seconds"
t_start=$SECONDS
deadline=$((SECONDS + budget))

# ---- per-device defaults ------------------------------------------------------------------
if [ "$device" = cuda ]; then
  : "${updates:=4}" "${quota:=16}" "${gsize:=8}" "${slots:=128}"
  early=512 late=4096 shapes_all="qwen3-1.7b qwen3-4b qwen3-0.6b" quick_shape=qwen3-1.7b
  : "${out:=$root/bench/results/e2e-h200.json}"
else
  : "${updates:=2}" "${quota:=2}" "${gsize:=4}" "${slots:=16}"
  early=16 late=48 shapes_all="qwen3-tiny" quick_shape=qwen3-tiny
fi
formats_all="bf16 w8a8-int8 w8a8-fp8 int4kv w4a16-nvfp4"
work=${work:-$root/runs/e2e-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
: "${out:=$work/e2e-cpu.json}"
bin=$build/bin benchbin=$build/bench
[[ $bin = /* ]] || bin=$root/$bin
[[ $benchbin = /* ]] || benchbin=$root/$benchbin
for b in qrl-learner qrl-rollout qrl-task qrl-kafka-admin; do
  [ -x "$bin/$b" ] || die "$bin/$b is missing (make BUILD=$build all bench)"
done
[ $anchor = 0 ] || [ -x "$benchbin/e2e_engine" ] || die "$benchbin/e2e_engine is missing (make BUILD=$build bench)"
log() { printf '[%s +%4ds] %s\n' "$(date +%H:%M:%S)" $((SECONDS - t_start)) "$*" | tee -a "$work/e2e.log" >&2; }

# ---- the configuration list ----------------------------------------------------------------
grid=()
for s in $shapes_all; do for f in $formats_all; do for l in early late; do for m in overlap alternate; do
  grid+=("$s/$f/$l/$m"); done; done; done; done
sel=()
case $mode_sel in
  quick)
    q=$quick_shape
    sel=("$q/bf16/early/overlap" "$q/w8a8-int8/early/overlap" "$q/bf16/early/alternate"
         "$q/w8a8-fp8/early/overlap" "$q/int4kv/early/overlap" "$q/w4a16-nvfp4/early/overlap") ;;
  full) sel=("${grid[@]}") ;;
  list)
    IFS=, read -r -a want <<<"$configs"
    for w in "${want[@]}"; do
      [ -n "$w" ] || continue
      if [[ $w == *'*'* ]]; then
        n=0
        for g in "${grid[@]}"; do
          # shellcheck disable=SC2053
          if [[ $g == $w ]]; then sel+=("$g"); n=$((n + 1)); fi
        done
        [ $n -gt 0 ] || die "--configs: '$w' matches nothing of the grid"
      else
        sel+=("$w")
      fi
    done ;;
esac
[ ${#sel[@]} -gt 0 ] || die "no configuration selected"

# fields of one configuration: sets c_shape c_fmt c_prec c_kv c_len c_mode c_id, and
# c_qat (0/1: learner.qat nvfp4) and c_trace (0/1: rollout.trace + learner.trace_guidance)
parse_config() {
  IFS=/ read -r c_shape c_fmt c_len c_mode <<<"$1"
  [ -n "$c_mode" ] || die "configuration '$1' is not SHAPE/FORMAT/LENGTH/MODE"
  local f=$c_fmt
  c_qat=0 c_trace=0
  case $f in
    *+trace) c_qat=1 c_trace=1 f=${f%+trace} ;;
    *+qat) c_qat=1 f=${f%+qat} ;;
  esac
  [ "$f" != fp4 ] || f=w4a4-nvfp4+fp4
  case $f in
    bf16) c_prec=bf16 c_kv=bf16 ;;
    w8a8-int8|w8a8-fp8|w4a16-nvfp4|w4a16-mxfp4|w4a4-nvfp4) c_prec=$f c_kv=bf16 ;;
    int4kv) c_prec=bf16 c_kv=int4-protected ;;
    *+*+*) die "configuration '$1': format '$c_fmt' has more than PRECISION+KV (+trace or +qat last)" ;;
    *+*) c_prec=${f%%+*} c_kv=${f#*+} ;;
    *) die "configuration '$1': unknown format '$c_fmt'" ;;
  esac
  # the learner's QAT mirrors w4a4-nvfp4 weights and activations (SPEC §6)
  [ $c_qat = 0 ] || [ "$c_prec" = w4a4-nvfp4 ] ||
    die "configuration '$1': +trace / +qat need w4a4-nvfp4 weights (learner.qat nvfp4 mirrors them), not $c_prec"
  case $c_len in early) c_len=$early ;; late) c_len=$late ;; esac
  [[ $c_len =~ ^[1-9][0-9]*$ ]] || die "configuration '$1': length '$c_len' is not early, late or a number"
  [[ $c_mode = overlap || $c_mode = alternate ]] || die "configuration '$1': mode must be overlap or alternate"
  c_id=$(printf '%s' "$c_shape-$c_fmt-$c_len-$c_mode" | tr -c 'A-Za-z0-9.-' '_')
}
for c in "${sel[@]}"; do parse_config "$c"; done

# GPU placement per shape: the learner (F32 master + AdamW, ~16 bytes a parameter, plus
# activations of learner.max_tokens) and the replicas share GPU 0; the replicas'
# rollout.gpu_memory_utilization (all of them together) sizes their KV pools.
shape_gpu_mem() {
  if [ -n "$gpu_mem" ]; then echo "$gpu_mem"; return; fi
  case $1 in qwen3-0.6b) echo 0.50 ;; qwen3-4b) echo 0.22 ;; *) echo 0.40 ;; esac
}
# Memory on one H200 (~140 GiB), qwen3-1.7b: learner ~31 GB of parameters, gradients and
# AdamW + ~18 GB activations and 5 GB logits at max_tokens 8192 + two 3.4 GB BF16 publish
# slots; replica 0.40 of the device + its 3.4 GB staging copy.  qwen3-4b: 72 GB + recomputed
# activations at max_tokens 4608 + two 8 GB slots; replica 0.22 + 8 GB (tight).
shape_learner_args() { # $1 shape, $2 max_new
  local mt=$(( $2 + 1024 > 8192 ? $2 + 1024 : 8192 )) mt4=$(( $2 + 1024 > 4608 ? $2 + 1024 : 4608 ))
  if [ "$device" = cpu ]; then echo "--learner.max_tokens 1024 --learner.threads 1"; return; fi
  case $1 in
    qwen3-4b) echo "--learner.max_tokens $mt4 --learner.activation_recompute true" ;;
    *) echo "--learner.max_tokens $mt" ;;
  esac
}
# Seconds a configuration should take at least (starts, updates, shutdown): one starts only
# when that much is left of the budget; it may run up to 4x that + 60 s (or what is left).
estimate() { # $1 shape, $2 max_new, $3 1 for a QAT / TRACE configuration (slower)
  if [ "$device" = cpu ]; then echo $(( (20 + updates * (5 + $2 / 4)) * (2 + ${3:-0}) / 2 )); return; fi
  local k=2
  [ "$1" != qwen3-4b ] || k=4
  echo $(( (25 + updates * (3 + $2 / 150)) * (k + ${3:-0}) / 2 ))
}
# learner.trace_store_mb of a +trace configuration: two quotas of records (the one in
# training and the next one arriving) + 25%, at least the default 256.  Record bytes per
# token at the default sites (docs/performance.md "TRACE recorder overhead": 4 + n/16 + n/8
# per captured vector): the four linear inputs of every layer and, for the deeper half,
# K and V per KV head; Qwen3-0.6B 44,352, 1.7B 71,232.
trace_store_mb() { # $1 model folder, $2 shape, $3 max_new (--dry-run, no model yet: the shape's numbers)
  python3 - "$1/config.json" "$2" "$3" "$quota" "$gsize" <<'PY'
import json, os, sys
ln, T, G = (int(x) for x in sys.argv[3:6])
# hidden, layers, heads, KV heads, head dim, intermediate (services/tools/task_shapes.c)
shapes = {'qwen3-0.6b': (1024, 28, 16, 8, 128, 3072), 'qwen3-1.7b': (2048, 28, 16, 8, 128, 6144),
          'qwen3-4b': (2560, 36, 32, 8, 128, 9728), 'qwen3-tiny': (64, 2, 2, 1, 32, 128)}
if os.path.exists(sys.argv[1]):
    c = json.load(open(sys.argv[1]))
    h, L, nh, kvh = c['hidden_size'], c['num_hidden_layers'], c['num_attention_heads'], c['num_key_value_heads']
    hd, inter = c.get('head_dim') or h // nh, c['intermediate_size']
else:
    h, L, nh, kvh, hd, inter = shapes[sys.argv[2]]
site = lambda n: 4 + n // 16 + n // 8
bpt = L * (2 * site(h) + site(nh * hd) + site(inter)) + (L - L // 2) * 2 * kvh * site(hd)
print(max(256, int(2.5 * T * G * ln * bpt / 2**20) + 1))
PY
}

# ---- data ----------------------------------------------------------------------------------
gsm8k=""
for f in "$data_dir/gsm8k/test.jsonl" "$data_dir/gsm8k-test.jsonl"; do [ -f "$f" ] && { gsm8k=$f; break; }; done
[ -n "$gsm8k" ] || die "no GSM8K prompts in $data_dir (gsm8k/test.jsonl or gsm8k-test.jsonl)"
mkdir -p "$model_dir"
tokdir=""
if [ -f "$data_dir/qwen_tokenizer/vocab.json" ] || [ -f "$data_dir/qwen_tokenizer/tokenizer.json" ]; then
  tokdir=$data_dir/qwen_tokenizer
elif [ -f "$data_dir/qwen_tokenizer.tar.xz" ]; then
  [ -d "$model_dir/qwen_tokenizer" ] || tar -C "$model_dir" -xJf "$data_dir/qwen_tokenizer.tar.xz"
  tokdir=$model_dir/qwen_tokenizer
fi
[ -n "$tokdir" ] || die "no Qwen tokenizer in $data_dir (qwen_tokenizer/ or qwen_tokenizer.tar.xz)"

# ---- process bookkeeping: everything started is stopped on every exit path -------------------
pids=() broker_dir="" reported=0 watchdog=""
kill_tree() { # TERM (timeout forwards it), wait up to $2 s, KILL: pid $1 and its children
  local p=$1 t=${2:-10} kids end
  kids=$(ps -o pid= --ppid "$p" 2>/dev/null | tr -d ' ' || true)
  kill -TERM "$p" 2>/dev/null || true
  end=$((SECONDS + t))
  while { kill -0 "$p" 2>/dev/null || { [ -n "$kids" ] && kill -0 $kids 2>/dev/null; }; } && [ $SECONDS -lt $end ]; do
    sleep 0.2
  done
  kill -KILL "$p" $kids 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}
stop_all() {
  local p
  for p in "${pids[@]}"; do kill_tree "$p" 5; done
  pids=()
  [ ! -f "$work/pids" ] || : >"$work/pids"
}
report() {
  [ $reported = 0 ] || return 0
  reported=1
  [ $dry = 0 ] || return 0
  python3 "$root/bench/e2e_report.py" --work "$work" --out "$out" || echo "e2e.sh: the report failed" >&2
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_all
  if [ -n "$broker_dir" ]; then
    QRL_KAFKA_ADMIN=$bin/qrl-kafka-admin deploy/kafka/kafka.sh stop --dir "$broker_dir" --timeout 15 \
      >>"$work/kafka.log" 2>&1 && rm -rf "$broker_dir"
  fi
  [ -z "$watchdog" ] || kill "$watchdog" 2>/dev/null || true
  report
  [ $rc -eq 0 ] || echo "e2e.sh: stopped (rc=$rc); logs in $work" >&2
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
# the control plane's bearer token (the learner refuses Register without it)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token"
chmod 600 "$work/token"

# ---- plan ----------------------------------------------------------------------------------
printf '%s\n' "${sel[@]}" >"$work/configs.txt"
shapes_sel=()
for c in "${sel[@]}"; do
  parse_config "$c"
  [[ " ${shapes_sel[*]} " == *" $c_shape "* ]] || shapes_sel+=("$c_shape")
done
log "device $device, ${#sel[@]} configuration(s) over ${shapes_sel[*]}; T=$quota x G=$gsize, $updates updates," \
    "$slots slots, $replicas replica(s); budget ${budget}s; work $work"
cat >"$work/plan.json" <<EOF
{"device": "$device", "updates": $updates, "quota": $quota, "group_size": $gsize, "slots": $slots,
 "replicas": $replicas, "budget_s": $budget, "dataset": "$gsm8k", "early": $early, "late": $late,
 "started_unix_ms": $(date +%s%3N), "host": "$(hostname)"}
EOF

if command -v nvidia-smi >/dev/null 2>&1 && [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 >"$work/gpu.txt" || true
else
  echo "cpu: $(nproc) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)" >"$work/gpu.txt"
fi

# ---- Kafka (in the background while the models are made) -----------------------------------
bootstrap=""
if [ $dry = 0 ]; then
  broker_dir=$(mktemp -d "${TMPDIR:-/tmp}/qrl-e2e-kafka.XXXXXX")
  ( QRL_KAFKA_ADMIN=$bin/qrl-kafka-admin deploy/kafka/kafka.sh start --dir "$broker_dir" --port 0 --timeout 90 \
      >"$work/kafka.out" 2>>"$work/kafka.log" ) &
  kafka_starter=$!
  # if this script is killed outright, stop the broker and the daemons it left
  ( while kill -0 $$ 2>/dev/null; do sleep 2; done
    if [ -f "$work/pids" ]; then
      while read -r p; do kill -TERM "$p" 2>/dev/null || true; done <"$work/pids"
      sleep 5
      while read -r p; do kill -KILL "$p" 2>/dev/null || true; done <"$work/pids"
    fi
    QRL_KAFKA_ADMIN=$bin/qrl-kafka-admin deploy/kafka/kafka.sh stop --dir "$broker_dir" --timeout 5 >/dev/null 2>&1 || true
  ) </dev/null >/dev/null 2>&1 &
  watchdog=$!
fi

# ---- models ----------------------------------------------------------------------------------
declare -A model_of=()
for s in "${shapes_sel[@]}"; do
  m=$model_dir/$s-seed1
  model_of[$s]=$m
  if [ -f "$m/.complete" ]; then
    cp "$m/.complete" "$work/model-$s.json" 2>/dev/null || true
    log "model $s: $m (kept from an earlier run)"
    continue
  fi
  log "making model $s (random BF16 weights, Qwen tokenizer) in $m"
  if [ $dry = 1 ]; then show "$bin/qrl-task" init-model --shape "$s" --tokenizer "$tokdir" --out "$m" --seed 1; continue; fi
  rm -rf "$m"
  timeout 300 "$bin/qrl-task" init-model --shape "$s" --tokenizer "$tokdir" --out "$m" --seed 1 \
    >"$work/model-$s.json" 2>"$work/model-$s.log" || { cat "$work/model-$s.log" >&2; die "making model $s failed"; }
  cp "$work/model-$s.json" "$m/.complete"
  log "  $(cat "$work/model-$s.json")"
done

if [ $dry = 0 ]; then
  wait "$kafka_starter" || { tail -5 "$work/kafka.log" >&2; die "the Kafka broker did not start"; }
  bootstrap=$(sed -n 's/^BOOTSTRAP=//p' "$work/kafka.out" | tail -1)
  [ -n "$bootstrap" ] || die "the Kafka broker printed no BOOTSTRAP line"
  log "Kafka broker at $bootstrap"
else
  bootstrap=127.0.0.1:PORT
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
left() { echo $((deadline - SECONDS)); }
now_ms() { date +%s%3N; }
start_proc() { # $1 log file, $2 seconds, rest: command; appends the pid to pids and WORK/pids
  local logf=$1 secs=$2
  shift 2
  timeout -k 5 "$secs" "$@" </dev/null >"$logf" 2>&1 &
  pids+=($!)
  echo $! >>"$work/pids"
}

# ---- the engine alone, per shape -----------------------------------------------------------
run_anchor() { # $1 shape
  local s=$1 runs="" c r est secs
  for c in "${sel[@]}"; do
    parse_config "$c"
    [ "$c_shape" = "$s" ] || continue
    r="$c_prec:$c_kv:$c_len"
    [ $c_trace = 0 ] || r=$r:trace # the engine with the TRACE recorder on
    [[ ",$runs," == *",$r,"* ]] || runs=${runs:+$runs,}$r
  done
  local gm=0 dev=-1
  if [ "$device" = cuda ]; then gm=$(shape_gpu_mem "$s"); dev=0; fi
  local cmd=("$benchbin/e2e_engine" --model "${model_of[$s]}" --dataset "$gsm8k" --runs "$runs"
             --groups "$quota" --updates "$updates" --in-flight $((2 * quota))
             --group-size "$gsize" --slots "$slots" --device "$dev" --seed 1
             --gpu-memory-utilization "$(awk -v g="$gm" -v n="$replicas" 'BEGIN { printf "%.4f", g / n }')"
             --max-s 120 --label "$s" --json "$work/anchor-$s.json")
  [ "$device" = cuda ] || cmd+=(--threads 1)
  if [ $dry = 1 ]; then show "${cmd[@]}"; return 0; fi
  est=$(( $(echo "$runs" | tr , '\n' | wc -l) * 10 ))
  secs=$(( $(left) - 20 ))
  if [ "$secs" -lt $((est / 2)) ]; then log "engine alone $s: skipped (${secs}s left)"; return 0; fi
  [ "$secs" -le $((est * 4 + 60)) ] || secs=$((est * 4 + 60))
  log "engine alone $s: $runs (limit ${secs}s)"
  start_proc "$work/anchor-$s.log" "$secs" "${cmd[@]}"
  local p=${pids[-1]} rc=0
  wait "$p" || rc=$?
  pids=("${pids[@]:0:${#pids[@]}-1}")
  [ $rc = 0 ] || log "  engine alone $s failed (rc=$rc): $(grep -v '^\S*Z INFO' "$work/anchor-$s.log" | tail -2 | tr '\n' ' ')"
  grep -E '^(precision|bf16|w|int|f)' "$work/anchor-$s.log" | sed 's/^/    /' >&2 || true
}

# ---- one configuration of the cluster --------------------------------------------------------
run_config() { # $1 configuration
  parse_config "$1"
  local dir=$work/configs/$c_id m=${model_of[$c_shape]} est limit port nonce i
  mkdir -p "$dir"
  est=$(estimate "$c_shape" "$c_len" $c_qat)
  limit=$(( $(left) - 25 ))
  if [ $dry = 0 ] && [ "$limit" -lt "$est" ]; then
    log "$1: skipped (estimate ${est}s, ${limit}s left)"
    printf '{"name": "%s", "status": "skipped", "estimate_s": %d}\n' "$1" "$est" >"$dir/meta.json"
    return 0
  fi
  [ "$limit" -le $((est * 4 + 60)) ] || limit=$((est * 4 + 60))
  nonce=$(date +%s%N | tail -c 10)
  local pre="e2e.$c_id.$nonce" port gm store=0
  [ $c_trace = 0 ] || store=$(trace_store_mb "$m" "$c_shape" "$c_len")
  port=$(free_port)
  gm=0
  [ "$device" = cpu ] || gm=$(awk -v g="$(shape_gpu_mem "$c_shape")" -v n="$replicas" 'BEGIN { printf "%.4f", g / n }')
  cat >"$dir/meta.json" <<EOF
{"name": "$1", "shape": "$c_shape", "format": "$c_fmt", "precision": "$c_prec", "kv_cache": "$c_kv",
 "max_new_tokens": $c_len, "mode": "$c_mode", "quota": $quota, "group_size": $gsize, "updates": $updates,
 "slots": $slots, "replicas": $replicas, "gpu_memory_utilization": $gm, "device": "$device",
 "qat": $c_qat, "trace": $c_trace, "trace_store_mb": $store,
 "estimate_s": $est, "limit_s": $limit, "started_unix_ms": $(now_ms), "status": "running"}
EOF
  local topics="$pre.prompts,$pre.results,$pre.dlq"
  [ $c_trace = 0 ] || topics+=",$pre.trace"
  if [ $dry = 0 ]; then
    QRL_KAFKA_ADMIN=$bin/qrl-kafka-admin deploy/kafka/kafka.sh create-topics --bootstrap "$bootstrap" --partitions 4 \
      --topics "$topics" >>"$work/kafka.log" 2>&1 || { log "$1: creating topics failed"; return 0; }
  fi
  # +qat / +trace (deploy/local/compare.sh's fp4-qat / fp4-trace): the learner's QAT forward
  # as the replicas round; with +trace the records on the configuration's own trace topic
  local lqat=() rtrace=()
  if [ $c_qat = 1 ]; then
    lqat=(--learner.qat nvfp4 --learner.qat_kv "$([ "$c_kv" = fp4 ] && echo true || echo false)")
    if [ $c_trace = 1 ]; then
      lqat+=(--learner.trace_guidance on --learner.trace_store_mb "$store" --kafka.trace_topic "$pre.trace")
      rtrace=(--rollout.trace true --kafka.trace_topic "$pre.trace")
    else
      lqat+=(--learner.trace_guidance off)
    fi
  fi
  local ldev=() rdev=()
  if [ "$device" = cuda ]; then
    ldev=(--learner.device cuda --learner.cuda_device 0 --weights.nccl_device 0)
  else
    ldev=(--learner.device cpu)
  fi
  # shellcheck disable=SC2207
  local lshape=($(shape_learner_args "$c_shape" "$c_len"))
  local lcmd=("$bin/qrl-learner" --learner.model "$m" --dataset.path "$gsm8k" --dataset.task gsm8k
    --dataset.prompt_field question --dataset.answer_field answer --learner.group_size "$gsize"
    --learner.quota "$quota" --learner.max_updates "$updates" --learner.mode "$c_mode" --learner.seed 1
    --learner.run_id "$nonce" --learner.dynamic_sampling false --loss.beta 0
    --sampling.max_new_tokens "$c_len" --weights.bucket_bytes 67108864 --learner.heartbeat_timeout_ms 60000
    --kafka.bootstrap "$bootstrap" --kafka.prompts_topic "$pre.prompts" --kafka.results_topic "$pre.results"
    --kafka.dlq_topic "$pre.dlq" --kafka.group "$pre.learner" --rpc.listen "127.0.0.1:$port"
    --rpc.token_file "$work/token" --metrics.jsonl "$dir/learner.jsonl" "${ldev[@]}" "${lshape[@]}" "${lqat[@]}"
    "${learner_args[@]}")
  local rcmds=()
  log "$1: learner + $replicas replica(s), ${c_prec} weights, ${c_kv} KV, $c_len new tokens, $c_mode$(
    [ $c_qat = 0 ] || printf ', learner QAT'; [ $c_trace = 0 ] || printf ' + TRACE (store %s MiB)' "$store") (limit ${limit}s)"
  if [ $dry = 1 ]; then
    show "${lcmd[@]}"
  else
    : >"$dir/learner.jsonl"
    start_proc "$dir/learner.log" $((limit + 30)) "${lcmd[@]}"
  fi
  local lpid=0 rp=()
  [ $dry = 1 ] || lpid=${pids[-1]}
  for ((i = 0; i < replicas; i++)); do
    if [ "$device" = cuda ]; then
      rdev=(--rollout.device cuda --rollout.cuda_device 0 --rollout.nccl_device 0 --rollout.gpu_memory_utilization "$gm")
    else
      rdev=(--rollout.device cpu --rollout.threads 1)
    fi
    local rcmd=("$bin/qrl-rollout" --rollout.model "$m" --rollout.precision "$c_prec" --rollout.kv_cache "$c_kv"
      --rollout.slots "$slots" --rollout.max_concurrency $((2 * quota)) --rollout.replica_id "r$i"
      --rollout.drain_timeout_ms 2000 --kafka.bootstrap "$bootstrap" --kafka.prompts_topic "$pre.prompts"
      --kafka.results_topic "$pre.results" --kafka.dlq_topic "$pre.dlq" --kafka.group "$pre.rollout"
      --kafka.session_timeout_ms 6000 --learner.addr "127.0.0.1:$port" --rpc.token_file "$work/token"
      --metrics.jsonl "$dir/r$i.jsonl"
      "${rdev[@]}" "${rtrace[@]}" "${rollout_args[@]}")
    if [ $dry = 1 ]; then show "${rcmd[@]}"; else start_proc "$dir/r$i.log" $((limit + 30)) "${rcmd[@]}"; rp+=("${pids[-1]}"); fi
  done
  [ $dry = 0 ] || return 0
  # wait: the learner's N updates, its exit, all replicas dead, or the limit
  local end=$((SECONDS + limit)) status=running n=0 done_at=0 alive
  while :; do
    n=$(wc -l <"$dir/learner.jsonl" 2>/dev/null || echo 0)
    if ! kill -0 "$lpid" 2>/dev/null; then
      local lrc=0; wait "$lpid" 2>/dev/null || lrc=$?
      if [ "$n" -ge "$updates" ]; then status=ok; else status="learner exited (rc=$lrc) after $n updates"; fi
      break
    fi
    if [ "$n" -ge "$updates" ] && [ $done_at = 0 ]; then done_at=$SECONDS; fi
    if [ $done_at != 0 ] && [ $((SECONDS - done_at)) -ge 20 ]; then status=ok; break; fi
    alive=0
    for p in "${rp[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    if [ $alive = 0 ] && [ "$n" -lt "$updates" ]; then status="every replica exited after $n updates"; break; fi
    if [ $SECONDS -ge $end ]; then status="timeout after $n of $updates updates (${limit}s)"; break; fi
    sleep 0.5
  done
  # the replicas drain at the learner's shutdown; give them a moment, then stop what is left
  end=$((SECONDS + 10))
  while [ $SECONDS -lt $end ]; do
    alive=0
    for p in "${rp[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 1 ] || break
    sleep 0.3
  done
  stop_all
  python3 - "$dir/meta.json" "$status" "$(now_ms)" <<'PY'
import json, sys
p, status, t = sys.argv[1], sys.argv[2], int(sys.argv[3])
m = json.load(open(p))
m["status"] = status
m["ended_unix_ms"] = t
json.dump(m, open(p, "w"), indent=1)
PY
  log "  $status: $(python3 "$root/bench/e2e_report.py" --one "$dir" 2>&1 | tail -1)"
  if [ "$status" != ok ]; then
    for f in "$dir"/learner.log "$dir"/r*.log; do
      [ -f "$f" ] && grep -E 'ERROR|error:|WARN' "$f" | tail -3 | cut -c1-240 | sed "s|^|    $(basename "$f"): |" >&2 || true
    done
  fi
}

# ---- run -----------------------------------------------------------------------------------
for s in "${shapes_sel[@]}"; do
  [ $anchor = 0 ] || run_anchor "$s"
  for c in "${sel[@]}"; do
    parse_config "$c"
    [ "$c_shape" = "$s" ] || continue
    run_config "$c"
  done
done
log "done in $((SECONDS - t_start))s; report: $out"
