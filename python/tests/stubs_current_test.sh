#!/usr/bin/env bash
# The committed Python stubs (python/mptrain/_proto/) are what scripts/gen_python_stubs.sh makes
# of proto/mptrain.proto now: a .proto change without regenerating them fails here.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
fresh="$TEST_TMPDIR/stubs"
# The script regenerates from the proto beside it: a copy of the three files it needs.
mkdir -p "$TEST_TMPDIR/tree/scripts" "$TEST_TMPDIR/tree/proto"
cp "$root/scripts/gen_python_stubs.sh" "$TEST_TMPDIR/tree/scripts/"
cp "$root/proto/mptrain.proto" "$TEST_TMPDIR/tree/proto/"
bash "$TEST_TMPDIR/tree/scripts/gen_python_stubs.sh" "$fresh"
for file in mptrain_pb2.py mptrain_pb2_grpc.py; do
  if ! cmp -s "$fresh/$file" "$root/python/mptrain/_proto/$file"; then
    echo "FAIL: python/mptrain/_proto/$file is not what proto/mptrain.proto makes now:" \
         "run scripts/gen_python_stubs.sh and commit the result"
    exit 1
  fi
done
echo PASS
