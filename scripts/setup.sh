#!/usr/bin/env bash
# Installs every Debian package the project needs (Debian 12). Idempotent: does nothing when
# they are all present; runs `apt-get update` only when something must be installed.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java          # the build (Bazel 4.2.3, offline)
  g++ procps                                # compiler; pgrep for the integration tests
  libgrpc++-dev protobuf-compiler-grpc      # gRPC and its protoc plugin
  libprotobuf-dev protobuf-compiler         # Protobuf
  libabsl-dev libspdlog-dev libfmt-dev      # Status, flags, logging
  libgloo-dev libopenblas-dev               # CPU backend: collectives and GEMMs
  libxxhash-dev nlohmann-json3-dev          # checksums, safetensors headers
  libgtest-dev libgmock-dev                 # tests
  openssl                                   # certificates for the secure demo and tests
  libsqlite3-dev                            # the coordinator's durable job store
  libmicrohttpd-dev libgnutls28-dev         # the coordinator's /metrics and dashboard (HTTPS)
  prometheus chromium fonts-dejavu-core curl  # tests: promtool, dashboard screenshots, HTTP
  python3-torch python3-numpy               # the proof against PyTorch in CI (parity/)
  python3-sklearn                           # the digits data set (scripts/make_digits.py)
  python3-grpcio python3-protobuf python3-pandas  # the Python client (python/) and its test
  iproute2 util-linux                       # tests: simulated hosts (ip netns, unshare)
  systemd                                   # tests: systemd-analyze verify of scripts/systemd/
  kubernetes-client                         # tests: kubectl kustomize / --dry-run of deploy/kubernetes
  slurm-wlm munge                           # tests: slurmctld + slurmd for deploy/slurm
  podman runc debootstrap                   # deploy/oci: the image, and its test's containers
  bible-kjv                                 # the KJV text (scripts/make_text_shards.py)
)

missing=()
for package in "${PACKAGES[@]}"; do
  # Another package's kubectl (Google's `kubectl` package owns the same /usr/bin/kubectl, so
  # the two cannot both be installed) serves the test as well.
  if [ "$package" = kubernetes-client ] && command -v kubectl >/dev/null; then continue; fi
  if ! grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)"; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
