#!/usr/bin/env bash
# On the GPU machine (issue 18 item 4): the end-to-end loop benchmark in one call.
#   here:   .device-deps (../shared/tools/device-deps.sh), .device-kafka
#           (../shared/tools/device-kafka.sh) and .device-data (gsm8k test JSONL, Qwen
#           tokenizer) carried with the tree
#   there:  [E2E_NAME=e2e-h200] bench/run-e2e-gpu.sh [OUTDIR] [bench/e2e.sh flags...]
# Sets up the carried libraries and Kafka runtime, builds what is missing (make all bench),
# then runs bench/e2e.sh --data-dir .device-data with its logs in OUTDIR/$E2E_NAME-work and
# the JSON in OUTDIR/$E2E_NAME.json (and bench/results/$E2E_NAME.json); the e2e budget is what
# is left of E2E_TOTAL_S (default 520) s after the build (at most 450 s) unless --budget-s is
# given.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
out=${1:-/tmp/qrl-e2e-out}
[ $# -gt 0 ] && shift
mkdir -p "$out"
source bench/device_env.sh
build=${BUILD:-build}
make -j"$(nproc)" BUILD="$build" all bench > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
budget=()
[[ " $* " == *" --budget-s "* ]] || { b=$((${E2E_TOTAL_S:-520} - (SECONDS - t0))); [ $b -le 450 ] || b=450; budget=(--budget-s "$b"); }
rc=0
name=${E2E_NAME:-e2e-h200}
bench/e2e.sh --build "$build" --data-dir .device-data --work "$out/$name-work" --out "$out/$name.json" \
  "${budget[@]}" "$@" 2>&1 | tee "$out/$name.txt" || rc=$?
[ -f "$out/$name.json" ] && cp "$out/$name.json" "bench/results/$name.json"
echo "summary: rc=$rc, $((SECONDS - t0)) s"
exit $rc
