#!/usr/bin/env bash
# examples/gpt_bible.json must end below the README's validation loss on two CPU workers
# (parity/gpt_bible_test.py).
set -euo pipefail
PYTHON=/usr/bin/python3  # Debian's: numpy; the text from bible-kjv (scripts/setup.sh).
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin"
ln -sf "$root/coordinator/coordinator" "$root/worker/worker" "$root/client/trainctl" "$bin/"
exec "$PYTHON" "$root/parity/gpt_bible_test.py" --bin "$bin" --out "$TEST_TMPDIR/out"
