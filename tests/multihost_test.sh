#!/usr/bin/env bash
# Four simulated hosts (tests/lib/simulated_hosts.sh): the coordinator on h0, listening on its
# network address with mutual TLS and tokens (required off loopback), and one worker daemon on
# each of h1, h2 and h3, started WITHOUT --host. The workers must advertise their own network
# addresses (not 127.0.0.1), a 2-rank and a 3-rank job must succeed across the hosts (gloo
# between them), and a worker told --host=127.0.0.1 while its coordinator is on another host
# must refuse to start, saying why, as must one told another host's address. The worker on h1
# runs with --port_range: while its rank of the 3-rank job connects (its peers' daemons held
# back with SIGSTOP meanwhile), it must listen on ports of that range only, bound to h1's
# address (not 0.0.0.0), with NCCL pinned to h1's interface in its environment, and its peers'
# connections must arrive at ports of the range; a --port_range too small for --slots, or
# reversed, is refused naming the flag.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
BIN_COORDINATOR=$RUNFILES/coordinator/coordinator
BIN_WORKER=$RUNFILES/worker/worker
BIN_TRAINCTL=$RUNFILES/client/trainctl
SPEC=$RUNFILES/examples/seed_cpu.json

N_HOSTS=4
source "$RUNFILES/tests/lib/simulated_hosts.sh"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
hosts_up

bash "$RUNFILES/scripts/make_pki.sh" --worker w1 --worker w2 --worker w3 --worker bad \
  --worker elsewhere --worker small --worker reversed "$WORK/pki" $NET.10 >/dev/null
# A worker's own credentials (make_pki.sh --worker NAME): the coordinator registers it as NAME only.
creds() { local p=$WORK/pki; echo "--tls_ca=$p/ca.pem --tls_cert=$p/$1.pem --tls_key=$p/$1.key --token_file=$p/$1.token"; }
TLS=(--tls_ca="$WORK/pki/ca.pem" --tls_cert="$WORK/pki/client.pem" --tls_key="$WORK/pki/client.key")
COORDINATOR=$NET.10:50051

on_host 0 "$BIN_COORDINATOR" --listen=$COORDINATOR --state_dir="$WORK/state" \
  --tls_cert="$WORK/pki/server.pem" --tls_key="$WORK/pki/server.key" \
  --tls_client_ca="$WORK/pki/ca.pem" --token_file="$WORK/pki/tokens" \
  --heartbeat_timeout=30 >"$WORK/coordinator.log" 2>&1 &
PORTS_LO=29500
PORTS_HI=29509
for i in 1 2 3; do
  mkdir -p "$WORK/w$i"
  ports=()
  [ $i -eq 1 ] && ports=(--port_range=$PORTS_LO-$PORTS_HI)
  on_host $i "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --slots=1 --name=w$i \
    --work_dir="$WORK/w$i" --data_root="$WORK" --output_root="$WORK" $(creds w$i) \
    "${ports[@]}" >"$WORK/worker$i.log" 2>&1 &
done

ctl() { on_host 0 "$BIN_TRAINCTL" --coordinator=$COORDINATOR "${TLS[@]}" \
          --token_file="$WORK/pki/alice.token" "$@"; }
for _ in $(seq 100); do
  [ "$(ctl --output=json workers 2>/dev/null | grep -c '"ALIVE"')" -ge 3 ] && break
  sleep 0.1
done
workers=$(ctl workers)
echo "$workers"
for i in 1 2 3; do
  grep -q "w$i#.* $NET.1$i " <<<"$workers" || fail "worker w$i does not advertise $NET.1$i"
done
grep -q "127.0.0.1" <<<"$workers" && fail "a worker advertises 127.0.0.1"

submitted=$(ctl submit "$SPEC" --wait 2>&1)
status=$?
echo "$submitted" | tail -4
[ $status -eq 0 ] || fail "the cross-host job did not succeed (exit $status)"
ctl status "$(echo "$submitted" | tail -n 1)" | tee "$WORK/status.txt"
grep -q "$NET.11" "$WORK/status.txt" && grep -q "$NET.12" "$WORK/status.txt" ||
  fail "the job's ranks were not placed on both hosts"

# Three ranks on three hosts. w1 has --port_range. Placement takes tied workers in name order,
# so w1 gets rank 0, which makes its connections first (gloo's other ranks first wait for the
# lower ranks' host names), and h1 has the lowest address, the side of each connection that
# listens (gloo: the larger address connects). With the daemons of h2 and h3 held (SIGSTOP,
# well within the heartbeat timeout), h1's rank waits for its peers, listening, while h1 is
# looked at.
# 300 steps (a few seconds): long enough that the sampling below sees the peers' connections
# even on a loaded machine (5 steps once ended between two samples).
sed -e 's/"world_size": 2/"world_size": 3/' -e 's/"steps": 5,/"steps": 300,/' "$SPEC" >"$WORK/three.json"
grep -q '"steps": 300' "$WORK/three.json" || fail "could not lengthen the 3-rank job"
for _ in $(seq 100); do  # The last job's slots are free once its ranks' exits are reported.
  [ "$(ctl --output=json workers | grep -o '"free_slots": *1' | wc -l)" -ge 3 ] && break
  sleep 0.1
done
held=$(host_processes 2 "--name=w2"; host_processes 3 "--name=w3")
kill -STOP $held
ctl submit "$WORK/three.json" --wait >"$WORK/submit3.txt" 2>&1 &
submit_pid=$!
listeners=""
deadline=$((SECONDS + 15))  # w2 and w3 are stopped: well inside the 30 s heartbeat timeout
while [ $SECONDS -lt $deadline ]; do
  listeners=$(on_host 1 ss -Hltnp | grep '"worker"')
  [ "$(echo "$listeners" | grep -c LISTEN)" -ge 2 ] && break
  sleep 0.05
done
rank=$(echo "$listeners" | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2)
# NCCL would take the interface that holds h1's address (a CPU rank has it too).
ifname=$([ -n "$rank" ] && tr '\0' '\n' </proc/$rank/environ | grep '^NCCL_SOCKET_IFNAME=')
kill -CONT $held
echo "h1's rank ${rank:-(none)} listens on:"
echo "$listeners"
[ "$ifname" = "NCCL_SOCKET_IFNAME==eth0" ] ||
  fail "h1's rank does not have NCCL pinned to eth0: ${ifname:-unset}"
[ "$(echo "$listeners" | grep -c LISTEN)" -eq 2 ] ||
  fail "h1's rank of 3 does not listen on one socket per peer while it connects: $listeners"
in_range() { [ "$1" -ge $PORTS_LO ] 2>/dev/null && [ "$1" -le $PORTS_HI ]; }
for local in $(echo "$listeners" | awk '{print $4}'); do
  [ "${local%:*}" = "$NET.11" ] || fail "h1's rank listens on $local, not on $NET.11"
  in_range "${local##*:}" || fail "h1's rank listens on $local, outside --port_range $PORTS_LO-$PORTS_HI"
done
# While the job runs: every socket that listens on h1 (only ranks do) is in the range, and the
# peers' connections arrive at ports of the range.
: >"$WORK/h1_listening.txt"
: >"$WORK/h1_peers.txt"
while kill -0 $submit_pid 2>/dev/null; do
  on_host 1 ss -Hltn | awk '{print $4}' >>"$WORK/h1_listening.txt"
  on_host 1 ss -Htn | awk -v peers="^$NET.1[23]:" '$5 ~ peers {print $4 " <- " $5}' >>"$WORK/h1_peers.txt"
  sleep 0.03
done
for local in $(sort -u "$WORK/h1_listening.txt"); do
  in_range "${local##*:}" || fail "a socket on h1 listened on $local, outside the range"
done
[ -s "$WORK/h1_peers.txt" ] || fail "no connection from h2 or h3 to h1's rank was seen"
for local in $(awk '{print $1}' "$WORK/h1_peers.txt" | sort -u); do
  in_range "${local##*:}" || fail "a peer connected to h1's rank at $local, outside the range"
done
echo "connections to h1's rank seen: $(sort -u "$WORK/h1_peers.txt" | tr '\n' ' ')"
wait $submit_pid
status=$?
submitted=$(cat "$WORK/submit3.txt")
[ $status -eq 0 ] || fail "the 3-host job did not succeed (exit $status): $(echo "$submitted" | tail -3)"
ctl status "$(echo "$submitted" | tail -n 1)" >"$WORK/status3.txt"
for i in 1 2 3; do
  grep -q "$NET.1$i" "$WORK/status3.txt" || fail "the 3-rank job has no rank on h$i"
done

# Loopback towards a coordinator on another host: refused at start, with the reason.
on_host 2 "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --name=bad --host=127.0.0.1 \
  $(creds bad) >"$WORK/bad.log" 2>&1
code=$?
[ $code -eq 2 ] || fail "a worker with --host=127.0.0.1 started (exit $code)"
grep -q "loopback" "$WORK/bad.log" || fail "the refusal does not say loopback: $(cat "$WORK/bad.log")"

# An address of another host: no rank could listen there; refused at start, with the reason.
on_host 2 "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --name=elsewhere --host=$NET.13 \
  $(creds elsewhere) >"$WORK/elsewhere.log" 2>&1
code=$?
[ $code -eq 2 ] || fail "a worker with --host=$NET.13 (h3's address) started on h2 (exit $code)"
grep -q "no network interface of this machine holds $NET.13" "$WORK/elsewhere.log" ||
  fail "the refusal of another host's address does not say why: $(cat "$WORK/elsewhere.log")"

# --port_range: at least one port per slot, and well formed; the error names the flag.
on_host 3 "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --slots=2 --name=small \
  --port_range=29600-29600 $(creds small) >"$WORK/small.log" 2>&1
code=$?
[ $code -eq 2 ] || fail "a worker with 2 slots and 1 port started (exit $code)"
grep -q -- "--port_range 29600-29600 has 1 port but this worker runs 2 ranks" "$WORK/small.log" ||
  fail "the refusal of a small range does not say why: $(cat "$WORK/small.log")"
on_host 3 "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --name=reversed \
  --port_range=29700-29600 $(creds reversed) >"$WORK/reversed.log" 2>&1
code=$?
[ $code -eq 2 ] || fail "a worker with --port_range=29700-29600 started (exit $code)"
grep -q -- "--port_range 29700-29600: LO must be <= HI" "$WORK/reversed.log" ||
  fail "the refusal of a reversed range does not say why: $(cat "$WORK/reversed.log")"

if [ $failures -ne 0 ]; then
  for f in "$WORK"/*.log; do echo "--- $f"; tail -20 "$f"; done
  echo "0 passed, $failures failed"
  exit 1
fi
echo "multihost: 15 checks passed"
