#!/usr/bin/env bash
# qrl-rollout's engine device keys refuse what the CUDA engine cannot run, at start and
# before touching Kafka (exit 1, one "qrl-rollout: error:" line naming the key):
#   - rollout.device gpu: not one of cpu|cuda;
#   - rollout.trace_sites that do not parse or do not fit the model;
# and it names the selected trace sites it drops (not FP4 here) and the ones it records.
# (every weight precision and KV format, w4a4-nvfp4 and fp4 included, and rollout.trace
# run on the CUDA engine: nothing else is refused here.)
# The CUDA engine itself is tested on a GPU by tests/cuda/test_cuda_scheduler.c.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
bin=${BUILD:-build}/bin/qrl-rollout
[ -x "$bin" ] || { echo "missing $bin (run make)"; exit 1; }
model=${QRL_DATA_DIR:-../shared/data}/llama2c_stories260K/stories260K.bin
tmp=$(mktemp -d /tmp/qrl-rollout-device-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_refused PATTERN ARGS...: exit 1, the error line matches PATTERN (extended regex)
expect_refused() {
  local pat=$1 rc line
  shift
  "$bin" --rollout.model "$model" --kafka.bootstrap 127.0.0.1:1 "$@" >/dev/null 2>"$tmp/err"
  rc=$?
  [ $rc -eq 1 ] || fail "$*: exit $rc (expected 1): $(tail -3 "$tmp/err")"
  line=$(grep -c '^qrl-rollout: error:' "$tmp/err")
  [ "$line" -eq 1 ] || fail "$*: $line error lines: $(cat "$tmp/err")"
  grep -qE "$pat" "$tmp/err" || fail "$*: error does not match '$pat': $(grep error: "$tmp/err")"
}

expect_refused "rollout\.device: 'gpu' is not one of the allowed values: cpu, cuda" --rollout.device gpu
# the TRACE site spec: named when it is malformed (also with rollout.trace off) and when it
# does not fit the model (its layers, or no FP4 vector among the sites it selects)
# (checked by qrl-rollout's start against the loaded model, before the engine: the error
# names the key and the value)
expect_refused "rollout\.trace_sites 'garbage': trace sites clause 1: 'garbage' is not key=value" \
  --rollout.trace_sites garbage
expect_refused "rollout\.trace_sites 'layers=9-99,sites=attn_in': trace sites clause 1: layers=9-99: the model has 5 layers" \
  --rollout.precision w4a4-nvfp4 --rollout.trace true --rollout.trace_sites layers=9-99,sites=attn_in
expect_refused "rollout\.trace_sites 'layers=0-2,sites=k;layers=5,sites=v': trace sites clause 2: layers=5-5: the model has 5 layers \(0-4\)" \
  --rollout.kv_cache fp4 --rollout.trace true --rollout.trace_sites 'layers=0-2,sites=k;layers=5,sites=v'
expect_refused "rollout\.trace_sites 'layers=all,sites=attn_in': trace sites: none of the requested sites is FP4 here" \
  --rollout.kv_cache fp4 --rollout.trace true --rollout.trace_sites layers=all,sites=attn_in

# a selected site that is not FP4 here is named at start (WARN, with the reason), not
# dropped silently, and the CPU engine's recorder line lists what it records (sites,
# bytes per token, layer ranges); the daemon is stopped once the line is there (before Kafka)
"$bin" --rollout.model "$model" --kafka.bootstrap 127.0.0.1:1 --rollout.precision w4a4-nvfp4 \
  --rollout.trace true --rollout.trace_sites 'layers=0, sites=mlp_in,k' >"$tmp/run" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q 'trace recorder device=cpu' "$tmp/run" && break; sleep 0.1; done
kill -KILL $pid; wait $pid 2>/dev/null
grep -qF 'WARN  [rollout] rollout.trace_sites: not recorded: k layers 0 (k/v are FP4 only with the fp4 KV cache) (here rollout.precision w4a4-nvfp4, rollout.kv_cache f32)' "$tmp/run" ||
  fail "no WARN naming the dropped k site: $(grep -E 'WARN|trace' "$tmp/run" | head -5)"
grep -qE 'INFO  \[sched\] trace recorder device=cpu sites=1 bytes_per_token=16 recorded=mlp_in layers 0$' "$tmp/run" ||
  fail "no CPU trace recorder line: $(grep -E 'trace' "$tmp/run" | head -5)"

[ $fails -eq 0 ] && echo "ok: rollout.device refusals, dropped trace sites named" && exit 0
exit 1
