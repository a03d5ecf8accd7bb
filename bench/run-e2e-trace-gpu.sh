#!/usr/bin/env bash
# On the GPU machine (issue 19, TRACE end to end): bench/e2e.sh's real cluster (Kafka broker,
# qrl-learner and a qrl-rollout replica as separate processes on one GPU) at Qwen3-0.6B, early
# length (512 new tokens), T = 16 groups x G = 8, 4 updates, overlap mode, two configurations:
#   qwen3-0.6b/bf16/early/overlap       the anchor (BF16 weights and KV, F32 learner)
#   qwen3-0.6b/fp4+trace/early/overlap  w4a4-nvfp4 weights + fp4 KV with rollout.trace (the
#                                       records as TraceChunks on the trace topic), learner
#                                       learner.qat nvfp4 + qat_kv + trace_guidance on
# and the engine alone on the same work (bf16, and w4a4-nvfp4 + fp4 KV with the recorder).
# One call of about 5-6 minutes with the build (~50 s) and the model creation; the e2e budget
# is what is left of E2E_TOTAL_S (default 370) s after the build.  A short table last.
#   here:   .device-deps, .device-kafka, .device-data carried (as bench/run-e2e-gpu.sh)
#   there:  bench/run-e2e-trace-gpu.sh [OUTDIR (default /tmp/qrl-e2e-trace)] [bench/e2e.sh flags...]
#   E2E_SHAPE=qwen3-1.7b: 1.7B instead (71 KB of records per token against 44 KB; longer)
# Logs: OUTDIR/e2e-trace-h200-work/, JSON OUTDIR/e2e-trace-h200.json and
# bench/results/e2e-trace-h200.json (E2E_NAME to rename).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-/tmp/qrl-e2e-trace}
[ $# -gt 0 ] && shift
shape=${E2E_SHAPE:-qwen3-0.6b}
name=${E2E_NAME:-e2e-trace-h200}
rc=0
E2E_NAME=$name E2E_TOTAL_S=${E2E_TOTAL_S:-370} BUILD=${BUILD:-build-gpu} bench/run-e2e-gpu.sh "$out" \
  --configs "$shape/bf16/early/overlap,$shape/fp4+trace/early/overlap" "$@" || rc=$?
[ -f "$out/$name.json" ] || { echo "no report ($out/$name.json); rc=$rc"; exit 1; }
python3 - "$out/$name.json" "$rc" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def f(x, nd=2):
    return '-' if x is None else (f'{x:.{nd}f}' if isinstance(x, float) else str(x))
print(f'\nTRACE end to end ({d.get("gpu")}; e2e.sh rc={sys.argv[2]}): T={d["plan"]["quota"]} x '
      f'G={d["plan"]["group_size"]}, {d["plan"]["updates"]} updates; steady means (updates 2..N); guided = rows '
      f'guided / trained, miss/ev = responses whose records were missing / evicted at the join')
print(f'{"config":36} {"status":8} {"e2e t/s":>8} {"vs bf16":>7} {"eng t/s":>8} {"eff":>5} {"period":>6} '
      f'{"prox":>5} {"train":>5} {"B/tok":>6} {"MB/s":>6} {"share":>6} {"eng sh":>6} {"guided":>7} '
      f'{"miss/ev":>7} {"disagree":>8} {"disc mean":>9} {"disc max":>8}')
for c in d['configs']:
    s = c.get('summary')
    if not s:
        print(f'{c["name"][:36]:36} {c.get("status")}')
        continue
    t = s.get('trace', {})
    st = t.get('store') or {}
    g = f'{t["rows_guided"]}/{t["rows_guided"] + t["rows_unguided"]}' if 'rows_guided' in t else '-'
    me = f'{st.get("missing")}/{st.get("evicted")}' if st else '-'
    print(f'{c["name"][:36]:36} {("ok" if c["status"] == "ok" else "FAILED"):8} {f(s["e2e_tokens_per_s"], 0):>8} '
          f'{f(t.get("vs_bf16"), 3):>7} {f(s.get("engine_tokens_per_s"), 0):>8} {f(s.get("loop_efficiency")):>5} '
          f'{f(s.get("period_s")):>6} {f(s.get("prox_s")):>5} {f(s.get("train_s")):>5} '
          f'{f(t.get("bytes_per_token"), 0):>6} {f(t.get("steady_mb_per_s"), 0):>6} {f(t.get("capture_share"), 3):>6} '
          f'{f(t.get("engine_capture_share"), 3):>6} {g:>7} {me:>7} {f(t.get("disagree_share"), 4):>8} '
          f'{("-" if t.get("disc_mean") is None else format(t["disc_mean"], ".3g")):>9} '
          f'{("-" if t.get("disc_max") is None else format(t["disc_max"], ".3g")):>8}')
    if c['status'] != 'ok':
        print(f'  status: {c["status"]}')
PY
exit $rc
