#!/usr/bin/env bash
# The docs' commands run (issue 20 item 9; docs/runnable-docs.md): every command block of
# README.md and docs/*.md marked <!-- runnable --> is executed by
# tests/support/docs_commands.py in a sandbox (qrlctl examples against the stand-in learner
# tests/integration/rpc_test_server), each with a time limit, so that a renamed key or
# option breaks this test instead of the reader.  Also checks what a newcomer reads first:
# README and docs/demo.md agree on the demo's time, README tells a CPU-only machine how to
# skip the CUDA toolchain, no doc promises a GGUF loader.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
for b in qrl-generate qrl-eval qrl-task qrl-verify qrl-inspect qrlctl qrl-learner qrl-rollout; do
  [ -x "$build/bin/$b" ] || { echo "FAIL: $build/bin/$b is not built"; exit 1; }
done
[ -x "$build/tests/integration/rpc_test_server" ] || { echo "FAIL: $build/tests/integration/rpc_test_server is not built"; exit 1; }
tmp=$(mktemp -d /tmp/qrl-docs-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

out=$(python3 tests/support/docs_commands.py "$root" "$build" "$tmp" 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "runnable doc blocks failed"
n=$(sed -n 's/^\([0-9]*\) runnable blocks run.*/\1/p' <<<"$out")
[ "${n:-0}" -ge 9 ] || fail "only ${n:-0} runnable blocks found (a marker lost?)"

# what README.md and docs/demo.md say must agree and hold
demo_min=$(sed -n 's/.*\*\*\([0-9]*\) min [0-9]* s wall\*\*.*/\1/p' docs/demo.md | head -1)
readme=$(tr '\n' ' ' <README.md)
grep -qE "About ${demo_min:-X} +minutes on 2 CPU cores" <<<"$readme" ||
  fail "README's demo time disagrees with docs/demo.md's measured ${demo_min:-?} min run: $(grep -oE 'About [0-9-]+ +minutes on 2 CPU cores' <<<"$readme")"
grep -q "QRL_SETUP_SKIP_CUDA=1" README.md || fail "README does not say how a CPU-only machine skips the CUDA toolchain"
grep -rniE "gguf" README.md docs/*.md | grep -viE "no gguf|not (read|supported)|gguf is not|is not read|none exists" &&
  fail "a doc promises GGUF loading (there is no GGUF loader)"

[ $fails -eq 0 ] && echo "ok: the docs' runnable commands" && exit 0
exit 1
