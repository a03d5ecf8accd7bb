#!/usr/bin/env bash
# Round trip through a real single-node Kafka broker (deploy/kafka/kafka.sh):
# start it in a temp dir on a free port, create the qrl topics, run
# kafka_roundtrip before-restart (idempotent produce, group commits and redelivery,
# a 6 MiB record, dead letters, error paths), stop and restart the broker on the same
# data dir and port, run kafka_roundtrip after-restart (records and commits kept), stop.
# Whatever it started is stopped on every exit path.
#
# Skips (exit 77) when java or the Kafka jars are missing, unless QRL_REQUIRE_KAFKA=1
# (CI), where that is a failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
kafka=deploy/kafka/kafka.sh
home=${QRL_KAFKA_HOME:-${QRL_DEPS:-$root/.deps}/kafka}
prog=$build/tests/integration/kafka_roundtrip
export QRL_KAFKA_ADMIN=$build/bin/qrl-kafka-admin

unavailable() {
  if [ "${QRL_REQUIRE_KAFKA:-0}" = 1 ]; then
    echo "FAIL: $1, and QRL_REQUIRE_KAFKA=1"; exit 1
  fi
  echo "skipped: $1 (run deploy/setup.sh)"; exit 77
}
command -v java >/dev/null || unavailable "java not found"
[ -f "$home/libs/.stamp" ] || unavailable "no Kafka jars in $home/libs"
for f in "$prog" "$QRL_KAFKA_ADMIN"; do
  [ -x "$f" ] || { echo "FAIL: $f is not built (make test builds it)"; exit 1; }
done

data=$(mktemp -d "${TMPDIR:-/tmp}/qrl-kafka-test.XXXXXX")
cleanup() {
  local rc=$?
  "$kafka" stop --dir "$data" --timeout 20 || true
  if [ $rc -ne 0 ] && [ -f "$data/logs/server.log" ]; then
    echo "--- last lines of the broker log ($data/logs/server.log):"
    tail -n 40 "$data/logs/server.log"
  fi
  rm -rf "$data"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
t_all=$(date +%s.%N)

t=$(date +%s.%N)
bootstrap=$("$kafka" start --dir "$data" --port 0 | sed -n 's/^BOOTSTRAP=//p')
[ -n "$bootstrap" ] || { echo "FAIL: kafka.sh start printed no BOOTSTRAP"; exit 1; }
echo "broker started at $bootstrap in $(secs "$t") s (first start: includes formatting)"
port=${bootstrap##*:}

"$kafka" create-topics --bootstrap "$bootstrap" --partitions 4
# create-topics again: idempotent
"$kafka" create-topics --bootstrap "$bootstrap" --partitions 4
"$QRL_KAFKA_ADMIN" describe --bootstrap "$bootstrap" --topics qrl.prompts,qrl.results,qrl.trace,qrl.dlq

QRL_KAFKA_BOOTSTRAP=$bootstrap "$prog" before-restart

"$kafka" stop --dir "$data"
if "$kafka" status --dir "$data"; then echo "FAIL: status says serving after stop"; exit 1; fi
t=$(date +%s.%N)
again=$("$kafka" start --dir "$data" --port "$port" | sed -n 's/^BOOTSTRAP=//p')
[ "$again" = "$bootstrap" ] || { echo "FAIL: restart gave '$again', want $bootstrap"; exit 1; }
echo "broker restarted on the same data in $(secs "$t") s"
# a second start while it runs is a no-op that prints the same bootstrap
[ "$("$kafka" start --dir "$data" --port "$port" | sed -n 's/^BOOTSTRAP=//p')" = "$bootstrap" ]
"$kafka" status --dir "$data"

QRL_KAFKA_BOOTSTRAP=$bootstrap "$prog" after-restart

"$kafka" stop --dir "$data"
echo "kafka round trip passed in $(secs "$t_all") s"
