#!/usr/bin/env bash
# On a GPU machine with 2+ GPUs, in one call: build the weight-sync pieces (no CUDA kernels
# needed: LIBCUDA is left out), run the CPU unit test, the multi-process NCCL test and the
# weight-sync benchmark, and print a short summary last.  Logs and the JSON go to $OUT when set.
#   there:  bench/run-nccl-gpu.sh        (with .device-deps carried, as bench/run-gpu.sh)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-/tmp}
# NVLink multicast stays off on shared hosts (the device notes): NCCL, PyTorch, NVSHMEM
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source bench/device_env.sh
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4

# NCCL's header and library: the CUDA toolkit, the system, or the PyTorch wheel (nvidia-nccl-cu13);
# the header falls back to the copy staged beside the tree (.nccl-include, from the local wheel);
# QRL_NCCL_DIR=DIR (with include/ and lib/) comes first
inc=""; lib=""
for d in ${QRL_NCCL_DIR:-} /usr/local/cuda /usr \
         $(python3 -c 'import nvidia.nccl as n; print(*n.__path__)' 2>/dev/null) \
         $(ls -d /usr/local/lib/python3*/dist-packages/nvidia/nccl /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl 2>/dev/null); do
  [ -z "$inc" ] && [ -f "$d/include/nccl.h" ] && inc=$d/include
  [ -z "$lib" ] && lib=$(ls "$d"/lib/libnccl.so* "$d"/lib64/libnccl.so* "$d"/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -1)
done
[ -n "$lib" ] || lib=$(find /usr /opt -name 'libnccl.so*' 2>/dev/null | head -1)
[ -n "$inc" ] || { [ -f .nccl-include/nccl.h ] && inc=$PWD/.nccl-include; }
echo "nccl.h: ${inc:-NOT FOUND}  libnccl: ${lib:-NOT FOUND}"
mkdir -p /tmp/nccl/lib
ln -sfn "$inc" /tmp/nccl/include
ln -sf "$lib" /tmp/nccl/lib/libnccl.so
ln -sf "$lib" /tmp/nccl/lib/libnccl.so.2
export LD_LIBRARY_PATH=/tmp/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
grep -m3 -E '^#define NCCL_(MAJOR|MINOR|PATCH)' "$inc/nccl.h" | tr '\n' ' '; echo
b=build-gpu
t0=$(date +%s)
make -j"$(nproc)" BUILD=$b LIBCUDA= NCCL_HOME=/tmp/nccl $b/tests/unit/test_wsync $b/tests/cuda/test_nccl_bcast \
  $b/bench/weight_sync > "$out/build.log" 2>&1; rc_b=$?
echo "build rc=$rc_b in $(( $(date +%s) - t0 )) s"
[ $rc_b -eq 0 ] || { grep -E 'error:|undefined reference|No rule' "$out/build.log" | head -30; exit 1; }

$b/tests/unit/test_wsync --jobs=1 > "$out/test_wsync.log" 2>&1; rc_u=$?
tail -1 "$out/test_wsync.log"
t0=$(date +%s)
NCCL_DEBUG=WARN timeout 170 $b/tests/cuda/test_nccl_bcast --jobs=1 --verbose > "$out/test_nccl_bcast.log" 2>&1; rc_t=$?
echo "test_nccl_bcast rc=$rc_t in $(( $(date +%s) - t0 )) s"
grep -aE '^\[(PASS|FAIL|SKIP|----)\]|Synthesis|nccl_bcast |refused|dead:|init alone|rank [0-9]' "$out/test_nccl_bcast.log" | grep -v '^\[----\]   $' | head -60

mkdir -p bench/results
t0=$(date +%s)
timeout 110 $b/bench/weight_sync --out "$out/weight_sync-h200x2.json" > "$out/weight_sync.log" 2>&1; rc_w=$?
echo "weight_sync rc=$rc_w in $(( $(date +%s) - t0 )) s"
cat "$out/weight_sync.log"
echo "summary: unit rc=$rc_u nccl-test rc=$rc_t bench rc=$rc_w"
