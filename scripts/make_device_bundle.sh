#!/usr/bin/env bash
# Builds here and gathers what the GPU machine needs into device_bundle/ (git-ignored):
# the binaries, the GPU test and benchmark binaries, and every non-CUDA, non-glibc shared
# library they load (the GPU machine has no gRPC/protobuf/gloo libraries). CUDA, cuBLAS and
# NCCL are NOT carried: the machine has its own (NCCL at /usr/lib/x86_64-linux-gnu).
#
#   bash scripts/make_device_bundle.sh
#   BASELINE=<commit> bash scripts/make_device_bundle.sh   # also bin/train_bench_baseline (and gpt_train_bench_baseline), built
#                                      # at that commit (device_run.sh ab: before and after)
#   # then, on the device: source device_bundle/env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TARGETS=(//coordinator //worker //client:trainctl //backends/cuda:cuda_backend_test
  //backends/cuda:cuda_language_model_test //worker:device_usage_test)
if [ -d bench ] && [ -f bench/BUILD ]; then TARGETS+=(//bench:all); fi
bazel build -c opt "${TARGETS[@]}"

BUNDLE=device_bundle
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
cp bazel-bin/coordinator/coordinator bazel-bin/worker/worker bazel-bin/client/trainctl \
  bazel-bin/backends/cuda/cuda_backend_test bazel-bin/backends/cuda/cuda_language_model_test \
  bazel-bin/worker/device_usage_test "$BUNDLE/bin/"
for binary in bazel-bin/bench/*; do
  if [ -f "$binary" ] && [ -x "$binary" ] && file "$binary" | grep -Eq "ELF .*executable"; then
    cp "$binary" "$BUNDLE/bin/"
  fi
done
if [ -n "${BASELINE:-}" ]; then
  # A worktree of its own (its own Bazel output base): this tree's build is left as it is.
  baseline_tree=/tmp/mptrain-baseline
  git worktree remove --force "$baseline_tree" 2>/dev/null || rm -rf "$baseline_tree"
  git worktree add --detach "$baseline_tree" "$BASELINE"
  # The in-process benchmarks that baseline has (gpt_train_bench from d4816c0 on).
  baseline_targets=(//bench:train_bench)
  if [ -f "$baseline_tree/bench/gpt_train_bench.cc" ]; then baseline_targets+=(//bench:gpt_train_bench); fi
  (cd "$baseline_tree" && bazel build -c opt "${baseline_targets[@]}")
  for target in "${baseline_targets[@]}"; do
    name=${target#//bench:}
    cp "$baseline_tree/bazel-bin/bench/$name" "$BUNDLE/bin/${name}_baseline"
  done
fi
chmod u+w "$BUNDLE"/bin/*
# The digits example's data (Debian's python3-sklearn file; the GPU machine has no sklearn).
mkdir -p "$BUNDLE/data"
cp /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz "$BUNDLE/data/"
# The GPT example's byte-level KJV shards (the GPU machine has no bible-kjv).
/usr/bin/python3 scripts/make_text_shards.py "$BUNDLE/data/bible" >/dev/null

# Libraries the device machine provides itself (or must provide: the driver).
SKIP='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcublas|libcudart|libnvidia|libcudnn|libnvrtc)'
for binary in "$BUNDLE"/bin/*; do
  ldd "$binary" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if ! echo "$name" | grep -Eq "$SKIP"; then cp -L "$path" "$BUNDLE/lib/$name"; fi
done

cat > "$BUNDLE/env.sh" <<'ENV'
# Source on the GPU machine: our libraries first, then the machine's CUDA and NCCL.
BUNDLE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$BUNDLE_DIR/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN (the GPT's fused attention) and NVRTC: the machine's CUDA where it has them, else the
# copies in PyTorch's nvidia-* wheels.
for lib in libcudnn.so.9 libnvrtc.so.13; do
  if ! grep -q "$lib" <<<"$(ldconfig -p)" && [ ! -e "/usr/local/cuda/lib64/$lib" ]; then
    found=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null |
      xargs -n1 -I{} find {} -path '*nvidia*' -name "$lib" 2>/dev/null | head -1)
    if [ -n "$found" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"; fi
  fi
done
export MPTRAIN_BIN="$BUNDLE_DIR/bin"
export MPTRAIN_DIGITS_CSV="$BUNDLE_DIR/data/digits.csv.gz"
export MPTRAIN_BIBLE_SHARDS="$BUNDLE_DIR/data/bible"
# NVLink multicast stays off on the shared GPU machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ENV
du -sh "$BUNDLE"

# The device tool carries at most 64 MiB: ship the bundle compressed.
XZ_OPT="-T0" tar -C "$(dirname "$BUNDLE")" -cJf device_bundle.tar.xz "$(basename "$BUNDLE")"
du -sh device_bundle.tar.xz
