#!/usr/bin/env bash
# The main job: builds, starts a local coordinator and two worker daemons, submits the original
# example (examples/seed.json on GPUs when two are visible, else examples/seed_cpu.json), shows
# its telemetry live, and shuts everything down. Exits 0 only if the job SUCCEEDED.
#
#   bash scripts/run_example.sh            # auto: CUDA with 2 GPUs, CPU otherwise
#   bash scripts/run_example.sh --cpu      # force the CPU backend
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=auto
for arg in "$@"; do
  case "$arg" in
    --cpu) DEVICE=cpu ;;
    --cuda) DEVICE=cuda ;;
    *) echo "usage: $0 [--cpu|--cuda]" >&2; exit 2 ;;
  esac
done

if [ -z "${MPTRAIN_BIN:-}" ]; then
  bash scripts/setup.sh
  bazel build //coordinator //worker //client:trainctl
  MPTRAIN_BIN=bazel-bin
  COORDINATOR=$MPTRAIN_BIN/coordinator/coordinator
  WORKER=$MPTRAIN_BIN/worker/worker
  TRAINCTL=$MPTRAIN_BIN/client/trainctl
else
  # A prebuilt bundle (scripts/make_device_bundle.sh) with the three binaries side by side.
  COORDINATOR=$MPTRAIN_BIN/coordinator
  WORKER=$MPTRAIN_BIN/worker
  TRAINCTL=$MPTRAIN_BIN/trainctl
fi

GPUS=0
if [ "$DEVICE" != cpu ] && command -v nvidia-smi >/dev/null 2>&1; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
if [ "$DEVICE" = cuda ] && [ "$GPUS" -lt 1 ]; then
  echo "run_example: --cuda asked for but no GPU is visible" >&2
  exit 1
fi
if [ "$GPUS" -ge 2 ]; then
  SPEC=examples/seed.json
  WORKER_ARGS=(--device=cuda --slots=1)
  export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
else
  SPEC=examples/seed_cpu.json
  WORKER_ARGS=(--device=cpu --slots=1)
fi

RUN_DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

"$COORDINATOR" --listen=127.0.0.1:0 --port_file="$RUN_DIR/port" >"$RUN_DIR/coordinator.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$RUN_DIR/port" ] && break; sleep 0.05; done
ADDRESS=127.0.0.1:$(cat "$RUN_DIR/port")
echo "coordinator on $ADDRESS (logs in $RUN_DIR)"

for i in 0 1; do
  if [ "$GPUS" -ge 2 ]; then export CUDA_VISIBLE_DEVICES=$i; fi
  "$WORKER" --coordinator="$ADDRESS" "${WORKER_ARGS[@]}" --name="worker$i" \
    --work_dir="$RUN_DIR/worker$i" >"$RUN_DIR/worker$i.log" 2>&1 &
  PIDS+=($!)
done
unset CUDA_VISIBLE_DEVICES

for _ in $(seq 200); do
  if [ "$("$TRAINCTL" --coordinator="$ADDRESS" --output=json workers | grep -c '"ALIVE"')" -ge 2 ]; then break; fi
  sleep 0.05
done
"$TRAINCTL" --coordinator="$ADDRESS" workers

echo "submitting $SPEC"
set +e
"$TRAINCTL" --coordinator="$ADDRESS" submit "$SPEC" --wait | tee "$RUN_DIR/submit.out"
STATUS=${PIPESTATUS[0]}
set -e
JOB=$(tail -n 1 "$RUN_DIR/submit.out")
"$TRAINCTL" --coordinator="$ADDRESS" status "$JOB"
if [ "$STATUS" -eq 0 ]; then
  echo "run_example: $JOB SUCCEEDED; the coordinator found identical parameters on every rank"
else
  echo "run_example: $JOB did not succeed; logs in $RUN_DIR" >&2
fi
exit "$STATUS"
