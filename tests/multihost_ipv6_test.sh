#!/usr/bin/env bash
# IPv6-only hosts (tests/lib/simulated_hosts.sh, no IPv4 address but loopback): the coordinator
# on h0 listens on its IPv6 address with mutual TLS and tokens, one worker daemon on each of h1
# and h2 is started without --host. Each must advertise its own IPv6 address, and a 2-rank job
# must succeed across the two hosts (gloo over IPv6), its ranks' checksums identical.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
BIN_COORDINATOR=$RUNFILES/coordinator/coordinator
BIN_WORKER=$RUNFILES/worker/worker
BIN_TRAINCTL=$RUNFILES/client/trainctl
SPEC=$RUNFILES/examples/seed_cpu.json

N_HOSTS=3
source "$RUNFILES/tests/lib/simulated_hosts.sh"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
hosts_up
hosts_ipv6_only

bash "$RUNFILES/scripts/make_pki.sh" --worker w1 --worker w2 "$WORK/pki" $NET6:10 >/dev/null
# A worker's own credentials (make_pki.sh --worker NAME): the coordinator registers it as NAME only.
creds() { local p=$WORK/pki; echo "--tls_ca=$p/ca.pem --tls_cert=$p/$1.pem --tls_key=$p/$1.key --token_file=$p/$1.token"; }
TLS=(--tls_ca="$WORK/pki/ca.pem" --tls_cert="$WORK/pki/client.pem" --tls_key="$WORK/pki/client.key")
COORDINATOR="[$NET6:10]:50051"

on_host 0 "$BIN_COORDINATOR" --listen="$COORDINATOR" --state_dir="$WORK/state" \
  --tls_cert="$WORK/pki/server.pem" --tls_key="$WORK/pki/server.key" \
  --tls_client_ca="$WORK/pki/ca.pem" --token_file="$WORK/pki/tokens" >"$WORK/coordinator.log" 2>&1 &
for i in 1 2; do
  mkdir -p "$WORK/w$i"
  on_host $i "$BIN_WORKER" --coordinator="$COORDINATOR" --device=cpu --slots=1 --name=w$i \
    --work_dir="$WORK/w$i" --data_root="$WORK" --output_root="$WORK" $(creds w$i) \
    >"$WORK/worker$i.log" 2>&1 &
done

ctl() { on_host 0 "$BIN_TRAINCTL" --coordinator="$COORDINATOR" "${TLS[@]}" \
          --token_file="$WORK/pki/alice.token" "$@"; }
for _ in $(seq 150); do
  [ "$(ctl --output=json workers 2>/dev/null | grep -c '"ALIVE"')" -ge 2 ] && break
  sleep 0.1
done
workers=$(ctl workers)
echo "$workers"
for i in 1 2; do
  grep -q "w$i#.* $NET6:1$i " <<<"$workers" || fail "worker w$i does not advertise $NET6:1$i"
done

submitted=$(ctl submit "$SPEC" --wait 2>&1)
status=$?
echo "$submitted" | tail -3
[ $status -eq 0 ] || fail "the job across the IPv6 hosts did not succeed (exit $status)"
job=$(echo "$submitted" | tail -n 1)
ctl --output=json status "$job" >"$WORK/status.json"
python3 - "$WORK/status.json" "$NET6" <<'PY' || fail "placement or checksums wrong: $(cat "$WORK/status.json")"
import json, sys
job = json.load(open(sys.argv[1]))
hosts = sorted(p["host"] for p in job["placement"])
sums = [r.get("parameter_checksum") for r in job["progress"]]
print("placed on", hosts, "checksums", sums)
assert hosts == [sys.argv[2] + ":11", sys.argv[2] + ":12"], hosts
assert len(sums) == 2 and len(set(sums)) == 1 and sums[0], sums
PY

if [ $failures -ne 0 ]; then
  for f in "$WORK"/*.log; do echo "--- $f"; tail -20 "$f"; done
  echo "$failures failed"
  exit 1
fi
echo "multihost ipv6: all checks passed"
