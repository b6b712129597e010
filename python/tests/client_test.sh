#!/usr/bin/env bash
# CI's run of the Python client's test (python/tests/client_test.py) against our coordinator and
# a CPU worker, with Debian's interpreter and its python3-grpcio, python3-protobuf and
# python3-pandas (scripts/setup.sh installs them).
set -euo pipefail
PYTHON=/usr/bin/python3
if ! "$PYTHON" -c "import grpc, google.protobuf, pandas" 2>/dev/null; then
  echo "FAILED: $PYTHON cannot import grpc, google.protobuf and pandas (scripts/setup.sh" \
       "installs python3-grpcio, python3-protobuf, python3-pandas)"
  exit 1
fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin"
ln -sf "$root/coordinator/coordinator" "$root/worker/worker" "$bin/"
exec "$PYTHON" "$root/python/tests/client_test.py" --bin "$bin" --out "$TEST_TMPDIR/out" \
  --trainctl "$root/client/trainctl"
