#!/usr/bin/env bash
# deploy/oci against a real podman: builds the image with deploy/oci/build_image.sh (the Debian
# root from its cache, else debootstrap from the mirror of /etc/apt: a few minutes, once), then
#   1. the image: the binaries at /usr/local/bin (and /opt/mptrain/bin, deploy/kubernetes's
#      path) start in it as the user mptrain (uid 10001), every library found (ldd);
#   2. a podman network of the test's own; the coordinator (mutual TLS and tokens, which it
#      requires off loopback) and two CPU workers as three containers on it, each run as
#      deploy/kubernetes runs them: non-root, read-only root file system, no capabilities,
#      credentials, state, work and roots on volumes;
#   3. both workers register under their names with their containers' addresses; the seed
#      example (examples/seed_cpu.json) submitted with trainctl from a fourth container
#      SUCCEEDS with one rank on each worker and one parameter checksum on both ranks;
#   4. teardown (trap): every container and the network removed, nothing of the test's left.
# Every wait has a deadline. The image (localhost/mptrain:oci-test) stays, as a cache.
# Where containers cannot run (no root, no podman or debootstrap, or podman failing for a
# kernel or namespace reason) the test says exactly why and skips, except under CI (CI set and
# not empty), where it fails: scripts/setup.sh installs podman, runc and debootstrap. Two
# limitations of some hosts are worked around, and said: crun (podman's runtime on Debian 12)
# refuses cgroups in hybrid mode with a controller on the v2 hierarchy (runc is used instead),
# and a kernel that refuses to raise a hard resource limit even to root makes podman's default
# ulimits fail (the container gets the current hard limits instead).
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
BUILD_IMAGE=$RUNFILES/deploy/oci/build_image.sh
SPEC=$RUNFILES/examples/seed_cpu.json
IMAGE=localhost/mptrain:oci-test
export PATH=$PATH:/usr/sbin:/sbin

unavailable() {  # REASON: skip, or fail under CI.
  if [ -n "${CI:-}" ]; then
    echo "FAIL: $*; under CI=$CI this test must run, not skip (scripts/setup.sh installs podman, runc and debootstrap)"
    exit 1
  fi
  echo "SKIPPED: $*"
  exit 0
}
[ "$(id -u)" -eq 0 ] || unavailable "not root (debootstrap and rootful podman need it)"
missing=()
for program in podman debootstrap; do
  command -v $program >/dev/null || missing+=("$program (Debian package $program)")
done
command -v openssl >/dev/null || missing+=("openssl (Debian package openssl)")
[ ${#missing[@]} -eq 0 ] || unavailable "missing ${missing[*]}"

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
WORK=$(mktemp -d "${TEST_TMPDIR:-/tmp}/oci.XXXXXX")
PREFIX=mptrain-oci-$$
NETWORK=$PREFIX
CONTAINERS=("$PREFIX-coordinator" "$PREFIX-w1" "$PREFIX-w2" "$PREFIX-ctl")
# podman, bounded: a hung podman fails the test instead of hanging it.
pm() { timeout --kill-after=10 "${PM_TIMEOUT:-60}" podman "$@"; }
cleanup() {
  local container
  for container in "${CONTAINERS[@]}"; do pm rm -f -t 0 "$container" >/dev/null 2>&1; done
  pm network rm -f "$NETWORK" >/dev/null 2>&1
  rm -rf "$WORK"
  return 0
}
trap cleanup EXIT
dump_logs() {
  local container
  for container in "${CONTAINERS[@]}"; do
    pm container exists "$container" 2>/dev/null || continue
    echo "--- $container"
    pm logs "$container" 2>&1 | tail -n 25
  done
}
abort() { fail "$*"; dump_logs; echo "0 passed, $failures failed"; exit 1; }

# ---- The image ----
started=$SECONDS
if ! PM_TIMEOUT=900 timeout 900 bash "$BUILD_IMAGE" --bin_dir="$RUNFILES" --tag="$IMAGE" \
      >"$WORK/build.log" 2>&1; then
  cat "$WORK/build.log"
  grep -q "debootstrap failed" "$WORK/build.log" &&
    unavailable "debootstrap could not make the Debian root (its log above): is the mirror reachable?"
  abort "build_image.sh failed (its output above)"
fi
echo "$(tail -n 1 "$WORK/build.log") in $((SECONDS - started)) s"

# ---- Can this machine run containers? Find the flags it needs, or say why not ----
RUN_FLAGS=()
notes=()
probe() { pm run --rm "${RUN_FLAGS[@]}" "$IMAGE" /usr/local/bin/trainctl --help >"$WORK/probe.log" 2>&1; }
for _ in 1 2 3; do
  probe && break
  error=$(grep -m 1 -iE "error|denied|not supported" "$WORK/probe.log" || tail -n 1 "$WORK/probe.log")
  if grep -q "cgroups in hybrid mode not supported" "$WORK/probe.log" &&
     ! grep -q -- --runtime <<<"$(printf '%s\n' "${RUN_FLAGS[@]}")"; then
    command -v runc >/dev/null ||
      unavailable "podman's runtime crun refuses this host's hybrid cgroups ($error) and runc (Debian package runc) is missing"
    RUN_FLAGS+=(--runtime=runc)
    notes+=("crun refuses this host's hybrid cgroups (a controller on the v2 hierarchy: $(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)): --runtime=runc")
  elif grep -qiE "setrlimit|error setting rlimit" "$WORK/probe.log" &&
       ! grep -q -- --ulimit <<<"$(printf '%s\n' "${RUN_FLAGS[@]}")"; then
    # podman asks for more than the hard limits, and this kernel refuses root raising them;
    # podman itself lowers RLIMIT_NPROC to kernel.pid_max.
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    pid_max=$(cat /proc/sys/kernel/pid_max)
    [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
    RUN_FLAGS+=(--ulimit="nofile=$nofile:$nofile" --ulimit="nproc=$nproc:$nproc")
    notes+=("raising a hard resource limit is refused here even to root ($error): --ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc")
  else
    break
  fi
done
probe || unavailable "podman cannot run a container here: $(grep -iE 'error|denied' "$WORK/probe.log" | head -n 3 | tr '\n' ' ')"
for note in "${notes[@]}"; do echo "oci: this host: $note"; done

# ---- 1. The image's binaries ----
in_image() { pm run --rm "${RUN_FLAGS[@]}" --network=none "$IMAGE" "$@"; }
user=$(in_image id -u 2>&1)
[ "$user" = 10001 ] || fail "1. the image runs as uid '$user', not 10001 (mptrain)"
for name in coordinator worker trainctl; do
  out=$(in_image /usr/local/bin/$name --version 2>&1)
  [ $? -eq 0 ] || fail "1. /usr/local/bin/$name --version in the image: $out"
  linked=$(in_image readlink /opt/mptrain/bin/$name 2>&1)
  [ "$linked" = /usr/local/bin/$name ] || fail "1. /opt/mptrain/bin/$name is '$linked', not a link to /usr/local/bin/$name"
done
unresolved=$(in_image sh -c 'ldd /usr/local/bin/coordinator /usr/local/bin/worker /usr/local/bin/trainctl | grep "not found"' 2>&1)
[ -z "$unresolved" ] || fail "1. libraries missing in the image: $unresolved"
version=$(in_image coordinator --version 2>&1 | head -n 1)
echo "image: $version, $(in_image sh -c '. /etc/os-release; echo $PRETTY_NAME')"

# ---- 2. A network, the coordinator and two workers ----
# A /24 of 10.89.0.0/16 that no podman network and no route of the host has yet.
subnet=""
for _ in $(seq 20); do
  candidate=10.89.$((RANDOM % 200 + 20))
  grep -q "^$candidate\." <<<"$(ip route)" && continue
  if pm network create --subnet=$candidate.0/24 "$NETWORK" >"$WORK/network.log" 2>&1; then
    subnet=$candidate
    break
  fi
  grep -qi "subnet\|overlap\|in use" "$WORK/network.log" || break
done
[ -n "$subnet" ] || unavailable "podman cannot create a network here: $(cat "$WORK/network.log")"
COORDINATOR_IP=$subnet.10
COORDINATOR=$COORDINATOR_IP:50051

bash "$RUNFILES/scripts/make_pki.sh" --worker w1 --worker w2 "$WORK/pki" "$COORDINATOR_IP" >/dev/null ||
  abort "make_pki.sh failed"
# The containers' user reads its credentials; the state, work and output directories are its.
mkdir -p "$WORK/state" "$WORK/w1" "$WORK/w2" "$WORK/data" "$WORK/output" "$WORK/specs"
cp "$SPEC" "$WORK/specs/seed_cpu.json"
chown -R 10001:10001 "$WORK/pki" "$WORK/state" "$WORK/w1" "$WORK/w2" "$WORK/output"
# deploy/kubernetes's securityContext, as podman flags.
HARDENED=(--read-only --cap-drop=all --security-opt=no-new-privileges --network="$NETWORK")
pm run -d "${RUN_FLAGS[@]}" "${HARDENED[@]}" --name="$PREFIX-coordinator" --ip=$COORDINATOR_IP \
  -v "$WORK/pki:/etc/mptrain/tls:ro" -v "$WORK/state:/var/lib/mptrain/state" \
  "$IMAGE" coordinator --listen=0.0.0.0:50051 --health_listen=0.0.0.0:50052 \
  --state_dir=/var/lib/mptrain/state --tls_cert=/etc/mptrain/tls/server.pem \
  --tls_key=/etc/mptrain/tls/server.key --tls_client_ca=/etc/mptrain/tls/ca.pem \
  --token_file=/etc/mptrain/tls/tokens >/dev/null 2>"$WORK/run.log" ||
  abort "the coordinator's container did not start: $(cat "$WORK/run.log")"
for i in 1 2; do
  pm run -d "${RUN_FLAGS[@]}" "${HARDENED[@]}" --name="$PREFIX-w$i" --ip=$subnet.1$i \
    -v "$WORK/pki:/etc/mptrain/workers:ro" -v "$WORK/w$i:/var/lib/mptrain/work" \
    -v "$WORK/data:/srv/mptrain/data:ro" -v "$WORK/output:/srv/mptrain/output" \
    "$IMAGE" /opt/mptrain/bin/worker --coordinator=$COORDINATOR --device=cpu --slots=1 \
    --name=w$i --work_dir=/var/lib/mptrain/work --data_root=/srv/mptrain/data \
    --output_root=/srv/mptrain/output --tls_ca=/etc/mptrain/workers/ca.pem \
    --tls_cert=/etc/mptrain/workers/w$i.pem --tls_key=/etc/mptrain/workers/w$i.key \
    --token_file=/etc/mptrain/workers/w$i.token >/dev/null 2>"$WORK/run.log" ||
    abort "worker w$i's container did not start: $(cat "$WORK/run.log")"
done

# trainctl from a fourth container on the network, as user alice.
ctl() {
  PM_TIMEOUT=${CTL_TIMEOUT:-30} pm run --rm "${RUN_FLAGS[@]}" "${HARDENED[@]}" \
    --name="$PREFIX-ctl" --ip=$subnet.20 -v "$WORK/pki:/etc/mptrain/client:ro" \
    -v "$WORK/specs:/etc/mptrain/specs:ro" "$IMAGE" trainctl --coordinator=$COORDINATOR \
    --tls_ca=/etc/mptrain/client/ca.pem --tls_cert=/etc/mptrain/client/client.pem \
    --tls_key=/etc/mptrain/client/client.key --token_file=/etc/mptrain/client/alice.token "$@"
}

# ---- 3. Registration and the seed example ----
alive=0
deadline=$((SECONDS + 60))
while [ $SECONDS -lt $deadline ]; do
  alive=$(ctl --output=json workers 2>/dev/null | grep -c '"ALIVE"')
  [ "$alive" -ge 2 ] && break
  for container in "${CONTAINERS[@]:0:3}"; do
    [ "$(pm inspect -f '{{.State.Running}}' "$container" 2>/dev/null)" = true ] ||
      abort "container $container exited: $(pm logs "$container" 2>&1 | tail -n 5)"
  done
  sleep 1
done
[ "$alive" -ge 2 ] || abort "only $alive of 2 workers ALIVE after 60 s"
workers=$(ctl workers 2>&1)
echo "$workers"
for i in 1 2; do
  grep -q "w$i#.* $subnet.1$i " <<<"$workers" || fail "3. worker w$i does not advertise its container's address $subnet.1$i"
done

submitted=$(CTL_TIMEOUT=180 ctl submit /etc/mptrain/specs/seed_cpu.json --wait 2>&1)
status=$?
echo "$submitted" | tail -n 3
[ $status -eq 0 ] || fail "3. the seed example did not succeed in the containers (exit $status)"
job=$(echo "$submitted" | tail -n 1)
ctl --output=json status "$job" >"$WORK/status.json" 2>&1
python3 - "$WORK/status.json" "$subnet" <<'PY' || fail "3. state, placement or checksums wrong: $(cat "$WORK/status.json")"
import json, sys
job = json.load(open(sys.argv[1]))
hosts = sorted(p["host"] for p in job["placement"])
sums = [r.get("parameter_checksum") for r in job["progress"]]
print("job", job.get("job_id", "?"), job["state"], "placed on", hosts, "checksums", sums)
assert job["state"] == "SUCCEEDED", job["state"]
assert hosts == [sys.argv[2] + ".11", sys.argv[2] + ".12"], hosts
assert len(sums) == 2 and len(set(sums)) == 1 and sums[0], sums
PY

# ---- 4. Teardown: nothing of the test's left ----
[ $failures -eq 0 ] || dump_logs
cleanup
trap - EXIT
left=$(podman ps -a --format '{{.Names}}' | grep -F "$PREFIX"; podman network ls --format '{{.Name}}' | grep -F "$NETWORK")
[ -z "$left" ] || fail "4. left after teardown: $left"

if [ $failures -ne 0 ]; then
  echo "0 passed, $failures failed"
  exit 1
fi
echo "oci image: all checks passed"
