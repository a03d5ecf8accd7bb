#!/usr/bin/env bash
# On the GPU machine (issue 18): the built-in arithmetic task through the GPU launcher
# (deploy/local/launch.sh --device cuda, compared with the CPU run of the same seed in
# docs/demo.md), then the end-to-end loop at the late length (4096 new tokens) for BF16
# and the int4-protected KV cache (bench/e2e.sh).  Carry .device-deps, .device-kafka and
# .device-data.   there:  bench/run-loop-gpu.sh OUTDIR
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
out=${1:-/tmp/qrl-loop-out}
mkdir -p "$out"
source bench/device_env.sh
make -j"$(nproc)" all bench > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
timeout 240 deploy/local/launch.sh --device cuda --seed 3 --sft-threads 1 --run-dir "$out/arith-run" \
  > "$out/arith.txt" 2>&1; echo "arith launch rc=$? after $((SECONDS - t0)) s"
cp "$out/arith-run/summary.txt" "$out/arith-summary.txt" 2>/dev/null
tail -25 "$out/arith.txt"
rm -rf "$out/arith-run"
left=$((560 - (SECONDS - t0)))
E2E_NAME=e2e-h200-late bench/run-e2e-gpu.sh "$out" --configs \
  'qwen3-1.7b/bf16/late/overlap,qwen3-1.7b/int4kv/late/overlap' --updates 3 --quota 8 --budget-s "$left" \
  > "$out/late.txt" 2>&1
tail -40 "$out/late.txt"
rm -rf "$out"/e2e-h200-late-work
echo "summary: $((SECONDS - t0)) s"
