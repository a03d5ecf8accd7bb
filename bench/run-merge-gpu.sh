#!/usr/bin/env bash
# On the GPU machine, one call (issue 22 item 2, the split merge fused into the last split
# of the tensor-core decode attention): build; the CUDA tests of the attention (fused ==
# separate merge kernel bit for bit: test_cuda_attn_merge; against the CPU: the attention
# cases of test_cuda_ops, test_cuda_kv; engine steps and graph replays: test_cuda_forward_kv,
# test_cuda_graphs), pass/fail and the worst errors; then the late-stage decode step
# (QRL_DECODE_REPEATS=3 bench/decode --from 10 --grid 0) for bf16 and int4-protected KV with
# the fused merge (QRL_ATTN_MERGE_KERNEL=0) and with the separate merge kernel (=1, the default),
# ms per step side by side.  Every step runs under what is left of BUDGET_S (default 150 s).
# Logs and JSON under $OUT (or /tmp); the short table last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
t0=$(date +%s)
left() { echo $(( ${BUDGET_S:-150} - ($(date +%s) - t0) )); }
at() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
cap() { local l; l=$(left); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
source bench/device_env.sh
b=build-gpu
tests="test_cuda_attn_merge test_cuda_ops test_cuda_kv test_cuda_forward_kv test_cuda_graphs"
make -j"$(nproc)" BUILD=$b $b/bench/decode $(for t in $tests; do echo $b/tests/cuda/$t; done) \
  > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
at built
w=/tmp/merge-v; rm -rf $w; mkdir -p $w
declare -A rc
run_test() { # name, seconds at most, criterion args
  local t=$1 s=$2; shift 2
  timeout "$(cap "$s")" $b/tests/cuda/$t "$@" > "$w/$t.log" 2>&1
  rc[$t]=$?
  at "$t rc=${rc[$t]}"
}
run_test test_cuda_attn_merge 30
run_test test_cuda_ops 20 --filter 'cuda_ops/attention*'
run_test test_cuda_kv 40 --filter 'cuda_kv/tensor_core*'
run_test test_cuda_forward_kv 25
run_test test_cuda_graphs 25
export QRL_DECODE_REPEATS=3
QRL_ATTN_MERGE_KERNEL=0 timeout "$(cap 40)" $b/bench/decode --from 10 --grid 0 --formats bf16,int4-protected \
  --out "$w/late-fused.json" > "$w/late-fused.log" 2>&1
at "decode late, merge fused rc=$?"
QRL_ATTN_MERGE_KERNEL=1 timeout "$(cap 40)" $b/bench/decode --from 10 --grid 0 --formats bf16,int4-protected \
  --out "$w/late-kernel.json" > "$w/late-kernel.log" 2>&1
at "decode late, merge kernel rc=$?"
tar czf "$out/logs.tgz" -C /tmp merge-v
{
echo "== tests (rc 0 = pass)"
for t in $tests; do
  printf "%-22s rc=%-3s %s\n" "$t" "${rc[$t]:-skipped}" "$(grep -h Synthesis "$w/$t.log" | tail -1 | sed 's/.*Synthesis: //')"
done
grep -hE "FAIL|Assertion|assert|differs|left at" "$w"/test_*.log | head -8
echo "fused == merge kernel (memcmp): $(grep -c 'fused == merge kernel' "$w/test_cuda_attn_merge.log") cases"
awk '/^attention H=/ { e = $NF + 0; if (e > m) { m = e; l = $0 } } END { if (l) print "worst bf16 attention vs cpu: " l }' "$w/test_cuda_ops.log"
awk '/^attention_q / { e = $NF + 0; if (e > m) { m = e; l = $0 } } END { if (l) print "worst quantized attention vs cpu: " l }' "$w/test_cuda_kv.log"
grep -hE "worst|rel" "$w/test_cuda_forward_kv.log" | tail -3
grep -hE "^graphs " "$w/test_cuda_graphs.log" | tail -5
echo "== late-stage decode step, ms (QRL_DECODE_REPEATS=3 median), fused merge vs QRL_ATTN_MERGE_KERNEL=1"
grep -h "^device:" "$w/late-fused.log" | head -1
grep -hE "^NOTE|rror" "$w"/late-*.log | head -4
python3 - "$w/late-fused.json" "$w/late-kernel.json" <<'EOF'
import json, sys
def load(p):
    try:
        return {(s["batch"], s["context"]): s["formats"] for s in json.load(open(p))["shapes"] if s["stage"] == "late"}
    except Exception as e:
        print("no json:", p, e); return {}
fu, ke = load(sys.argv[1]), load(sys.argv[2])
fm = ["bf16", "int4-protected"]
print("%-11s" % "shape" + " | ".join("%-14s %7s %7s" % (f + " fused", "kernel", "gain") for f in fm))
tot = {f: [0.0, 0.0, 0] for f in fm}
for k in sorted(fu, key=lambda k: -k[0]):
    line = "%4dx%-6d" % k
    for f in fm:
        a = fu[k].get(f, {}).get("ms_per_step"); b = ke.get(k, {}).get(f, {}).get("ms_per_step")
        if a and b:
            tot[f][0] += a; tot[f][1] += b; tot[f][2] += 1
            cell = "%14.3f %7.3f %6.2f%%" % (a, b, 100 * (b - a) / b)
        else:
            cell = "%14s %7s %7s" % (a or "-", b or "-", "")
        line += cell + (" | " if f != fm[-1] else "")
    print(line)
line = "%-11s" % "mean"
for f in fm:
    a, b, n = tot[f]
    line += ("%14.3f %7.3f %6.2f%%" % (a / n, b / n, 100 * (b - a) / b) if n else "%14s %7s %7s" % ("-", "-", "")) + (" | " if f != fm[-1] else "")
print(line)
EOF
} | tee "$out/table.txt"
at done
