#!/usr/bin/env bash
# CI: the C++ token batches and parity/token_batches.py agree (parity/token_batches_test.py).
set -euo pipefail
PYTHON=/usr/bin/python3  # Debian's interpreter, with numpy.
root="$TEST_SRCDIR/$TEST_WORKSPACE"
# -B: no __pycache__ beside the runfiles (a stale one outlived an edit within the same second).
exec "$PYTHON" -B "$root/parity/token_batches_test.py" "$root/parity/token_batches_dump" \
  "$TEST_TMPDIR/tokens"
