#!/usr/bin/env bash
# The coordinator itself stops (SIGSTOP for 12 s, as a paused VM or a long stall would) while a
# job runs on two real workers (loopback, heartbeat timeout 5 s: the workers' ranks self-fence
# after 5 s without answers; the grace after the stall, one interval, is 1 s, which the
# coordinator's threads get even on a loaded 2-core machine). Checked, after SIGCONT:
#   - no worker is declared lost: the heartbeats that queued are read first (a grace of one
#     interval); both are ALIVE and the coordinator's log has no "lost: no heartbeat";
#   - the job fails naming the coordinator's stall first, never a lost worker.
# Before, the first liveness check after the stall marked every worker lost ("no heartbeat for
# 8.1 s") and the job blamed one of them.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
COORDINATOR=$RUNFILES/coordinator/coordinator
WORKER=$RUNFILES/worker/worker
TRAINCTL=$RUNFILES/client/trainctl
CLUSTER_DIR=${TEST_TMPDIR:-/tmp}/coordinator_stall.$$
mkdir -p "$CLUSTER_DIR"
source "$RUNFILES/scripts/lib/local_cluster.sh"
stalled_pid=
# A stopped coordinator would not die of SIGTERM: continue it first.
trap '[ -n "$stalled_pid" ] && kill -CONT "$stalled_pid" 2>/dev/null; stop_cluster' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ctl() { "$TRAINCTL" --coordinator="$ADDRESS" "$@"; }

start_coordinator --heartbeat_timeout=5 || exit 1
coordinator_pid=${CLUSTER_PIDS[0]}
start_worker w1 "" --device=cpu --slots=1
start_worker w2 "" --device=cpu --slots=1
wait_for_workers 2 || exit 1

cat >"$CLUSTER_DIR/job.json" <<JSON
{"name": "through-a-stall", "world_size": 2, "device": "cpu",
 "model": {"input_dim": 64, "hidden_dims": [64], "output_dim": 8, "activation": "relu"},
 "loss": "mse", "data": {"synthetic": {"seed": 1}}, "micro_batch_size": 16,
 "accumulation_steps": 1, "steps": 1000000, "precision": "fp32",
 "optimizer": {"lr": 0.01}, "seed": 3, "telemetry_every": 1, "collective_timeout_s": 30}
JSON
job=$(ctl submit "$CLUSTER_DIR/job.json" | tail -n 1)
job_field() {  # EXPRESSION over `job`
  ctl --output=json status "$job" 2>/dev/null |
    python3 -c "import json, sys; job = json.load(sys.stdin); print($1)" 2>/dev/null
}
for _ in $(seq 300); do
  [ "$(job_field "job.get('latest_telemetry', {}).get('step', '0')")" -ge 5 ] 2>/dev/null && break
  sleep 0.1
done
[ "$(job_field "job.get('state')")" = RUNNING ] || { fail "the job did not start"; exit 1; }

stalled_pid=$coordinator_pid
kill -STOP "$coordinator_pid"
sleep 12  # The stall itself: the workers hear nothing for 12 s (their ranks fence after 5 s).
kill -CONT "$coordinator_pid"
stalled_pid=

state=
for _ in $(seq 150); do
  state=$(job_field "job.get('state')")
  [ "$state" = FAILED ] || [ "$state" = PENDING ] && break
  sleep 0.2
done
error=$(job_field "job.get('error', '') or (job.get('failures') or [''])[-1]")
echo "after the stall the job is $state: $error"
[ "$state" = FAILED ] || [ "$state" = PENDING ] || fail "the job did not fail after the stall ($state)"
grep -q "^the coordinator did not run for" <<<"$error" ||
  fail "the job's error does not name the coordinator's stall first"
grep -q "lost: no heartbeat" <<<"$error" && fail "the job blames a lost worker"

alive=$(ctl --output=json workers | grep -c '"ALIVE"')
[ "$alive" -eq 2 ] || fail "$alive of 2 workers ALIVE after the stall"
if grep "lost: no heartbeat" "$CLUSTER_DIR/coordinator.log"; then
  fail "the coordinator declared a worker lost for its own stall"
fi
grep -q "the coordinator did not run for" "$CLUSTER_DIR/coordinator.log" ||
  fail "the coordinator did not log its stall"

[ "$failures" -eq 0 ] && echo PASS || cat "$CLUSTER_DIR/coordinator.log" | tail -20
exit $((failures > 0))
