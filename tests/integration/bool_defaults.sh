#!/usr/bin/env bash
# A bool key's default reads the same in --help and in --print-config (which writes the
# parsed value, true/false): the config tables spell bool defaults true or false, not
# on/off or yes/no.  Checked over every program whose --help lists bool keys.
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
bin=${BUILD:-build}/bin
fails=0; checked=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

for p in qrl-learner qrl-rollout qrl-eval qrl-sft qrl-generate; do
  [ -x "$bin/$p" ] || { fail "$bin/$p is not built"; continue; }
  help=$(timeout 30 "$bin/$p" --help </dev/null 2>&1) || { fail "$p --help: exit $?"; continue; }
  printed=$(timeout 30 "$bin/$p" --print-config </dev/null 2>&1) || { fail "$p --print-config: exit $?"; continue; }
  # "  --learner.trace_guidance=<bool>  default: true" -> "learner.trace_guidance true"
  while read -r key def; do
    got=$(grep -E "^$key: " <<<"$printed" | sed -E 's/^[^:]+: ([^ ]+).*/\1/')
    checked=$((checked + 1))
    [ "$got" = "$def" ] || fail "$p $key: --help says default '$def', --print-config says '$got'"
  done < <(sed -nE 's/^  --([a-z0-9_.]+)=<bool>  default: ([^ ]+).*/\1 \2/p' <<<"$help")
done
[ $checked -gt 10 ] || fail "only $checked bool keys found in the programs' --help (format changed?)"
[ $fails -eq 0 ] && echo "ok: $checked bool defaults agree between --help and --print-config" && exit 0
exit 1
