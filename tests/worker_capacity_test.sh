#!/usr/bin/env bash
# A coordinator full of live workers (--max_live_workers 1) and a second real daemon: the
# refusal carries a retry delay that the daemon honours (it waits at least 1 s, longer after
# each refusal, instead of every 2 s at most for ever), the coordinator counts it
# (mptrain_worker_registrations_refused_total{reason="capacity"}, trainctl workers), a queued
# job's reason says a worker was refused, and the refused daemon gets in once room frees.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
COORDINATOR=$RUNFILES/coordinator/coordinator
WORKER=$RUNFILES/worker/worker
TRAINCTL=$RUNFILES/client/trainctl
CLUSTER_DIR=${TEST_TMPDIR:-/tmp}/worker_capacity.$$
mkdir -p "$CLUSTER_DIR"
source "$RUNFILES/scripts/lib/local_cluster.sh"
trap stop_cluster EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ctl() { "$TRAINCTL" --coordinator="$ADDRESS" "$@"; }

start_coordinator --heartbeat_timeout=3 --max_live_workers=1 --http_listen=127.0.0.1:0 \
  --http_port_file="$CLUSTER_DIR/http_port" || exit 1
start_worker w1 "" --device=cpu --slots=1
wait_for_workers 1 || exit 1
first_pid=${CLUSTER_PIDS[1]}
start_worker w2 "" --device=cpu --slots=1

# Three refusals in a row: the daemon's waits grow from the coordinator's 1 s.
for _ in $(seq 300); do
  [ "$(grep -c 'retrying in' "$CLUSTER_DIR/w2.log")" -ge 3 ] && break
  sleep 0.1
done
waits=$(grep -o 'retrying in [0-9]* ms' "$CLUSTER_DIR/w2.log" | head -3 | grep -o '[0-9]*')
echo "w2's first waits (ms):" $waits
[ "$(echo "$waits" | wc -l)" -eq 3 ] || fail "w2 was not refused three times"
set -- $waits
[ "${1:-0}" -ge 1000 ] || fail "the first wait (${1:-?} ms) is under the coordinator's 1 s"
[ "${3:-0}" -ge 4000 ] || fail "the third wait (${3:-?} ms) did not grow (doubling from 1 s)"
grep -q "RESOURCE_EXHAUSTED\|--max_live_workers 1" "$CLUSTER_DIR/w2.log" ||
  fail "w2's log does not say why it was refused"

listing=$(ctl workers)
grep -q "registrations refused for capacity (--max_live_workers 1); last: w2" <<<"$listing" ||
  fail "trainctl workers does not show the refusals: $listing"
HTTP=http://127.0.0.1:$(cat "$CLUSTER_DIR/http_port")
refused=$(curl -sf "$HTTP/metrics" |
  sed -n 's/^mptrain_worker_registrations_refused_total{reason="capacity"} //p')
[ "${refused:-0}" -ge 3 ] 2>/dev/null || fail "the refusal metric says '${refused:-}'"

cat >"$CLUSTER_DIR/job.json" <<JSON
{"name": "needs-two", "world_size": 2, "device": "cpu",
 "model": {"input_dim": 8, "hidden_dims": [8], "output_dim": 2, "activation": "relu"},
 "loss": "mse", "data": {"synthetic": {"seed": 1}}, "micro_batch_size": 4,
 "accumulation_steps": 1, "steps": 5, "precision": "fp32", "optimizer": {"lr": 0.01}, "seed": 3}
JSON
job=$(ctl submit "$CLUSTER_DIR/job.json" | tail -n 1)
reason=$(ctl --output=json status "$job" |
  python3 -c "import json, sys; print(json.load(sys.stdin).get('pending_reason', ''))")
echo "pending: $reason"
grep -q "1 worker refused for capacity" <<<"$reason" ||
  fail "the queued job's reason does not name the refused worker"

# Room frees: w1 leaves (SIGTERM: it deregisters); w2 gets in at its next try (<= 60 s).
kill -TERM "$first_pid"
joined=
for _ in $(seq 700); do
  if grep -q '"w2#' <<<"$(ctl --output=json workers)"; then joined=1; break; fi
  sleep 0.1
done
[ -n "$joined" ] || fail "w2 did not register once room freed"

[ "$failures" -eq 0 ] && echo PASS || tail -20 "$CLUSTER_DIR/coordinator.log"
exit $((failures > 0))
