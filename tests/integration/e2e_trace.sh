#!/usr/bin/env bash
# bench/e2e.sh's TRACE configurations (issue 19) on the CPU, with a real Kafka broker:
#   1. --dry-run: a FORMAT ending in +trace gives the replicas rollout.trace on the
#      configuration's own trace topic and the learner learner.qat nvfp4, qat_kv (fp4 KV
#      only), trace_guidance on, that topic and learner.trace_store_mb (2.5 quotas of records
#      at the default sites: Qwen3-0.6B / 1.7B at 44,352 / 71,232 bytes per token, the
#      numbers of docs/performance.md); +qat the learner's QAT with guidance off and no
#      records; the BF16 configuration beside them stays plain; the engine-alone anchor of
#      a +trace configuration runs with the recorder (PREC:KV:N:trace); +trace on a
#      precision the learner's QAT does not mirror is refused naming the configuration.
#   2. qwen3-tiny, T = 2 x G = 4, 2 updates, 8 new tokens: bf16 and fp4+trace as separate
#      processes end to end: both ok, the report's TRACE summary has chunks, bytes and
#      record bytes per token (172 in the engine alone: the layout's), every trained row is
#      counted guided or unguided (16) and most are guided, nothing evicted, the ratio to
#      the BF16 configuration is set, and the printed TRACE table lists both.  ~45 s.
# Skips (77) without java or the Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" e2e_trace
data=${QRL_DATA_DIR:-../shared/data}
engine=$build/bench/e2e_engine
[ -x "$engine" ] || fail "$engine is not built (make test builds it)"
t_all=$(date +%s.%N)
e2e() { bench/e2e.sh --build "$build" --data-dir "$data" --model-dir "$tmp/models" "$@"; }

# ---- 1. the commands ---------------------------------------------------------------------------
e2e --device cpu --dry-run --work "$tmp/dry" \
  --configs qwen3-tiny/bf16/early/overlap,qwen3-tiny/fp4+trace/early/overlap,qwen3-tiny/w4a4-nvfp4+qat/8/alternate \
  >"$tmp/dry.log" 2>&1 || fail "dry run: $(tail -3 "$tmp/dry.log")"
learners() { grep '^+ .*qrl-learner ' "$tmp/dry.log" | sed -n "${1}p"; }
rollouts() { grep '^+ .*qrl-rollout ' "$tmp/dry.log" | sed -n "${1}p"; }
[ "$(grep -c '^+ .*qrl-learner ' "$tmp/dry.log")" = 3 ] || fail "expected 3 learner commands: $(cat "$tmp/dry.log")"
lflags='--learner\.(qat|trace)|--kafka\.trace' rflags='--rollout\.trace|--kafka\.trace'
learners 1 | grep -qE -- "$lflags" && fail "bf16 learner has QAT/TRACE flags: $(learners 1)"
rollouts 1 | grep -qE -- "$rflags" && fail "bf16 replica has TRACE flags: $(rollouts 1)"
l=$(learners 2) r=$(rollouts 2)
for want in '--learner.qat nvfp4' '--learner.qat_kv true' '--learner.trace_guidance on' '--learner.trace_store_mb 256' \
    '--kafka.trace_topic e2e\.qwen3-tiny-fp4_trace-16-overlap\.[0-9]*\.trace' '--learner.device cpu'; do
  grep -qE -- "$want" <<<"$l" || fail "fp4+trace learner lacks '$want': $l"
done
for want in '--rollout.precision w4a4-nvfp4' '--rollout.kv_cache fp4' '--rollout.trace true' \
    '--kafka.trace_topic e2e\.qwen3-tiny-fp4_trace-16-overlap\.[0-9]*\.trace'; do
  grep -qE -- "$want" <<<"$r" || fail "fp4+trace replica lacks '$want': $r"
done
l=$(learners 3) r=$(rollouts 3)
for want in '--learner.qat nvfp4' '--learner.qat_kv false' '--learner.trace_guidance off' '--learner.mode alternate'; do
  grep -qE -- "$want" <<<"$l" || fail "w4a4-nvfp4+qat learner lacks '$want': $l"
done
grep -qE -- '--learner\.trace_store_mb|--kafka\.trace' <<<"$l" && fail "w4a4-nvfp4+qat learner reads a trace topic: $l"
grep -qE -- "$rflags" <<<"$r" && fail "w4a4-nvfp4+qat replica records: $r"
grep -q -- '--rollout.precision w4a4-nvfp4 --rollout.kv_cache bf16' <<<"$r" || fail "w4a4-nvfp4+qat replica: $r"
grep -q -- '--runs bf16:bf16:16\\\?,w4a4-nvfp4:fp4:16:trace\\\?,w4a4-nvfp4:bf16:8 ' "$tmp/dry.log" ||
  fail "anchor runs: $(grep e2e_engine "$tmp/dry.log")"
# the store: 2.5 quotas of records, T=16 x G=8 x 512 tokens (the cuda defaults)
e2e --device cuda --dry-run --no-anchor --work "$tmp/dry-cuda" \
  --configs qwen3-0.6b/fp4+trace/early/overlap,qwen3-1.7b/fp4+trace/early/overlap >"$tmp/dry-cuda.log" 2>&1 ||
  fail "cuda dry run: $(tail -3 "$tmp/dry-cuda.log")"
stores=$(grep -o -- '--learner.trace_store_mb [0-9]*' "$tmp/dry-cuda.log" | awk '{ print $2 }' | xargs)
[ "$stores" = "$((65536 * 44352 * 5 / 2 / 1048576 + 1)) $((65536 * 71232 * 5 / 2 / 1048576 + 1))" ] ||
  fail "trace_store_mb: $stores"
grep -q -- '--learner.device cuda .*--learner.qat nvfp4 --learner.qat_kv true --learner.trace_guidance on' "$tmp/dry-cuda.log" ||
  fail "cuda learner flags: $(grep qrl-learner "$tmp/dry-cuda.log" | head -1)"
# refused: the learner's QAT mirrors w4a4-nvfp4 only; three '+' parts
for bad in qwen3-tiny/w8a8-int8+trace/early/overlap qwen3-tiny/bf16+fp4+qat/early/overlap; do
  if e2e --device cpu --dry-run --work "$tmp/bad" --configs "$bad" >"$tmp/bad.log" 2>&1; then fail "$bad accepted"; fi
  grep -q "configuration '$bad': +trace / +qat need w4a4-nvfp4 weights" "$tmp/bad.log" || fail "$bad: $(cat "$tmp/bad.log")"
done
if e2e --device cpu --dry-run --work "$tmp/bad" --configs qwen3-tiny/w4a4-nvfp4+fp4+bf16/early/overlap >"$tmp/bad.log" 2>&1; then
  fail "three-part format accepted"; fi
grep -q "has more than PRECISION+KV" "$tmp/bad.log" || fail "three-part format: $(cat "$tmp/bad.log")"
echo "dry runs: flags, store sizes ($stores MiB for 0.6B / 1.7B) and refusals as expected"

# ---- 2. end to end -----------------------------------------------------------------------------
need_kafka
t=$(date +%s.%N)
e2e --device cpu --configs qwen3-tiny/bf16/8/overlap,qwen3-tiny/fp4+trace/8/overlap --work "$tmp/run" \
  --out "$tmp/e2e.json" >"$tmp/run.log" 2>&1 || fail "e2e.sh exited $?: $(tail -20 "$tmp/run.log")"
j=$tmp/e2e.json
jq -e '[.configs[].status] == ["ok", "ok"]' "$j" >/dev/null || fail "statuses: $(jq -c '[.configs[].status]' "$j")"
tr() { jq -c '.configs[1].summary.trace' "$j"; }
jq -e '.configs[1].summary.trace | .chunks > 0 and .bytes > 0 and .bytes_per_token > 0 and .bytes_per_s > 0
  and .capture_share > 0 and .capture_share < 1' "$j" >/dev/null || fail "replica TRACE costs: $(tr)"
jq -e '.configs[1].summary.trace | .rows_guided + .rows_unguided == 16 and .rows_guided >= 8 and .record_bytes > 0
  and .store.evicted == 0 and .store.joined == .rows_guided' "$j" >/dev/null || fail "learner guidance: $(tr)"
jq -e '.configs[1].summary.trace | .engine_bytes_per_token == 172 and .engine_capture_share > 0 and .vs_bf16 > 0
  and .disc_mean > 0' "$j" >/dev/null || fail "anchor / ratio: $(tr)"
jq -e '.configs[0].summary.trace | has("chunks") | not' "$j" >/dev/null || fail "bf16 has TRACE costs"
jq -e '.anchors["qwen3-tiny"].runs | map(.trace) == [false, true]' "$j" >/dev/null || fail "anchor runs"
grep -q '^TRACE (issue 19)' "$tmp/run.log" || fail "no TRACE table"
grep -qE '^qwen3-tiny/fp4\+trace/8/overlap +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9]+ ' "$tmp/run.log" ||
  fail "TRACE table row: $(sed -n '/^TRACE/,/^$/p' "$tmp/run.log")"
sed -n '/^TRACE (issue 19)/,/^$/p' "$tmp/run.log" | tail -n +2
echo "end to end in $(secs "$t") s: $(jq -c '.configs[1].summary.trace | {chunks, bytes, bytes_per_token, rows_guided,
  rows_unguided, disagree_share, disc_mean, vs_bf16}' "$j")"
echo "e2e trace test passed in $(secs "$t_all") s"
