# Helpers of tests/multihost/netns.sh (sourced after tests/support/cluster.sh; not a test:
# tests/run.sh runs only tests/multihost/*.sh).  Hosts are network namespaces on one
# machine: each has its own loopback, one interface eth0 with an address on 10.213.0.0/24
# and its own UTS name; eth0 is one end of a veth pair whose other end is a port of the
# bridge br0 in the "switch" namespace.  Nothing is created in the caller's namespace
# (the veth pairs are made directly inside the namespaces), so several runs can coexist
# and no traffic leaves the namespaces this file made.
#
#   mh_net_init                 the switch namespace and the bridge
#   mh_host NAME ADDR           a host namespace NAME with eth0 = ADDR/24 on the bridge
#   mh_exec NAME CMD...         CMD in host NAME (network and UTS name of the host)
#   mh_spawn NAME LOG CMD...    the same in the background; its pid in $mh_pid
#   mh_link down|up NAME        the host's bridge port (a cable pulled / plugged back)
#   mh_certs NAME ADDR          $tmp/tls/NAME.pem + .key signed by $tmp/tls/ca.pem (SAN = ADDR)
#   mh_kafka_start I            broker I (1..3) of the KRaft quorum on host kafkaI, in the
#                               background; mh_kafka_wait I waits until it serves
#   mh_kafka_kill I             kill -9 of broker I's JVM
#   mh_teardown                 kill everything in our namespaces, delete them
mh_tag=qmh$$            # namespace prefix of this run
mh_net=10.213.0
mh_hosts=()             # host namespaces created (short names)
declare -A mh_addr=()   # short name -> address

mh_ns() { echo "$mh_tag-$1"; }

mh_net_init() {
  local sw; sw=$(mh_ns sw)
  ip netns add "$sw" || return 1
  mh_hosts+=(sw)
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  # forward at once (no STP listening delay) so a plugged-back cable works immediately
  ip -n "$sw" link set br0 type bridge forward_delay 0 stp_state 0
  ip -n "$sw" link set br0 up || return 1
  # the rest of what the hosts need, probed here so a machine that lacks it skips the test
  # (exit 77) instead of failing half-way: a veth pair, a UTS namespace of its own
  ip -n "$sw" link add qrlprobe0 type veth peer name qrlprobe1 && ip -n "$sw" link del qrlprobe0 || return 1
  ip netns exec "$sw" unshare --uts true || return 1
}

mh_host() { # NAME ADDR
  local n=$1 a=$2 ns sw; ns=$(mh_ns "$1"); sw=$(mh_ns sw)
  ip netns add "$ns"
  mh_hosts+=("$n")
  mh_addr[$n]=$a
  ip link add eth0 netns "$ns" type veth peer name "$n" netns "$sw"
  ip -n "$sw" link set "$n" master br0
  ip -n "$sw" link set "$n" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$a/24" dev eth0
  ip -n "$ns" link set eth0 up
}

# CMD inside host NAME, with the host's name as hostname (a UTS namespace of its own, so
# ReplicaInfo.host and node ids differ per host as on real machines).
mh_exec() {
  local n=$1; shift
  ip netns exec "$(mh_ns "$n")" unshare --uts bash -c 'hostname "$0" && exec "$@"' "$n" "$@"
}
# mh_spawn NAME LOG CMD...: the same in the background, stdout and stderr appended to LOG;
# every step execs, so $mh_pid is the daemon's own pid
mh_spawn() {
  local n=$1 log=$2; shift 2
  ( exec ip netns exec "$(mh_ns "$n")" unshare --uts bash -c 'hostname "$0" && exec "$@"' "$n" "$@" ) >>"$log" 2>&1 &
  mh_pid=$!
}

mh_link() { ip -n "$(mh_ns sw)" link set "$2" "$1"; }

mh_certs() { # NAME ADDR
  local d=$tmp/tls
  mkdir -p "$d"
  if [ ! -f "$d/ca.pem" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
      -keyout "$d/ca.key" -out "$d/ca.pem" -subj /CN=qrl-multihost-ca \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
      >/dev/null 2>&1 || return 1
  fi
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$d/$1.key" \
    -out "$d/$1.csr" -subj "/CN=$1" >/dev/null 2>&1 || return 1
  printf 'subjectAltName=IP:%s,DNS:%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' \
    "$2" "$1" >"$d/$1.ext"
  openssl x509 -req -in "$d/$1.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 1 \
    -extfile "$d/$1.ext" -out "$d/$1.pem" >/dev/null 2>&1
}

# ---- the Kafka quorum: three KRaft nodes (broker + controller each), RF 3, min ISR 2 ------
mh_kafka_id=""
mh_kafka_voters() { echo "1@$mh_net.11:9093,2@$mh_net.12:9093,3@$mh_net.13:9093"; }
mh_bootstrap() { echo "$mh_net.11:9092,$mh_net.12:9092,$mh_net.13:9092"; }
mh_kafka_start() { # I: deploy/kafka/kafka.sh in host kafkaI, output in $tmp/kafkaI.out
  local i=$1
  [ -n "$mh_kafka_id" ] || mh_kafka_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' | cut -c1-22 | sed 's/^-/A/')
  mh_exec "kafka$i" env QRL_KAFKA_HEAP="${QRL_MH_KAFKA_HEAP:-384m}" "$kafka" start --dir "$tmp/kafka$i" \
    --host "$mh_net.1$i" --port 9092 --controller-port 9093 --timeout 150 --cluster-id "$mh_kafka_id" \
    --prop "node.id=$i" --prop "controller.quorum.voters=$(mh_kafka_voters)" \
    --prop offsets.topic.replication.factor=3 --prop transaction.state.log.replication.factor=3 \
    --prop transaction.state.log.min.isr=2 --prop share.coordinator.state.topic.replication.factor=3 \
    --prop share.coordinator.state.topic.min.isr=2 --prop default.replication.factor=3 \
    --prop min.insync.replicas=2 --prop unclean.leader.election.enable=false \
    --prop broker.heartbeat.interval.ms=1000 --prop broker.session.timeout.ms=5000 \
    --prop replica.lag.time.max.ms=10000 >"$tmp/kafka$i.out" 2>&1 &
  eval "mh_kafka_starter_$i=$!"
}
mh_kafka_wait() { # I: wait for the start of broker I (its kafka.sh) to finish
  local p; eval "p=\$mh_kafka_starter_$1"
  wait "$p" || { cat "$tmp/kafka$1.out"; return 1; }
}
mh_kafka_pid() { cat "$tmp/kafka$1/kafka.pid" 2>/dev/null; }
mh_kafka_kill() { local p; p=$(mh_kafka_pid "$1") || true; [ -z "$p" ] || kill -KILL "$p"; rm -f "$tmp/kafka$1/kafka.pid"; }
# Kafka's own Java tools, run on the ops host (one JVM start each: a few seconds)
mh_kjava() { # CLASS ARGS...
  local libs=${QRL_KAFKA_HOME:-${QRL_DEPS:-$root/.deps}/kafka}/libs cls=$1; shift
  mh_exec ops java -Xmx256m -XX:TieredStopAtLevel=1 -Xshare:auto -cp "$libs/*" "$cls" "$@" 2>/dev/null
}

# ---- teardown: every exit path ---------------------------------------------------------------
mh_teardown() {
  local n ns p
  for i in 1 2 3; do p=$(mh_kafka_pid $i) || true; [ -z "$p" ] || kill -KILL "$p" 2>/dev/null || true; done
  # whatever still runs inside our namespaces (started by this script: daemons, brokers,
  # tools) is killed by pid, then the namespaces are deleted
  for n in "${mh_hosts[@]}"; do
    ns=$(mh_ns "$n")
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  done
  for n in "${mh_hosts[@]}"; do
    ns=$(mh_ns "$n")
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.2; done
    ip netns del "$ns" 2>/dev/null || true
  done
  mh_hosts=()
}
