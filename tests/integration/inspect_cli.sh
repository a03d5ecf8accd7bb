#!/usr/bin/env bash
# qrl-inspect on good and bad safetensors files made in a temp folder: listings on stdout
# and exit 0 for good input; exit 1 and exactly one stderr line naming the file and the
# field for bad input.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
bin=${BUILD:-build}/bin/qrl-inspect
[ -x "$bin" ] || { echo "missing $bin (run make)"; exit 1; }
tmp=$(mktemp -d /tmp/qrl-inspect-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# mkst FILE HEADER_JSON DATA: 8-byte little-endian header length, header, data
mkst() {
  local n=${#2}
  printf "$(printf '\\%03o\\%03o\\%03o\\%03o\\000\\000\\000\\000' $((n & 255)) $(((n >> 8) & 255)) \
    $(((n >> 16) & 255)) $(((n >> 24) & 255)))" >"$1"
  printf '%s%s' "$2" "$3" >>"$1"
}

# expect_ok PATH EXPECTED_STDOUT
expect_ok() {
  local out rc
  out=$("$bin" "$1" 2>"$tmp/err"); rc=$?
  [ $rc -eq 0 ] || { fail "$1: exit $rc: $(cat "$tmp/err")"; return; }
  [ -s "$tmp/err" ] && fail "$1: unexpected stderr: $(cat "$tmp/err")"
  [ "$out" = "$2" ] || fail "$1: stdout was:"$'\n'"$out"$'\n'"expected:"$'\n'"$2"
}

# expect_bad PATH WORD...: exit 1, one stderr line with the prefix, the file name and words
expect_bad() {
  local path=$1 rc lines msg w before=$fails; shift
  "$bin" "$path" >"$tmp/out" 2>"$tmp/err"; rc=$?
  msg=$(cat "$tmp/err")
  [ $rc -eq 1 ] || fail "$path: exit $rc, expected 1 ($msg)"
  [ -s "$tmp/out" ] && fail "$path: printed a listing despite the error"
  lines=$(wc -l <"$tmp/err")
  [ "$lines" -eq 1 ] || fail "$path: stderr has $lines lines: $msg"
  [[ $msg == "qrl-inspect: error: "* ]] || fail "$path: no 'qrl-inspect: error:' prefix: $msg"
  [[ $msg == *"$(basename "$path")"* ]] || fail "$path: message does not name the file: $msg"
  for w in "$@"; do [[ $msg == *"$w"* ]] || fail "$path: message lacks '$w': $msg"; done
  [ $fails -eq $before ] && echo "ok   bad: $msg"
}

# ---- good input -----------------------------------------------------------------------
mkst "$tmp/good.safetensors" \
  '{"__metadata__":{"format":"pt"},"w1":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"s":{"dtype":"I64","shape":[],"data_offsets":[24,32]}}' \
  '0123456789abcdef012345--01234567'
expect_ok "$tmp/good.safetensors" "b BF16 [3] 6
s I64 [] 8
w1 F32 [2, 2] 16"

mkdir -p "$tmp/sharded"
mkst "$tmp/sharded/model-00001-of-00002.safetensors" \
  '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}' 'xy'
mkst "$tmp/sharded/model-00002-of-00002.safetensors" \
  '{"c":{"dtype":"F16","shape":[1,2],"data_offsets":[0,4]}}' 'wxyz'
printf '%s' '{"metadata":{"total_size":6},"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}' \
  >"$tmp/sharded/model.safetensors.index.json"
expect_ok "$tmp/sharded" "a U8 [2] 2
c F16 [1, 2] 4"
expect_ok "$tmp/sharded/model.safetensors.index.json" "a U8 [2] 2
c F16 [1, 2] 4"

model=${QRL_DATA_DIR:-../shared/data}/tinystories_656k/model.safetensors
if [ -r "$model" ]; then
  out=$("$bin" "$model") || fail "$model: exit $?"
  [ "$(wc -l <<<"$out")" -eq 20 ] || fail "$model: expected 20 tensors"
  grep -qx 'model.embed_tokens.weight BF16 \[2048, 128\] 524288' <<<"$out" ||
    fail "$model: embed_tokens line missing"
else
  echo "note: $model absent, real-model check skipped"
fi

# ---- bad input ------------------------------------------------------------------------
printf 'abc' >"$tmp/short.safetensors"
expect_bad "$tmp/short.safetensors" "field header_length" "3 bytes"
head -c 30 "$tmp/good.safetensors" >"$tmp/cut.safetensors"
expect_bad "$tmp/cut.safetensors" "field header_length"
mkst "$tmp/range.safetensors" '{"w1":{"dtype":"F32","shape":[50],"data_offsets":[100,300]}}' '0123456789abcdef'
expect_bad "$tmp/range.safetensors" "tensor 'w1' field data_offsets" "[100, 300) exceeds the data region (16 bytes)"
mkst "$tmp/overlap.safetensors" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' '0123456789ab'
expect_bad "$tmp/overlap.safetensors" "tensor 'b' field data_offsets" "overlaps tensor 'a'"
mkst "$tmp/dtype.safetensors" '{"w":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}}' 'x'
expect_bad "$tmp/dtype.safetensors" "tensor 'w' field dtype" "'F4'"
mkst "$tmp/size.safetensors" '{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}' '01234567'
expect_bad "$tmp/size.safetensors" "tensor 'w' field data_offsets" "need 12"
mkst "$tmp/json.safetensors" '{"w":{"dtype":"F32",' ''
expect_bad "$tmp/json.safetensors" "field header" "invalid JSON"
mkst "$tmp/shape.safetensors" '{"w":{"dtype":"U8","shape":[-4],"data_offsets":[0,0]}}' ''
expect_bad "$tmp/shape.safetensors" "tensor 'w' field shape"
mkst "$tmp/order.safetensors" '{"w":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}}' 'ab'
expect_bad "$tmp/order.safetensors" "tensor 'w' field data_offsets" "begin 2 > end 1"
mkst "$tmp/nl.safetensors" '{"a\nb\u0007":{"dtype":"??","shape":[],"data_offsets":[0,0]}}' ''
expect_bad "$tmp/nl.safetensors" "field dtype"
expect_bad "$tmp/absent.safetensors" "cannot open"
printf '%s' '{"weight_map":{"a":"model-00001-of-00002.safetensors","q":"model-00009.safetensors"}}' \
  >"$tmp/sharded/model.safetensors.index.json"
expect_bad "$tmp/sharded/model.safetensors.index.json" "tensor 'q' field weight_map" "model-00009.safetensors"
printf '%s' '{"weight_map":{"a":"model-00001-of-00002.safetensors","q":"model-00002-of-00002.safetensors"}}' \
  >"$tmp/sharded/model.safetensors.index.json"
expect_bad "$tmp/sharded/model.safetensors.index.json" "tensor 'q' field weight_map" "not found in shard"

# ---- usage ----------------------------------------------------------------------------
"$bin" --help >"$tmp/out" 2>&1 || fail "--help exit $?"
grep -q '^usage: qrl-inspect FILE_OR_DIR' "$tmp/out" || fail "--help prints no usage"
# a usage error: exit 1 (as every qrl program) with one "qrl-inspect: error:" line
err=$("$bin" 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && [[ $err == "qrl-inspect: error: expected one FILE_OR_DIR argument"* ]] ||
  fail "no argument: exit $rc, expected 1: $err"
err=$("$bin" --version 2>&1 >/dev/null); rc=$?
[ $rc -eq 1 ] && [[ $err == "qrl-inspect: error: unknown option '--version'"* ]] || fail "--version: exit $rc: $err"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "inspect_cli: all checks passed"
