#!/usr/bin/env bash
# Regenerates the Python client's gRPC stubs (python/mptrain/_proto/) from proto/mptrain.proto
# with Debian's protoc and grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc; the
# same versions as the C++ build's). They are committed so that `pip install ./python` needs no
# compiler; python:stubs_current_test fails when they no longer match the .proto.
#   scripts/gen_python_stubs.sh [OUT_DIR]   (default: python/mptrain/_proto)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/python/mptrain/_proto}"
mkdir -p "$out"
/usr/bin/protoc --proto_path="$root/proto" --python_out="$out" --grpc_out="$out" \
  --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin "$root/proto/mptrain.proto"
# The plugin imports the messages as a top-level module: inside the package, relatively.
sed -i 's/^import mptrain_pb2 as mptrain__pb2$/from . import mptrain_pb2 as mptrain__pb2/' \
  "$out/mptrain_pb2_grpc.py"
