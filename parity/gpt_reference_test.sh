#!/usr/bin/env bash
# Self-tests of the GPT reference (parity/gpt_reference_test.py): attention, DDP averaging over
# worlds 1-3, no_sync accumulation, the HF layout, bf16 autocast, PyTorch's own spread.
set -euo pipefail
PYTHON=/usr/bin/python3  # Debian's interpreter: python3-torch (1.13) is installed for it.
if ! "$PYTHON" -c "import torch, numpy" 2>/dev/null; then
  echo "FAILED: $PYTHON cannot import torch and numpy (scripts/setup.sh installs python3-torch)"
  exit 1
fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PYTHON" "$root/parity/gpt_reference_test.py" --out "$TEST_TMPDIR/out"
