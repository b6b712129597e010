#!/usr/bin/env bash
# The cost of the normalization layers per step, and the latency of small collectives, on the
# GPU machine after `source device_bundle/env.sh`: our engine in process (bench/train_bench) and
# PyTorch DDP + GradScaler + no_sync (bench/pytorch_baseline.py) in the same run, 2 GPUs, each
# configuration without a norm and with each norm. Each line is a JSON record; the table at the
# end is the step time per norm and the cost over no norm.
#   CONFIGS=seed,mlp1k NORMS="none sync_batch_norm" bash bench/run_norm_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mptrain-out}
mkdir -p "$OUT"
WARMUP=${WARMUP:-10}
STEPS=${STEPS:-50}
CONFIGS=${CONFIGS:-mlp1k}
NORMS=${NORMS:-none batch_norm sync_batch_norm layer_norm}
RESULTS="$OUT/norm_bench.jsonl"
: >"$RESULTS"
status=0
for norm in $NORMS; do
  "$MPTRAIN_BIN/train_bench" --gpus=2 --configs="$CONFIGS" --norm="$norm" --warmup="$WARMUP" \
    --steps="$STEPS" | tee -a "$RESULTS" || status=1
  python3 -m torch.distributed.run --standalone --nproc_per_node=2 bench/pytorch_baseline.py \
    --configs "$CONFIGS" --norm "$norm" --warmup "$WARMUP" --steps "$STEPS" \
    2>"$OUT/norm_pytorch_$norm.err" | tee -a "$RESULTS" || status=1
done
python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
step = {(r["engine"], r["config"], r.get("norm", "none")): r for r in rows}
print(f"{'config':<8}{'norm':<17}{'mptrain ms':>11}{'cost':>9}{'pytorch ms':>12}{'cost':>9}"
      f"{'speed-up':>10}{'allreduce ms ours / torch':>28}")
for (engine, config, norm), r in sorted(step.items()):
    if engine != "mptrain":
        continue
    t = step.get(("pytorch", config, norm))
    base_ours = step.get(("mptrain", config, "none"))
    base_torch = step.get(("pytorch", config, "none"))
    cost = lambda x, b: f"{x['step_ms'] - b['step_ms']:+.3f}" if x and b else "-"
    print(f"{config:<8}{norm:<17}{r['step_ms']:>11.3f}{cost(r, base_ours):>9}"
          f"{(t['step_ms'] if t else 0):>12.3f}{cost(t, base_torch):>9}"
          f"{(t['step_ms'] / r['step_ms'] if t else 0):>9.2f}x"
          f"{r['allreduce_ms']:>14.4f} / {(t['allreduce_ms'] if t else 0):.4f}")
PY
exit $status
