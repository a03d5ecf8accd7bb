#!/usr/bin/env bash
# deploy/local/compare.sh's run sets, without starting anything (docs/results.md):
#   - a bad --set, an unknown --runs entry, a non-numeric --seeds entry and --seed are
#     refused with one "compare.sh: error:" line;
#   - --dry-run --set fp4 --seeds "1 2": one SFT start and the nine runs per seed, each run's
#     command checked by launch.sh --dry-run (its options and every daemon key after --: a
#     refused --kv-cache fp4 or a misspelt loss.* / learner.* key fails here), fp4 runs on
#     w4a4-nvfp4 + fp4 KV, bf16 on BF16, the QAT / TRACE runs with their keys;
#   - --set int8 (the default) keeps issue 10's four runs.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
for b in qrl-learner qrl-rollout qrl-eval qrl-task qrl-kafka-admin; do
  [ -x "$build/bin/$b" ] || { echo "missing $build/bin/$b (run make)"; exit 1; }
done
tmp=$(mktemp -d /tmp/qrl-compare-sets-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
cmp() { BUILD=$build timeout 120 deploy/local/compare.sh "$@"; }

refused() { # PATTERN ARGS...: exit != 0, one error line matching PATTERN
  local pat=$1
  shift
  cmp --out "$tmp/r" "$@" >"$tmp/out" 2>"$tmp/err" && fail "$*: accepted"
  [ "$(grep -c '^compare.sh: error:' "$tmp/err")" -eq 1 ] && grep -q -- "$pat" "$tmp/err" ||
    fail "$*: expected one error line matching '$pat', got: $(cat "$tmp/err")"
}
refused "--set must be int8 or fp4" --set fp8 --dry-run
refused "'fp4-bogus' is not a run of --set fp4" --set fp4 --runs "bf16 fp4-bogus" --dry-run
refused "'x' is not a seed number" --set fp4 --seeds "1 x" --dry-run
refused "use --seeds" --seed 3 --dry-run
# --help prints the usage and starts nothing (it used to fall through to launch.sh)
cmp --help --out "$tmp/h" >"$tmp/help" 2>&1 && grep -q -- "--set fp4" "$tmp/help" && [ ! -e "$tmp/h" ] ||
  fail "--help: rc, usage or a run folder: $(head -3 "$tmp/help")"

# the SFT starts the runs would load (any HF model: launch.sh --dry-run checks it exists)
for s in 1 2; do
  mkdir -p "$tmp/fp4/seed-$s/sft-only"
  ln -s "$root/tests/fixtures/hf/llama" "$tmp/fp4/seed-$s/sft-only/sft"
done
cmp --set fp4 --seeds "1 2" --out "$tmp/fp4" --sft-steps 300 --updates 16 --dry-run >"$tmp/fp4.out" 2>&1 ||
  fail "fp4 dry run: $(tail -5 "$tmp/fp4.out")"
n=$(grep -c '^+ deploy/local/launch.sh' "$tmp/fp4.out")
[ "$n" -eq 20 ] || fail "fp4 dry run: $n launch.sh commands (expected 2 x (1 SFT + 9 runs)): $(cat "$tmp/fp4.out")"
for s in 1 2; do
  grep -q "seed-$s/sft-only .*--seed $s --updates 1\$" "$tmp/fp4.out" || fail "seed $s: no SFT-only start"
done
line() { grep "seed-1/$1 " "$tmp/fp4.out"; }
for r in fp4-naive fp4-tis fp4-tis-acr fp4-seq-tis fp4-tok-mis fp4-seq-mis fp4-qat fp4-trace; do
  line $r | grep -q -- "--precision w4a4-nvfp4 --kv-cache fp4 --" || fail "$r: not w4a4-nvfp4 + fp4 KV: $(line $r)"
  line $r | grep -q -- "--model $tmp/fp4/seed-1/sft-only/sft --sft-steps\|--sft-steps 300 --updates 16 --model $tmp/fp4/seed-1/sft-only/sft" ||
    fail "$r: not from the seed's SFT start: $(line $r)"
done
line bf16 | grep -q -- "--precision bf16 --kv-cache bf16 --" || fail "bf16: $(line bf16)"
line fp4-naive | grep -q -- "-- --loss.mode naive" || fail "fp4-naive: $(line fp4-naive)"
line fp4-tis | grep -q -- "--loss.acr false" || fail "fp4-tis: $(line fp4-tis)"
line fp4-qat | grep -q -- "--learner.qat nvfp4 --learner.qat_kv true --learner.trace_guidance off" ||
  fail "fp4-qat: $(line fp4-qat)"
line fp4-trace | grep -q -- "--learner.qat nvfp4 --learner.qat_kv true --learner.trace_guidance on --rollout.trace true" ||
  fail "fp4-trace: $(line fp4-trace)"
line fp4-seq-tis | grep -q -- "--loss.is_level seq" || fail "fp4-seq-tis: $(line fp4-seq-tis)"
line fp4-tok-mis | grep -q -- "--loss.mis token" || fail "fp4-tok-mis: $(line fp4-tok-mis)"
line fp4-seq-mis | grep -q -- "--loss.mis seq" || fail "fp4-seq-mis: $(line fp4-seq-mis)"

# the default set: issue 10's four runs, flags after -- reach every run
mkdir -p "$tmp/int8/sft-only" && ln -s "$root/tests/fixtures/hf/llama" "$tmp/int8/sft-only/sft"
cmp --out "$tmp/int8" --dry-run -- --loss.beta 0 >"$tmp/int8.out" 2>&1 || fail "int8 dry run: $(tail -5 "$tmp/int8.out")"
runs=$(grep -o 'int8/[a-z0-9-]* ' "$tmp/int8.out" | tr -d ' ' | sed 's|int8/||' | tr '\n' ' ')
[ "$runs" = "sft-only bf16 w8a8-int8 int4-kv naive " ] || fail "int8 set: runs '$runs'"
[ "$(grep -c -- '--loss.beta 0' "$tmp/int8.out")" -eq 4 ] || fail "flags after -- not on every run: $(cat "$tmp/int8.out")"

[ $fails -eq 0 ] && echo "ok: compare.sh run sets" && exit 0
exit 1
