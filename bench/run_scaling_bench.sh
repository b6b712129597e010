#!/usr/bin/env bash
# Scaling on one host (issue 17), on the GPU machine after `source device_bundle/env.sh`: for N in
# 1, 2, 4, 8 GPUs (up to what `nvidia-smi -L` lists; GPUS="1 2" overrides), ours through the
# service both as ONE worker daemon with N slots and as N daemons of one slot each (a fresh
# coordinator per layout; jobs submitted with trainctl; the median step_time_ms of the exported
# telemetry after WARMUP steps), and PyTorch DDP + GradScaler + no_sync under torchrun
# (bench/pytorch_baseline.py) in the same run, for seed, mlp1k and mlp8k.
#   GPUS="1 2 4 8" CONFIGS="seed mlp1k mlp8k" WARMUP=5 STEPS=20 bash bench/run_scaling_bench.sh
# Weak scaling: the micro-batch per rank is fixed (bench/bench_configs.h), so the global batch
# grows with N; efficiency = t1 / tN. Gradient allreduce bus bandwidth: ours from
# bench/train_bench --gpus N (our engine in one process, the same Collective), PyTorch's from a
# dist.all_reduce of the same size. bench/scaling_report.py prints the table (and issue 17's
# goals); results go to $OUT/scaling_bench.jsonl. Should 1, 2, 4, 8 not fit in one device call
# (scripts/device_run.sh gives it 580 s), split it: GPUS="1 2 4", then GPUS="1 8" (t1 each time).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mptrain-out}
mkdir -p "$OUT"
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-20}
CONFIGS=${CONFIGS:-seed mlp1k mlp8k}
JOB_TIMEOUT=${JOB_TIMEOUT:-180}
RESULTS="$OUT/scaling_bench.jsonl"
: >"$RESULTS"
export NCCL_NVLS_ENABLE=0

available=$(nvidia-smi -L | grep -c '^GPU ')
if [ -z "${GPUS:-}" ]; then
  GPUS=""
  for n in 1 2 4 8; do [ "$n" -le "$available" ] && GPUS="$GPUS $n"; done
fi
echo "GPUs listed: $available; measuring N = $GPUS"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
nvidia-smi topo -m || true

source bench/lib/configs.sh  # widths_of CONFIG

COORDINATOR=$MPTRAIN_BIN/coordinator WORKER=$MPTRAIN_BIN/worker TRAINCTL=$MPTRAIN_BIN/trainctl
source scripts/lib/local_cluster.sh
status=0

# run_layout N WORKERS SLOTS: a fresh coordinator and WORKERS daemons of SLOTS GPUs each, then
# one job per configuration with world_size N.
run_layout() {
  local n=$1 workers=$2 slots=$3 layout="$2x$3"
  CLUSTER_DIR=$(mktemp -d)
  start_coordinator || return 1
  local w first
  for ((w = 0; w < workers; w++)); do
    first=$((w * slots))
    start_worker "w$w" "$(seq -s, "$first" $((first + slots - 1)))" --device=cuda --slots="$slots"
  done
  if ! wait_for_workers "$workers"; then stop_cluster; return 1; fi
  local config input hidden output batch spec job state
  for config in $CONFIGS; do
    IFS='|' read -r input hidden output batch <<<"$(widths_of "$config")"
    spec="$CLUSTER_DIR/$config.json"
    cat >"$spec" <<SPEC
{"name": "scaling-$config-$layout", "world_size": $n, "device": "cuda",
 "model": {"input_dim": $input, "hidden_dims": [$hidden], "output_dim": $output,
           "activation": "relu"},
 "data": {"synthetic": {"seed": 0}}, "micro_batch_size": $batch, "accumulation_steps": 4,
 "steps": $((WARMUP + STEPS)), "precision": "fp16",
 "optimizer": {"lr": 0.01}, "telemetry_every": 1}
SPEC
    job=$("$TRAINCTL" --coordinator="$ADDRESS" submit "$spec" | tail -1)
    timeout "$JOB_TIMEOUT" "$TRAINCTL" --coordinator="$ADDRESS" watch "$job" \
      >"$CLUSTER_DIR/$config.watch" 2>&1
    state=$("$TRAINCTL" --coordinator="$ADDRESS" --output=json status "$job" |
            python3 -c 'import json, sys; print(json.load(sys.stdin).get("state", "UNKNOWN"))' \
            2>/dev/null || echo UNKNOWN)
    if [ "$state" != SUCCEEDED ]; then
      status=1
      echo "$config on $layout: $job $state after at most ${JOB_TIMEOUT}s; see $CLUSTER_DIR" >&2
      "$TRAINCTL" --coordinator="$ADDRESS" cancel "$job" >/dev/null 2>&1 || true
    fi
    "$TRAINCTL" --coordinator="$ADDRESS" export "$job" --format=jsonl \
      >"$CLUSTER_DIR/$config.jsonl" || status=1
    python3 bench/scaling_report.py job "$CLUSTER_DIR/$config.jsonl" --config "$config" \
      --gpus "$n" --layout "$layout" --warmup "$WARMUP" --state "$state" | tee -a "$RESULTS"
  done
  stop_cluster
}

for n in $GPUS; do
  echo "=== $n GPU(s)"
  run_layout "$n" 1 "$n" || status=1
  if [ "$n" -gt 1 ]; then run_layout "$n" "$n" 1 || status=1; fi
  "$MPTRAIN_BIN/train_bench" --gpus="$n" --configs="$(echo $CONFIGS | tr ' ' ,)" \
    --warmup="$WARMUP" --steps="$STEPS" 2>"$OUT/scaling_train_bench_$n.err" |
    tee -a "$RESULTS" || status=1
  python3 -m torch.distributed.run --standalone --nproc_per_node="$n" bench/pytorch_baseline.py \
    --configs "$(echo $CONFIGS | tr ' ' ,)" --warmup "$WARMUP" --steps "$STEPS" \
    2>"$OUT/scaling_pytorch_$n.err" | tee -a "$RESULTS" || status=1
done

echo
python3 bench/scaling_report.py table "$RESULTS" | tee "$OUT/scaling_table.md"
exit $status
