#!/usr/bin/env bash
# qrlctl against a stand-in learner (tests/integration/rpc_test_server.c) on 127.0.0.1:
# status as a table and as JSON, replicas, metrics, set with and without the token, replica
# commands, exit codes (docs/qrlctl.md), --help, an unreachable server, shutdown.
set -u
build=${BUILD:-build}
ctl=$build/bin/qrlctl
srv=$build/tests/integration/rpc_test_server
[ -x "$ctl" ] && [ -x "$srv" ] || { echo "no $ctl or $srv (run make)"; exit 77; }
command -v python3 >/dev/null || { echo "no python3"; exit 77; }
unset QRL_RPC_TOKEN QRL_RPC_TOKEN_FILE QRL_LEARNER

tmp=$(mktemp -d /tmp/qrl-test-ctl-XXXXXX)
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid"; wait "$pid" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }

printf 'itest-token-42\n' >"$tmp/token"
printf 'wrong-token\n' >"$tmp/wrong"
"$srv" --port-file "$tmp/port" --token-file "$tmp/token" --lifetime 60 2>"$tmp/server.log" &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || { echo "the test server did not start"; cat "$tmp/server.log"; exit 1; }
addr=$(cat "$tmp/port")
q() { "$ctl" --learner "$addr" --timeout 5 "$@"; }
# expect_rc WANT NAME CMD...: run, compare the exit code, keep stdout in $out and stderr in $err
expect_rc() {
  local want=$1 name=$2; shift 2
  out=$("$@" 2>"$tmp/stderr"); rc=$?; err=$(cat "$tmp/stderr")
  if [ "$rc" -ne "$want" ]; then fail "$name: exit $rc, want $want; stdout: $out; stderr: $err"; return 1; fi
  ok "$name (exit $rc)"
}
pyjson() {  # pyjson NAME PYTHON-EXPR-ON-d <<< json
  python3 -c "import json,sys; d=json.load(sys.stdin); assert $2, d" 2>"$tmp/py" || fail "$1: $(tail -1 "$tmp/py")"
}

# ---- status ---------------------------------------------------------------------------
expect_rc 0 "status" q status &&
  for line in 'state +RUNNING' 'step +42' 'version +7' 'position.source +gsm8k' 'train_tokens_per_s +1234.5'; do
    grep -qE "^  $line\$" <<<"$out" || fail "status table lacks '$line': $out"
  done
expect_rc 0 "status --json" q --json status &&
  pyjson "status --json" 'd["state"] == "RUNNING" and d["step"] == 42 and d["version"] == 7 and d["position"]["epoch"] == 1 and abs(d["train_tokens_per_s"] - 1234.5) < 1e-9 and d["mode"] == "overlap"' <<<"$out"

# ---- replicas, metrics ------------------------------------------------------------------
expect_rc 0 "replicas" q replicas && {
  grep -qE '^ID +HOST +DEVICE' <<<"$out" || fail "replicas header: $out"
  grep -qE '^rollout-0 +node-a +cuda:0 +w8a8-int8 +int4-protected +RUNNING +7 +10/64 +1000.0' <<<"$out" || fail "replicas row: $out"
  # a drained replica that exited: no stale slots or tokens/s (its last status had 12/64, 3000)
  grep -qE '^rollout-2 +node-a +cpu +bf16 +int4-protected +STOPPED +5 +- +- ' <<<"$out" || fail "stopped replica row: $out"
}
expect_rc 0 "replicas --json" q --json replicas &&
  pyjson "replicas --json" '[r["info"]["id"] for r in d["replicas"]] == ["rollout-0", "rollout-1", "rollout-2"] and d["replicas"][1]["status"]["slots_in_use"] == 11' <<<"$out"
expect_rc 0 "metrics --json" q --json metrics &&
  pyjson "metrics --json" 'd["learner"]["step"] == 42 and d["replicas"]["rollout-1"]["tokens_per_s"] == 2000 and "mode" not in d["learner"]' <<<"$out"

# ---- set: token rules, values -----------------------------------------------------------
expect_rc 2 "set without a token" q set rollout.max_staleness=9 &&
  { [[ "$err" == *UNAUTHENTICATED* ]] || fail "no-token message: $err"; }
expect_rc 2 "set with a wrong token" q --token-file "$tmp/wrong" set rollout.max_staleness=9 &&
  { [[ "$err" == *PERMISSION_DENIED* ]] || fail "wrong-token message: $err"; }
expect_rc 0 "set with the token file" q --token-file "$tmp/token" set rollout.max_staleness=9 &&
  { [ "$out" = "learner: rollout.max_staleness = 9 (was 4)" ] || fail "set output: $out"; }
expect_rc 0 "set with \$QRL_RPC_TOKEN, --json" env QRL_RPC_TOKEN=itest-token-42 "$ctl" --learner "$addr" --json set rollout.max_staleness=10 &&
  pyjson "set --json" 'd["old_value"] == "9" and d["new_value"] == "10" and d["target"] == "learner"' <<<"$out"
expect_rc 2 "set out of range" q --token-file "$tmp/token" set rollout.max_staleness=99 &&
  { [[ "$err" == *"is outside [0, 16]"* ]] || fail "range message: $err"; }
expect_rc 2 "set of a fixed key" q --token-file "$tmp/token" set rollout.kv_cache=int8 &&
  { [[ "$err" == *FAILED_PRECONDITION*"cannot be changed at run time"* ]] || fail "fixed-key message: $err"; }
expect_rc 2 "set of an unknown key" q --token-file "$tmp/token" set rollout.max_stalenes=1 &&
  { [[ "$err" == *"did you mean rollout.max_staleness"* ]] || fail "unknown-key message: $err"; }
expect_rc 2 "error as JSON" q --json set rollout.max_staleness=1 &&
  pyjson "error --json" 'd["error"]["status"] == "PERMISSION" and d["error"]["exit"] == 2 and not d["error"]["retriable"]' <<<"$out"
expect_rc 0 "value kept through the refusals" q --token-file "$tmp/token" --json set rollout.max_staleness=3 &&
  pyjson "set after refusals" 'd["old_value"] == "10"' <<<"$out"

# ---- learner and replica commands -------------------------------------------------------
expect_rc 0 "pause (learner)" q --token-file "$tmp/token" pause &&
  { [ "$out" = "learner: PAUSED - dispatch paused" ] || fail "pause output: $out"; }
expect_rc 0 "status shows the pause" q --json status && pyjson "paused" 'd["state"] == "PAUSED"' <<<"$out"
expect_rc 0 "resume (learner)" q --token-file "$tmp/token" resume
expect_rc 0 "pause a replica" q --token-file "$tmp/token" pause rollout-1 &&
  { [ "$out" = "rollout-1: PAUSED - replica paused" ] || fail "replica pause output: $out"; }
expect_rc 2 "pause an unknown replica" q --token-file "$tmp/token" pause rollout-9 &&
  { [[ "$err" == *"registered: rollout-0, rollout-1"* ]] || fail "unknown replica message: $err"; }
expect_rc 0 "set on a replica" q --token-file "$tmp/token" set rollout.max_staleness=2 rollout-0 &&
  { [[ "$out" == "rollout-0: rollout.max_staleness = 2 (was 3)" ]] || fail "replica set output: $out"; }
expect_rc 0 "drain" q --token-file "$tmp/token" --drain-timeout 30 drain rollout-0 &&
  { [ "$out" = "rollout-0: DRAINING - draining" ] || fail "drain output: $out"; }
expect_rc 2 "drain an unknown replica" q --token-file "$tmp/token" drain ghost
expect_rc 0 "checkpoint --json" q --token-file "$tmp/token" --json checkpoint nightly &&
  pyjson "checkpoint" 'd["path"] == "/tmp/qrl-ckpt/step-42-nightly" and d["step"] == 42' <<<"$out"

# ---- usage and local errors -------------------------------------------------------------
expect_rc 0 "--help" "$ctl" --help &&
  for w in status replicas pause resume drain checkpoint set metrics shutdown "exit status"; do
    grep -q -- "$w" <<<"$out" || fail "--help lacks '$w'"
  done
expect_rc 1 "no command" "$ctl"
expect_rc 1 "unknown command" q frobnicate
expect_rc 1 "unknown option" q --frob status
expect_rc 1 "set without '='" q set rollout.max_staleness
expect_rc 1 "drain without a replica" q drain
expect_rc 1 "bad --timeout" q --timeout 0 status
expect_rc 5 "missing token file" q --token-file "$tmp/nope" status &&
  { [[ "$err" == *"$tmp/nope"* ]] || fail "missing token file message: $err"; }

# ---- unreachable: a port nothing listens on --------------------------------------------
free_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s%N)
expect_rc 3 "unreachable server" "$ctl" --learner "127.0.0.1:$free_port" --timeout 3 status &&
  { [[ "$err" == *UNAVAILABLE* ]] || fail "unreachable message: $err"; }
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$ms" -lt 3000 ] || fail "unreachable took $ms ms"
expect_rc 3 "unreachable, --json" "$ctl" --learner "127.0.0.1:$free_port" --timeout 3 --json status &&
  pyjson "unreachable json" 'd["error"]["retriable"] and d["error"]["status"] == "NETWORK" and d["error"]["exit"] == 3' <<<"$out"

# ---- shutdown: the reply arrives, then the server exits by itself ------------------------
expect_rc 0 "shutdown" q --token-file "$tmp/token" --checkpoint shutdown &&
  { [ "$out" = "learner: STOPPED - stopping" ] || fail "shutdown output: $out"; }
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$pid" 2>/dev/null; then fail "the server still runs after shutdown"; else
  wait "$pid"; src=$?; pid=; [ "$src" -eq 0 ] || fail "server exit status $src"; fi

[ "$fails" -eq 0 ] || { echo "--- server log"; cat "$tmp/server.log"; echo "$fails failed"; exit 1; }
echo "all passed"
