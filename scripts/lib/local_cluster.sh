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

# Where secure_cluster put the CA, certificates and tokens ("": not secure).
CLUSTER_PKI=
# secure_cluster [WORKER NAME...]: a fresh CA, certificates and tokens (scripts/make_pki.sh) in
# $CLUSTER_DIR/pki, one certificate and token per worker name (default: make_pki.sh's), and the
# flags that turn on mutual TLS and tokens everywhere: trainctl acts as the user alice, each
# worker start_worker starts as itself (its own certificate and token: the coordinator
# registers it under that name only).
secure_cluster() {
  local pki=$CLUSTER_DIR/pki name workers=()
  for name in "$@"; do workers+=(--worker "$name"); done
  bash "$(dirname "${BASH_SOURCE[0]}")/../make_pki.sh" "${workers[@]}" "$pki"
  CLUSTER_PKI=$pki
  COORDINATOR_FLAGS+=(--tls_cert="$pki/server.pem" --tls_key="$pki/server.key"
                      --tls_client_ca="$pki/ca.pem" --token_file="$pki/tokens")
  TRAINCTL_FLAGS+=(--tls_ca="$pki/ca.pem" --tls_cert="$pki/client.pem" --tls_key="$pki/client.key"
                   --token_file="$pki/alice.token")
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
  if [ -n "$CLUSTER_PKI" ]; then
    if [ ! -f "$CLUSTER_PKI/$name.token" ]; then
      echo "start_worker: no credentials for worker $name: pass it to secure_cluster" >&2
      return 1
    fi
    set -- --tls_ca="$CLUSTER_PKI/ca.pem" --tls_cert="$CLUSTER_PKI/$name.pem" \
      --tls_key="$CLUSTER_PKI/$name.key" --token_file="$CLUSTER_PKI/$name.token" "$@"
  fi
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
