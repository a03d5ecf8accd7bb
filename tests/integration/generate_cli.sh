#!/usr/bin/env bash
# qrl-generate end to end: llama2.c's greedy reference token for token, TinyStories
# logits dump against its float64 reference, an HF transformers fixture without a
# tokenizer, seeded sampling reproducibility, groups and stop strings, bf16 precision and
# KV cache, the plain chat template, and bad input (exit 1 with exactly one
# "qrl-generate: error: ..." line): prompt longer than the context, unknown model_type,
# missing tensor, tensor shape disagreeing with config.json, unknown precisions and KV
# formats, malformed options and prompt files; a llama2.c story ends at BOS,
# --stop-token-ids, --output text, unknown flags.  (Every precision x KV format:
# generate_formats.sh.)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin=${BUILD:-build}/bin/qrl-generate
data=${QRL_DATA_DIR:-../shared/data}
s260=$data/llama2c_stories260K
ts=$data/tinystories_656k
[ -x "$bin" ] || { echo "missing $bin"; exit 1; }
[ -f "$s260/stories260K.bin" ] && [ -d "$ts" ] || { echo "skip: no model data under $data"; exit 77; }
tmp=$(mktemp -d /tmp/qrl_gen_cli.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect_error PATTERN ARGS...: exit status 1, nothing on stdout, one stderr line
# "qrl-generate: error: ..." containing PATTERN.
expect_error() {
  local pat=$1; shift
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  [ $rc -eq 1 ] || fail "exit $rc (want 1) for: $*"
  [ ! -s "$tmp/out" ] || fail "stdout not empty for: $*"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { cat "$tmp/err"; fail "want one stderr line for: $*"; }
  grep -q '^qrl-generate: error: ' "$tmp/err" || fail "bad error prefix: $(cat "$tmp/err")"
  grep -qF -- "$pat" "$tmp/err" || fail "error lacks '$pat': $(cat "$tmp/err")"
  echo "ok error: $(cat "$tmp/err")"
}

# 1. stories260K: both cases of greedy_reference.json (run.c -t 0).
"$bin" --model "$s260/stories260K.bin" --prompt "" --temperature 0 --max-new-tokens 200 >"$tmp/c1" \
  || fail "case 1 run"
"$bin" --model "$s260/stories260K.bin" --prompt "Once upon a time" --temperature 0 \
  --max-new-tokens 60 --threads 1 >"$tmp/c2" || fail "case 2 run"
python3 - "$s260/greedy_reference.json" "$tmp/c1" "$tmp/c2" <<'EOF' || fail "stories260K reference"
import json, sys
ref = json.load(open(sys.argv[1]))["cases"]
for case, path in zip(ref, sys.argv[2:]):
    out = json.loads(open(path).read())
    assert out["token_ids"] == case["generated_token_ids"], (path, out["token_ids"][:10])
    assert out["prompt_tokens"] == len(case["prompt_token_ids"])
    # run.c prints the prompt, then the generated text
    assert case["prompt"] + out["text"] == case["text"], (out["text"][:60], case["text"][:60])
    assert out["finish_reason"] == "length" and len(out["logprobs"]) == len(out["token_ids"])
    assert all(lp <= 0 for lp in out["logprobs"])
print("ok stories260K greedy: both cases token for token and text")
EOF

# 2. TinyStories: the prompt's logits dumped as .npy against the float64 reference.
ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$ts/forward_reference.json'))['input_ids'])))")
"$bin" --model "$ts" --prompt-ids "$ids" --temperature 0 --max-new-tokens 1 \
  --dump-logits "$tmp/logits.npy" >"$tmp/ts" || fail "tinystories dump run"
python3 - "$ts/forward_reference.json" "$tmp/logits.npy" "$tmp/ts" <<'EOF' || fail "tinystories logits"
import json, struct, sys
ref = json.load(open(sys.argv[1]))
raw = open(sys.argv[2], "rb").read()
assert raw[:8] == b"\x93NUMPY\x01\x00", raw[:8]
hl = struct.unpack("<H", raw[8:10])[0]
header = raw[10:10 + hl].decode()
assert (10 + hl) % 64 == 0 and "'descr': '<f4'" in header and "(40, 2048)" in header, header
data = struct.unpack("<%df" % (40 * 2048), raw[10 + hl:])
last = data[39 * 2048:]
err = max(abs(a - b) for a, b in zip(last, ref["last_position_logits"]))
assert err < 3e-5, err
out = json.loads(open(sys.argv[3]).read())
assert out["token_ids"] == [ref["argmax_next_token"][-1]], out["token_ids"]
assert out["text"] is not None
print("ok tinystories dump: shape (40, 2048), last-row max |diff| %.2g" % err)
EOF

# 3. HF transformers fixture (no tokenizer): greedy ids from --prompt-ids, text null.
fx=tests/fixtures/hf/qwen3
if [ -f "$fx/reference.json" ]; then
  read -r pids nnew < <(python3 -c "import json;g=json.load(open('$fx/reference.json'))['greedy'];print(','.join(map(str,g['prompt_ids'])),g['max_new_tokens'])")
  "$bin" --model "$fx" --prompt-ids "$pids" --temperature 0 --max-new-tokens "$nnew" >"$tmp/fx" \
    || fail "fixture run"
  python3 - "$fx/reference.json" "$tmp/fx" <<'EOF' || fail "fixture greedy"
import json, sys
g = json.load(open(sys.argv[1]))["greedy"]
out = json.loads(open(sys.argv[2]).read())
assert out["text"] is None and out["prompt"] is None
want = g["output_ids"]
assert out["token_ids"][:len(want)] == want, (out["token_ids"], want)
print("ok HF fixture qwen3 greedy via --prompt-ids")
EOF
fi

# 4. Seeded sampling: same seed, same bytes (minus timing); other seed, other draws.
run_sampled() {
  "$bin" --model "$ts" --prompts "$tmp/prompts.jsonl" --n 3 --temperature 0.8 --top-k 40 \
    --top-p 0.9 --max-new-tokens 24 --seed "$1" --threads "$2" | sed 's/,"tokens_per_s":[^}]*//'
}
printf '{"prompt": "Once upon a time,"}\n\n{"prompt": "Tom had a red ball.", "id": 7}\n' >"$tmp/prompts.jsonl"
run_sampled 11 1 >"$tmp/s1" || fail "sampled run"
run_sampled 11 2 >"$tmp/s2" || fail "sampled run"
run_sampled 12 2 >"$tmp/s3" || fail "sampled run"
cmp -s "$tmp/s1" "$tmp/s2" || fail "same seed, different output (1 vs 2 threads)"
cmp -s "$tmp/s1" "$tmp/s3" && fail "seeds 11 and 12 gave identical output"
python3 - "$tmp/s1" <<'EOF' || fail "group structure"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["prompt_index"], r["response_index"]) for r in rows] == \
    [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)], rows
assert len({tuple(r["token_ids"]) for r in rows[:3]}) > 1, "responses of a group should differ"
for r in rows:
    assert r["finish_reason"] in ("eos", "length")
    assert len(r["token_ids"]) == len(r["logprobs"]) <= 24
print("ok seeded sampling: reproducible across thread counts, groups of 3")
EOF

# 5. Stop string: greedy TinyStories continues " an ordinary cat named Kitty."
"$bin" --model "$ts" --prompt "Once upon a time," --temperature 0 --max-new-tokens 30 \
  --stop "Kitty" >"$tmp/stop" || fail "stop run"
python3 -c "
import json,sys; r=json.loads(open('$tmp/stop').read())
assert r['finish_reason']=='stop' and r['text']==' an ordinary cat named ', r
print('ok stop string')" || fail "stop string"

# 6. --precision bf16 rounds weights to BF16 (TinyStories' weights already are) and
#    --kv-cache bf16 stores K/V in BF16; the plain chat template wraps the bare prompt.
"$bin" --model "$ts" --prompt-ids "$ids" --temperature 0 --max-new-tokens 1 --precision bf16 \
  --kv-cache bf16 --dump-logits "$tmp/logits_bf16.npy" >/dev/null || fail "bf16 run"
"$bin" --model "$ts" --prompt-ids "$ids" --temperature 0 --max-new-tokens 1 --kv-cache f32 \
  --precision f32 --dump-logits "$tmp/logits_f32.npy" >/dev/null || fail "f32 run"
python3 - "$tmp/logits_bf16.npy" "$tmp/logits_f32.npy" <<'EOF' || fail "bf16 precision / kv"
import struct, sys
def load(p):
    raw = open(p, "rb").read(); hl = struct.unpack("<H", raw[8:10])[0]
    return struct.unpack("<%df" % ((len(raw) - 10 - hl) // 4), raw[10 + hl:])
a, b = load(sys.argv[1]), load(sys.argv[2])
# BF16 K/V (8 significant bits) moves the logits a little, not a lot
err = max(abs(x - y) for x, y in zip(a, b))
assert len(a) == len(b) == 40 * 2048 and 0 < err < 0.1, err
print("ok --precision bf16 --kv-cache bf16: max |logit diff| vs f32 %.3g" % err)
EOF
"$bin" --model "$ts" --prompt "Once upon a time," --chat-template plain --temperature 0 \
  --max-new-tokens 8 | sed 's/,"tokens_per_s":[^}]*//' >"$tmp/tpl" || fail "template run"
"$bin" --model "$ts" --prompt "Once upon a time," --temperature 0 \
  --max-new-tokens 8 | sed 's/,"tokens_per_s":[^}]*//' >"$tmp/notpl" || fail "no-template run"
cmp -s "$tmp/tpl" "$tmp/notpl" || fail "plain template without system should equal the bare prompt"
python3 -c "
import json; r=json.loads(open('$tmp/tpl').read()); assert r['prompt_tokens']==7, r
print('ok --chat-template plain')" || fail "template prompt tokens"

# 7. Bad input.

long=$(python3 -c "print(','.join(['1']*513))")
expect_error "the model's context is 512 positions" --model "$s260/stories260K.bin" --prompt-ids "$long"
expect_error "--precision f64: precision: 'f64' is not one of the allowed values" \
  --model "$s260/stories260K.bin" --prompt x --precision f64
expect_error "--kv-cache int2: kv_cache: 'int2' is not one of the allowed values" \
  --model "$s260/stories260K.bin" --prompt x --kv-cache int2
mkdir "$tmp/gpt2" && echo '{"model_type": "gpt2", "n_embd": 8}' >"$tmp/gpt2/config.json"
expect_error "model_type 'gpt2' is not supported" --model "$tmp/gpt2" --prompt-ids 1
expect_error "config.json" --model "$tmp/gpt2" --prompt-ids 1
# A broken copy of the llama fixture: drop one tensor, or transpose one's shape.
break_fixture() {  # $1 = out dir, $2 = drop|transpose
  mkdir -p "$1" && cp tests/fixtures/hf/llama/config.json "$1/"
  python3 - tests/fixtures/hf/llama/model.safetensors "$1/model.safetensors" "$2" <<'EOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
name = "model.layers.1.mlp.up_proj.weight"
out, blob = {}, b""
for k, v in hdr.items():
    if k == "__metadata__": out[k] = v; continue
    if k == name and sys.argv[3] == "drop": continue
    b, e = v["data_offsets"]
    shape = v["shape"][::-1] if k == name else v["shape"]
    out[k] = {"dtype": v["dtype"], "shape": shape, "data_offsets": [len(blob), len(blob) + e - b]}
    blob += data[b:e]
h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + blob)
EOF
}
if [ -f tests/fixtures/hf/llama/model.safetensors ]; then
  break_fixture "$tmp/drop" drop
  expect_error "missing tensor 'model.layers.1.mlp.up_proj.weight'" --model "$tmp/drop" --prompt-ids 1
  break_fixture "$tmp/transpose" transpose
  expect_error "tensor 'model.layers.1.mlp.up_proj.weight' has shape [64, 160], config.json implies [160, 64]" \
    --model "$tmp/transpose" --prompt-ids 1
fi
expect_error "no such file" --model "$tmp/none.bin" --prompt x
expect_error "give exactly one of" --model "$s260/stories260K.bin" --prompt x --prompt-ids 1
expect_error "--temperature hot: temperature: expected a number, got 'hot'" --model "$s260/stories260K.bin" --prompt x --temperature hot
printf '{"prompt": "ok"}\n{"text": "no prompt field"}\n' >"$tmp/bad.jsonl"
expect_error "bad.jsonl: line 2: field 'prompt' must be a string" \
  --model "$s260/stories260K.bin" --prompts "$tmp/bad.jsonl"
expect_error 'chat template "vicuna" is not supported' --model "$ts" --prompt x --chat-template vicuna
expect_error "--dump-logits needs a single prompt" --model "$s260/stories260K.bin" \
  --prompts "$tmp/prompts.jsonl" --dump-logits "$tmp/x.npy"
# Options through the config table: YAML file, unknown key, wrong type, out of range.
cat >"$tmp/gen.yaml" <<YAML
model: $s260/stories260K.bin
temperature: 0
max_new_tokens: 7
YAML
"$bin" --config "$tmp/gen.yaml" --prompt "Once upon a time" --max-new-tokens 5 >"$tmp/cfg" \
  || fail "config file run"
python3 -c "
import json; r=json.loads(open('$tmp/cfg').read())
assert len(r['token_ids'])==5 and r['token_ids']==[432,383,286,261,376], r  # CLI wins over YAML
print('ok --config YAML + override')" || fail "config file"
printf 'model: x\ntemprature: 0.5\n' >"$tmp/typo.yaml"
expect_error "typo.yaml:2:1: unknown key temprature (did you mean temperature?)" --config "$tmp/typo.yaml" --prompt x
printf 'max_new_tokens: lots\n' >"$tmp/type.yaml"
expect_error "type.yaml:1:17: max_new_tokens: expected an integer, got 'lots'" --config "$tmp/type.yaml" --prompt x
expect_error "--top-p 2: top_p = 2 is outside [1e-06, 1]" --model x --prompt y --top-p 2
expect_error "--bogus 1: unknown key bogus" --model x --prompt y --bogus 1
"$bin" --help-markdown | grep -qF '| `max_new_tokens` | int |' || fail "help-markdown lacks max_new_tokens"
# Fixes from a newcomer's trial.
# text is always a valid JSON string, even when sampling stops inside a UTF-8 character
"$bin" --model "$s260/stories260K.bin" --prompt hi --max-new-tokens 16 --temperature 50 --n 20 \
  --threads 1 --seed 0 >"$tmp/hot" || fail "hot sampling run"
python3 -c "
import json
rows=[json.loads(l) for l in open('$tmp/hot')]
assert len(rows)==20 and all(isinstance(r['text'], str) for r in rows), rows
assert any('\ufffd' in r['text'] for r in rows)  # seed 0 stops inside characters here
print('ok text always present (U+FFFD for cut characters)')" || fail "lossy text"
expect_error "tokenizer vocabulary 2048 is larger than the model's 512" \
  --model "$s260/stories260K.bin" --tokenizer "$ts/tokenizer.json" --prompt hi
expect_error "pass its folder" --model "$ts/model.safetensors" --prompt hi
mkfifo "$tmp/fifo"
timeout 10 "$bin" --model "$tmp/fifo" --prompt hi >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "not a regular file" "$tmp/err" || fail "FIFO model: $(cat "$tmp/err")"
if [ -w /dev/full ]; then
  "$bin" --model "$s260/stories260K.bin" --prompt hi --max-new-tokens 4 >/dev/full 2>"$tmp/err" \
    && fail "writing to /dev/full succeeded"
  grep -q "writing to stdout failed" "$tmp/err" || fail "/dev/full: $(cat "$tmp/err")"
  expect_error "not a regular file; refusing to replace it" --model "$s260/stories260K.bin" \
    --prompt hi --max-new-tokens 1 --dump-logits /dev/full
  [ -c /dev/full ] || fail "/dev/full was replaced"
fi

# Issue 20: a story ends at BOS, --stop-token-ids, --output text, unknown flags.
# stories260K, seed 6: BOS (id 1) is sampled as token 241 (the model's "next story").
story=(--model "$s260/stories260K.bin" --prompt "Once upon a time" --max-new-tokens 400 --seed 6 --threads 1)
"$bin" "${story[@]}" >"$tmp/bos" || fail "story run"
"$bin" "${story[@]}" --stop-at-bos false >"$tmp/nobos" || fail "story run without the BOS stop"
"$bin" "${story[@]}" --stop-token-ids 2,337 >"$tmp/stopid" || fail "story run with stop ids"
"$bin" "${story[@]}" --output text >"$tmp/text" || fail "story run --output text"
python3 - "$tmp/bos" "$tmp/nobos" "$tmp/stopid" "$tmp/text" <<'PY' || fail "BOS / stop ids / text output"
import json, sys
bos, nobos, stopid = (json.loads(open(p).read()) for p in sys.argv[1:4])
text = open(sys.argv[4]).read()
ids = nobos["token_ids"]
assert nobos["finish_reason"] == "length" and len(ids) == 400 and 1 in ids, nobos["finish_reason"]
k = ids.index(1)
# llama2.c models stop at BOS by default (run.c does), the BOS kept as the last token id
assert bos["finish_reason"] == "stop" and bos["token_ids"] == ids[:k + 1], (bos["finish_reason"], len(bos["token_ids"]))
assert "Once upon a time" not in bos["text"], bos["text"][-80:]
assert nobos["text"].startswith(bos["text"]) and len(nobos["text"]) > len(bos["text"])
# a stop id: the response ends at its first occurrence
j = ids.index(337)
assert j < k and stopid["finish_reason"] == "stop" and stopid["token_ids"] == ids[:j + 1], stopid
# plain text: the prompt, then the same continuation as the JSON text
assert text == "Once upon a time" + bos["text"] + "\n", (text[:80], bos["text"][:80])
print("ok story ends at BOS (stop, token %d), --stop-at-bos false runs on, --stop-token-ids, --output text" % (k + 1))
PY
expect_error "--stop-token-ids: '512' is not a token id in [0, 512)" "${story[@]}" --stop-token-ids 512
expect_error "--foo: unknown key foo" --model x --prompt y --foo
expect_error "--version: unknown key version" --version
echo "generate_cli: all checks passed"
