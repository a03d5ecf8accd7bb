#!/usr/bin/env bash
# The local qrl cluster on one machine (docs/demo.md): a single-node Kafka broker
# (deploy/kafka/kafka.sh, data under the run folder), one qrl-learner and N qrl-rollout
# replicas as separate processes, a built-in task prepared end to end, an evaluation
# before and after RL, a summary table and a reward/accuracy plot.  `make demo` runs it
# with the defaults.  Everything it starts is stopped on every exit path (Ctrl-C too).
#
#   deploy/local/launch.sh [--task arith|story|gsm8k|math500] [--replicas N]
#       [--precision P] [--kv-cache F] [--model PATH] [--updates N] [--group-size G]
#       [--quota T] [--max-new-tokens N] [--sft-steps N] [--eval-n N] [--eval-k K]
#       [--seed S] [--lr LR] [--bootstrap HOST:PORT] [--run-dir DIR] [--threads N]
#       [--sft-threads N] [--mode overlap|alternate]
#       [--device cpu|cuda] [--gpus 0,1,...] [--gpu-memory-utilization F]
#       [--dataset FILE.jsonl] [--testset FILE.jsonl] [--config FILE.yaml]
#       [--dry-run] [-- extra flags]
#   deploy/local/launch.sh --resume RUN_DIR [more options, overriding the run's]
#
# --run-dir DIR must be new or empty: one folder, one run.  --resume RUN_DIR continues a
# stopped run (Ctrl-C, a crash) in its folder with the arguments it was started with
# (RUN_DIR/launch.args; options given with --resume override them, e.g. --updates 96 to
# go on further): the learner restarts from its newest checkpoint (and the settings its
# manifest records), the task data, SFT model and first evaluation are reused.  A run
# ended by `qrlctl shutdown` is a normal early end: exported, evaluated, summarized.
#
# --config FILE.yaml: options from a file, the command line winning: the launcher's options
# by name (task: arith, updates: 96, group-size: 8, dataset: my.jsonl) and daemon keys as
# nested mappings or dotted keys, routed as after -- (rollout: {slots: 32} to the replicas,
# learner: {lr: 5e-5} or loss.mode: naive to the learner).  Read with PyYAML when python3
# has it, else as the YAML subset such files need (nested mappings, scalars, quoted
# strings, [a, b] and "- item" lists, comments).
# --dataset FILE.jsonl / --testset FILE.jsonl: the train / evaluation prompts instead of
# the task's ({"prompt", "answer"} lines; arith SFT also reads "solution").
#
# -- FLAGS: --rollout.* keys go to every qrl-rollout replica, every other flag to
# qrl-learner (a "--key value" pair travels together); they come last, so they override
# the launcher's own settings (e.g. -- --loss.mode naive --rollout.slots 32).
#
# GPU (docs/demo.md "On a GPU"): --device cuda places the learner (learner.device cuda,
# learner.cuda_device) and each replica (rollout.device cuda, rollout.cuda_device) on the
# GPUs of --gpus (default 0), round-robin: process k (0 = the learner, 1 + i = replica ri)
# on GPU k mod len(--gpus); several may share one GPU.  The evaluations run qrl-eval
# --device cuda on the first GPU; SFT stays on the CPU.  --gpu-memory-utilization F: the
# fraction of a GPU's memory each replica sizes its KV cache for
# (rollout.gpu_memory_utilization); default: 0 (off) for a replica alone on its GPU, else
# 0.5 of a GPU the learner shares, 0.9 of one it does not, split evenly over its
# replicas.  The GPUs are checked before anything starts.  --device cpu (the default) runs
# everything on the CPU, as before.
#
# --dry-run (or --print-commands): print the commands the run would make ("+ CMD"
# lines; LEARNER_PORT and KAFKA_BOOTSTRAP stand for what is known only once they run)
# and exit; nothing is started, written or checked on the GPUs.
#
# arith defaults (docs/results.md): 240 SFT steps, then 48 updates of T=32 groups x G=8 at
# lr 5e-5 in alternate mode (on-policy: replicas pause while the learner updates), 48 new
# tokens, evaluations on 200 test prompts x k=4 at T=1.  Other tasks: lr 1e-4, overlap.
#
# Output: runs/<UTC timestamp>/ with learner.jsonl (one line per update), tb/ (TensorBoard
# events), eval-before.json, eval-after.json, summary.txt, curve.png and every log.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
caller_pwd=$PWD # the paths given (--model, --run-dir, --dataset, ...) are the caller's
cd "$root"
build=${BUILD:-build}
bin=$build/bin
data=${QRL_DATA_DIR:-../shared/data}

task=arith replicas=2 lr="" mode="" precision=w8a8-int8 kv=int4-protected model="" updates="" G="" T=""
max_new="" sft_steps="" eval_n="" eval_k=4 seed=1 bootstrap="" run_dir="" threads=1 extra=()
device=cpu gpus=0 gpus_given=0 gpu_mem="" dry=0 user_dataset="" user_testset="" resume=""
# SFT and the evaluations run alone (no daemons yet / any more): --sft-threads 2 uses both
# cores of an idle machine; 1 by default, since OpenMP threads on a busy shared box run slower
sft_threads=1
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }
# A usage error: one "launch.sh: error:" line and exit 1, as every qrl program.
usage_error() { echo "launch.sh: error: $* (--help lists the options)" >&2; exit 1; }
value_opts=" --task --replicas --precision --kv-cache --model --updates --group-size --quota --max-new-tokens"
value_opts+=" --sft-steps --eval-n --eval-k --seed --lr --mode --bootstrap --run-dir --threads --sft-threads"
value_opts+=" --device --gpus --gpu-memory-utilization --dataset --testset "

# ---- --config FILE.yaml and --resume RUN_DIR: more arguments, ahead of the command line's ----
# (applied in this order, the last one winning: the resumed run's saved arguments, the
# --config file, the command line; the flags after -- likewise)
cli_opts=() cli_extra=() config_file=""
abs_path() { case $1 in /*|"") printf '%s' "$1" ;; *) printf '%s/%s' "${base:-$caller_pwd}" "$1" ;; esac; }
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; cli_extra=("$@"); break ;;
    --resume|--config)
      [ $# -ge 2 ] || usage_error "option '$1' needs a value"
      if [ "$1" = --resume ]; then resume=$(abs_path "$2"); else config_file=$(abs_path "$2"); fi
      shift 2 ;;
    --model|--run-dir|--dataset|--testset)
      [ $# -ge 2 ] || usage_error "option '$1' needs a value"
      cli_opts+=("$1" "$(abs_path "$2")"); shift 2 ;;
    *) cli_opts+=("$1"); shift ;;
  esac
done
die() { echo "launch.sh: error: $*" >&2; exit 1; }
saved_opts=() saved_extra=() file_opts=() file_extra=()
if [ -n "$resume" ]; then
  # the run's arguments as its first start saved them (RUN_DIR/launch.args, one per line)
  [ -f "$resume/launch.args" ] ||
    die "--resume $resume: not a launch.sh run folder (no $resume/launch.args; a run started by this launcher has one)"
  to=saved_opts
  while IFS= read -r a; do
    if [ "$a" = -- ]; then to=saved_extra; continue; fi
    if [ $to = saved_opts ]; then saved_opts+=("$a"); else saved_extra+=("$a"); fi
  done <"$resume/launch.args"
fi
if [ -n "$config_file" ]; then
  # YAML: the launcher's options by their flag name (task: arith, group-size: 8 or
  # group_size: 8, dataset: FILE); nested mappings and dotted keys are daemon keys, routed as
  # after -- (rollout.* to the replicas, the rest to the learner)
  [ -r "$config_file" ] || die "--config $config_file: cannot read the file"
  conv=$(python3 - "$config_file" 2>&1 <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()

def subset(text):
    """The YAML a launcher config needs, without PyYAML: block mappings by indentation,
    scalars (quoted or plain), [a, b] flow lists and "- item" block lists, # comments."""
    def uncomment(raw):
        q = None
        for i, c in enumerate(raw):
            if q:
                q = None if c == q else q
            elif c in "\"'":
                q = c
            elif c == "#" and (i == 0 or raw[i - 1] in " \t"):
                return raw[:i]
        return raw
    def scalar(v, ln):
        v = v.strip()
        if v and v[0] in "\"'":
            if len(v) < 2 or v[-1] != v[0]: sys.exit("%s:%d: unterminated quoted string" % (path, ln))
            return v[1:-1]
        if v.startswith("["):
            if not v.endswith("]"): sys.exit("%s:%d: unterminated [list]" % (path, ln))
            return [scalar(x, ln) for x in v[1:-1].split(",") if x.strip()]
        if v in ("true", "True", "yes", "on"): return True
        if v in ("false", "False", "no", "off"): return False
        if v in ("", "~", "null"): return None
        return v
    root = {}
    stack = [(0, root)]   # (indent, container) of the open mappings and lists
    pending = None        # (indent, parent, key) of a "key:" whose value may be a block
    for ln, raw in enumerate(text.splitlines(), 1):
        line = uncomment(raw).rstrip()
        if not line.strip() or line.strip() == "---": continue
        indent = len(line) - len(line.lstrip(" "))
        if line[indent] == "\t": sys.exit("%s:%d: tabs are not YAML indentation" % (path, ln))
        body = line.strip()
        if pending and indent > pending[0]:
            block = [] if body == "-" or body.startswith("- ") else {}
            pending[1][pending[2]] = block
            stack.append((indent, block))
        pending = None
        while indent < stack[-1][0]: stack.pop()
        if indent != stack[-1][0]: sys.exit("%s:%d: bad indentation" % (path, ln))
        cur = stack[-1][1]
        if body == "-" or body.startswith("- "):
            if not isinstance(cur, list): sys.exit("%s:%d: a list item where a key belongs" % (path, ln))
            cur.append(scalar(body[1:], ln))
            continue
        if isinstance(cur, list): sys.exit("%s:%d: a key inside a list" % (path, ln))
        m = re.match(r"^([^:\s][^:]*?)\s*:(?:\s+(.*))?$", body)
        if not m: sys.exit("%s:%d: expected 'key: value'" % (path, ln))
        key, val = m.group(1).strip("\"'"), (m.group(2) or "").strip()
        if key in cur: sys.exit("%s:%d: duplicate key %s" % (path, ln, key))
        cur[key] = scalar(val, ln)
        if val == "": pending = (indent, cur, key)
    return root

try:
    if __import__("os").environ.get("QRL_LAUNCH_YAML") == "subset": raise ImportError  # (tests)
    import yaml
except ImportError:
    doc = subset(text)
else:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        sys.exit("%s: malformed YAML: %s" % (path, str(e).replace("\n", " ")))
if doc is None: doc = {}
if not isinstance(doc, dict): sys.exit("%s: the top level must be a mapping of options" % path)
def text(k, v):
    if isinstance(v, bool): return "true" if v else "false"
    if isinstance(v, list): return ",".join(text(k, x) for x in v)
    if v is None or isinstance(v, dict): sys.exit("%s: %s: expected a value" % (path, k))
    t = str(v)
    if "\n" in t or "\t" in t: sys.exit("%s: %s: a value may not hold a newline or tab" % (path, k))
    return t
def daemon(prefix, v):
    if isinstance(v, dict):
        for k2, v2 in v.items(): daemon(prefix + "." + str(k2), v2)
    else:
        print("E\t--%s\t%s" % (prefix, text(prefix, v)))
for k, v in doc.items():
    k = str(k)
    if isinstance(v, dict) or "." in k: daemon(k, v)
    else: print("O\t--%s\t%s" % (k.replace("_", "-"), text(k, v)))
PY
) || die "--config: ${conv:-$config_file: cannot be read}"
  while IFS=$'\t' read -r kind k v; do
    [ -n "$kind" ] || continue
    if [ "$kind" = O ]; then
      [[ $value_opts == *" $k "* && $k != --run-dir ]] ||
        die "--config $config_file: unknown launcher option '${k#--}' (the options of --help, by name; daemon keys as section.key)"
      # (paths in the file are relative to its folder)
      case $k in --model|--dataset|--testset) v=$(base=$(dirname "$config_file") abs_path "$v") ;; esac
      file_opts+=("$k" "$v")
    else
      file_extra+=("$k" "$v")
    fi
  done <<<"$conv"
fi
set -- "${saved_opts[@]}" "${file_opts[@]}" "${cli_opts[@]}" -- "${saved_extra[@]}" "${file_extra[@]}" "${cli_extra[@]}"
launch_args=("$@") # what a --resume of this run starts from (saved in RUN_DIR/launch.args)
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help|--|--dry-run|--print-commands) ;;
    --*) [[ $value_opts == *" $1 "* ]] || usage_error "unknown option '$1'"
         [ $# -ge 2 ] && [ "$2" != -- ] || usage_error "option '$1' needs a value" ;;
  esac
  case $1 in
    --task) task=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --kv-cache) kv=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --updates) updates=$2; shift 2 ;;
    --group-size) G=$2; shift 2 ;;
    --quota) T=$2; shift 2 ;;
    --max-new-tokens) max_new=$2; shift 2 ;;
    --sft-steps) sft_steps=$2; shift 2 ;;
    --eval-n) eval_n=$2; shift 2 ;;
    --eval-k) eval_k=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --bootstrap) bootstrap=$2; shift 2 ;;
    --run-dir) run_dir=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --sft-threads) sft_threads=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --gpus) gpus=$2 gpus_given=1; shift 2 ;;
    --gpu-memory-utilization) gpu_mem=$2; shift 2 ;;
    --dataset) user_dataset=$2; shift 2 ;;
    --testset) user_testset=$2; shift 2 ;;
    --dry-run|--print-commands) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) usage_error "unknown option '$1'" ;;
  esac
done
case $task in arith|story|gsm8k|math500) ;; *) die "unknown --task '$task' (arith, story, gsm8k, math500)" ;; esac
[[ $replicas =~ ^[1-9][0-9]*$ ]] || die "--replicas must be a positive integer, not '$replicas'"
[[ -z $mode || $mode = overlap || $mode = alternate ]] || die "--mode must be overlap or alternate, not '$mode'"
case " f32 bf16 w8a8-int8 w8a8-fp8 w4a16-nvfp4 w4a16-mxfp4 w4a4-nvfp4 " in
  *" $precision "*) ;; *) die "--precision must be one of f32 bf16 w8a8-int8 w8a8-fp8 w4a16-nvfp4 w4a16-mxfp4 w4a4-nvfp4, not '$precision'" ;;
esac
case " f32 bf16 fp8 int8 int4 int4-protected fp4 " in
  *" $kv "*) ;; *) die "--kv-cache must be one of f32 bf16 fp8 int8 int4 int4-protected fp4, not '$kv'" ;;
esac
for v in updates:updates G:group-size T:quota max_new:max-new-tokens sft_steps:sft-steps eval_n:eval-n \
         eval_k:eval-k threads:threads sft_threads:sft-threads; do
  name=${v%%:*}
  [[ -z ${!name} || ${!name} =~ ^[1-9][0-9]*$ ]] || die "--${v#*:} must be a positive integer, not '${!name}'"
done
[[ $device = cpu || $device = cuda ]] || die "--device must be cpu or cuda, not '$device'"
if [ "$device" = cpu ]; then
  [ $gpus_given = 0 ] || die "--gpus needs --device cuda (the default --device cpu uses no GPU)"
  [ -z "$gpu_mem" ] || die "--gpu-memory-utilization needs --device cuda"
fi
[[ $gpus =~ ^[0-9]{1,4}(,[0-9]{1,4})*$ ]] ||
  die "--gpus must be a comma-separated list of GPU ordinals such as 0 or 0,1, not '$gpus'"
IFS=, read -r -a gpu_list <<<"$gpus"
for i in "${!gpu_list[@]}"; do gpu_list[i]=$((10#${gpu_list[i]})); done # 00 = 0
declare -A seen_gpu=()
for g in "${gpu_list[@]}"; do
  [ "$g" -le 64 ] || die "--gpus: GPU ordinal $g is out of range (0..64)"
  [ -z "${seen_gpu[$g]:-}" ] || die "--gpus lists GPU $g twice ('$gpus'); processes share a GPU by round-robin when there are fewer GPUs than processes"
  seen_gpu[$g]=1
done
if [ -n "$gpu_mem" ]; then
  [[ $gpu_mem =~ ^(0?\.[0-9]+|[01](\.[0-9]*)?)$ ]] && awk -v f="$gpu_mem" 'BEGIN { exit !(f > 0 && f <= 1) }' ||
    die "--gpu-memory-utilization must be a fraction in (0, 1], not '$gpu_mem'"
fi
# Routing of the flags after --: --rollout.* to the replicas, the rest to the learner.
learner_extra=() replica_extra=()
for ((i = 0; i < ${#extra[@]}; i++)); do
  a=${extra[i]} to=learner n=1
  [[ $a == --rollout.* ]] && to=replica
  # "--key value": the value travels with its key (not for --key=value, not before --x)
  [[ $a == --* && $a != *=* ]] && ((i + 1 < ${#extra[@]})) && [[ ${extra[i + 1]} != --* ]] && n=2
  if [ $to = replica ]; then replica_extra+=("${extra[@]:i:n}"); else learner_extra+=("${extra[@]:i:n}"); fi
  i=$((i + n - 1))
done
# GPU placement: process k (0 = learner, 1 + i = replica ri) on gpu_list[k mod len]
n_gpus=${#gpu_list[@]}
gpu_of() { echo "${gpu_list[$(($1 % n_gpus))]}"; }
learner_gpu=$(gpu_of 0)
declare -A procs_on=()
for ((k = 0; k <= replicas; k++)); do g=$(gpu_of $k); procs_on[$g]=$((${procs_on[$g]:-0} + 1)); done
# rollout.gpu_memory_utilization of replica i: the flag, else 0 (alone on its GPU), else
# 0.5 (a GPU shared with the learner) or 0.9 (replicas only) split over its replicas
replica_mem() {
  local g n; g=$(gpu_of $(($1 + 1))); n=${procs_on[$g]}
  [ "$g" = "$learner_gpu" ] && n=$((n - 1))
  if [ -n "$gpu_mem" ]; then echo "$gpu_mem"
  elif [ "${procs_on[$g]}" -eq 1 ]; then echo 0
  else awk -v s="$([ "$g" = "$learner_gpu" ] && echo 0.5 || echo 0.9)" -v n="$n" 'BEGIN { printf "%.3f", s / n }'
  fi
}
if [ "$device" = cuda ] && [ -n "$gpu_mem" ]; then
  for g in "${!procs_on[@]}"; do
    n=${procs_on[$g]}; [ "$g" = "$learner_gpu" ] && n=$((n - 1))
    awk -v f="$gpu_mem" -v n="$n" 'BEGIN { exit !(f * n <= 1) }' ||
      die "--gpu-memory-utilization $gpu_mem x $n replicas on GPU $g is more than the whole GPU (lower it or add --gpus)"
  done
fi
# A run folder holds one run: a used one is refused (its learner.jsonl, checkpoints and tb/
# events would mix with this run's, and the export could take the old run's checkpoint).
# (--resume RUN_DIR continues that run in its folder instead.)
if [ -n "$resume" ]; then
  [ -z "$run_dir" ] || [ "$(cd "$run_dir" 2>/dev/null && pwd)" = "$(cd "$resume" && pwd)" ] ||
    die "--run-dir $run_dir and --resume $resume name different folders (--resume continues the run in its own)"
  run_dir=$resume
elif [ -n "$run_dir" ] && [ -d "$run_dir" ] && [ -n "$(ls -A "$run_dir" 2>/dev/null)" ]; then
  die "--run-dir $run_dir is not empty (it holds $(ls -A "$run_dir" | head -4 | tr '\n' ' ' | sed 's/ $//')$( [ "$(ls -A "$run_dir" | wc -l)" -gt 4 ] && echo ", ...")): give a new folder, or --resume $run_dir to continue that run"
fi
for b in qrl-learner qrl-rollout qrl-eval qrl-task qrl-kafka-admin; do
  [ -x "$bin/$b" ] || die "$bin/$b is not built: run 'make' first (after deploy/setup.sh)"
done
command -v jq >/dev/null || die "jq is missing: run deploy/setup.sh"
# The daemons' keys given after -- (or in --config) are checked now, by the daemons' own
# config tables, not after the task data, SFT and the first evaluation (a --dry-run shows
# the commands as given, unchecked)
for chk_prog in learner rollout; do
  [ $dry = 0 ] || break
  if [ $chk_prog = learner ]; then chk_keys=("${learner_extra[@]}"); else chk_keys=("${replica_extra[@]}"); fi
  [ ${#chk_keys[@]} -gt 0 ] || continue
  chk_msg=$("$bin/qrl-$chk_prog" "${chk_keys[@]}" --print-config 2>&1 >/dev/null) ||
    die "${chk_msg#qrl-$chk_prog: error: } (a qrl-$chk_prog key given after -- or in --config)"
done
unset chk_prog chk_keys chk_msg
# The GPUs, before anything starts (qrl-eval --check-device: a build with CUDA, the device
# visible); refused with the reason.
if [ "$device" = cuda ] && [ $dry = 0 ]; then
  for g in "${gpu_list[@]}"; do
    [ -n "${procs_on[$g]:-}" ] || continue # a GPU no process lands on
    msg=$("$bin/qrl-eval" --device cuda --device-id "$g" --check-device 2>&1) ||
      die "--device cuda: GPU $g cannot be used: $(sed 's/^qrl-eval: error: --device cuda (--device-id [0-9]*): //' <<<"$msg" | tail -1)"
    echo "GPU $g: $msg"
  done
fi

run_dir=${run_dir:-runs/$(date -u +%Y%m%d-%H%M%S)-$$}
if [ $dry = 0 ]; then
  mkdir -p "$run_dir"
  run_dir=$(cd "$run_dir" && pwd)
  # the arguments a --resume of this run starts from, one per line (not the folder, not
  # --dry-run): the first start's, with a resume's additions
  for ((i = 0; i < ${#launch_args[@]}; i++)); do
    case ${launch_args[i]} in
      --run-dir) i=$((i + 1)) ;;
      --dry-run|--print-commands) ;;
      *) printf '%s\n' "${launch_args[i]}" ;;
    esac
  done >"$run_dir/launch.args.tmp" && mv "$run_dir/launch.args.tmp" "$run_dir/launch.args"
fi
log() {
  if [ $dry = 1 ]; then printf '# %s\n' "$*"; return; fi
  printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$run_dir/launch.log"
}
# show CMD...: the "+ CMD" line of a dry run; xcmd CMD...: run CMD, or in a dry run show it;
# xrun OUT ERR CMD...: the same with stdout to OUT and stderr to ERR (one file: both into it)
show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
xcmd() { if [ $dry = 1 ]; then show "$@"; else "$@"; fi; }
xrun() {
  local out=$1 errf=$2
  shift 2
  if [ $dry = 1 ]; then
    printf '+'; printf ' %q' "$@"
    if [ "$out" = "$errf" ]; then printf ' >%q 2>&1\n' "$out"; else printf ' >%q 2>%q\n' "$out" "$errf"; fi
    return 0
  fi
  if [ "$out" = "$errf" ]; then "$@" >"$out" 2>&1; else "$@" >"$out" 2>"$errf"; fi
}
# Progress of the long phases: xfollow KIND OUT ERR CMD... is xrun, showing the command's
# progress lines (in ERR) as they come: KIND sft ("[sft] step=..." every sft.log_every
# steps) or eval (qrl-eval's "progress" lines, every QRL_LAUNCH_PROGRESS_S seconds).
progress_s=${QRL_LAUNCH_PROGRESS_S:-10}
show_progress() { # KIND LINE
  case $1 in
    sft) [[ $2 == *"[sft] step="* ]] || return 0
         awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                printf "  SFT step %d/%d (%.0f%%): loss %s, %s tok/s, %.0f s, ETA %s s\n", v["step"], v["of"],
                       100 * v["step"] / v["of"], v["loss"], v["tokens_per_s"], v["elapsed_s"], v["eta_s"] }' <<<"$2" ;;
    eval) [[ $2 == "qrl-eval: progress "* ]] && echo "  evaluating: ${2#qrl-eval: progress }" ;;
  esac
}
xfollow() {
  local kind=$1 out=$2 errf=$3 p rc=0 l
  shift 3
  if [ $dry = 1 ]; then xrun "$out" "$errf" "$@"; return; fi
  : >"$errf"
  if [ "$out" = "$errf" ]; then "$@" >"$out" 2>&1 & else "$@" >"$out" 2>"$errf" & fi
  p=$!
  pids+=("$p") # (a background job: cleanup stops it on Ctrl-C)
  # (SFT logs every 10 steps: shown about every QRL_LAUNCH_PROGRESS_S seconds, and its last)
  local every_us last_us=0 now_us
  every_us=$(awk -v s="$progress_s" 'BEGIN { printf "%d", s * 1e6 }')
  while IFS= read -r l; do
    now_us=${EPOCHREALTIME/./}
    if [ "$kind" = sft ] && [[ $l == *"[sft] step="* ]] && [ $((now_us - last_us)) -lt "$every_us" ] &&
       ! awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } exit !(v["step"] == v["of"]) }' <<<"$l"; then
      continue
    fi
    [[ $l == *"[sft] step="* || $l == "qrl-eval: progress "* ]] && last_us=$now_us
    show_progress "$kind" "$l" | tee -a "$run_dir/launch.log"
  done < <(tail -n +1 -s 0.2 -f --pid="$p" "$errf" 2>/dev/null)
  wait "$p" || rc=$?
  pids=("${pids[@]:0:${#pids[@]}-1}")
  return $rc
}

# ---- process bookkeeping: everything started is stopped on exit ------------------------
# The daemons run in sessions of their own (setsid), so that a Ctrl-C in the terminal
# reaches the launcher only; cleanup then stops them in order: the watchdog first (it would
# signal the learner again), one SIGTERM each (the learner finishes its running update and
# writes the final checkpoint it promises; a second signal would make it exit at once; the
# replicas drain), the learner given up to QRL_LAUNCH_DRAIN_S (120) s for that, the others
# 10 s, then SIGKILL.  A second Ctrl-C while waiting escalates at once.
pids=() rpids=() broker=0 pid_learner="" wpid="" force=0
drain_s=${QRL_LAUNCH_DRAIN_S:-120}
cleanup() {
  local rc=$? p end
  trap - EXIT
  trap 'force=1' INT TERM
  [ -z "$wpid" ] || kill -TERM "$wpid" 2>/dev/null || true
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  if [ -n "$pid_learner" ] && kill -0 "$pid_learner" 2>/dev/null; then
    echo "launch.sh: waiting for the learner to finish its update and final checkpoint (up to $drain_s s; Ctrl-C again to stop at once)" >&2
    end=$((SECONDS + drain_s))
    while kill -0 "$pid_learner" 2>/dev/null && [ $SECONDS -lt $end ] && [ $force = 0 ]; do sleep 0.2; done
  fi
  end=$((SECONDS + 10))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ] && [ $force = 0 ]; do sleep 0.2; done
    kill -KILL "$p" 2>/dev/null || true
  done
  if [ $broker = 1 ]; then
    deploy/kafka/kafka.sh stop --dir "$run_dir/kafka" --timeout 20 >>"$run_dir/kafka.log" 2>&1 || true
  fi
  if [ $rc -ne 0 ]; then
    echo "launch.sh: stopped (rc=$rc); logs in $run_dir" >&2
    [ -z "$pid_learner" ] || [ ! -d "$run_dir/checkpoints" ] ||
      echo "launch.sh: continue this run from its newest checkpoint with: deploy/local/launch.sh --resume $run_dir" >&2
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- task ------------------------------------------------------------------------------
# Each task sets: model, dataset (train JSONL), testset, verifier, field flags, template,
# and defaults for the run size.
fields=() eval_fields=() template=none stop=() eval_stop=()
# gen_data OUT ARGS...: the task's data (qrl-task gen ARGS --out OUT), unless --dataset /
# --testset gave that split's file (then OUT is it) or a resumed run has it already
gen_data() {
  local out=$1
  shift
  if [ "$out" = "${dataset:-}" ] && [ -n "$user_dataset" ]; then dataset=$user_dataset; return; fi
  if [ "$out" = "${testset:-}" ] && [ -n "$user_testset" ]; then testset=$user_testset; return; fi
  [ -n "$resume" ] && [ -s "$out" ] && return
  xcmd "$bin/qrl-task" gen "$@" --out "$out"
}
case $task in
  arith)
    verifier=arith
    # RL defaults measured in docs/results.md: larger on-policy batches at a small lr are
    # what improves this 269K model; lr >= 1e-4 (x1.5 with UAQ) or T <= 16 made it worse;
    # a 240-step SFT start leaves RL more to fix than 300 steps (+0.06 vs +0.02 avg@4, 3 seeds)
    : "${updates:=48}" "${G:=8}" "${T:=32}" "${max_new:=48}" "${sft_steps:=240}" "${eval_n:=200}"
    : "${lr:=5e-5}" "${mode:=alternate}"
    dataset=$run_dir/arith-train.jsonl testset=$run_dir/arith-test.jsonl
    gen_data "$dataset" --task arith --split train --n 4000 --seed "$seed"
    gen_data "$testset" --task arith --split test --n "$eval_n" --seed "$seed"
    if [ -z "$model" ] && [ -n "$resume" ] && [ -f "$run_dir/sft/config.json" ] && grep -q "\[sft\] done" "$run_dir/sft.log"; then
      log "SFT warm start: done in this run already ($run_dir/sft)"
      model=$run_dir/sft
    elif [ -z "$model" ]; then
      log "SFT warm start: a fresh model on $([ $dry = 1 ] && echo 4000 || wc -l <"$dataset") worked-steps problems, $sft_steps steps"
      xrun "$run_dir/init.log" "$run_dir/init.log" \
        "$bin/qrl-task" init-model --task arith --seed "$seed" --dim 64 --layers 4 --heads 4 \
        --out "$run_dir/init" ||
        { tail -5 "$run_dir/init.log"; die "init-model failed"; }
      xfollow sft "$run_dir/sft.log" "$run_dir/sft.log" \
        "$bin/qrl-learner" --mode sft --learner.model "$run_dir/init" --dataset.path "$dataset" \
        --dataset.chat_template none --learner.seed "$seed" --learner.threads "$sft_threads" \
        --sft.steps "$sft_steps" --sft.out "$run_dir/sft" ||
        { tail -5 "$run_dir/sft.log"; die "SFT failed"; }
      [ $dry = 1 ] || grep -E "\[sft\] done" "$run_dir/sft.log" | tail -1 | sed 's/^.*\[sft\] /  SFT /'
      model=$run_dir/sft
    fi ;;
  story)
    verifier=name-twice stop=(--sampling.stop_token_ids 1) eval_stop=(--stop_token_ids 1)
    : "${updates:=10}" "${G:=8}" "${T:=8}" "${max_new:=400}" "${eval_n:=100}"
    model=${model:-$data/llama2c_stories260K/stories260K.bin}
    dataset=$run_dir/story-train.jsonl testset=$run_dir/story-test.jsonl
    gen_data "$dataset" --task story-name --split train --n 2000 --seed "$seed"
    gen_data "$testset" --task story-name --split test --n "$eval_n" --seed "$seed" ;;
  gsm8k|math500)
    [ -n "$model" ] || die "--task $task needs --model PATH (a real instruction model; the tiny ones score 0)"
    : "${updates:=50}" "${G:=8}" "${T:=32}" "${max_new:=512}" "${eval_n:=200}"
    template=auto
    if [ "$task" = gsm8k ]; then
      verifier=gsm8k dataset=$data/gsm8k/train.jsonl testset=$data/gsm8k/test.jsonl
      fields=(--dataset.prompt_field question --dataset.answer_field answer)
      eval_fields=(--prompt_field question --answer_field answer)
    else
      verifier=math dataset=$data/math500/test.jsonl testset=$data/math500/test.jsonl
      fields=(--dataset.prompt_field problem --dataset.answer_field answer)
      eval_fields=(--prompt_field problem --answer_field answer)
    fi ;;
  *) die "unknown --task '$task' (arith, story, gsm8k, math500)" ;;
esac
# --dataset / --testset: the prompts to train on / to evaluate on, instead of the task's
dataset=${user_dataset:-$dataset} testset=${user_testset:-$testset}
for f in "$dataset" "$testset"; do [ -f "$f" ] || [ $dry = 1 ] || die "dataset $f not found"; done
: "${lr:=1e-4}" "${mode:=overlap}"
[ -e "$model" ] || [[ $dry = 1 && $model = "$run_dir/sft" ]] || die "model $model not found"

# --device cuda: the evaluations on the first GPU (the scheduler's CUDA engine: BF16
# activations, so they differ from a CPU evaluation by rounding); the learner and each
# replica on theirs (gpu_of)
edev=() ldev=()
if [ "$device" = cuda ]; then
  edev=(--device cuda --device_id "$learner_gpu")
  ldev=(--learner.device cuda --learner.cuda_device "$learner_gpu" --weights.nccl_device "$learner_gpu")
fi
eprog=() # qrl-eval's progress lines: every 10 s by default, as the launcher's
[ -z "${QRL_LAUNCH_PROGRESS_S:-}" ] || eprog=(--progress_s "$progress_s")
evaluate() { # $1 = model, $2 = output name
  xfollow eval "$run_dir/$2.json" "$run_dir/$2.log" \
    "$bin/qrl-eval" --model "$1" --dataset "$testset" --task "$verifier" --k "$eval_k" --n "$eval_n" \
    --max_tokens "$max_new" --temperature 1.0 --seed "$seed" --threads "$sft_threads" \
    --chat_template "$template" "${eval_fields[@]}" "${eval_stop[@]}" "${edev[@]}" "${eprog[@]}" --json ||
    { tail -5 "$run_dir/$2.log"; die "qrl-eval failed on $1"; }
}
if [ -n "$resume" ] && [ -s "$run_dir/eval-before.json" ]; then
  log "the starting policy was evaluated in this run already"
else
  log "evaluating the starting policy on $eval_n test prompts (k=$eval_k)"
  evaluate "$model" eval-before
fi
[ $dry = 1 ] || jq -r '"  before RL: avg@k \(.avg_at_k)  pass@k \(.pass_at_k)  greedy \(.greedy_accuracy)  (\(.seconds | floor) s)"' "$run_dir/eval-before.json"

# ---- broker ----------------------------------------------------------------------------
if [ -z "$bootstrap" ] && [ $dry = 1 ]; then
  show deploy/kafka/kafka.sh start --dir "$run_dir/kafka" --port 0
  bootstrap=KAFKA_BOOTSTRAP
elif [ -z "$bootstrap" ]; then
  t0=$SECONDS
  # (setsid: in a session of its own, so that a Ctrl-C does not take the broker down under
  # the learner's final checkpoint and commit; cleanup stops it last)
  bootstrap=$(setsid deploy/kafka/kafka.sh start --dir "$run_dir/kafka" --port 0 2>>"$run_dir/kafka.log" |
              sed -n 's/^BOOTSTRAP=//p')
  [ -n "$bootstrap" ] || die "the Kafka broker did not start (see $run_dir/kafka.log; deploy/setup.sh fetches it)"
  broker=1
  log "Kafka broker at $bootstrap ($((SECONDS - t0)) s)"
fi
[ $dry = 0 ] || show deploy/kafka/kafka.sh create-topics --bootstrap "$bootstrap" --partitions 4
[ $dry = 1 ] || QRL_KAFKA_ADMIN=$bin/qrl-kafka-admin deploy/kafka/kafka.sh create-topics --bootstrap "$bootstrap" \
  --partitions 4 >>"$run_dir/kafka.log" 2>&1 || die "creating topics on $bootstrap failed"

# ---- learner and replicas ----------------------------------------------------------------
if [ $dry = 0 ] && [ ! -s "$run_dir/token" ]; then
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$run_dir/token"
  chmod 600 "$run_dir/token"
fi
resume_flags=() jsonl_kept=0
if [ -n "$resume" ] && [ $dry = 0 ]; then
  # the learner continues from its newest complete checkpoint, with the settings its manifest
  # records (the launcher gives them all again anyway); metrics lines of updates after that
  # checkpoint (a crash, kill -9) are dropped, since those updates are made again
  resume_flags=(--resume auto)
  ck_step=0
  for d in "$run_dir"/checkpoints/step-*; do
    [ -f "$d/manifest.json" ] || continue
    n=$(basename "$d" | sed 's/^step-0*\([0-9][0-9]*\).*/\1/; s/^step-0*$/0/')
    [ "$n" -le "$ck_step" ] || ck_step=$n
  done
  # a finished run: nothing to resume (and nothing of it is moved or removed)
  [ "$ck_step" -lt "$updates" ] || die "$run_dir is complete: its checkpoint is at step $ck_step of" \
    "$updates updates; give --updates N with N > $ck_step to continue it"
  if [ -f "$run_dir/learner.jsonl" ]; then
    jq -c "select(.step <= $ck_step)" "$run_dir/learner.jsonl" >"$run_dir/learner.jsonl.tmp"
    mv "$run_dir/learner.jsonl.tmp" "$run_dir/learner.jsonl"
    jsonl_kept=$(wc -l <"$run_dir/learner.jsonl")
  fi
  k=1; while [ -e "$run_dir/learner.$k.log" ]; do k=$((k + 1)); done # the earlier starts' logs
  for f in "$run_dir"/learner.log "$run_dir"/r[0-9]*.log; do [ -f "$f" ] && mv "$f" "${f%.log}.$k.log"; done
  rm -f "$run_dir/replicas-died" "$run_dir/early-end" "$run_dir/summary.txt"
  log "resuming $run_dir from its checkpoint of step $ck_step (start $((k + 1)); the earlier logs: *.$k.log)"
fi
tb=()
# (not `--help | grep -q`: grep exits at the match, the learner may then die of SIGPIPE
# and pipefail fails the test; the events were missing from some runs)
learner_help=$("$bin/qrl-learner" --help 2>/dev/null || true)
[[ $learner_help == *metrics.tensorboard_dir* ]] && tb=(--metrics.tensorboard_dir "$run_dir/tb")
ckpt=(--learner.checkpoint_dir "$run_dir/checkpoints" --learner.checkpoint_every 5)
learner_cmd=("$bin/qrl-learner" --learner.model "$model" --dataset.path "$dataset" --dataset.task "$verifier"
  --dataset.chat_template "$template" "${fields[@]}" --kafka.bootstrap "$bootstrap"
  --learner.group_size "$G" --learner.quota "$T" --learner.max_updates "$updates"
  --learner.seed "$seed" --learner.threads "$threads" --sampling.max_new_tokens "$max_new"
  --learner.lr "$lr" --learner.mode "$mode" --loss.beta 0 "${stop[@]}" --rpc.token_file "$run_dir/token"
  --metrics.jsonl "$run_dir/learner.jsonl" "${tb[@]}" "${ckpt[@]}" "${resume_flags[@]}" "${ldev[@]}" "${learner_extra[@]}")
replica_cmd() { # $1 = index, $2 = learner port: the qrl-rollout command of replica r$1
  local i=$1 g rdev=() m
  if [ "$device" = cuda ]; then
    g=$(gpu_of $((i + 1))) m=$(replica_mem "$i")
    rdev=(--rollout.device cuda --rollout.cuda_device "$g" --rollout.nccl_device "$g")
    [ "$m" = 0 ] || rdev+=(--rollout.gpu_memory_utilization "$m")
  fi
  rcmd=("$bin/qrl-rollout" --rollout.model "$model" --rollout.precision "$precision" --rollout.kv_cache "$kv"
    --rollout.replica_id "r$i" --rollout.threads "$threads" --rollout.slots 16
    --kafka.bootstrap "$bootstrap" --kafka.session_timeout_ms 6000 --rpc.token_file "$run_dir/token"
    --learner.addr "127.0.0.1:$2" --metrics.jsonl "$run_dir/r$i.jsonl" "${rdev[@]}" "${replica_extra[@]}")
}
if [ "$device" = cuda ]; then
  placement="learner on GPU $learner_gpu"
  for i in $(seq 0 $((replicas - 1))); do
    m=$(replica_mem "$i")
    placement+=", r$i on GPU $(gpu_of $((i + 1)))$([ "$m" = 0 ] || echo " (gpu_memory_utilization $m)")"
  done
  log "GPU placement: $placement"
fi
if [ $dry = 1 ]; then # the rest of the run, shown; nothing was started
  xrun "$run_dir/learner.log" "$run_dir/learner.log" "${learner_cmd[@]}"
  for i in $(seq 0 $((replicas - 1))); do
    replica_cmd "$i" LEARNER_PORT
    xrun "$run_dir/r$i.log" "$run_dir/r$i.log" "${rcmd[@]}"
  done
  xrun "$run_dir/export.log" "$run_dir/export.log" \
    "$bin/qrl-learner" export --checkpoint "$run_dir/checkpoints" --out "$run_dir/final"
  evaluate "$run_dir/final" eval-after
  show deploy/local/summary.sh "$run_dir"
  exit 0
fi
setsid "${learner_cmd[@]}" >"$run_dir/learner.log" 2>&1 &
pid_learner=$!
pids+=("$pid_learner")
end=$((SECONDS + 60))
until grep -qs "rpc listening port=[0-9]" "$run_dir/learner.log"; do
  kill -0 "$pid_learner" 2>/dev/null || { tail -5 "$run_dir/learner.log"; die "the learner exited at start"; }
  [ $SECONDS -lt $end ] || die "the learner did not start in 60 s"
  sleep 0.2
done
sleep 0.2 # the line may still be half written when grep first sees it
port=$(sed -n 's/.*rpc listening port=\([0-9]*\).*/\1/p' "$run_dir/learner.log" | head -1)
echo "127.0.0.1:$port" >"$run_dir/learner.addr"
for i in $(seq 0 $((replicas - 1))); do
  replica_cmd "$i" "$port"
  setsid "${rcmd[@]}" >"$run_dir/r$i.log" 2>&1 &
  pids+=($!) rpids+=($!)
done
# Watchdog: when every replica has exited while the learner still runs (a bad setting, a
# crash), stop the learner so that the progress loop ends and the run fails loudly; one
# replica alone may die: the others take its groups.
( while kill -0 "$pid_learner" 2>/dev/null; do
    alive=0
    for p in "${rpids[@]}"; do kill -0 "$p" 2>/dev/null && [ "$(ps -o stat= -p "$p" 2>/dev/null | cut -c1)" != Z ] && alive=1; done
    # (at max_updates, or on an operator's qrlctl shutdown, the learner tells the replicas
    # to shut down, then exits itself)
    grep -qE "reached: telling replicas to shut down|Shutdown requested" "$run_dir/learner.log" && exit 0
    if [ $alive = 0 ]; then : >"$run_dir/replicas-died"; kill -TERM "$pid_learner"; exit 0; fi
    sleep 1
  done ) &
wpid=$!
pids+=("$wpid")
log "learner at 127.0.0.1:$port, $replicas replicas ($precision weights, $kv KV cache);" \
    "T=$T groups of G=$G per update, $updates updates  mode $mode, lr $lr  ($bin/qrlctl --learner 127.0.0.1:$port --token-file $run_dir/token status)"

# ---- progress: one line per update from the learner's metrics JSONL ----------------------
printf '%5s %7s %7s %6s %9s %8s %6s %6s\n' step version reward acc "tok/s" "KL(b|p)" tis acr | tee -a "$run_dir/launch.log"
prev_ms=$(($(date +%s%N) / 1000000))
touch "$run_dir/learner.jsonl"
# A slow update says so: with no update line for QRL_LAUNCH_PROGRESS_S (10) s, one line with
# the time since the last one, the groups the learner holds for the next (qrlctl status)
# and an ETA for the rest of the run from the mean time per update so far.
rl_t0=$SECONDS rl_last=$SECONDS rl_done=0 partial=""
waiting_line() {
  local st="" n=$((jsonl_kept + rl_done + 1)) eta=""
  st=$("$bin/qrlctl" --learner "127.0.0.1:$port" --token-file "$run_dir/token" --json --timeout 2 status 2>/dev/null |
       jq -r '"\(.groups_buffered) of \(.quota) groups in, \(.rollout_tokens_per_s | floor) rollout tok/s"' 2>/dev/null) || st=""
  [ $rl_done -eq 0 ] || eta=$(( (SECONDS - rl_t0) * (updates - n + 1) / rl_done ))
  printf '  ... update %d: %d s since %s%s%s\n' "$n" $((SECONDS - rl_last)) \
    "$([ $rl_done -eq 0 ] && echo "the start" || echo "the last")" "${st:+ ($st)}" \
    "${eta:+; ETA ${eta} s for the $((updates - n + 1)) updates left}" | tee -a "$run_dir/launch.log"
}
while :; do
  rc_read=0
  IFS= read -r -t "$progress_s" line || rc_read=$?
  if [ $rc_read -ne 0 ]; then
    [ $rc_read -gt 128 ] || break # the end of the metrics (the learner exited)
    partial+=$line                 # (a timed-out read keeps what it read of a line)
    [ $((jsonl_kept + rl_done)) -ge "$updates" ] || waiting_line # (after the last: the learner closes)
    continue
  fi
  line=$partial$line partial="" rl_done=$((rl_done + 1)) rl_last=$SECONDS
  ms=$(jq -r .unix_ms <<<"$line")
  jq -r --argjson prev "$prev_ms" --argjson G "$G" '
    ((.groups | length) * $G * .response_len_mean) as $tok |
    [ .step, .version, (.reward_mean * 1000 | round / 1000), (.accuracy * 1000 | round / 1000),
      ($tok / ((.unix_ms - $prev) / 1000 + 1e-9) | round), .kl_behav_prox, .tis_frac, .acr_frac,
      .groups_used, (.groups | length) ] |
    "\(.[0]) \(.[1]) \(.[2]) \(.[3]) \(.[4]) \(.[5]) \(.[6]) \(.[7]) \(.[8]) \(.[9])"' <<<"$line" |
    awk '{ printf "%5d %7d %7.3f %6.3f %9d %8.2e %6.3f %6.3f", $1, $2, $3, $4, $5, $6, $7, $8
           # an update that trained on no group (dynamic sampling dropped every one: each
           # group'"'"'s rewards were all equal) changed nothing; say so on its line
           if ($9 == 0) printf "  WARNING: trained on no group (all %d dropped: equal rewards)", $10
           printf "\n" }' |
    tee -a "$run_dir/launch.log"
  prev_ms=$ms
done < <(tail -n +$((jsonl_kept + 1)) -f --pid="$pid_learner" "$run_dir/learner.jsonl")
rc=0; wait "$pid_learner" || rc=$?
if [ -e "$run_dir/replicas-died" ]; then
  for i in $(seq 0 $((replicas - 1))); do echo "--- last lines of r$i.log:"; tail -3 "$run_dir/r$i.log" | cut -c1-200; done
  die "every rollout replica exited (logs above); the learner was stopped"
fi
[ $rc -eq 0 ] || { tail -5 "$run_dir/learner.log"; die "the learner exited with $rc"; }
done_updates=$(wc -l <"$run_dir/learner.jsonl")
if grep -q "Shutdown requested" "$run_dir/learner.log"; then
  # an operator's qrlctl shutdown: a normal early end (export, evaluate, summarize, rc 0)
  reason=$(sed -n "s/.*Shutdown requested reason='\([^']*\)'.*/\1/p" "$run_dir/learner.log" | tail -1)
  echo "stopped early by qrlctl shutdown${reason:+ (reason: $reason)} after $done_updates of $updates updates" \
    >"$run_dir/early-end"
  log "$(cat "$run_dir/early-end")"
  if [ "$done_updates" -eq 0 ]; then
    log "no update was made: nothing to export or evaluate after RL (the evaluation before RL: $run_dir/eval-before.json)"
    exit 0
  fi
elif [ "$done_updates" -lt "$updates" ]; then
  die "only $done_updates of $updates updates"
fi

# ---- after RL: export, evaluate, summarize, plot --------------------------------------------
# This run's newest checkpoint, as its learner logged it (not whatever else the folder holds),
# and it must be the last update's.
final_ckpt=$(sed -n -e 's/.* checkpoint step=\([0-9]*\) version=[0-9]* dir=\([^ ]*\) .*/\1 \2/p' \
                   -e 's/.* resumed from \([^ ]*\): step=\([0-9]*\) .*/\2 \1/p' "$run_dir/learner.log" | tail -1)
last_step=$(tail -1 "$run_dir/learner.jsonl" | jq -r .step)
[ -n "$final_ckpt" ] || die "the learner wrote no checkpoint (see $run_dir/learner.log)"
[ "${final_ckpt%% *}" = "$last_step" ] ||
  die "the learner's last checkpoint is of step ${final_ckpt%% *}, its last update step $last_step (see $run_dir/learner.log)"
"$bin/qrl-learner" export --checkpoint "${final_ckpt#* }" --out "$run_dir/final" \
  >"$run_dir/export.log" 2>&1 || { tail -5 "$run_dir/export.log"; die "export failed"; }
log "evaluating the trained policy"
evaluate "$run_dir/final" eval-after
deploy/local/summary.sh "$run_dir" | tee "$run_dir/summary.txt"
