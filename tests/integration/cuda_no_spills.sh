#!/usr/bin/env bash
# Every CUDA kernel compiles without register spills (issue 5: "no kernel spills registers
# in its hot loop"): ptxas -v over each kernels/cuda/*.cu with the build's flags; a spill
# names the file and the kernel (a stack frame without spills, a local array, is printed
# as a note).  Needs nvcc only (no GPU): skipped (77)
# when the build has no CUDA compiler.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
nvcc=$(make -s print-nvcc 2>/dev/null)
[ -n "$nvcc" ] && [ -x "$nvcc" ] || { echo "skip: no nvcc in this build"; exit 77; }
tmp=$(mktemp -d /tmp/qrl-spills-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0 kernels=0
for f in kernels/cuda/*.cu; do
  "$nvcc" $(make -s print-nvflags) -Xptxas -v -c "$f" -o "$tmp/o.o" > "$tmp/log" 2>&1 ||
    { echo "FAIL: $f does not compile: $(tail -3 "$tmp/log")"; fails=$((fails + 1)); continue; }
  # ptxas prints "Compiling entry function 'NAME'" then "N bytes stack frame, N bytes spill
  # stores, N bytes spill loads" for each kernel
  out=$(awk -v f="$f" '/Compiling entry function/ { k = $0; sub(/.*function ./, "", k); sub(/. for .*/, "", k); n++ }
        /bytes spill stores/ { if ($5 != 0 || $9 != 0) print "FAIL: " f ": " k ": " $0
                               else if ($1 != 0) print "note: " f ": " k ": " $0 }
        END { print "kernels " n + 0 }' "$tmp/log")
  kernels=$((kernels + $(echo "$out" | awk '/^kernels/ { print $2 }')))
  echo "$out" | grep '^note' | sed 's/ \+/ /g'
  if echo "$out" | grep -q '^FAIL'; then echo "$out" | grep '^FAIL'; fails=$((fails + 1)); fi
done
[ "$kernels" -gt 0 ] || { echo "FAIL: ptxas reported no kernels"; exit 1; }
echo "$kernels kernels compiled, $fails files with spills"
[ $fails -eq 0 ]
