#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything (the CUDA backend too when
# /usr/local/cuda exists) and runs every test. GPU tests skip with a reason where no GPU is.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bazel build //...
bazel test //... "$@"
