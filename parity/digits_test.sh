#!/usr/bin/env bash
# examples/digits.json must reach >= 97% test accuracy on two CPU workers (parity/digits_test.py).
set -euo pipefail
PYTHON=/usr/bin/python3  # Debian's: numpy and python3-sklearn's digits.csv.gz.
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin"
ln -sf "$root/coordinator/coordinator" "$root/worker/worker" "$root/client/trainctl" "$bin/"
exec "$PYTHON" "$root/parity/digits_test.py" --bin "$bin" --out "$TEST_TMPDIR/out"
