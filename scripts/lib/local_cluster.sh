# Shell helpers to run a local coordinator and worker daemons (sourced by run_example.sh,
# bench/run_bench.sh and gpu_fault_demo.sh). Needs COORDINATOR and WORKER set to the binaries.
# Every process started is recorded in CLUSTER_PIDS; stop_cluster terminates them.

CLUSTER_PIDS=()
CLUSTER_DIR=${CLUSTER_DIR:-$(mktemp -d)}
# Flags every trainctl call of these helpers passes (e.g. TLS and a token; see secure_cluster).
TRAINCTL_FLAGS=()
# Flags every worker started here gets.
WORKER_FLAGS=()
# Flags the coordinator gets.
COORDINATOR_FLAGS=()

# secure_cluster: a fresh CA, certificates and tokens (scripts/make_pki.sh) in
# $CLUSTER_DIR/pki, and the flags that turn on mutual TLS and tokens everywhere: trainctl acts
# as the user alice, the workers as the worker principal.
secure_cluster() {
  local pki=$CLUSTER_DIR/pki
  bash "$(dirname "${BASH_SOURCE[0]}")/../make_pki.sh" "$pki"
  local tls=(--tls_ca="$pki/ca.pem" --tls_cert="$pki/client.pem" --tls_key="$pki/client.key")
  COORDINATOR_FLAGS+=(--tls_cert="$pki/server.pem" --tls_key="$pki/server.key"
                      --tls_client_ca="$pki/ca.pem" --token_file="$pki/tokens")
  WORKER_FLAGS+=("${tls[@]}" --token_file="$pki/worker.token")
  TRAINCTL_FLAGS+=("${tls[@]}" --token_file="$pki/alice.token")
}

# start_coordinator [extra coordinator flags...]: sets ADDRESS=127.0.0.1:PORT.
start_coordinator() {
  "$COORDINATOR" --listen=127.0.0.1:0 --port_file="$CLUSTER_DIR/port" \
    --state_dir="$CLUSTER_DIR/state" \
    "${COORDINATOR_FLAGS[@]}" "$@" \
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
# Every worker reads under $CLUSTER_DIR/data and writes under $CLUSTER_DIR/outputs (a worker
# has no implicit roots); extra --data_root/--output_root flags add to them.
start_worker() {
  local name=$1 gpu=$2
  shift 2
  mkdir -p "$CLUSTER_DIR/data" "$CLUSTER_DIR/outputs"
  local roots=(--data_root="$CLUSTER_DIR/data" --output_root="$CLUSTER_DIR/outputs")
  if [ -n "$gpu" ]; then
    CUDA_VISIBLE_DEVICES=$gpu "$WORKER" --coordinator="$ADDRESS" --name="$name" \
      --work_dir="$CLUSTER_DIR/$name" "${roots[@]}" "${WORKER_FLAGS[@]}" "$@" \
      >"$CLUSTER_DIR/$name.log" 2>&1 &
  else
    "$WORKER" --coordinator="$ADDRESS" --name="$name" --work_dir="$CLUSTER_DIR/$name" \
      "${roots[@]}" "${WORKER_FLAGS[@]}" "$@" >"$CLUSTER_DIR/$name.log" 2>&1 &
  fi
  CLUSTER_PIDS+=($!)
}

# wait_for_workers COUNT: until COUNT workers are ALIVE (10 s at most).
wait_for_workers() {
  for _ in $(seq 200); do
    if [ "$("$TRAINCTL" --coordinator="$ADDRESS" "${TRAINCTL_FLAGS[@]}" --output=json workers |
          grep -c '"ALIVE"')" -ge "$1" ]; then
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
