#!/usr/bin/env bash
# Three simulated hosts (network namespaces on a bridge, each with its own hostname): the
# coordinator on h0, listening on its network address with mutual TLS and tokens (required off
# loopback), and one worker daemon on each of h1 and h2, started WITHOUT --host. The workers
# must advertise their own network addresses (not 127.0.0.1), the 2-rank job must succeed
# across the hosts (gloo between h1 and h2), and a worker told --host=127.0.0.1 while its
# coordinator is on another host must refuse to start, saying why.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
BIN_COORDINATOR=$RUNFILES/coordinator/coordinator
BIN_WORKER=$RUNFILES/worker/worker
BIN_TRAINCTL=$RUNFILES/client/trainctl
SPEC=$RUNFILES/examples/seed_cpu.json

if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
  echo "SKIPPED: needs root and ip netns (network namespaces) to simulate hosts"
  exit 0
fi

ID=$(( $$ % 200 + 20 ))        # this run's subnet 10.77.$ID.0/24 and names
P=mph$ID
NET=10.77.$ID
WORK=${TEST_TMPDIR:-/tmp}/multihost.$$
mkdir -p "$WORK"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cleanup() {
  for ns in ${P}0 ${P}1 ${P}2 ${P}br; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  done
  sleep 0.2
  for ns in ${P}0 ${P}1 ${P}2 ${P}br; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
cleanup

ip netns add ${P}br
ip -n ${P}br link add br0 type bridge
ip -n ${P}br link set br0 up
for i in 0 1 2; do
  ns=${P}$i
  ip netns add "$ns"
  ip link add ${P}h$i type veth peer name ${P}b$i
  ip link set ${P}h$i netns "$ns"
  ip link set ${P}b$i netns ${P}br
  ip -n ${P}br link set ${P}b$i master br0
  ip -n ${P}br link set ${P}b$i up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set ${P}h$i name eth0
  ip -n "$ns" addr add $NET.1$i/24 dev eth0
  ip -n "$ns" link set eth0 up
done

# A host: its namespace and its own hostname.
on_host() {  # INDEX COMMAND...
  local i=$1; shift
  ip netns exec ${P}$i unshare --uts sh -c "hostname h$i && exec \"\$@\"" sh "$@"
}

bash "$RUNFILES/scripts/make_pki.sh" "$WORK/pki" $NET.10 >/dev/null
TLS=(--tls_ca="$WORK/pki/ca.pem" --tls_cert="$WORK/pki/client.pem" --tls_key="$WORK/pki/client.key")
COORDINATOR=$NET.10:50051

on_host 0 "$BIN_COORDINATOR" --listen=$COORDINATOR --state_dir="$WORK/state" \
  --tls_cert="$WORK/pki/server.pem" --tls_key="$WORK/pki/server.key" \
  --tls_client_ca="$WORK/pki/ca.pem" --token_file="$WORK/pki/tokens" >"$WORK/coordinator.log" 2>&1 &
for i in 1 2; do
  mkdir -p "$WORK/w$i"
  on_host $i "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --slots=1 --name=w$i \
    --work_dir="$WORK/w$i" --data_root="$WORK" --output_root="$WORK" "${TLS[@]}" \
    --token_file="$WORK/pki/worker.token" >"$WORK/worker$i.log" 2>&1 &
done

ctl() { on_host 0 "$BIN_TRAINCTL" --coordinator=$COORDINATOR "${TLS[@]}" \
          --token_file="$WORK/pki/alice.token" "$@"; }
for _ in $(seq 100); do
  [ "$(ctl --output=json workers 2>/dev/null | grep -c '"ALIVE"')" -ge 2 ] && break
  sleep 0.1
done
workers=$(ctl workers)
echo "$workers"
for i in 1 2; do
  echo "$workers" | grep -q "w$i#.* $NET.1$i " || fail "worker w$i does not advertise $NET.1$i"
done
echo "$workers" | grep -q "127.0.0.1" && fail "a worker advertises 127.0.0.1"

submitted=$(ctl submit "$SPEC" --wait 2>&1)
status=$?
echo "$submitted" | tail -4
[ $status -eq 0 ] || fail "the cross-host job did not succeed (exit $status)"
ctl status "$(echo "$submitted" | tail -n 1)" | tee "$WORK/status.txt"
grep -q "$NET.11" "$WORK/status.txt" && grep -q "$NET.12" "$WORK/status.txt" ||
  fail "the job's ranks were not placed on both hosts"

# Loopback towards a coordinator on another host: refused at start, with the reason.
on_host 2 "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --name=bad --host=127.0.0.1 \
  "${TLS[@]}" --token_file="$WORK/pki/worker.token" >"$WORK/bad.log" 2>&1
code=$?
[ $code -eq 2 ] || fail "a worker with --host=127.0.0.1 started (exit $code)"
grep -q "loopback" "$WORK/bad.log" || fail "the refusal does not say loopback: $(cat "$WORK/bad.log")"

if [ $failures -ne 0 ]; then
  for f in "$WORK"/*.log; do echo "--- $f"; tail -20 "$f"; done
  echo "0 passed, $failures failed"
  exit 1
fi
echo "multihost: 4 checks passed"
