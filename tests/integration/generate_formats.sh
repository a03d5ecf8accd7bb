#!/usr/bin/env bash
# qrl-generate with every precision x KV-cache format of SPEC §3 on stories260K (7 x 7
# runs): each exits 0 with one valid JSON line (token ids in the vocabulary, finite
# log-probs <= 0, decoded text, a finish reason); f32/f32 reproduces run.c's greedy
# reference; every other combination changes the log-probs (the format is applied, not
# ignored).  With --kv-sink/--kv-recent available: int4-protected with 0/0 equals int4
# exactly, and 4/8 differs from both int4 and int8.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin=${BUILD:-build}/bin/qrl-generate
data=${QRL_DATA_DIR:-../shared/data}
s260=$data/llama2c_stories260K
[ -x "$bin" ] || { echo "missing $bin"; exit 1; }
[ -f "$s260/stories260K.bin" ] || { echo "skip: no stories260K under $data"; exit 77; }
tmp=$(mktemp -d /tmp/qrl_gen_formats.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

precisions="f32 bf16 w8a8-int8 w8a8-fp8 w4a16-nvfp4 w4a16-mxfp4 w4a4-nvfp4"
kvs="f32 bf16 fp8 int8 int4 fp4 int4-protected"
gen() {  # $1 precision, $2 kv, $3 output, rest: extra options
  local p=$1 k=$2 out=$3; shift 3
  "$bin" --model "$s260/stories260K.bin" --prompt "Once upon a time" --temperature 0 \
    --max-new-tokens 40 --threads 1 --precision "$p" --kv-cache "$k" "$@" >"$out" 2>"$out.err" \
    || { cat "$out.err"; fail "exit status for --precision $p --kv-cache $k $*"; }
}
for p in $precisions; do
  for k in $kvs; do gen "$p" "$k" "$tmp/$p.$k"; done
done
python3 - "$tmp" "$s260/greedy_reference.json" "$precisions" "$kvs" <<'PY' || fail "outputs"
import json, math, sys
tmp, ref, precs, kvs = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
want = json.load(open(ref))["cases"][1]
out = {}
for p in precs:
    for k in kvs:
        lines = open(f"{tmp}/{p}.{k}").read().splitlines()
        assert len(lines) == 1, (p, k, lines)
        r = json.loads(lines[0])
        ids, lps = r["token_ids"], r["logprobs"]
        assert 1 <= len(ids) == len(lps) <= 40, (p, k)
        assert all(0 <= t < 512 for t in ids), (p, k, ids)
        assert all(math.isfinite(x) and x <= 0 for x in lps), (p, k, lps)
        assert isinstance(r["text"], str) and r["finish_reason"] in ("eos", "length"), (p, k, r)
        assert r["prompt_tokens"] == 5, r
        out[p, k] = r
base = out["f32", "f32"]
assert base["token_ids"] == want["generated_token_ids"][:40], base["token_ids"]
for key, r in out.items():
    if key != ("f32", "f32"):
        assert r["logprobs"] != base["logprobs"], f"{key} gave exactly the f32 log-probs"
agree = sum(r["token_ids"] == base["token_ids"] for r in out.values())
print(f"ok {len(out)} precision x kv runs valid; {agree} of {len(out)} reproduce the f32 greedy tokens")
for p in precs:
    print("  %-12s" % p + " ".join("%6.3f" % (sum(out[p, k]["logprobs"]) / len(out[p, k]["logprobs"]))
                                    for k in kvs))
PY

if "$bin" --help | grep -q -- 'kv_sink'; then
  gen f32 int4 "$tmp/i4" --max-new-tokens 60
  gen f32 int8 "$tmp/i8" --max-new-tokens 60
  gen f32 int4-protected "$tmp/p00" --max-new-tokens 60 --kv-sink 0 --kv-recent 0
  gen f32 int4-protected "$tmp/p48" --max-new-tokens 60 --kv-sink 4 --kv-recent 8
  strip() { sed 's/,"tokens_per_s":[^}]*//' "$1"; }
  [ "$(strip "$tmp/p00")" = "$(strip "$tmp/i4")" ] || fail "int4-protected 0/0 differs from int4"
  [ "$(strip "$tmp/p48")" != "$(strip "$tmp/i4")" ] || fail "int4-protected 4/8 equals int4"
  [ "$(strip "$tmp/p48")" != "$(strip "$tmp/i8")" ] || fail "int4-protected 4/8 equals int8"
  echo "ok --kv-sink/--kv-recent: 0/0 equals int4 exactly, 4/8 differs from int4 and int8"
else
  echo "note: --kv-sink/--kv-recent not wired into the option table yet; widths checked by unit tests"
fi
echo "generate_formats: all checks passed"
