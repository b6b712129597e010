#!/usr/bin/env bash
# CI's proof against PyTorch on the CPU (parity/cpu_parity.py): Debian's python3-torch (1.13)
# against our coordinator and two CPU workers, for every loss, optimizer and schedule.
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
exec "$PYTHON" "$root/parity/cpu_parity.py" --bin "$bin" --out "$TEST_TMPDIR/out"
