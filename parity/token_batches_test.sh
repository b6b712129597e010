#!/usr/bin/env bash
# CI: the C++ token batches and parity/token_batches.py agree (parity/token_batches_test.py).
set -euo pipefail
PYTHON=/usr/bin/python3  # Debian's interpreter, with numpy.
root="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PYTHON" "$root/parity/token_batches_test.py" "$root/parity/token_batches_dump" \
  "$TEST_TMPDIR/tokens"
