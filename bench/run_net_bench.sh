#!/usr/bin/env bash
# Network-bound speed (issue: multi-node), on the GPU machine after `source device_bundle/env.sh`:
# the two GPUs act as two hosts (distinct NCCL_HOSTID, NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1:
# NCCL's socket transport, as between nodes), the same settings for both engines, in one run.
# Ours through the service (coordinator, two worker daemons, trainctl submit; the median of the
# step times in telemetry after WARMUP steps), PyTorch DDP + GradScaler + no_sync under torchrun
# (bench/pytorch_baseline.py --as_hosts), each with fp32 gradients and with the fp16 and bf16
# compress hooks (our grad_comm_dtype).
#   CONFIGS="mlp1k mlp8k" WARMUP=5 STEPS=20 bash bench/run_net_bench.sh
# NCCL's socket settings apply to both engines alike: e.g. NCCL_SOCKET_NTHREADS=4
# NCCL_NSOCKS_PERTHREAD=4 in the environment (TAG names the variant in the results).
# LANES sets our JobSpec.grad_comm_lanes (default 0: rank 0 decides, 4 between these "hosts";
# LANES=1 is one communicator, as PyTorch's process group has).
# TRANSPORT=nvlink measures the same way with NCCL's own choice (NVLink between the two GPUs of
# one host): the step through the service beside PyTorch, for issue 16's "through the service".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mptrain-out}
mkdir -p "$OUT"
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-20}
CONFIGS=${CONFIGS:-mlp1k mlp8k}
COMMS=${COMMS:-fp32 fp16 bf16}
TAG=${TAG:-default}
LANES=${LANES:-0}
TRANSPORT=${TRANSPORT:-socket}
RESULTS="$OUT/net_bench_${TRANSPORT}_$TAG.jsonl"
: >"$RESULTS"
export NCCL_NVLS_ENABLE=0
AS_HOSTS=()
if [ "$TRANSPORT" = socket ]; then
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
  AS_HOSTS=(--as_hosts)
fi

source bench/lib/configs.sh  # widths_of CONFIG

COORDINATOR=$MPTRAIN_BIN/coordinator WORKER=$MPTRAIN_BIN/worker TRAINCTL=$MPTRAIN_BIN/trainctl
source scripts/lib/local_cluster.sh
start_coordinator
if [ "$TRANSPORT" = socket ]; then
  NCCL_HOSTID=net-host-a start_worker hostA 0 --device=cuda
  NCCL_HOSTID=net-host-b start_worker hostB 1 --device=cuda
else
  start_worker hostA 0 --device=cuda
  start_worker hostB 1 --device=cuda
fi
wait_for_workers 2 || exit 1
status=0
for config in $CONFIGS; do
  IFS='|' read -r input hidden output batch <<<"$(widths_of "$config")"
  for comm in $COMMS; do
    spec="$CLUSTER_DIR/$config-$comm.json"
    cat >"$spec" <<SPEC
{"name": "$config-$comm", "world_size": 2, "device": "cuda",
 "model": {"input_dim": $input, "hidden_dims": [$hidden], "output_dim": $output, "activation": "relu"},
 "data": {"synthetic": {"seed": 0}}, "micro_batch_size": $batch, "accumulation_steps": 4,
 "steps": $((WARMUP + STEPS)), "precision": "fp16", "grad_comm_dtype": "$comm",
 "grad_comm_lanes": $LANES,
 "optimizer": {"lr": 0.01}, "telemetry_every": 1}
SPEC
    job=$("$TRAINCTL" --coordinator="$ADDRESS" submit "$spec" --wait | tail -1)
    "$TRAINCTL" --coordinator="$ADDRESS" export "$job" --format=jsonl >"$CLUSTER_DIR/$config-$comm.jsonl" || status=1
    LANES=$LANES python3 - "$CLUSTER_DIR/$config-$comm.jsonl" "$config" "$comm" "$WARMUP" <<'PY' | tee -a "$RESULTS"
import json, os, statistics, sys
path, config, comm, warmup = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
records = [json.loads(line) for line in open(path) if line.strip()]
times = [r.get("stepTimeMs", r.get("step_time_ms")) for r in records
         if int(r.get("step", 0)) > warmup and r.get("rank", 0) in (0, None)]
times = [t for t in times if t is not None]
print(json.dumps({"engine": "mptrain (service)", "config": config, "grad_comm": comm,
                  "lanes": int(os.environ.get("LANES", "0")) or "auto",
                  "nccl_socket": "threads %s x socks %s" % (os.environ.get("NCCL_SOCKET_NTHREADS", "default"),
                                                          os.environ.get("NCCL_NSOCKS_PERTHREAD", "default")),
                  "step_ms": statistics.median(times) if times else None, "steps": len(times)}))
PY
  done
done
stop_cluster
for comm in $COMMS; do
  hook=$([ "$comm" = fp32 ] && echo none || echo "$comm")
  python3 -m torch.distributed.run --standalone --nproc_per_node=2 bench/pytorch_baseline.py \
    --configs "$(echo $CONFIGS | tr ' ' ,)" --warmup "$WARMUP" --steps "$STEPS" --hook "$hook" \
    "${AS_HOSTS[@]}" 2>"$OUT/net_pytorch_${TRANSPORT}_$comm.err" | tee -a "$RESULTS" || status=1
done
LANES=$LANES TAG=$TAG TRANSPORT=$TRANSPORT python3 - "$RESULTS" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
ours = {(r["config"], r["grad_comm"]): r["step_ms"] for r in rows if r["engine"] != "pytorch"}
torch = {(r["config"], r["grad_comm"]): r["step_ms"] for r in rows if r["engine"] == "pytorch"}
print(f"NCCL {os.environ.get('TRANSPORT', 'socket')} transport, {os.environ.get('TAG', 'default')} settings, "
      f"our grad_comm_lanes {os.environ.get('LANES', '0')} (0: auto)")
print(f"{'config':<8}{'grad comm':<11}{'mptrain ms':>12}{'pytorch ms':>12}{'speed-up':>10}")
for key in sorted(set(ours) | set(torch)):
    a, b = ours.get(key), torch.get(key)
    ratio = f"{b / a:.2f}x" if a and b else "-"
    print(f"{key[0]:<8}{key[1]:<11}{(a or 0):>12.2f}{(b or 0):>12.2f}{ratio:>10}")
PY
exit $status
