#!/usr/bin/env bash
# The benchmark, on the GPU machine (after `source device_bundle/env.sh`): our engine and the
# PyTorch baseline in the same run, on 1 and 2 GPUs, then end to end (trainctl submit to
# SUCCEEDED with daemons running, against torchrun of the original example), then the step
# through the service (bench/run_net_bench.sh, TRANSPORT=nvlink) beside PyTorch.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mptrain-out}
mkdir -p "$OUT"
WARMUP=${WARMUP:-10}
STEPS=${STEPS:-50}
RESULTS="$OUT/bench.jsonl"
: >"$RESULTS"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for gpus in 1 2; do
  "$MPTRAIN_BIN/train_bench" --gpus=$gpus --warmup=$WARMUP --steps=$STEPS | tee -a "$RESULTS"
  python3 -m torch.distributed.run --standalone --nproc_per_node=$gpus \
    bench/pytorch_baseline.py --warmup=$WARMUP --steps=$STEPS 2>"$OUT/pytorch_$gpus.err" | tee -a "$RESULTS"
done

# End to end on 2 GPUs.
COORDINATOR=$MPTRAIN_BIN/coordinator WORKER=$MPTRAIN_BIN/worker TRAINCTL=$MPTRAIN_BIN/trainctl
source scripts/lib/local_cluster.sh
start_coordinator
start_worker gpu0 0 --device=cuda
start_worker gpu1 1 --device=cuda
wait_for_workers 2
for run in 1 2 3; do
  start=$(date +%s.%N)
  "$MPTRAIN_BIN/trainctl" --coordinator="$ADDRESS" submit examples/seed.json --wait >/dev/null
  end=$(date +%s.%N)
  echo "{\"engine\": \"e2e\", \"name\": \"mptrain: trainctl submit --wait (daemons running), run $run\", \"seconds\": $(python3 -c "print(round($end - $start, 3))")}" | tee -a "$RESULTS"
done
for run in 1 2; do
  start=$(date +%s.%N)
  python3 -m torch.distributed.run --standalone --nproc_per_node=2 bench/original_example.py >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "{\"engine\": \"e2e\", \"name\": \"pytorch: torchrun original example, run $run\", \"seconds\": $(python3 -c "print(round($end - $start, 3))")}" | tee -a "$RESULTS"
done
stop_cluster
python3 bench/report.py "$RESULTS"

# The step through the service (jobs submitted with trainctl, telemetry step times) beside
# PyTorch, in this same run: issue 16's measurement (results in $OUT/net_bench_nvlink_*.jsonl).
TRANSPORT=nvlink COMMS=fp32 CONFIGS="seed mlp1k mlp8k" bash bench/run_net_bench.sh | tail -5
