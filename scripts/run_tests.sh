#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything (the CUDA backend too when
# /usr/local/cuda exists) and runs every test. GPU tests skip with a reason where no GPU is.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, printed as it ends and together at the end (the suite must stay well
# under 30 minutes on 2 cores).
phases=()
phase_started=$SECONDS
phase_done() {
  phases+=("$1 $((SECONDS - phase_started)) s")
  echo "run_tests: $1 took $((SECONDS - phase_started)) s"
  phase_started=$SECONDS
}
trap '[ ${#phases[@]} -eq 0 ] || echo "run_tests: phases: ${phases[*]}; total $SECONDS s"' EXIT

bash scripts/setup.sh
phase_done setup
bazel build //...
phase_done build
# Every target's skip count, also when a test failed (scripts/test_skips.py: the CUDA tests skip
# without a GPU; every other skip fails under CI).
tests_status=0
bazel test //... "$@" || tests_status=$?
/usr/bin/python3 scripts/test_skips.py summary "$(bazel info bazel-testlogs)"
phase_done tests
[ "$tests_status" -eq 0 ] || exit "$tests_status"

# Sanitizers: the unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (gcc), then
# 20 s per libFuzzer harness (clang, ASan + UBSan; fuzz/). Each has its own output base, so the
# plain build's outputs stay; like Bazel's default one it is keyed by the checkout's path (a
# shared one would keep runfiles links into another checkout).
ASAN_OUTPUT_BASE="$HOME/.cache/bazel_mptrain_asan_$(pwd | md5sum | cut -c1-12)"
bazel --output_base="$ASAN_OUTPUT_BASE" test --config=asan --build_tests_only \
  //common/... //io/... //trainer/... //coordinator/... //client/... //worker/... //backends/cpu/...
phase_done sanitizers
bash scripts/run_fuzzers.sh 20
phase_done fuzzers
