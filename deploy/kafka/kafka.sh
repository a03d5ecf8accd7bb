#!/usr/bin/env bash
# A single-node Apache Kafka 4.x (KRaft: broker and controller in one JVM) on loopback,
# for qrl's tests and demo.  See docs/kafka.md.
#
#   kafka.sh start --dir DATA_DIR [--port PORT] [--controller-port P] [--timeout S]
#                  [--host ADDR] [--cluster-id ID] [--prop KEY=VALUE]...
#       Writes DATA_DIR/server.properties, formats DATA_DIR/data on first use (the cluster
#       id is kept in DATA_DIR/cluster.id, so a restart keeps all data), starts the broker
#       in the background and waits until it serves.  Prints BOOTSTRAP=127.0.0.1:PORT.
#       PORT defaults to 19092; 0 picks a free port.  Already running: prints the same.
#       Multi-broker quorum (tests/multihost/): --host binds ADDR instead of 127.0.0.1,
#       --cluster-id formats with a shared id, each --prop line overrides the written
#       config (node.id, controller.quorum.voters, replication factors, ...).
#   kafka.sh create-topics --bootstrap B [--partitions N] [--topics a,b] [--max-message-bytes N]
#                          [--replication-factor R]
#       Creates qrl.prompts, qrl.results, qrl.trace, qrl.dlq (or --topics) if missing.
#   kafka.sh stop --dir DATA_DIR [--timeout S]
#       SIGTERM (controlled shutdown), SIGKILL after S seconds (default 30).
#   kafka.sh status --dir DATA_DIR
#       Exit 0 and "serving ..." when it answers, 1 when running but not answering,
#       3 when not running.
#   kafka.sh warm
#       Start and stop a throwaway broker once, so the JVM class-data archive that
#       halves start-up exists (deploy/kafka/fetch.sh runs it; a no-op when it exists).
#
# Environment: QRL_KAFKA_HOME (jars in $QRL_KAFKA_HOME/libs; default $QRL_DEPS/kafka, <repo>/.deps/kafka),
# QRL_KAFKA_HEAP (default 512m), JAVA (default java), QRL_KAFKA_ADMIN (the C admin tool;
# default <repo>/build/bin/qrl-kafka-admin; without it the Java tools are used, slower).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
kafka_home=${QRL_KAFKA_HOME:-${QRL_DEPS:-$root/.deps}/kafka}
[ -d "$kafka_home" ] && kafka_home=$(cd "$kafka_home" && pwd)  # the JVM runs in DATA_DIR
libs="$kafka_home/libs"
java=${JAVA:-java}
heap=${QRL_KAFKA_HEAP:-512m}
admin=${QRL_KAFKA_ADMIN:-$root/build/bin/qrl-kafka-admin}
default_topics=qrl.prompts,qrl.results,qrl.trace,qrl.dlq
max_message_bytes=16777216   # QRL_KAFKA_MAX_MESSAGE_BYTES in common/kafka/kafka.h

say() { printf 'kafka: %s\n' "$*" >&2; }
die() { printf 'kafka: error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---- options -------------------------------------------------------------------------
cmd=${1:-}; [ $# -gt 0 ] && shift
dir="" port=19092 cport="" timeout="" bootstrap="" partitions=4 topics=$default_topics
host=127.0.0.1 cluster_id="" rf=1 props=()
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --controller-port) cport=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --bootstrap) bootstrap=$2; shift 2 ;;
    --partitions) partitions=$2; shift 2 ;;
    --topics) topics=$2; shift 2 ;;
    --max-message-bytes) max_message_bytes=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --cluster-id) cluster_id=$2; shift 2 ;;
    --prop) props+=("$2"); shift 2 ;;
    --replication-factor) rf=$2; shift 2 ;;
    -h|--help) usage ;;
    *) say "unknown option $1"; usage ;;
  esac
done
need_dir() { [ -n "$dir" ] || die "$cmd needs --dir DATA_DIR"; mkdir -p "$dir"; dir=$(cd "$dir" && pwd); }

# ---- helpers -------------------------------------------------------------------------
pid_file() { echo "$dir/kafka.pid"; }

# The broker's pid when it runs from this DATA_DIR (checked through its command line, so
# a recycled pid is not mistaken for it), else nothing.
broker_pid() {
  local f pid; f=$(pid_file)
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] &&
     tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "kafka.Kafka $dir/server.properties"; then
    echo "$pid"
  fi
}

# Alive and not a zombie: the broker outlives the shell that started it, so its exit is
# reaped by init, which may take a second; a zombie has done its shutdown.
alive() {
  local st
  st=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

port_in_use() { (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }

free_port() {
  python3 -c 'import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$host"
}

have_admin() { [ -x "$admin" ]; }

# JVM class-data sharing: a dynamic archive of the broker's classes halves its start-up
# on 2 cores.  It is written by the first broker's JVM at exit (to a temp name, moved in
# place by `stop`) and keyed by the jar set and the java binary, so a new JDK or Kafka
# version makes a new one; a stale one is ignored by the JVM (-Xshare:auto).
cds_archive() {
  local j; j=$(readlink -f "$(command -v "$java")")
  echo "$kafka_home/cds/kafka-$(printf '%s %s %s' "$(cat "$libs/.stamp")" "$j" "$(stat -c %Y "$j")" |
    sha256sum | cut -c1-16).jsa"
}
archive=""
[ -f "$libs/.stamp" ] && command -v "$java" >/dev/null && archive=$(cds_archive)

# A short-lived Kafka tool JVM (formatting, and the fallbacks when qrl-kafka-admin is not
# built): small heap, C1 only, since these run for seconds.
java_tool=("$java" -Xmx256m -XX:TieredStopAtLevel=1 -Xshare:auto -cp "$libs/*")
[ -n "$archive" ] && [ -f "$archive" ] && java_tool+=(-XX:SharedArchiveFile="$archive" -Xlog:cds=off)


# One readiness probe, at most $2 seconds: a metadata request answered.
probe() {
  if have_admin; then
    "$admin" wait --bootstrap "$1" --timeout "$2" >/dev/null 2>&1
  else
    timeout "$(( $2 + 5 ))" "${java_tool[@]}" org.apache.kafka.tools.BrokerApiVersionsCommand \
      --bootstrap-server "$1" >/dev/null 2>&1
  fi
}

# Read one key from server.properties.
prop() { sed -n "s/^$1=//p" "$dir/server.properties"; }

write_config() {  # $1 = port, $2 = controller port
  mkdir -p "$dir/data" "$dir/logs"
  cat >"$dir/server.properties" <<EOF
# Written by deploy/kafka/kafka.sh at each start; edits here are overwritten.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$host:$2
listeners=PLAINTEXT://$host:$1,CONTROLLER://$host:$2
advertised.listeners=PLAINTEXT://$host:$1
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
# one node: every internal topic has one replica
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
min.insync.replicas=1
default.replication.factor=1
num.partitions=1
# a consumer joining an empty group starts at once
group.initial.rebalance.delay.ms=0
# qrl's results are chunked below 16 MiB (SPEC 8)
message.max.bytes=$max_message_bytes
replica.fetch.max.bytes=$max_message_bytes
# topics are made on purpose (kafka.sh create-topics), never by a typo
auto.create.topics.enable=false
# sized for a 2-core machine: fewer threads, and the log cleaner (compacted
# __consumer_offsets) does not allocate its default 128 MiB buffer at start
num.network.threads=2
num.io.threads=4
background.threads=4
log.cleaner.dedupe.buffer.size=16777216
log.cleaner.threads=1
EOF
  # --prop KEY=VALUE lines come last: java.util.Properties keeps the last value of a key
  [ ${#props[@]} -eq 0 ] || { echo "# --prop"; printf '%s\n' "${props[@]}"; } >>"$dir/server.properties"
  cat >"$dir/log4j2.properties" <<EOF
# Written by deploy/kafka/kafka.sh: broker log to $dir/logs/server.log
status = warn
# keep logging while the broker shuts down (its own hook logs the shutdown)
shutdownHook = disable
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = $dir/logs/server.log
appender.file.filePattern = $dir/logs/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
}

# A cluster id for `kafka-storage format`: 16 random bytes, base64url without padding.
# An id starting with '-' would be read as an option by the storage tool, so draw again
# (Kafka's own Uuid.randomUuid() does the same).
new_cluster_id() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' | cut -c1-22)
    [ "${id#-}" = "$id" ] && break
  done
  echo "$id"
}

format_if_needed() {
  [ -f "$dir/data/meta.properties" ] && return 0
  [ -z "$cluster_id" ] || echo "$cluster_id" >"$dir/cluster.id"
  # (an id saved by an older version may start with '-': never formatted, so replace it)
  case $(cat "$dir/cluster.id" 2>/dev/null) in ""|-*) new_cluster_id >"$dir/cluster.id" ;; esac
  say "formatting $dir/data (cluster id $(cat "$dir/cluster.id"))"
  "${java_tool[@]}" kafka.tools.StorageTool format -t "$(cat "$dir/cluster.id")" \
    -c "$dir/server.properties" >"$dir/logs/format.log" 2>&1 ||
    { cat "$dir/logs/format.log" >&2; die "formatting $dir/data failed"; }
}

show_logs() {
  say "errors in $dir/logs/server.log, then the last lines of it and of stdout.log:"
  grep -E '^\[[^]]*\] (ERROR|FATAL)' "$dir/logs/server.log" 2>/dev/null | tail -n 8 | cut -c1-400 |
    sed 's/^/  /' >&2 || true
  tail -n 10 "$dir/logs/server.log" 2>/dev/null | cut -c1-400 | sed 's/^/  /' >&2 || true
  tail -n 10 "$dir/logs/stdout.log" 2>/dev/null | cut -c1-400 | sed 's/^/  /' >&2 || true
}

# ---- commands ------------------------------------------------------------------------
# Wait until the broker at $1 serves, while process $2 lives, at most $3 seconds.
wait_serving() {
  local b=$1 pid=$2 limit=$3 w
  if have_admin; then
    # the tool retries by itself (reconnect backoff <= 250 ms); watch the JVM meanwhile
    "$admin" wait --bootstrap "$b" --timeout "$limit" >/dev/null 2>&1 & w=$!
    while kill -0 "$w" 2>/dev/null; do
      if ! alive "$pid"; then
        kill "$w" 2>/dev/null || true; wait "$w" 2>/dev/null || true; return 2
      fi
      sleep 0.1
    done
    if wait "$w"; then return 0; else return 1; fi
  fi
  local deadline=$(( $(date +%s) + limit ))
  until probe "$b" 2; do
    alive "$pid" || return 2
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.2
  done
}

cmd_start() {
  need_dir
  local t0 pid; t0=$(now)
  pid=$(broker_pid)
  if [ -n "$pid" ]; then
    local b; b=$(cat "$dir/bootstrap")
    probe "$b" 5 || die "broker pid $pid from $dir runs but does not answer at $b"
    say "already running (pid $pid)"
    echo "BOOTSTRAP=$b"
    return 0
  fi
  rm -f "$(pid_file)" "$dir/cds.pending"
  [ -f "$libs/.stamp" ] || die "no Kafka jars in $libs: run deploy/setup.sh (or deploy/kafka/fetch.sh $kafka_home)"
  command -v "$java" >/dev/null || die "java not found (Debian package openjdk-17-jre-headless)"
  local auto_port=0 auto_cport=0 attempt
  [ "$port" = 0 ] && auto_port=1
  [ -z "$cport" ] && auto_cport=1
  local cds
  if [ -f "$archive" ]; then
    cds=-XX:SharedArchiveFile=$archive
  else
    mkdir -p "$(dirname "$archive")"
    cds=-XX:ArchiveClassesAtExit=$archive.tmp.$$
    echo "$archive.tmp.$$ $archive" >"$dir/cds.pending"
  fi
  local format_if_needed_done=0
  for attempt in 1 2 3; do
    [ "$port" = 0 ] && port=$(free_port)
    port_in_use "$port" && die "port $port on $host is in use (pick another with --port, or 0 for a free one)"
    if [ -z "$cport" ]; then
      cport=$((port + 1))
      port_in_use "$cport" && cport=$(free_port)
    fi
    [ "$cport" != "$port" ] || die "controller port equals the broker port ($port)"
    port_in_use "$cport" && die "controller port $cport on $host is in use"
    write_config "$port" "$cport"
    [ $format_if_needed_done = 1 ] || { format_if_needed; format_if_needed_done=1; }
    : >"$dir/logs/stdout.log"
    # G1 with short pauses as Kafka's own launcher does.  C1 only (TieredStopAtLevel=1):
    # on 2 cores the C2 compiler threads slow start-up more than the broker needs its
    # peak speed here; QRL_KAFKA_JVM_OPTS=-XX:TieredStopAtLevel=4 brings C2 back.
    # stdin/stdout detached so a caller's pipe never waits on the broker.
    # shellcheck disable=SC2086
    (cd "$dir" && exec "$java" -Xmx"$heap" -Xms"$heap" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:+ExplicitGCInvokesConcurrent -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
        -Xshare:auto "$cds" -Xlog:cds=off -Xlog:cds+dynamic=off ${QRL_KAFKA_JVM_OPTS:-} \
        -Dlog4j2.configurationFile="$dir/log4j2.properties" -Dkafka.logs.dir="$dir/logs" \
        -cp "$libs/*" kafka.Kafka "$dir/server.properties" \
        </dev/null >>"$dir/logs/stdout.log" 2>&1) &
    pid=$!
    echo "$pid" >"$(pid_file)"
    local b="$host:$port" rc=0
    echo "$b" >"$dir/bootstrap"
    wait_serving "$b" "$pid" "${timeout:-90}" || rc=$?
    if [ $rc -eq 2 ] && [ "$attempt" -lt 3 ] && { [ "$auto_port" = 1 ] || [ "$auto_cport" = 1 ]; } &&
       grep -qE "Unable to start acceptor|Address already in use" "$dir/logs/server.log" 2>/dev/null; then
      # a port picked free was taken before the broker bound it: pick again
      rm -f "$(pid_file)"
      say "a listener port was taken during start-up (attempt $attempt): picking other ports"
      [ "$auto_port" = 1 ] && port=0
      [ "$auto_cport" = 1 ] && cport=
      : >"$dir/logs/server.log"
      continue
    fi
    if [ $rc -eq 2 ]; then
      rm -f "$(pid_file)"; show_logs; die "broker exited during start-up"
    elif [ $rc -ne 0 ]; then
      show_logs; kill -KILL "$pid" 2>/dev/null || true; rm -f "$(pid_file)"
      die "broker did not serve at $b within ${timeout:-90} s"
    fi
    break
  done
  say "serving at $b after $(elapsed "$t0") s (pid $pid, data $dir/data, log $dir/logs/server.log)"
  echo "BOOTSTRAP=$b"
}

cmd_stop() {
  need_dir
  local pid t0 killed=0; pid=$(broker_pid); t0=$(now)
  if [ -z "$pid" ]; then
    rm -f "$(pid_file)"; say "not running (data $dir)"; return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$(( $(date +%s) + ${timeout:-30} ))
  while alive "$pid"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      say "no exit ${timeout:-30} s after SIGTERM: SIGKILL pid $pid"
      kill -KILL "$pid" 2>/dev/null || true
      killed=1
      while alive "$pid"; do sleep 0.1; done
      break
    fi
    sleep 0.1
  done
  rm -f "$(pid_file)"
  if [ -f "$dir/cds.pending" ]; then
    local tmp final; read -r tmp final <"$dir/cds.pending"
    if [ $killed = 0 ] && [ -s "$tmp" ]; then
      mv -f "$tmp" "$final" && say "saved the JVM class-data archive $final (faster next start)"
    fi
    rm -f "$tmp" "$dir/cds.pending"
  fi
  say "stopped pid $pid after $(elapsed "$t0") s"
}

cmd_status() {
  need_dir
  local pid b; pid=$(broker_pid)
  if [ -z "$pid" ]; then echo "not running (data $dir)"; exit 3; fi
  b=$(cat "$dir/bootstrap" 2>/dev/null || echo "127.0.0.1:$(prop listeners | sed -n 's/.*PLAINTEXT:\/\/[^:]*:\([0-9]*\).*/\1/p')")
  if probe "$b" 3; then echo "serving pid=$pid bootstrap=$b data=$dir/data"; exit 0; fi
  echo "running pid=$pid but not answering at $b"; exit 1
}

cmd_create_topics() {
  [ -n "$bootstrap" ] || die "create-topics needs --bootstrap HOST:PORT"
  local t0; t0=$(now)
  if have_admin; then
    "$admin" create-topics --bootstrap "$bootstrap" --topics "$topics" --partitions "$partitions" \
      --max-message-bytes "$max_message_bytes" --replication-factor "$rf" --timeout "${timeout:-60}" >/dev/null ||
      die "creating topics $topics on $bootstrap failed"
  else
    local t
    for t in ${topics//,/ }; do
      "${java_tool[@]}" org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --create \
        --if-not-exists --topic "$t" --partitions "$partitions" --replication-factor "$rf" \
        --config "max.message.bytes=$max_message_bytes" >/dev/null ||
        die "creating topic $t on $bootstrap failed"
    done
  fi
  say "topics $topics ready on $bootstrap ($partitions partitions, replication $rf, max.message.bytes $max_message_bytes) after $(elapsed "$t0") s"
}

# Start and stop a throwaway broker so that the class-data archive exists (fetch.sh).
cmd_warm() {
  [ -f "$libs/.stamp" ] || die "no Kafka jars in $libs"
  if [ -f "$archive" ]; then say "class-data archive $archive present"; return 0; fi
  local t0; t0=$(now)
  dir=$(mktemp -d "${TMPDIR:-/tmp}/qrl-kafka-warm.XXXXXX")
  trap 'cmd_stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
  say "starting a throwaway broker once to write the JVM class-data archive (faster starts later)"
  port=0 cmd_start >/dev/null
  cmd_stop
  [ -f "$archive" ] || die "no class-data archive was written ($archive)"
  say "warm-up done in $(elapsed "$t0") s"
}

case $cmd in
  start) cmd_start ;;
  warm) cmd_warm ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  create-topics) cmd_create_topics ;;
  ""|-h|--help|help) usage ;;
  *) say "unknown command $cmd"; usage ;;
esac
