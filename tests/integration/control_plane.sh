#!/usr/bin/env bash
# The control plane end to end with real daemons (issue 9 "Done when"): a real Kafka
# broker, qrl-learner, two qrl-rollout replicas (r0, r1) on stories260K and qrlctl, all
# over TLS (a self-signed certificate made here with openssl) with a bearer token.
#   0. half a TLS pair (learner) or a missing learner.tls_ca_file (replica): exit 1 at start;
#   1. status: `qrlctl status` lists both replicas with live numbers (tokens/s > 0,
#      tokens generated, weights version >= 1 once the learner has trained); --json parses;
#   2. TLS: a plaintext client and a client trusting another CA cannot connect (exit 3);
#   3. auth: without the token / with a wrong one pause, set, drain, shutdown are refused
#      (exit 2, UNAUTHENTICATED / PERMISSION_DENIED) and nothing changes; reads follow
#      rpc.token_for_reads (open on the learner and r0, closed on r1);
#   4. set: learner.lr changes (seen in status and in the next update's lr), an immutable
#      key, an unknown key and an out-of-range value are refused (exit 2) and nothing
#      changes; a replica's rollout.max_concurrency changes (seen in its status);
#   5. pause/resume r0: its token counter stops (and tokens/s reads 0), then moves again;
#   6. pause/resume the learner: the dataset cursor and every replica's tokens stop, then
#      move again;
#   7. 1,000 garbage requests to the learner's service and to r0's (300 more to r1's), then
#      both daemons still answer with sane values and the cluster still trains;
#   8. kill -9 r1: marked LOST by `qrlctl replicas` within the heartbeat timeout; the learner
#      keeps training (version advances) with r0;
#      r1 started again with the same id registers cleanly and is RUNNING again;
#   9. drain r0: it finishes its groups, exits 0, and every result it produced reached the
#      learner; then `qrlctl shutdown` stops the learner (exit 0) and r1 (exit 0).
# Whatever it started is stopped on every exit path.  Skips (77) without java or the
# Kafka jars unless QRL_REQUIRE_KAFKA=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/cluster.sh" ctl
ctl=$build/bin/qrlctl
garbage=$build/tests/integration/rpc_garbage
hb_timeout_ms=1500
for f in "$ctl" "$garbage"; do [ -x "$f" ] || fail "$f is not built (make test builds it)"; done
for t in jq openssl; do command -v $t >/dev/null || fail "$t missing (deploy/setup.sh installs it)"; done

# ---- 0. bad TLS settings stop a daemon at start (no broker needed) --------------------------
t0=$tmp/start
mkdir -p "$t0"
printf '{"prompt":"Once upon a time","answer":"the"}\n' >"$t0/data.jsonl"
rc=0; "$learner" --learner.model "$model" --learner.tokenizer "$tokenizer" --dataset.path "$t0/data.jsonl" \
  --dataset.task contains --dataset.chat_template none --learner.threads 1 --kafka.bootstrap 127.0.0.1:1 \
  --rpc.tls_cert_file "$t0/cert.pem" >"$t0/out" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "qrl-learner: error: .*TLS needs both tls_cert_file and tls_key_file" "$t0/out" ||
  fail "learner with half a TLS pair: exit $rc"
rc=0; "$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" --kafka.bootstrap 127.0.0.1:1 \
  --learner.addr 127.0.0.1:1 --learner.tls_ca_file "$t0/nope.pem" >"$t0/out" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "qrl-rollout: error: tls_ca_file $t0/nope.pem" "$t0/out" ||
  fail "rollout with a missing learner.tls_ca_file: exit $rc"
echo "bad TLS settings refused at start (exit 1, naming the file)"

need_kafka
t_all=$(date +%s.%N)

# ---- cluster ---------------------------------------------------------------------------
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -keyout "$tmp/key.pem" -out "$tmp/cert.pem" -subj /CN=qrl-test \
  -addext "subjectAltName=IP:127.0.0.1" >/dev/null 2>&1 || fail "openssl could not make a certificate"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -keyout "$tmp/other-key.pem" -out "$tmp/other.pem" -subj /CN=other \
  -addext "subjectAltName=IP:127.0.0.1" >/dev/null 2>&1 || fail "openssl could not make a certificate"
printf 'ctl-token-%s\n' "$$" >"$tmp/token"
printf 'not-the-token\n' >"$tmp/wrong"
tls=(--rpc.tls_cert_file "$tmp/cert.pem" --rpc.tls_key_file "$tmp/key.pem")

t=$(date +%s.%N)
start_broker 4
echo "broker at $bootstrap with topics in $(secs "$t") s"

words=(the was and she he little girl boy day happy big play)
names=(Lily Tom Sue Ben Max Mia)
: >"$tmp/data.jsonl"
for i in $(seq 0 23); do
  printf '{"prompt":"Once upon a time, %s","answer":"%s"}\n' "${names[$((i % 6))]}" \
    "${words[$((i % 12))]}" >>"$tmp/data.jsonl"
done
# debug: the learner logs each result it takes ("result group=N from REPLICA"), step 9 reads them
QRL_LOG_LEVEL=debug "$learner" --learner.model "$model" --learner.tokenizer "$tokenizer" \
  --dataset.path "$tmp/data.jsonl" --dataset.chat_template none --dataset.task contains \
  --learner.threads 1 --kafka.bootstrap "$bootstrap" --learner.group_size 2 --learner.quota 2 \
  --learner.max_staleness 1 --learner.lr 1e-3 --learner.seed 3 --sampling.max_new_tokens 16 \
  --learner.heartbeat_interval_ms 250 --learner.heartbeat_timeout_ms $hb_timeout_ms \
  --rpc.token_file "$tmp/token" "${tls[@]}" --metrics.jsonl "$tmp/learner.jsonl" >"$tmp/learner.log" 2>&1 &
pids+=($!)
pid_learner=$!
port=$(log_port "$tmp/learner.log")
addr=127.0.0.1:$port
start_replica() { # ID LOG: r1 closes its reads (rpc.token_for_reads)
  local extra=(); [ "$1" = r1 ] && extra=(--rpc.token_for_reads true)
  "$rollout" --rollout.model "$model" --rollout.tokenizer "$tokenizer" --kafka.bootstrap "$bootstrap" \
    --rollout.replica_id "$1" --rollout.slots 4 --rollout.max_concurrency 2 --rollout.threads 1 \
    --rollout.step_delay_ms 20 --kafka.session_timeout_ms 6000 --rpc.token_file "$tmp/token" \
    "${tls[@]}" "${extra[@]}" --learner.addr "$addr" --learner.tls_ca_file "$tmp/cert.pem" \
    --metrics.jsonl "$tmp/$1.jsonl" >"$2" 2>&1 &
  pids+=($!)
  eval "pid_$1=$!"
}
start_replica r0 "$tmp/r0.log"
start_replica r1 "$tmp/r1.log"

# qrlctl over TLS with the token (q), without it (qn); out/err/rc of the last call
q()  { rc=0; out=$("$ctl" --learner "$addr" --tls-ca "$tmp/cert.pem" --token-file "$tmp/token" "$@" 2>"$tmp/err") || rc=$?; err=$(cat "$tmp/err"); }
qn() { rc=0; out=$(env -u QRL_RPC_TOKEN -u QRL_RPC_TOKEN_FILE "$ctl" --learner "$addr" --tls-ca "$tmp/cert.pem" "$@" 2>"$tmp/err") || rc=$?; err=$(cat "$tmp/err"); }
expect_rc() { # want what: the last call's exit code
  [ "$rc" -eq "$1" ] || fail "$2: exit $rc, want $1 (stdout: $out; stderr: $err)"
}
js() { jq -e "$1" <<<"$out" >/dev/null || fail "$2: $(jq -c "$1" <<<"$out" 2>&1) from $out"; }
lstatus() { q --json status; expect_rc 0 "status"; }
rep() { # ID FIELD: a replica's field from `qrlctl --json replicas`
  q --json replicas; expect_rc 0 "replicas"
  jq -r --arg id "$1" ".replicas[] | select(.info.id == \$id) | .status.$2" <<<"$out"
}
until_true() { # SECONDS WHAT JQ: poll `qrlctl --json status` until the filter holds
  local end=$((SECONDS + $1))
  while :; do
    lstatus
    jq -e "$3" <<<"$out" >/dev/null && return 0
    [ $SECONDS -lt $end ] || fail "timed out ($1 s) waiting for $2: $out"
    sleep 0.3
  done
}
tokens_sum() { q --json replicas; jq '[.replicas[] | select(.status.state != "LOST") | .status.tokens_generated] | add' <<<"$out"; }

# ---- 1. status ---------------------------------------------------------------------------
t=$(date +%s.%N)
until_true 60 "both replicas generating, the learner at version >= 1, replicas synced" \
  '.version >= 1 and .replicas == 2 and (.replica_list | length) == 2 and
   all(.replica_list[]; .status.state == "RUNNING" and .status.tokens_per_s > 0 and
       .status.tokens_generated > 0 and .status.version >= 1)'
echo "cluster up, training and generating in $(secs "$t") s"
js '.state == "RUNNING" and .quota == 2 and .step == .version and (.lr - 0.001 | fabs) < 1e-12 and
    ([.replica_list[].info.id] | sort) == ["r0", "r1"] and
    all(.replica_list[]; .info.device == "cpu" and .info.slots == 4 and .status.slots_total == 4 and
        (.info.control_addr | startswith("127.0.0.1:")) and .last_heartbeat_unix_ms > 0 and
        .status.max_concurrency == 2)' "status --json"
q status; expect_rc 0 "status (text)"
for r in r0 r1; do
  grep -qE "^$r +[^ ]+ +cpu +f32 +f32 +RUNNING +[1-9][0-9]* +[0-9]+/4 +[0-9.]+ +[0-9.]+s ago$" <<<"$out" ||
    fail "status table lacks a live row for $r: $out"
done
grep -qE "^  state +RUNNING$" <<<"$out" || fail "status text lacks the state: $out"
echo "status: $(jq -c '{version, step, replicas, reward_mean, replica_list: [.replica_list[] |
  {id: .info.id, v: .status.version, tps: .status.tokens_per_s, tok: .status.tokens_generated}]}' <<<"$(q --json status; echo "$out")")"

# ---- 2. TLS ------------------------------------------------------------------------------
rc=0; out=$("$ctl" --learner "$addr" --timeout 3 status 2>"$tmp/err") || rc=$?; err=$(cat "$tmp/err")
expect_rc 3 "plaintext client against the TLS learner"
grep -q "UNAVAILABLE" <<<"$err" || fail "plaintext: $err"
rc=0; out=$("$ctl" --learner "$addr" --tls-ca "$tmp/other.pem" --timeout 3 status 2>"$tmp/err") || rc=$?
err=$(cat "$tmp/err"); expect_rc 3 "client trusting another CA"
r0_addr=$(q --json replicas; jq -r '.replicas[] | select(.info.id == "r0") | .info.control_addr' <<<"$out")
r1_addr=$(q --json replicas; jq -r '.replicas[] | select(.info.id == "r1") | .info.control_addr' <<<"$out")
[ "$("$garbage" --target "$r0_addr" --call /qrl.Rollout/Status)" = UNAVAILABLE ] ||
  fail "plaintext call to the TLS replica r0 did not fail with UNAVAILABLE"
echo "TLS: plaintext and untrusted clients refused (exit 3), TLS clients served"

# ---- 3. auth -----------------------------------------------------------------------------
qn pause; expect_rc 2 "pause without a token"; grep -q UNAUTHENTICATED <<<"$err" || fail "no token: $err"
qn --json set learner.lr=0.5; expect_rc 2 "set without a token"
js '.error.status == "PERMISSION" and .error.exit == 2 and (.error.message | test("UNAUTHENTICATED"))' "no-token JSON error"
for cmd in "pause" "set learner.lr=0.5" "drain r0" "pause r0" "set rollout.max_concurrency=1 r0" "shutdown"; do
  q --token-file "$tmp/wrong" $cmd; expect_rc 2 "$cmd with a wrong token"
  grep -q PERMISSION_DENIED <<<"$err" || fail "$cmd with a wrong token: $err"
done
lstatus
js '.state == "RUNNING" and (.lr - 0.001 | fabs) < 1e-12 and .replicas == 2 and
    all(.replica_list[]; .status.state == "RUNNING" and .status.max_concurrency == 2)' "state after refused calls"
kill -0 "$pid_learner" || fail "the learner died after a refused shutdown"
qn status; expect_rc 0 "status without a token (rpc.token_for_reads=false)"
[ "$("$garbage" --target "$r0_addr" --tls-ca "$tmp/cert.pem" --call /qrl.Rollout/Status)" = OK ] ||
  fail "r0 Status without a token should be open"
[ "$("$garbage" --target "$r1_addr" --tls-ca "$tmp/cert.pem" --call /qrl.Rollout/Status)" = UNAUTHENTICATED ] ||
  fail "r1 (rpc.token_for_reads=true) Status without a token should be refused"
[ "$("$garbage" --target "$r1_addr" --tls-ca "$tmp/cert.pem" --token-file "$tmp/token" --call /qrl.Rollout/Status)" = OK ] ||
  fail "r1 Status with the token should be served"
echo "auth: no token -> UNAUTHENTICATED, wrong token -> PERMISSION_DENIED (exit 2), nothing changed; reads follow rpc.token_for_reads"

# ---- 4. set ------------------------------------------------------------------------------
q set learner.lr=0.002; expect_rc 0 "set learner.lr"
[ "$out" = "learner: learner.lr = 0.002 (was 0.001)" ] || fail "set output: $out"
lstatus; js '(.lr - 0.002 | fabs) < 1e-12' "lr in status after set"
set_step=$(jq .step <<<"$out")
q set learner.group_size=8; expect_rc 2 "set of an immutable key"
grep -q "FAILED_PRECONDITION" <<<"$err" && grep -q "cannot be changed at run time" <<<"$err" || fail "immutable: $err"
q set learner.lrr=1; expect_rc 2 "set of an unknown key"
grep -q "INVALID_ARGUMENT" <<<"$err" && grep -q "learner.lr" <<<"$err" || fail "unknown key: $err"
q set learner.lr=5; expect_rc 2 "set out of range"
grep -q "INVALID_ARGUMENT" <<<"$err" && grep -q "outside" <<<"$err" || fail "out of range: $err"
q set learner.lr=abc; expect_rc 2 "set of a malformed value"
q set learner.lr; expect_rc 1 "set without '='"
lstatus; js '(.lr - 0.002 | fabs) < 1e-12 and .quota == 2' "values after refused sets"
q set rollout.max_concurrency=1 r1; expect_rc 0 "set on r1"
[ "$out" = "r1: rollout.max_concurrency = 1 (was 2)" ] || fail "replica set output: $out"
q set rollout.kv_cache=bf16 r1; expect_rc 2 "set of r1's immutable key"
q set rollout.max_concurrency=0 r1; expect_rc 2 "set of r1's key out of range"
q set rollout.max_concurrency=1 r9; expect_rc 2 "set on an unknown replica"
grep -q "replica 'r9' is not registered" <<<"$err" || fail "unknown replica: $err"
end=$((SECONDS + 5))
until [ "$(rep r1 max_concurrency)" = 1 ]; do [ $SECONDS -lt $end ] || fail "r1 max_concurrency not 1 in status"; sleep 0.2; done
[ "$(rep r0 max_concurrency)" = 2 ] || fail "r0's max_concurrency changed"
echo "set: learner.lr and r1's rollout.max_concurrency changed (seen in status); immutable, unknown, out-of-range refused (exit 2)"

# ---- 5. pause / resume a replica -------------------------------------------------------
q pause r0; expect_rc 0 "pause r0"; [ "$out" = "r0: PAUSED - replica paused" ] || fail "pause r0: $out"
sleep 2.6 # past the tokens/s window and a few heartbeats
a=$(rep r0 tokens_generated); sleep 1.5; b=$(rep r0 tokens_generated)
[ "$a" = "$b" ] || fail "r0 generated tokens while paused: $a -> $b"
[ "$(rep r0 state)" = PAUSED ] || fail "r0 not PAUSED in replicas"
[ "$(rep r0 tokens_per_s)" = 0 ] || fail "paused r0 reports tokens/s $(rep r0 tokens_per_s)"
q resume r0; expect_rc 0 "resume r0"; [ "$out" = "r0: RUNNING - replica resumed" ] || fail "resume r0: $out"
end=$((SECONDS + 20))
until [ "$(rep r0 tokens_generated)" -gt "$b" ]; do [ $SECONDS -lt $end ] || fail "r0 did not generate after resume"; sleep 0.3; done
echo "pause/resume r0: tokens $a -> $b while paused (tokens/s 0), $(rep r0 tokens_generated) after resume"

# ---- 6. pause / resume the learner ------------------------------------------------------
q pause; expect_rc 0 "pause"; [ "$out" = "learner: PAUSED - dispatch paused" ] || fail "pause: $out"
lstatus; js '.state == "PAUSED"' "learner state after pause"
end=$((SECONDS + 30)); prev=-1; same=0
while [ $same -lt 2 ]; do # the groups already dispatched finish; then nothing moves for 3 s
  cur=$(tokens_sum)
  if [ "$cur" = "$prev" ]; then same=$((same + 1)); else same=0; fi
  [ $SECONDS -lt $end ] || fail "replicas still generating 30 s after the learner paused"
  prev=$cur; [ $same -lt 2 ] && sleep 1.5
done
lstatus; pos1=$(jq -c .position <<<"$out"); sleep 1.5
lstatus; pos2=$(jq -c .position <<<"$out")
[ "$pos1" = "$pos2" ] || fail "dataset cursor moved while paused: $pos1 -> $pos2"
[ "$(tokens_sum)" = "$prev" ] || fail "tokens moved while the learner was paused"
q resume; expect_rc 0 "resume"; [ "$out" = "learner: RUNNING - dispatch resumed" ] || fail "resume: $out"
until_true 20 "the cursor to move after resume" ".position != $pos2"
end=$((SECONDS + 20))
until [ "$(tokens_sum)" -gt "$prev" ]; do [ $SECONDS -lt $end ] || fail "no tokens after resume"; sleep 0.3; done
echo "pause/resume learner: cursor $pos2 and $prev tokens held while paused, both moved after resume"

# ---- 7. garbage over the wire -------------------------------------------------------------
lstatus; v_before=$(jq .version <<<"$out")
t=$(date +%s.%N)
# all three at once: the daemons also see concurrent connections
"$garbage" --target "$addr" --tls-ca "$tmp/cert.pem" --token-file "$tmp/token" --service learner \
  --count 1000 --seed 11 >"$tmp/garbage-learner.out" 2>&1 & g1=$!
"$garbage" --target "$r0_addr" --tls-ca "$tmp/cert.pem" --token-file "$tmp/token" --service rollout \
  --count 1000 --seed 12 >"$tmp/garbage-r0.out" 2>&1 & g2=$!
"$garbage" --target "$r1_addr" --tls-ca "$tmp/cert.pem" --token-file "$tmp/token" --service rollout \
  --count 300 --seed 13 --token-for-reads >"$tmp/garbage-r1.out" 2>&1 & g3=$!
grc=0
for g in "$g1 learner" "$g2 r0" "$g3 r1"; do
  set -- $g; rc=0; wait "$1" || rc=$?
  cat "$tmp/garbage-$2.out"
  [ $rc -eq 0 ] || { echo "garbage to $2: exit $rc"; grc=1; }
done
[ $grc -eq 0 ] || fail "garbage requests got answers they should not have"
echo "garbage: 2,300 requests in $(secs "$t") s"
for p in $pid_learner $pid_r0 $pid_r1; do kill -0 "$p" || fail "a daemon died from garbage"; done
until_true 30 "training to go on after the garbage" ".version > $v_before"
js '.state == "RUNNING" and .replicas == 2 and (.lr - 0.002 | fabs) < 1e-12 and .quota == 2 and
    all(.replica_list[]; .status.state == "RUNNING")' "status after garbage"
[ "$(rep r0 max_concurrency)" = 2 ] && [ "$(rep r1 max_concurrency)" = 1 ] || fail "replica config changed by garbage"
jq -s -e --argjson s "$set_step" '[.[] | select(.step > $s + 1)] | length > 0 and all(.[]; (.lr - 0.002 | fabs) < 1e-9)' \
  "$tmp/learner.jsonl" >/dev/null || fail "updates after the set did not use lr 0.002: $(jq -c '[.step, .lr]' "$tmp/learner.jsonl")"
echo "after garbage: both daemons serve, version $v_before -> $(jq .version <<<"$out"), updates use lr 0.002"

# ---- 8. kill -9 a replica ------------------------------------------------------------------
lstatus; v_kill=$(jq .version <<<"$out")
t=$(date +%s.%N)
kill -KILL "$pid_r1"; wait "$pid_r1" 2>/dev/null || true
while [ "$(rep r1 state)" != LOST ]; do
  awk -v s="$(secs "$t")" -v l=$hb_timeout_ms 'BEGIN { exit !(s * 1000 < l + 1000) }' ||
    fail "r1 not LOST $(secs "$t") s after kill -9 (timeout ${hb_timeout_ms} ms)"
  sleep 0.1
done
lost_s=$(secs "$t")
q replicas; expect_rc 0 "replicas"
grep -qE "^r1 .* LOST " <<<"$out" || fail "replicas table does not show r1 LOST: $out"
grep -qE "^r0 .* RUNNING " <<<"$out" || fail "replicas table does not show r0 RUNNING: $out"
silent=$(sed -n 's/.*replica r1 lost: silent for \([0-9]*\) ms.*/\1/p' "$tmp/learner.log")
[ -n "$silent" ] || fail "the learner did not log r1 lost"
# marked as soon as the silence passes the timeout (the check runs every kafka.poll_ms tick)
[ "$silent" -le $((hb_timeout_ms + 200)) ] || fail "r1 marked lost only after $silent ms of silence"
lstatus; js '.replicas == 1' "live replicas after the kill"
q pause r1; expect_rc 2 "pause of a lost replica"; grep -q "replica 'r1' is lost" <<<"$err" || fail "pause lost r1: $err"
q drain ""; expect_rc 1 "drain of an empty replica id"
until_true 45 "training to go on with r0 alone" ".version >= $v_kill + 2"
echo "kill -9 r1: LOST after $lost_s s, $silent ms after its last heartbeat (timeout ${hb_timeout_ms} ms); version $v_kill -> $(jq .version <<<"$out") with r0 alone"
# the same id comes back: a clean registration, RUNNING, counted again, gets the current version
start_replica r1 "$tmp/r1b.log"
until_true 30 "r1 to register again" '.replicas == 2 and any(.replica_list[]; .info.id == "r1" and
  .status.state == "RUNNING" and .status.version >= 1)'
grep -q "registered with learner=" "$tmp/r1b.log" || fail "r1 did not register again"
echo "r1 restarted: registered again, RUNNING with version $(rep r1 version)"

# ---- 9. drain r0, shut the learner down ---------------------------------------------------
q drain r0; expect_rc 0 "drain r0"; [ "$out" = "r0: DRAINING - 1 replica(s) draining" ] || fail "drain: $out"
q drain r9; expect_rc 2 "drain of an unknown replica"
rc=0; timeout 40 tail --pid="$pid_r0" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "r0 still running 40 s after drain"
rc=0; wait "$pid_r0" || rc=$?
[ $rc -eq 0 ] || fail "r0 exited $rc after drain"
grep -q "draining (learner shutdown): in_flight=" "$tmp/r0.log" || fail "r0 never started draining"
line=$(grep "stopped rc=0 consumed=" "$tmp/r0.log") || fail "r0 has no clean stop line"
consumed=$(sed 's/.*consumed=\([0-9]*\).*/\1/' <<<"$line"); produced=$(sed 's/.*produced=\([0-9]*\).*/\1/' <<<"$line")
dl=$(sed 's/.*dead_letters=\([0-9]*\).*/\1/' <<<"$line"); dup=$(sed 's/.*duplicates_skipped=\([0-9]*\).*/\1/' <<<"$line")
[ $((produced + dl + dup)) -eq "$consumed" ] || fail "r0 left groups unfinished: $line"
end=$((SECONDS + 15))
while :; do # every acknowledged result of r0 is taken by the learner (or ignored as a duplicate)
  missing=()
  for g in $(jq -r '.group_id' "$tmp/r0.jsonl"); do
    grep -qE "result group=$g (run_id=[0-9]+ )?from r0 " "$tmp/learner.log" || missing+=("$g")
  done
  [ ${#missing[@]} -eq 0 ] && break
  [ $SECONDS -lt $end ] || fail "r0's results for groups ${missing[*]} never reached the learner"
  sleep 0.5
done
[ "$(wc -l <"$tmp/r0.jsonl")" -ge 1 ] || fail "r0 produced nothing"
q shutdown; expect_rc 0 "shutdown"
rc=0; timeout 20 tail --pid="$pid_learner" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "learner still running 20 s after shutdown"
rc=0; wait "$pid_learner" || rc=$?
[ $rc -eq 0 ] || fail "learner exited $rc after shutdown"
rc=0; timeout 30 tail --pid="$pid_r1" -f /dev/null || rc=$?
[ $rc -eq 0 ] || fail "r1 did not drain after the learner's shutdown"
rc=0; wait "$pid_r1" || rc=$?
[ $rc -eq 0 ] || fail "r1 exited $rc after the learner's shutdown"
grep -q "learner announced shutdown" "$tmp/r1b.log" || fail "r1 never saw SHUTDOWN"
echo "drain r0: $(grep -o 'in_flight=[0-9]*' "$tmp/r0.log" | head -1) at the drain; exit 0, consumed=$consumed produced=$produced, all $(wc -l <"$tmp/r0.jsonl") results reached the learner; learner shut down (exit 0)"
echo "control plane test passed in $(secs "$t_all") s"
