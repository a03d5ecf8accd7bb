#!/usr/bin/env bash
# On the GPU machine: build and run the CUDA training tests (kernels and whole engine vs the
# CPU engine, 2-GPU data parallel when 2 GPUs are visible) and bench/train_step; logs
# under $OUT when set.  Here: carry .device-deps (../shared/tools/device-deps.sh).
#   bench/run-train-gpu.sh [tests|bench|all] [train_step args...]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what=${1:-all}; shift || true
out=${OUT:-/tmp}
if [ -f .device-deps/env.sh ]; then
  source .device-deps/env.sh
  export PATH=/opt/qrl-deps/usr/bin:$PATH
fi
export NCCL_NVLS_ENABLE=0
[ -d .stage-data ] && export QRL_DATA_DIR=$PWD/.stage-data   # ../shared/data staged here
tests="test_cuda_train_ops test_cuda_train_attn test_cuda_train test_cuda_learner"
targets=""
for t in $tests; do [ -f tests/cuda/$t.c ] && targets="$targets build-gpu/tests/cuda/$t"; done
rc=0
# a failed build fails the run (old binaries may survive in build-gpu between calls)
make -k -j"$(nproc)" BUILD=build-gpu $targets build-gpu/bench/train_step > "$out/train-build.log" 2>&1 \
  || { grep -E 'error:|Error [0-9]|undefined reference' "$out/train-build.log" | head -30; rc=1; }
if [ "$what" != bench ]; then
  for t in $tests; do
    [ -x build-gpu/tests/cuda/$t ] || { echo "$t: not built"; rc=1; continue; }
    build-gpu/tests/cuda/$t --verbose > "$out/$t.log" 2>&1; r=$?
    grep -E "^train |^recompute|^data parallel|^learner|attn|FAIL|Assert|CRASH|Synthesis" "$out/$t.log" | tail -40
    echo "$t rc=$r"; [ $r -eq 0 ] || rc=1
  done
fi
if [ "$what" != tests ]; then
  build-gpu/bench/train_step "$@" 2>&1 | tee "$out/train_step.log"; r=${PIPESTATUS[0]}
  case " $* " in *" --out "*) ;; *) cp bench/results/train_step-h200.json "$out/" 2>/dev/null ;; esac
  [ $r -eq 0 ] || rc=1
fi
exit $rc
