#!/usr/bin/env bash
# deploy/kubernetes, offline: `kubectl kustomize` renders it; `kubectl apply --dry-run=client`
# takes every object (kubectl still asks a server which kinds exist: tests/lib/kube_api_stub.py
# answers that discovery on loopback, and nothing else, so --validate=false: no OpenAPI schema
# is checked, and the stub fails the test if kubectl ever tried to write); then
# tests/lib/check_kube_manifests.py checks the rendered objects against the binaries' --help
# and each other (flags, ports, probes, volumes, Secrets, Services: its docstring lists them).
# Last, the manifests' own arguments run for real (paths moved into the test's directory,
# ports onto free loopback ports, $(NODE_NAME) = node1): the coordinator starts with them, its
# health port answers SERVING to a plaintext probe as kubelet's gRPC probe sends it while its
# TLS port does not, the CPU worker registers with them and runs the seed example, the GPU
# worker's arguments parse (--version), and SIGTERM stops both daemons with exit 0.
# Without kubectl (Debian's kubernetes-client, which scripts/setup.sh installs) the test skips,
# except under CI (CI set and not empty), where it fails.
set -uo pipefail
RUNFILES=${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-mptrain}
BIN_COORDINATOR=$RUNFILES/coordinator/coordinator
BIN_WORKER=$RUNFILES/worker/worker
BIN_TRAINCTL=$RUNFILES/client/trainctl
HEALTH=$RUNFILES/tests/grpc_health_check
KUBECTL=${KUBECTL:-kubectl}
WORK=${TEST_TMPDIR:-/tmp}/kube.$$
mkdir -p "$WORK"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pids=()
cleanup() { local p; for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; return 0; }
trap cleanup EXIT

if ! command -v "$KUBECTL" >/dev/null; then
  if [ -n "${CI:-}" ]; then
    echo "FAIL: $KUBECTL is not installed (Debian package kubernetes-client, which" \
      "scripts/setup.sh installs), and CI=$CI: the manifests must be checked"
    exit 1
  fi
  echo "SKIPPED: $KUBECTL is not installed (Debian package kubernetes-client)"
  exit 0
fi
export HOME=$WORK  # kubectl's discovery cache goes here, not into the user's home.
echo "kubectl: $("$KUBECTL" version --client 2>&1 | head -n 1)"

# 1. Render (a copy: kustomize does not follow the symbolic links of Bazel's runfiles).
cp -rL "$RUNFILES/deploy/kubernetes" "$WORK/kubernetes"
if ! "$KUBECTL" kustomize "$WORK/kubernetes" >"$WORK/rendered.yaml" 2>"$WORK/kustomize.err"; then
  fail "kubectl kustomize deploy/kubernetes: $(cat "$WORK/kustomize.err")"
fi

# 2. Client-side dry run against the discovery stub.
python3 "$RUNFILES/tests/lib/kube_api_stub.py" "$WORK/api.port" "$WORK/api.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$WORK/api.port" ] && break; sleep 0.05; done
cat >"$WORK/kubeconfig" <<CONFIG
apiVersion: v1
kind: Config
clusters: [{name: stub, cluster: {server: "http://127.0.0.1:$(cat "$WORK/api.port")"}}]
contexts: [{name: stub, context: {cluster: stub, user: stub, namespace: default}}]
users: [{name: stub, user: {}}]
current-context: stub
CONFIG
export KUBECONFIG=$WORK/kubeconfig
dry() { "$KUBECTL" apply --dry-run=client --validate=false -f "$WORK/rendered.yaml" "$@"; }
if ! dry >"$WORK/dry.txt" 2>&1; then
  fail "kubectl apply --dry-run=client refused the manifests: $(cat "$WORK/dry.txt")"
fi
cat "$WORK/dry.txt"
for object in namespace/mptrain service/mptrain-coordinator service/mptrain-coordinator-pods \
              statefulset.apps/mptrain-coordinator daemonset.apps/mptrain-worker-gpu \
              daemonset.apps/mptrain-worker-cpu; do
  grep -qx "$object created (dry run)" "$WORK/dry.txt" || fail "the dry run did not create $object"
done
dry -o json >"$WORK/rendered.json" 2>"$WORK/dry-json.err" ||
  fail "kubectl apply --dry-run=client -o json: $(cat "$WORK/dry-json.err")"
[ ! -s "$WORK/api.log" ] || fail "kubectl tried to change the stub server: $(cat "$WORK/api.log")"

# 3. The objects against the binaries and each other.
mkdir -p "$WORK/help"
"$BIN_COORDINATOR" --help >"$WORK/help/coordinator.help" 2>&1
"$BIN_WORKER" --help >"$WORK/help/worker.help" 2>&1
bash "$RUNFILES/scripts/make_pki.sh" --worker node1 --worker node1-cpu "$WORK/pki" >/dev/null
(cd "$WORK/pki" && ls) >"$WORK/pki.files"
python3 "$RUNFILES/tests/lib/check_kube_manifests.py" "$WORK/rendered.json" "$WORK/help" \
  "$WORK/pki.files" "$RUNFILES/README.md" || failures=$((failures + 1))

# 4. The manifests' arguments, for real. ARGS OBJECT: the first container's arguments, one a
# line, with its paths and ports moved here and its $(VARIABLES) given values.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mkdir -p "$WORK/state" "$WORK/data" "$WORK/output/alice" "$WORK/work-cpu" "$WORK/work-gpu"
args() {
  python3 - "$WORK/rendered.json" "$1" <<'PY' | sed \
    -e "s|0\.0\.0\.0:50051|127.0.0.1:$GRPC|; s|0\.0\.0\.0:50052|127.0.0.1:$HEALTH_PORT|" \
    -e "s|0\.0\.0\.0:8443|127.0.0.1:$HTTPS|; s|mptrain-coordinator\.mptrain\.svc:50051|localhost:$GRPC|" \
    -e "s|/var/lib/mptrain/state|$WORK/state|; s|/etc/mptrain/[a-z]*/|$WORK/pki/|" \
    -e "s|/srv/mptrain/data|$WORK/data|; s|/srv/mptrain/output|$WORK/output|" \
    -e "s|\$(NODE_NAME)|node1|g; s|\$(POD_IP)|127.0.0.1|; s|\$(HOST_IP)|127.0.0.1|"
import json, sys
for o in json.load(open(sys.argv[1]))["items"]:
    if f'{o["kind"]}/{o["metadata"]["name"]}' == sys.argv[2]:
        print("\n".join(o["spec"]["template"]["spec"]["containers"][0]["args"]))
PY
}
# The manifests' fixed ports become ports probed free here; the other test running beside this
# one may take one of them before the coordinator binds it, so a coordinator that exits at once
# is started again on other ports (3 tries).
for attempt in 1 2 3; do
  GRPC=$(free_port); HEALTH_PORT=$(free_port); HTTPS=$(free_port)
  mapfile -t coordinator_args < <(args StatefulSet/mptrain-coordinator)
  mapfile -t cpu_args < <(args DaemonSet/mptrain-worker-cpu | sed "s|/var/lib/mptrain/work|$WORK/work-cpu|")
  mapfile -t gpu_args < <(args DaemonSet/mptrain-worker-gpu | sed "s|/var/lib/mptrain/work|$WORK/work-gpu|")
  if [ ${#coordinator_args[@]} -eq 0 ] || [ ${#cpu_args[@]} -eq 0 ] || [ ${#gpu_args[@]} -eq 0 ]; then
    fail "the rendered manifests hold no arguments to run"
    echo "kubernetes manifests: $failures failed"
    exit 1
  fi
  echo "coordinator ${coordinator_args[*]}"
  "$BIN_COORDINATOR" "${coordinator_args[@]}" >"$WORK/coordinator.log" 2>&1 &
  coordinator=$!
  pids+=($coordinator)
  serving=""
  for _ in $(seq 100); do
    serving=$("$HEALTH" 127.0.0.1:$HEALTH_PORT 2>&1) && break
    kill -0 $coordinator 2>/dev/null || break
    sleep 0.1
  done
  [ "$serving" = SERVING ] || kill -0 $coordinator 2>/dev/null || [ $attempt -eq 3 ] || {
    echo "the coordinator exited at start (attempt $attempt): $(tail -n 2 "$WORK/coordinator.log")"
    continue
  }
  break
done
[ "$serving" = SERVING ] ||
  fail "the --health_listen port does not answer SERVING to a plaintext probe: $serving"
if tls=$("$HEALTH" 127.0.0.1:$GRPC 2>&1); then
  fail "the TLS port answered a plaintext probe ($tls): the test cannot show why the health port exists"
fi
echo "plaintext probe: health port $serving; TLS port: $tls"

echo "worker (cpu) ${cpu_args[*]}"
"$BIN_WORKER" "${cpu_args[@]}" >"$WORK/worker-cpu.log" 2>&1 &
worker=$!
pids+=($worker)
ctl() { "$BIN_TRAINCTL" --coordinator=localhost:$GRPC --tls_ca="$WORK/pki/ca.pem" \
          --tls_cert="$WORK/pki/client.pem" --tls_key="$WORK/pki/client.key" \
          --token_file="$WORK/pki/alice.token" "$@"; }
for _ in $(seq 100); do
  grep -q '"ALIVE"' <<<"$(ctl --output=json workers 2>/dev/null)" && break
  sleep 0.1
done
grep -q "^node1-cpu#" <<<"$(ctl workers)" || fail "the CPU worker did not register as node1-cpu: $(ctl workers 2>&1)"
if ! submitted=$(timeout 60 "$BIN_TRAINCTL" --coordinator=localhost:$GRPC --tls_ca="$WORK/pki/ca.pem" \
    --tls_cert="$WORK/pki/client.pem" --tls_key="$WORK/pki/client.key" \
    --token_file="$WORK/pki/alice.token" submit "$RUNFILES/examples/seed_cpu.json" --wait 2>&1); then
  fail "the seed example did not succeed on the manifests' CPU worker: $(echo "$submitted" | tail -3)"
fi
echo "$submitted" | tail -2

# The GPU worker's arguments parse (this machine may have no GPU: --version stops there).
out=$("$BIN_WORKER" "${gpu_args[@]}" --version 2>&1) || fail "the GPU worker refuses its arguments: $out"

# SIGTERM, as kubelet stops a pod: both exit 0, the worker deregistered.
kill -TERM $worker
wait $worker
code=$?
[ $code -eq 0 ] || fail "the worker exited $code on SIGTERM"
# Deregistered: LOST at once (a silent worker would take the 10 s heartbeat timeout).
grep -q "^node1-cpu#.*LOST" <<<"$(ctl workers)" ||
  fail "the worker stopped by SIGTERM is not LOST at once (not deregistered): $(ctl workers 2>&1)"
kill -TERM $coordinator
wait $coordinator
code=$?
[ $code -eq 0 ] || fail "the coordinator exited $code on SIGTERM"

if [ $failures -ne 0 ]; then
  for f in "$WORK"/*.log; do echo "--- $f"; tail -15 "$f"; done
  echo "kubernetes manifests: $failures failed"
  exit 1
fi
echo "kubernetes manifests: rendered, dry-run applied, checked against the binaries, and run"
