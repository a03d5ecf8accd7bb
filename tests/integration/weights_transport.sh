#!/usr/bin/env bash
# qrl-learner weights.transport (docs/weight-sync.md) at start, no broker needed:
#   - a transport that is not tcp|nccl|auto is refused by the config table;
#   - nccl on a machine without a GPU (or a build without NCCL) is refused with an error
#     that names the setting and the way out, before anything is started.
# The NCCL path itself runs in tests/cuda/test_nccl_bcast.c (make test-cuda, 2 GPUs).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
learner=$build/bin/qrl-learner
data_dir=${QRL_DATA_DIR:-../shared/data}/llama2c_stories260K
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$learner" ] || fail "$learner is not built"
[ -f "$data_dir/stories260K.bin" ] || fail "$data_dir/stories260K.bin missing"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qrl-wt-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
printf '{"prompt":"Once upon a time","answer":"the"}\n' >"$tmp/data.jsonl"
common=(--learner.model "$data_dir/stories260K.bin" --learner.tokenizer "$data_dir/tok512.bin"
        --dataset.path "$tmp/data.jsonl" --dataset.chat_template none --dataset.task contains
        --learner.threads 1 --rpc.listen 127.0.0.1:0 --weights.listen 127.0.0.1:0)

out=$(timeout 60 "$learner" "${common[@]}" --weights.transport rdma 2>&1) && fail "weights.transport=rdma accepted"
echo "$out" | grep -q "weights.transport" || fail "rdma refused without naming the key: $out"
echo "unknown transport refused: $(echo "$out" | grep -m1 weights.transport)"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: a GPU is visible here, nccl would start"; exit 77
fi
out=$(timeout 60 "$learner" "${common[@]}" --weights.transport nccl 2>&1) && fail "weights.transport=nccl accepted without a GPU"
echo "$out" | grep -q "qrl-learner: error: weights.transport=nccl: this learner has no CUDA device or was built without NCCL (use tcp or auto)" ||
  fail "nccl without a GPU: $out"
echo "nccl without a GPU refused: $(echo "$out" | grep -m1 'error:')"
