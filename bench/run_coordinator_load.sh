#!/usr/bin/env bash
# Load benchmark of one coordinator (CPU only, loopback). For each worker count (default 1000
# and 10000) it starts a fresh coordinator on 127.0.0.1 with a 30 s heartbeat timeout (so the
# workers heartbeat every 6 s, the fifth of it the coordinator answers), runs bench/coordinator_load against it (simulated workers:
# register, heartbeat, one long-poll each; 4 users: submit, get, list, watch, cancel) for 30 s
# after registration and 5 s of warm-up, prints the latency table and the coordinator's CPU,
# threads and RSS, and stops the coordinator. Exits 1 when a run failed (an RPC kind above 1%
# errors, or workers that never registered).
#
#   bash bench/run_coordinator_load.sh [WORKERS...]
#
# Environment: DURATION_S (30), WARMUP_S (5), USERS (4), LOAD_ARGS (more coordinator_load
# flags, e.g. "--channels 16 --threads 2"), MPTRAIN_BIN (a folder holding prebuilt
# `coordinator` and `coordinator_load`: no build).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=("$@")
if [ ${#SIZES[@]} -eq 0 ]; then SIZES=(1000 10000); fi
DURATION_S=${DURATION_S:-30}
WARMUP_S=${WARMUP_S:-5}
USERS=${USERS:-4}
HEARTBEAT_TIMEOUT_S=30

if [ -z "${MPTRAIN_BIN:-}" ]; then
  bazel build //coordinator //bench:coordinator_load
  COORDINATOR=bazel-bin/coordinator/coordinator
  LOAD=bazel-bin/bench/coordinator_load
else
  COORDINATOR=$MPTRAIN_BIN/coordinator
  LOAD=$MPTRAIN_BIN/coordinator_load
fi

# The load opens a few connections, but the coordinator may hold one thread (and the kernel a
# few maps) per waiting long-poll: lift the soft limits to the hard ones.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
ulimit -u "$(ulimit -Hu)" 2>/dev/null || true

WORK_DIR=$(mktemp -d /tmp/coordinator_load.XXXXXX)
# A coordinator that keeps a job store on disk gets a fresh one per run, in WORK_DIR.
STORE_FLAG=0
if grep -q -- '--state_dir' <<<"$("$COORDINATOR" --helpfull 2>&1)"; then STORE_FLAG=1; fi
COORDINATOR_PID=
stop_coordinator() {
  if [ -n "$COORDINATOR_PID" ] && kill -0 "$COORDINATOR_PID" 2>/dev/null; then
    kill -TERM "$COORDINATOR_PID" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$COORDINATOR_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$COORDINATOR_PID" 2>/dev/null || true
    wait "$COORDINATOR_PID" 2>/dev/null || true
  fi
  COORDINATOR_PID=
}
trap 'stop_coordinator; rm -rf "$WORK_DIR"' EXIT

echo "coordinator_load: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo);" \
     "open files $(ulimit -n), processes $(ulimit -u)"
FAILED=0
for WORKERS in "${SIZES[@]}"; do
  echo
  echo "=== $WORKERS workers (load average before: $(cut -d' ' -f1-3 /proc/loadavg)) ==="
  PORT_FILE=$WORK_DIR/port.$WORKERS
  LOG=$WORK_DIR/coordinator.$WORKERS.log
  COORDINATOR_ARGS=(--listen 127.0.0.1:0 --port_file "$PORT_FILE"
                    --heartbeat_timeout "$HEARTBEAT_TIMEOUT_S")
  if [ "$STORE_FLAG" = 1 ]; then COORDINATOR_ARGS+=(--state_dir "$WORK_DIR/state.$WORKERS"); fi
  "$COORDINATOR" "${COORDINATOR_ARGS[@]}" >"$LOG" 2>&1 &
  COORDINATOR_PID=$!
  for _ in $(seq 100); do
    [ -s "$PORT_FILE" ] && break
    sleep 0.1
  done
  if [ ! -s "$PORT_FILE" ]; then
    echo "the coordinator did not start:" >&2
    tail -20 "$LOG" >&2
    exit 1
  fi
  # shellcheck disable=SC2086  # LOAD_ARGS is a list of flags.
  if "$LOAD" --coordinator "127.0.0.1:$(cat "$PORT_FILE")" --coordinator_pid "$COORDINATOR_PID" \
      --workers "$WORKERS" --duration_s "$DURATION_S" --warmup_s "$WARMUP_S" --users "$USERS" \
      ${LOAD_ARGS:-}; then
    echo "PASS: $WORKERS workers"
  else
    echo "FAIL: $WORKERS workers (exit $?)"
    FAILED=1
  fi
  if ! kill -0 "$COORDINATOR_PID" 2>/dev/null; then
    echo "the coordinator died during the run; its log ends:"
    tail -20 "$LOG"
  fi
  stop_coordinator
done
exit $FAILED
