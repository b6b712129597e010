#!/usr/bin/env bash
# CI's check of the GradScaler trajectory (parity/grad_scaler_check.py): fp16 jobs with forced
# overflows through our coordinator and two CPU workers, against an independent model of
# GradScaler; scale and skipped steps exact.
set -euo pipefail
PYTHON=/usr/bin/python3  # Debian's interpreter: python3-numpy is installed for it.
if ! "$PYTHON" -c "import numpy" 2>/dev/null; then
  echo "FAILED: $PYTHON cannot import numpy (scripts/setup.sh installs python3-numpy)"
  exit 1
fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin"
ln -sf "$root/coordinator/coordinator" "$root/worker/worker" "$root/client/trainctl" "$bin/"
exec "$PYTHON" "$root/parity/grad_scaler_check.py" --bin "$bin" --out "$TEST_TMPDIR/out"
