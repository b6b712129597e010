#!/usr/bin/env bash
# The main job: builds, starts a local coordinator and two worker daemons, submits the original
# example (examples/seed.json on GPUs when two are visible, else examples/seed_cpu.json), shows
# its telemetry live, and shuts everything down. Exits 0 only if the job SUCCEEDED.
#
#   bash scripts/run_example.sh            # auto: CUDA with 2 GPUs, CPU otherwise
#   bash scripts/run_example.sh --cpu      # force the CPU backend
#   bash scripts/run_example.sh --secure   # mutual TLS and tokens, made on the spot (openssl)
#   bash scripts/run_example.sh --digits   # the second example: examples/digits.json (a
#                                          # classifier of handwritten digits to >= 97% test
#                                          # accuracy; data from scripts/make_digits.py)
#   bash scripts/run_example.sh --gpt      # the language model: examples/gpt_bible.json (a
#                                          # byte-level GPT on the KJV Bible, CPU workers; fails
#                                          # unless the final validation loss is below
#                                          # GPT_MAX_EVAL_LOSS nats, default below)
#   bash scripts/run_example.sh --gpt --cuda   # the same on one or two GPUs
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=auto
SECURE=0
DIGITS=0
GPT=0
# The GPT example's promise, in nats per byte (bits per byte = nats / ln 2): the unigram
# entropy of the training bytes is 3.02 nats (4.36 bits); see README "Language models".
GPT_MAX_EVAL_LOSS=${GPT_MAX_EVAL_LOSS:-2.3}
for arg in "$@"; do
  case "$arg" in
    --cpu) DEVICE=cpu ;;
    --cuda) DEVICE=cuda ;;
    --secure) SECURE=1 ;;
    --digits) DIGITS=1 ;;
    --gpt) GPT=1 ;;
    *) echo "usage: $0 [--cpu|--cuda] [--secure] [--digits|--gpt]" >&2; exit 2 ;;
  esac
done
# The GPT example runs on CPU workers unless --cuda asks for GPUs (one or two).
if [ "$GPT" = 1 ] && [ "$DEVICE" != cuda ]; then DEVICE=cpu; fi

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
if [ "$DEVICE" = cuda ] && [ "$GPUS" -lt 2 ] && { [ "$GPT" = 0 ] || [ "$GPUS" -lt 1 ]; }; then
  echo "run_example: --cuda needs 2 GPUs (one rank each; --gpt: at least 1), $GPUS visible" >&2
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
if [ "$DIGITS" = 1 ]; then
  # The data under /tmp/mptrain-digits (the paths examples/digits.json names), a data root of
  # the workers; the same spec on GPUs with its device changed.
  # Debian's python3 (with python3-numpy from setup.sh); elsewhere the first python3 that has
  # numpy (the GPU machine's lives in a virtual environment).
  PYTHON=/usr/bin/python3
  if ! "$PYTHON" -c 'import numpy' 2>/dev/null; then PYTHON=python3; fi
  "$PYTHON" scripts/make_digits.py /tmp/mptrain-digits
  WORKER_ARGS+=(--data_root=/tmp/mptrain-digits)
  SPEC=examples/digits.json
  if [ "$GPUS" -ge 2 ]; then
    SPEC=$(mktemp --suffix=.json)
    sed 's/"device": "cpu"/"device": "cuda"/' examples/digits.json >"$SPEC"
  fi
fi
WORKERS=2
if [ "$GPT" = 1 ]; then
  # Byte-level shards of the KJV Bible under /tmp/mptrain-bible (the paths the spec names), a
  # data root of the workers: made from Debian's bible-kjv, or the device bundle's copy.
  PYTHON=/usr/bin/python3
  if ! "$PYTHON" -c 'import numpy' 2>/dev/null; then PYTHON=python3; fi
  if [ -n "${MPTRAIN_BIBLE_SHARDS:-}" ] && [ -d "$MPTRAIN_BIBLE_SHARDS" ]; then
    rm -rf /tmp/mptrain-bible && cp -r "$MPTRAIN_BIBLE_SHARDS" /tmp/mptrain-bible
  else
    "$PYTHON" scripts/make_text_shards.py /tmp/mptrain-bible
  fi
  SPEC=${GPT_SPEC:-examples/gpt_bible.json}
  if [ "$DEVICE" = cuda ]; then
    # On GPUs: two workers of one GPU each, or one (world 1, twice the micro-batch: the same
    # tokens per step).
    WORKERS=$((GPUS >= 2 ? 2 : 1))
    WORKER_ARGS=(--device=cuda --slots=1 --data_root=/tmp/mptrain-bible)
    CUDA_SPEC=$(mktemp --suffix=.json)
    "$PYTHON" - "$SPEC" "$CUDA_SPEC" "$WORKERS" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
workers = int(sys.argv[3])
spec["micro_batch_size"] = spec["micro_batch_size"] * spec["world_size"] // workers
spec["world_size"] = workers
spec["device"] = "cuda"
json.dump(spec, open(sys.argv[2], "w"))
PY
    SPEC=$CUDA_SPEC
  else
    WORKER_ARGS=(--device=cpu --slots=1 --data_root=/tmp/mptrain-bible)
    GPUS=0
  fi
fi
echo "run_example: $GPUS GPU(s) visible: running $SPEC"

source scripts/lib/local_cluster.sh
trap stop_cluster EXIT
if [ "$SECURE" = 1 ]; then
  secure_cluster worker0 worker1
  echo "run_example: mutual TLS and tokens (CA, certificates and tokens in $CLUSTER_DIR/pki)"
fi
start_coordinator
echo "coordinator on $ADDRESS (logs in $CLUSTER_DIR)"
for ((i = 0; i < WORKERS; i++)); do
  if [[ " ${WORKER_ARGS[*]} " == *" --device=cuda "* ]]; then start_worker "worker$i" "$i" "${WORKER_ARGS[@]}";
  else start_worker "worker$i" "" "${WORKER_ARGS[@]}"; fi
done
wait_for_workers "$WORKERS"
"$TRAINCTL" --coordinator="$ADDRESS" "${TRAINCTL_FLAGS[@]}" workers

echo "submitting $SPEC"
set +e
"$TRAINCTL" --coordinator="$ADDRESS" "${TRAINCTL_FLAGS[@]}" submit "$SPEC" --wait | tee "$CLUSTER_DIR/submit.out"
STATUS=${PIPESTATUS[0]}
set -e
JOB=$(tail -n 1 "$CLUSTER_DIR/submit.out")
"$TRAINCTL" --coordinator="$ADDRESS" "${TRAINCTL_FLAGS[@]}" status "$JOB"
if [ "$STATUS" -eq 0 ] && [ "$DIGITS" = 1 ]; then
  # The second example's promise: >= 97% accuracy on the held-out images (the last evaluation).
  ACCURACY=$("$TRAINCTL" --coordinator="$ADDRESS" "${TRAINCTL_FLAGS[@]}" status "$JOB" |
    grep -o 'eval_acc [0-9.]*' | tail -n 1 | cut -d' ' -f2)
  if awk -v a="${ACCURACY:-0}" 'BEGIN { exit !(a >= 0.97) }'; then
    echo "run_example: test accuracy $ACCURACY (>= 0.97)"
  else
    echo "run_example: test accuracy ${ACCURACY:-missing}, below 0.97" >&2
    STATUS=1
  fi
fi
if [ "$STATUS" -eq 0 ] && [ "$GPT" = 1 ]; then
  # The last evaluation's loss on the held-out 5% of the text.
  LOSS=$("$TRAINCTL" --coordinator="$ADDRESS" "${TRAINCTL_FLAGS[@]}" status "$JOB" |
    grep -o 'eval_loss [0-9.]*' | tail -n 1 | cut -d' ' -f2)
  if awk -v l="${LOSS:-99}" -v m="$GPT_MAX_EVAL_LOSS" 'BEGIN { exit !(l < m) }'; then
    echo "run_example: validation loss $LOSS nats/byte ($(awk -v l="$LOSS" \
      'BEGIN { printf "%.3f", l / log(2) }') bits/byte; below $GPT_MAX_EVAL_LOSS)"
  else
    echo "run_example: validation loss ${LOSS:-missing}, not below $GPT_MAX_EVAL_LOSS" >&2
    STATUS=1
  fi
fi
if [ "$STATUS" -eq 0 ]; then
  echo "run_example: $JOB SUCCEEDED; the coordinator found identical parameters on every rank"
else
  echo "run_example: $JOB did not succeed; logs in $CLUSTER_DIR" >&2
fi
exit "$STATUS"
