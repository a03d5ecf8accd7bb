# Shared setup of the cluster tests (sourced by tests/integration/*.sh and tests/long/*.sh;
# not a test itself).  After `source tests/support/cluster.sh NAME`:
#   - the working directory is the repository root; $build, $kafka, $learner, $rollout,
#     $model and $tokenizer (stories260K) are set, QRL_KAFKA_ADMIN is exported;
#   - $tmp is a fresh folder /tmp/qrl-NAME-test.XXXXXX; `pids+=($!)` registers a process;
#     on every exit each registered process is killed, the broker of $tmp/kafka stopped,
#     and on failure the last lines of $tmp/*.log printed; $tmp is removed unless
#     QRL_KEEP_TMP=1;
#   - helpers: fail MSG, secs T0, count FILE PATTERN, wait_log FILE PATTERN N TIMEOUT_S,
#     need_kafka (skip with 77 without java or the jars, unless QRL_REQUIRE_KAFKA=1),
#     start_broker [PARTITIONS] (sets $bootstrap, creates the qrl topics),
#     log_port FILE (the port of FILE's "rpc listening port=N" line, waiting for it).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
kafka=deploy/kafka/kafka.sh
kafka_home=${QRL_KAFKA_HOME:-${QRL_DEPS:-$root/.deps}/kafka}
export QRL_KAFKA_ADMIN=$build/bin/qrl-kafka-admin
learner=$build/bin/qrl-learner
rollout=$build/bin/qrl-rollout
data_dir=${QRL_DATA_DIR:-../shared/data}/llama2c_stories260K
model=$data_dir/stories260K.bin
tokenizer=$data_dir/tok512.bin

fail() { echo "FAIL: $*"; exit 1; }
secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
count() { local n; n=$(grep -c -- "$2" "$1" 2>/dev/null); echo "${n:-0}"; }
# wait_log FILE PATTERN N TIMEOUT_S: until PATTERN occurs N times in FILE
wait_log() {
  local end=$((SECONDS + $4))
  while [ "$(count "$1" "$2")" -lt "$3" ]; do
    [ $SECONDS -lt $end ] || fail "timed out waiting for '$2' x$3 in $1"
    sleep 0.1
  done
}
need_kafka() {
  if ! command -v java >/dev/null || [ ! -f "$kafka_home/libs/.stamp" ]; then
    [ "${QRL_REQUIRE_KAFKA:-0}" = 1 ] && fail "no java / Kafka jars, and QRL_REQUIRE_KAFKA=1"
    echo "skipped: no java or Kafka jars (run deploy/setup.sh)"; exit 77
  fi
}
start_broker() {
  bootstrap=$("$kafka" start --dir "$tmp/kafka" --port 0 | sed -n 's/^BOOTSTRAP=//p')
  [ -n "$bootstrap" ] || fail "kafka.sh start printed no BOOTSTRAP"
  "$kafka" create-topics --bootstrap "$bootstrap" --partitions "${1:-4}" >/dev/null 2>&1 ||
    fail "creating topics on $bootstrap"
}
log_port() {
  wait_log "$1" "rpc listening port=[0-9]" 1 30
  sleep 0.2 # the line may still be half written when grep first sees it
  sed -n 's/.*rpc listening port=\([0-9]*\).*/\1/p' "$1" | head -1
}

for f in "$learner" "$rollout" "$QRL_KAFKA_ADMIN"; do
  [ -x "$f" ] || fail "$f is not built (make test builds it)"
done
[ -f "$model" ] && [ -f "$tokenizer" ] || fail "$model or $tokenizer missing"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/qrl-${1:-cluster}-test.XXXXXX")
pids=()
cluster_cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do { kill -KILL "$p" && wait "$p"; } 2>/dev/null || true; done
  [ -d "$tmp/kafka" ] && { "$kafka" stop --dir "$tmp/kafka" --timeout 20 >/dev/null 2>&1 || true; }
  if [ $rc -ne 0 ]; then
    for l in "$tmp"/*.log; do
      [ -f "$l" ] && { echo "--- last lines of $l:"; grep -v ' DEBUG ' "$l" | tail -n 25; }
    done
  fi
  [ "${QRL_KEEP_TMP:-0}" = 1 ] || rm -rf "$tmp"
  exit $rc
}
trap cluster_cleanup EXIT
trap 'exit 130' INT TERM
