#!/usr/bin/env bash
# deploy/k8s validated offline (issue 21): deploy/k8s/validate.py with the Kubernetes
# OpenAPI schemas of the `kubernetes-validate` package (PyPI; installed here into
# $BUILD/k8s-validate on first use) and qrl's Strimzi v1 schemas; then broken copies of the
# manifests must be refused, each with its own message: an unknown field (strict schema),
# an unknown qrl config key, a bad enum value, a PVC nobody defines, min.insync.replicas
# equal to the replicas, a negative partition count, a probe on a port that does not exist.
# The config files of deploy/systemd/ are checked against the config tables too.
# Skips (77) when the package cannot be installed (no network, no pip).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
venv=$build/k8s-validate
py=$venv/bin/python
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qrl-k8s-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
t0=$(date +%s.%N)
if ! "$py" -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null; then
  rm -rf "$venv"
  if ! { python3 -m venv "$venv" && timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check \
           'kubernetes-validate>=1.31'; } >"$tmp/pip.log" 2>&1; then
    tail -5 "$tmp/pip.log"
    rm -rf "$venv"
    echo "skipped: kubernetes-validate could not be installed from PyPI"
    exit 77
  fi
fi
echo "validator: kubernetes-validate $("$py" -c 'import kubernetes_validate as k; print(k.__version__)' 2>/dev/null ||
  "$venv/bin/pip" show kubernetes-validate | sed -n 's/^Version: //p') ready in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"

"$py" deploy/k8s/validate.py >"$tmp/out.txt" || { cat "$tmp/out.txt"; fail "deploy/k8s does not validate"; }
tail -1 "$tmp/out.txt"
grep -q '^ok    rollout.yaml#0 Deployment/qrl-rollout (Kubernetes .* schema, strict)$' "$tmp/out.txt" || fail "Deployment not schema-checked"
grep -q '^ok    kafka.yaml#1 Kafka/qrl-kafka (Strimzi v1 schema)$' "$tmp/out.txt" || fail "Kafka not schema-checked"
grep -q 'ConfigMap/qrl-rollout-config rollout.yaml: [0-9]* keys of qrl-rollout with valid values' "$tmp/out.txt" ||
  fail "rollout config not checked"

# the systemd units' config files (deploy/systemd/) against the same config tables
"$py" deploy/k8s/validate.py --qrl-config qrl-learner=deploy/systemd/learner.yaml \
  --qrl-config qrl-rollout=deploy/systemd/rollout.yaml >"$tmp/sd.txt" || { cat "$tmp/sd.txt"; fail "deploy/systemd configs"; }
grep -c '^ok ' "$tmp/sd.txt" | grep -qx 2 || fail "systemd configs not both checked: $(cat "$tmp/sd.txt")"
echo "deploy/systemd/learner.yaml, rollout.yaml: $(grep -o '[0-9]* keys of qrl-[a-z]*' "$tmp/sd.txt" | tr '\n' ' ')valid"

# broken copies: FILE, sed expression, the error wanted
refuse() {
  rm -rf "$tmp/k8s"; cp -r deploy/k8s "$tmp/k8s"
  sed -i "$2" "$tmp/k8s/$1"
  cmp -s "deploy/k8s/$1" "$tmp/k8s/$1" && fail "sed '$2' changed nothing in $1"
  local rc=0
  "$py" deploy/k8s/validate.py "$tmp/k8s" >"$tmp/bad.txt" 2>&1 || rc=$?
  [ $rc -eq 1 ] || { cat "$tmp/bad.txt"; fail "$1 with '$2' accepted (exit $rc)"; }
  grep -q -- "$3" "$tmp/bad.txt" || { grep ERROR "$tmp/bad.txt"; fail "$1 with '$2': no error matching '$3'"; }
  echo "refused: $(grep -m1 -- "$3" "$tmp/bad.txt" | cut -c1-160)"
}
refuse learner.yaml 's/terminationGracePeriodSeconds: 600/terminationGracePeriodSecond: 600/' \
  "StatefulSet/qrl-learner: spec.template.spec: Additional properties are not allowed ('terminationGracePeriodSecond'"
refuse config.yaml 's/^      quota: 128/      quotas: 128/' "learner.quotas: not a qrl-learner key"
refuse config.yaml 's/precision: w8a8-fp8/precision: w8a8-fp9/' "rollout.precision: 'w8a8-fp9' is not one of"
refuse config.yaml 's/heartbeat_timeout_ms: 15000/heartbeat_timeout_ms: 15s/' "learner.heartbeat_timeout_ms: '15s' is no int"
refuse rollout.yaml 's/claimName: qrl-models/claimName: qrl-model/' "volume models: no PVC qrl-model"
refuse kafka.yaml '/name: qrl.results/,/max.message.bytes/s/min.insync.replicas: 2/min.insync.replicas: 3/' \
  "KafkaTopic/qrl.results: min.insync.replicas 3 must be < replicas 3"
refuse kafka.yaml '0,/partitions: 64/s//partitions: -1/' "spec.partitions: -1 is less than the minimum of 1"
refuse rollout.yaml 's/port: metrics/port: metric/' "livenessProbe: no container port named metric"
refuse config.yaml 's|bootstrap: qrl-kafka-kafka-bootstrap.qrl.svc:9092|bootstrap: kafka:9092|' \
  "is not the Strimzi bootstrap qrl-kafka-kafka-bootstrap.qrl.svc:9092"
echo "k8s manifests test passed"
