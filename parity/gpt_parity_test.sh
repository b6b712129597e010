#!/usr/bin/env bash
# CI's proof of our GPT (model.gpt) against PyTorch on the CPU (parity/gpt_parity.py): Debian's
# python3-torch (1.13) running parity/gpt_reference.py against our coordinator and CPU workers,
# worlds 1-3, fp32 and bf16, accumulation 1 and 2, a padded vocabulary, AdamW + clipping + a
# warmup-cosine schedule.
set -euo pipefail
PYTHON=/usr/bin/python3  # Debian's interpreter: python3-torch is installed for it.
if ! "$PYTHON" -c "import torch, numpy" 2>/dev/null; then
  echo "FAILED: $PYTHON cannot import torch and numpy (scripts/setup.sh installs python3-torch)"
  exit 1
fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin"
ln -sf "$root/coordinator/coordinator" "$root/worker/worker" "$root/client/trainctl" "$bin/"
exec "$PYTHON" "$root/parity/gpt_parity.py" --bin "$bin" --out "$TEST_TMPDIR/out"
