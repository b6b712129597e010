#!/usr/bin/env bash
# GPT-2 training on one GPU through the service (trainctl submit -> coordinator -> worker
# daemon; telemetry every step) beside PyTorch eager and torch.compile in the same run
# (bench/gpt_torch_bench.py), on the GPU machine after `source device_bundle/env.sh`:
#   bash bench/run_gpt_bench.sh
#   CONFIGS="124m:16:4 124m:32:2 350m:16:4" PRECISIONS="bf16 fp16" MODES="eager compile" \
#     GPT_STEPS=20 GPT_WARMUP=5 bash bench/run_gpt_bench.sh
# A configuration is MODEL:MICRO_BATCH:ACCUMULATION (124m: 12 layers, 768 wide, 12 heads;
# 350m: 24, 1024, 16; context 1024, vocabulary 50257 padded to 50304). Prints one JSON line per
# run and a table: ms/step (median after WARMUP steps), tokens/s, TFLOP/s (6N + attention),
# peak memory (smi GiB: the GPU's memory in use above its idle level, sampled by nvidia-smi every
# 100 ms while the engine runs, CUDA context included, for both engines; torch GiB: PyTorch's
# max_memory_allocated, without its context and allocator slack), and seconds to the first
# step (ours: from submit to the first step's telemetry; PyTorch: in its process).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mptrain-out}
mkdir -p "$OUT"
CONFIGS=${CONFIGS:-124m:16:4 124m:32:2}
PRECISIONS=${PRECISIONS:-bf16 fp16}
MODES=${MODES:-eager compile}
# GPT_STEPS / GPT_WARMUP: scripts/device_run.sh uses STEPS for its own list of steps.
STEPS=${GPT_STEPS:-20}
WARMUP=${GPT_WARMUP:-5}
RESULTS="$OUT/gpt_bench.jsonl"
: >"$RESULTS"
export NCCL_NVLS_ENABLE=0
# Which card (ratios differ between cards of one kind: BENCHMARKS.md, round 5) and its power cap.
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,power.limit --format=csv,noheader

shape_of() {  # MODEL -> "layers width heads"
  case "$1" in
    124m) echo "12 768 12" ;;
    350m) echo "24 1024 16" ;;
    *) echo "unknown model $1" >&2; return 1 ;;
  esac
}

COORDINATOR=$MPTRAIN_BIN/coordinator WORKER=$MPTRAIN_BIN/worker TRAINCTL=$MPTRAIN_BIN/trainctl
source scripts/lib/local_cluster.sh
start_coordinator
start_worker gpu0 0 --device=cuda
wait_for_workers 1 || exit 1
TOKENS="$CLUSTER_DIR/data/tokens.bin"
python3 - "$TOKENS" <<'PY'
import sys
import numpy as np
# llm.c's token file: a 256 x int32 header (magic 20240520, version 1, count), uint16 tokens.
count = 4 * 1024 * 1024
header = np.zeros(256, np.int32)
header[:3] = (20240520, 1, count)
tokens = np.random.default_rng(0).integers(0, 50257, count, dtype=np.uint16)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
PY
status=0
# One run of ours through the service (the job in $spec, telemetry every step): a row
# "mptrain (service)", or "mptrain (service) 2nd" for the ABBA order's second run ($1 = -2nd).
run_ours() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 \
    >"$CLUSTER_DIR/mem-$tag-$precision$1.log" &
  smi=$!
  submitted=$(date +%s%3N)
  job=$("$TRAINCTL" --coordinator="$ADDRESS" submit "$spec" --wait | tail -1)
  kill "$smi" 2>/dev/null
  "$TRAINCTL" --coordinator="$ADDRESS" status "$job" >"$CLUSTER_DIR/status-$tag-$precision$1.txt" 2>&1
  "$TRAINCTL" --coordinator="$ADDRESS" export "$job" --format=jsonl \
    >"$CLUSTER_DIR/gpt-$tag-$precision$1.jsonl" || status=1
  python3 - "$CLUSTER_DIR/gpt-$tag-$precision$1.jsonl" "$CLUSTER_DIR/mem-$tag-$precision$1.log" \
    "$WARMUP" "$layers" "$width" "$batch" "$accum" "$precision" "$submitted" "$1" <<'PY' | tee -a "$RESULTS" || status=1
import json, statistics, sys
path, mem_path, warmup, L, C, B, A, precision, submitted, suffix = sys.argv[1:]
warmup, L, C, B, A, submitted = int(warmup), int(L), int(C), int(B), int(A), int(submitted)
records = [json.loads(l) for l in open(path) if l.strip()]
times = [r.get("stepTimeMs", r.get("step_time_ms")) for r in records if int(r.get("step", 0)) > warmup]
times = [t for t in times if t]
first = min((int(r.get("unixMs", r.get("unix_ms", 0))) for r in records if r.get("unixMs") or r.get("unix_ms")), default=0)
mem = [int(x) for x in open(mem_path).read().split() if x.strip().isdigit()]
T, V = 1024, 50304
n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
ms = statistics.median(times) if times else float("nan")
tokens = B * A * T
losses = [r.get("loss") for r in records]
print(json.dumps({"engine": "mptrain (service)" + (" 2nd" if suffix else ""),
                  "precision": precision, "layers": L, "width": C, "batch": B, "accum": A,
                  "ms_per_step": round(ms, 2),
                  "tokens_per_s": round(tokens / ms * 1000) if times else None,
                  "tflops": round((6 * n + 12 * L * T * C) * tokens / ms / 1e9, 1) if times else None,
                  "peak_gib": round((max(mem) - min(mem)) / 1024, 2) if mem else None,
                  "smi_gib": round((max(mem) - min(mem)) / 1024, 2) if mem else None,
                  "first_step_s": round((first - submitted) / 1000, 2) if first else None,
                  "loss_first_last": [losses[0], losses[-1]] if losses else None,
                  "steps": len(times)}))
PY
}

# One PyTorch run in mode $1 (eager or compile) of the same configuration; $2 as run_ours'.
run_torch() {
  # The process's GPU memory as nvidia-smi sees it (CUDA context included), sampled as for
  # ours: smi_gib, beside PyTorch's own max_memory_allocated (peak_gib).
  smi_log="$CLUSTER_DIR/mem-$tag-$precision-$1$2.log"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$smi_log" &
  smi=$!
  line=$(python3 bench/gpt_torch_bench.py --layers "$layers" --width "$width" --heads "$heads" \
    --batch "$batch" --accum "$accum" --precision "$precision" --mode "$1" \
    --steps "$STEPS" --warmup "$WARMUP" 2>"$OUT/gpt_torch_$tag-$precision-$1$2.err") || status=1
  kill "$smi" 2>/dev/null
  python3 - "$line" "$smi_log" "$2" <<'PY' | tee -a "$RESULTS"
import json, sys
row = json.loads(sys.argv[1]) if sys.argv[1].strip().startswith("{") else None
mem = [int(x) for x in open(sys.argv[2]).read().split() if x.strip().isdigit()]
if row is not None:
    if sys.argv[3]:
        row["engine"] += " 2nd"
    row["smi_gib"] = round((max(mem) - min(mem)) / 1024, 2) if mem else None
    print(json.dumps(row))
PY
}

for config in $CONFIGS; do
  IFS=: read -r model batch accum <<<"$config"
  tag="$model-$batch-$accum"  # file names without colons
  read -r layers width heads <<<"$(shape_of "$model")"
  for precision in $PRECISIONS; do
    spec="$CLUSTER_DIR/gpt-$tag-$precision.json"
    cat >"$spec" <<SPEC
{"name": "gpt$model-$batch-$accum-$precision", "world_size": 1, "device": "cuda",
 "model": {"gpt": {"vocab_size": 50257, "padded_vocab_size": 50304, "context_length": 1024,
                   "layers": $layers, "heads": $heads, "width": $width}},
 "data": {"tokens": {"files": ["$TOKENS"]}},
 "micro_batch_size": $batch, "accumulation_steps": $accum, "steps": $((WARMUP + STEPS)),
 "precision": "$precision",
 "optimizer": {"kind": "adamw", "lr": 0.0006, "beta2": 0.95, "weight_decay": 0.1},
 "max_grad_norm": 1.0, "telemetry_every": 1}
SPEC
    run_ours ""
    # The same job again, 3 steps, on the worker that has just run one (its rank process reused:
    # worker --reuse_ranks): seconds from submit to the first step's telemetry, warm.
    warm_spec="$CLUSTER_DIR/gpt-$tag-$precision-warm.json"
    python3 - "$spec" "$warm_spec" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["name"] += "-warm"
spec["steps"] = 3
json.dump(spec, open(sys.argv[2], "w"))
PY
    submitted=$(date +%s%3N)
    warm_job=$("$TRAINCTL" --coordinator="$ADDRESS" submit "$warm_spec" --wait | tail -1)
    "$TRAINCTL" --coordinator="$ADDRESS" export "$warm_job" --format=jsonl \
      >"$CLUSTER_DIR/gpt-$tag-$precision-warm.jsonl" || status=1
    python3 - "$CLUSTER_DIR/gpt-$tag-$precision-warm.jsonl" "$submitted" "$layers" "$width" \
      "$batch" "$accum" "$precision" <<'PY' | tee -a "$RESULTS" || status=1
import json, sys
path, submitted, L, C, B, A, precision = sys.argv[1:]
records = [json.loads(l) for l in open(path) if l.strip()]
first = min((int(r.get("unixMs", r.get("unix_ms", 0))) for r in records
             if r.get("unixMs") or r.get("unix_ms")), default=0)
print(json.dumps({"engine": "mptrain (warm worker)", "precision": precision, "layers": int(L),
                  "width": int(C), "batch": int(B), "accum": int(A), "ms_per_step": None,
                  "first_step_s": round((first - int(submitted)) / 1000, 2) if first else None}))
PY
    for mode in $MODES; do run_torch "$mode" ""; done
    # GPT_ABBA=1: PyTorch's modes again in reverse order, then ours again, so that each engine's
    # mean sits at the same time on average: a card at its power cap slows as it warms (a
    # precision measured second, and the engine measured last, would otherwise pay for it).
    if [ "${GPT_ABBA:-0}" = 1 ]; then
      for mode in $(tr ' ' '\n' <<<"$MODES" | tac); do run_torch "$mode" -2nd; done
      run_ours -2nd
    fi
  done
done
# Where a job's start goes: the rank's own timestamps (assignment received, backend ready).
grep -hE "ready [0-9]+ ms after|model built|warm in|memory released|placed|started" "$CLUSTER_DIR/gpu0.log" \
  2>/dev/null | cut -c1-200 | tail -30 >"$OUT/gpt_worker_start.txt"
stop_cluster
python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
print(f"{'engine':<20}{'model':>6}{'prec':>6}{'B x A':>8}{'ms/step':>10}{'tokens/s':>11}"
      f"{'TFLOP/s':>9}{'smi GiB':>9}{'torch GiB':>10}{'first s':>9}")
for r in rows:
    tps = r.get("tokens_per_s")
    torch_gib = r.get("peak_gib") if r["engine"].startswith("pytorch") else None
    print(f"{r['engine']:<20}{'L%d' % r['layers']:>6}{r['precision']:>6}"
          f"{'%dx%d' % (r['batch'], r['accum']):>8}{r['ms_per_step'] or '-':>10}{tps or 0:>11}"
          f"{r.get('tflops') or 0:>9}{r.get('smi_gib') or 0:>9}{torch_gib or '-':>10}"
          f"{r.get('first_step_s') or 0:>9}")
# Ours against each PyTorch mode per configuration: the mean of each engine's runs (with
# GPT_ABBA=1 two each, measured in the order A B B A, so neither engine's mean is the later one).
groups = {}
for r in rows:
    if not r.get("ms_per_step"):
        continue
    engine = r["engine"].removesuffix(" 2nd")
    key = (r["layers"], r["width"], r["batch"], r["accum"], r["precision"])
    groups.setdefault(key, {}).setdefault(engine, []).append(r["ms_per_step"])
for (L, C, B, A, precision), engines in groups.items():
    ours = engines.get("mptrain (service)")
    if not ours:
        continue
    mean = sum(ours) / len(ours)
    for engine, times in engines.items():
        if engine.startswith("pytorch"):
            theirs = sum(times) / len(times)
            print(f"ratio L{L} {precision} {B}x{A}: ours {mean:.2f} ms ({len(ours)} runs), "
                  f"{engine} {theirs:.2f} ms ({len(times)} runs): {theirs / mean:.3f}x")
PY
exit $status
