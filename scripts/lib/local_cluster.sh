# Shell helpers to run a local coordinator and worker daemons (sourced by run_example.sh,
# bench/run_bench.sh and gpu_fault_demo.sh). Needs COORDINATOR and WORKER set to the binaries.
# Every process started is recorded in CLUSTER_PIDS; stop_cluster terminates them.

CLUSTER_PIDS=()
CLUSTER_DIR=${CLUSTER_DIR:-$(mktemp -d)}

# start_coordinator [extra coordinator flags...]: sets ADDRESS=127.0.0.1:PORT.
start_coordinator() {
  "$COORDINATOR" --listen=127.0.0.1:0 --port_file="$CLUSTER_DIR/port" "$@" \
    >"$CLUSTER_DIR/coordinator.log" 2>&1 &
  CLUSTER_PIDS+=($!)
  for _ in $(seq 200); do [ -s "$CLUSTER_DIR/port" ] && break; sleep 0.05; done
  if [ ! -s "$CLUSTER_DIR/port" ]; then
    echo "the coordinator did not start; see $CLUSTER_DIR/coordinator.log" >&2
    return 1
  fi
  ADDRESS=127.0.0.1:$(cat "$CLUSTER_DIR/port")
}

# start_worker NAME [GPU index or ""] [extra worker flags...]
start_worker() {
  local name=$1 gpu=$2
  shift 2
  if [ -n "$gpu" ]; then
    CUDA_VISIBLE_DEVICES=$gpu "$WORKER" --coordinator="$ADDRESS" --name="$name" \
      --work_dir="$CLUSTER_DIR/$name" "$@" >"$CLUSTER_DIR/$name.log" 2>&1 &
  else
    "$WORKER" --coordinator="$ADDRESS" --name="$name" --work_dir="$CLUSTER_DIR/$name" "$@" \
      >"$CLUSTER_DIR/$name.log" 2>&1 &
  fi
  CLUSTER_PIDS+=($!)
}

# wait_for_workers COUNT: until COUNT workers are ALIVE (10 s at most).
wait_for_workers() {
  for _ in $(seq 200); do
    if [ "$("$TRAINCTL" --coordinator="$ADDRESS" --output=json workers | grep -c '"ALIVE"')" -ge "$1" ]; then
      return 0
    fi
    sleep 0.05
  done
  echo "only some of $1 workers registered; see $CLUSTER_DIR" >&2
  return 1
}

stop_cluster() {
  for pid in "${CLUSTER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${CLUSTER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  CLUSTER_PIDS=()
}
