#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ (clang, ASan + UBSan) and runs each on a copy of its
# seed corpus for SECONDS_PER_FUZZER seconds (default 30), as many at a time as there are cores.
# Exits non-zero on any crash, leak, timeout, out-of-memory or invariant failure, printing the
# reproducer; prints one summary line per fuzzer either way.
#
#   scripts/run_fuzzers.sh [SECONDS_PER_FUZZER]
#
# Environment: MPTRAIN_FUZZ_OUTPUT_BASE (Bazel output base; default ~/.cache/bazel_mptrain_fuzz,
# kept between runs so that a rebuild is incremental), MPTRAIN_FUZZ_JOBS (fuzzers at a time),
# MPTRAIN_FUZZERS (a space-separated subset).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_FUZZER="${1:-30}"
if ! [[ "$SECONDS_PER_FUZZER" =~ ^[0-9]+$ ]] || [ "$SECONDS_PER_FUZZER" -lt 1 ]; then
  echo "usage: $0 [SECONDS_PER_FUZZER]" >&2
  exit 2
fi
FUZZERS=(${MPTRAIN_FUZZERS:-job_spec_fuzzer npy_fuzzer safetensors_fuzzer checkpoint_fuzzer
                            coordinator_state_fuzzer token_shard_fuzzer})
# Keyed by the checkout's path, as Bazel's own default is: an output base shared by two
# checkouts keeps runfiles links into the first one.
OUTPUT_BASE="${MPTRAIN_FUZZ_OUTPUT_BASE:-$HOME/.cache/bazel_mptrain_fuzz_$(pwd | md5sum | cut -c1-12)}"
JOBS="${MPTRAIN_FUZZ_JOBS:-$(nproc)}"

# ---- Tools: the project's packages, then clang and its libFuzzer runtime ----
bash scripts/setup.sh
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
apt_install() {
  echo "run_fuzzers: installing $*" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
if ! command -v clang >/dev/null; then apt_install clang; fi
if [ ! -e "$(clang -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a" ]; then
  apt_install "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"  # the libFuzzer runtime
fi

# ---- Build ----
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mptrain_fuzz.XXXXXX")"
BAZEL=(bazel --output_base="$OUTPUT_BASE")
TARGETS=()
for fuzzer in "${FUZZERS[@]}"; do TARGETS+=("//fuzz:$fuzzer"); done
build_start=$SECONDS
if ! "${BAZEL[@]}" build --config=fuzz "${TARGETS[@]}" >"$WORK/build.log" 2>&1; then
  grep -v "Cannot export local symbol" "$WORK/build.log" | tail -40 >&2
  echo "run_fuzzers: the build failed (log: $WORK/build.log)" >&2
  exit 1
fi
BIN="$("${BAZEL[@]}" info --config=fuzz bazel-bin 2>/dev/null)/fuzz"
echo "run_fuzzers: built ${#FUZZERS[@]} fuzzers in $((SECONDS - build_start)) s; running each" \
  "for $SECONDS_PER_FUZZER s, $JOBS at a time (work dir $WORK)"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
symbolizer="$(dirname "$(readlink -f "$(command -v clang)")")/llvm-symbolizer"
if [ -x "$symbolizer" ]; then export ASAN_SYMBOLIZER_PATH="$symbolizer"; fi

# Runs one fuzzer in $WORK/<fuzzer>/ on a copy of its corpus; writes its exit status to rc.
run_one() {
  local fuzzer="$1" dir="$WORK/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/tmp"
  cp fuzz/corpus/"$fuzzer"/* "$dir/corpus/"
  local rc=0
  # A fixed seed (FUZZ_SEED, default 1) makes a CI run reproducible; set another to explore.
  TMPDIR="$dir/tmp" "$BIN/$fuzzer" -seed="${FUZZ_SEED:-1}" -max_total_time="$SECONDS_PER_FUZZER" \
    -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
    "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/rc"
}

run_start=$SECONDS
for fuzzer in "${FUZZERS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  run_one "$fuzzer" &
done
wait

# ---- Report ----
failed=0
for fuzzer in "${FUZZERS[@]}"; do
  dir="$WORK/$fuzzer"
  rc="$(cat "$dir/rc" 2>/dev/null || echo 1)"
  final_stat() { sed -n "s/^stat::$1: *//p" "$dir/log" | tail -1; }
  last="$(grep -E '^#[0-9]+' "$dir/log" | grep -o 'cov: [0-9]*.*' | tail -1 || true)"
  cov="$(sed -n 's/^cov: \([0-9]*\).*/\1/p' <<<"$last")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
  corp="$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")"
  artifacts=("$dir"/artifacts/{crash,leak,timeout,oom}-*)
  found=()
  for artifact in "${artifacts[@]}"; do [ -e "$artifact" ] && found+=("$artifact"); done
  if [ "$rc" -eq 0 ] && [ ${#found[@]} -eq 0 ]; then verdict=OK; else verdict=FAILED; fi
  printf 'fuzz: %-26s %-6s runs=%s cov=%s ft=%s corpus=%s new_units=%s exec/s=%s peak_rss_mb=%s\n' \
    "$fuzzer" "$verdict" "$(final_stat number_of_executed_units)" "${cov:-?}" "${ft:-?}" \
    "${corp:-?}" "$(final_stat new_units_added)" "$(final_stat average_exec_per_sec)" \
    "$(final_stat peak_rss_mb)"
  if [ "$verdict" = FAILED ]; then
    failed=1
    pattern="ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|invariant violated"
    pattern+="|SUMMARY:|fatal error|terminate called|what\(\)"
    grep -E "$pattern" "$dir/log" | head -8 | sed 's/^/    /' || true
    echo "    exit status $rc; log: $dir/log"
    for artifact in "${found[@]}"; do
      echo "    reproducer: $artifact"
      echo "    reproduce:  $BIN/$fuzzer $artifact"
    done
    if [ "$fuzzer" = coordinator_state_fuzzer ]; then
      echo "    (MPTRAIN_FUZZ_TRACE=1 prints the calls the input decodes to)"
    fi
  fi
done
echo "run_fuzzers: ran for $((SECONDS - run_start)) s"
if [ "$failed" -ne 0 ]; then
  echo "run_fuzzers: FAILED (work dir kept: $WORK)" >&2
  exit 1
fi
rm -rf "$WORK"
