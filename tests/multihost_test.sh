#!/usr/bin/env bash
# Four simulated hosts (tests/lib/simulated_hosts.sh): the coordinator on h0, listening on its
# network address with mutual TLS and tokens (required off loopback), and one worker daemon on
# each of h1, h2 and h3, started WITHOUT --host. The workers must advertise their own network
# addresses (not 127.0.0.1), a 2-rank and a 3-rank job must succeed across the hosts (gloo
# between them), and a worker told --host=127.0.0.1 while its coordinator is on another host
# must refuse to start, saying why.
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

bash "$RUNFILES/scripts/make_pki.sh" "$WORK/pki" $NET.10 >/dev/null
TLS=(--tls_ca="$WORK/pki/ca.pem" --tls_cert="$WORK/pki/client.pem" --tls_key="$WORK/pki/client.key")
COORDINATOR=$NET.10:50051

on_host 0 "$BIN_COORDINATOR" --listen=$COORDINATOR --state_dir="$WORK/state" \
  --tls_cert="$WORK/pki/server.pem" --tls_key="$WORK/pki/server.key" \
  --tls_client_ca="$WORK/pki/ca.pem" --token_file="$WORK/pki/tokens" >"$WORK/coordinator.log" 2>&1 &
for i in 1 2 3; do
  mkdir -p "$WORK/w$i"
  on_host $i "$BIN_WORKER" --coordinator=$COORDINATOR --device=cpu --slots=1 --name=w$i \
    --work_dir="$WORK/w$i" --data_root="$WORK" --output_root="$WORK" "${TLS[@]}" \
    --token_file="$WORK/pki/worker.token" >"$WORK/worker$i.log" 2>&1 &
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

# Three ranks on three hosts.
sed 's/"world_size": 2/"world_size": 3/' "$SPEC" >"$WORK/three.json"
submitted=$(ctl submit "$WORK/three.json" --wait 2>&1)
status=$?
[ $status -eq 0 ] || fail "the 3-host job did not succeed (exit $status): $(echo "$submitted" | tail -3)"
ctl status "$(echo "$submitted" | tail -n 1)" >"$WORK/status3.txt"
for i in 1 2 3; do
  grep -q "$NET.1$i" "$WORK/status3.txt" || fail "the 3-rank job has no rank on h$i"
done

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
echo "multihost: 5 checks passed"
