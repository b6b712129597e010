#!/usr/bin/env bash
# Tokens/s of one GPT training step (forward, cross-entropy, backward, AdamW) on one rank: our
# CPU backend (bench/gpt_cpu_bench.cc, OpenBLAS) against PyTorch 1.13 CPU eager
# (bench/gpt_cpu_torch.py, the reference model), same configuration, same thread count.
#   bash bench/run_gpt_cpu_bench.sh [THREADS]      (default 1; numbers in BENCHMARKS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-1}
bazel build //bench:gpt_cpu_bench >/dev/null
DATA=/tmp/mptrain-bible
[ -f "$DATA/train_000.bin" ] || /usr/bin/python3 scripts/make_text_shards.py "$DATA" >/dev/null
for config in "2 64 4 64 8" "4 128 4 128 8"; do
  read -r L C H T B <<<"$config"
  for precision in fp32 bf16; do
    args=(--tokens "$DATA/train_000.bin" --layers "$L" --width "$C" --heads "$H" --context "$T"
          --batch "$B" --steps 12 --precision "$precision")
    ours=$(OPENBLAS_NUM_THREADS=$THREADS bazel-bin/bench/gpt_cpu_bench "${args[@]}" |
           cut -d' ' -f2)
    torch=$(/usr/bin/python3 bench/gpt_cpu_torch.py "${args[@]}" --threads "$THREADS" |
            cut -d' ' -f2)
    echo "L$L C$C H$H T$T B$B $precision threads $THREADS: ours $ours tokens/s, torch $torch tokens/s"
  done
done
