#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests (deploy/kubernetes, as kubectl's JSON List) against the
binaries they run and against each other. Prints one line per problem; exits 1 if any.

  check_kube_manifests.py RENDERED.json HELP_DIR PKI_FILES README.md

HELP_DIR holds BINARY.help (each binary's `--help` output); PKI_FILES lists, one a line, the
files scripts/make_pki.sh made for the workers node1 and node1-cpu (the manifests' $(NODE_NAME)
stands for node1); README.md holds the `kubectl create secret` commands of the admin.

What must hold (each a way the deployment would fail on a real cluster):
- every container runs a binary of HELP_DIR, and every argument is a flag that binary lists;
  every $(VAR) in an argument is one of the container's env variables;
- every volume is mounted and every mount names a volume (or a volumeClaimTemplate); every
  absolute path a flag names lies on a mount (the root file system is read-only), and every
  mount is named by a flag or is one of SCRATCH (/tmp, /dev/shm);
- every file a flag names on a Secret's mount is one make_pki.sh makes, and every Secret is
  one the README's `kubectl create secret generic` commands create;
- every containerPort is the port of a --*listen flag and back (pod network pods);
- every probe is a gRPC probe on the --health_listen port, which is not the TLS --listen port
  (kubelet's gRPC probe has no TLS); the coordinator has startup, readiness and liveness probes;
- the coordinator's --state_dir lies on a volumeClaimTemplate (persistent), its serviceName is
  a headless Service;
- every Service selects a pod template and its targetPorts are that pod's ports; the workers'
  --coordinator is SERVICE.NAMESPACE.svc:PORT of a Service whose targetPort is the
  coordinator's --listen port;
- a worker with --device=cuda requests nvidia.com/gpu, runs on the host network with
  dnsPolicy ClusterFirstWithHostNet (NCCL between nodes; the Service name still resolves);
  --port_range has a port per slot (GPUs requested, or --slots).
"""
import json
import os
import re
import sys

SCRATCH = {"/tmp", "/dev/shm"}  # Mounted for the process itself, named by no flag.
problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


def help_flags(path):
    flags = set()
    with open(path) as f:
        for line in f:
            m = re.match(r"^\s+--([A-Za-z0-9_]+)(=|\s|$)", line)
            if m:
                flags.add(m.group(1))
    return flags


def flag_args(args):
    parsed = []
    for arg in args:
        m = re.fullmatch(r"--([A-Za-z0-9_]+)=(.*)", arg)
        parsed.append((m.group(1), m.group(2)) if m else (None, arg))
    return parsed


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def port_of(hostport):
    m = re.fullmatch(r"(.+):(\d+)", hostport)
    return int(m.group(2)) if m else None


def main():
    rendered, help_dir, pki_files, readme = sys.argv[1:5]
    items = json.load(open(rendered))["items"]
    binaries = {name[:-5]: help_flags(os.path.join(help_dir, name))
                for name in os.listdir(help_dir) if name.endswith(".help")}
    pki = set(open(pki_files).read().split())
    secrets_made = set(re.findall(r"kubectl[^\n]* create secret generic ([a-z0-9-]+)",
                                  open(readme).read()))
    if not secrets_made:
        problem(readme, "has no `kubectl create secret generic NAME` command")
    services = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
                for o in items if o["kind"] == "Service"}
    workloads = [o for o in items if o["kind"] in ("StatefulSet", "DaemonSet", "Deployment")]
    coordinator_listen = {}  # (namespace, pod label set) -> its --listen port
    worker_targets = []
    for w in workloads:
        ns = w["metadata"].get("namespace")
        where = f'{w["kind"]}/{w["metadata"]["name"]}'
        pod = w["spec"]["template"]["spec"]
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        selector = w["spec"]["selector"].get("matchLabels", {})
        if any(labels.get(k) != v for k, v in selector.items()):
            problem(where, f"its selector {selector} does not select its own pods {labels}")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in w["spec"].get("volumeClaimTemplates", [])}
        mounted = set()
        host_network = pod.get("hostNetwork", False)
        for c in pod["containers"]:
            cw = f'{where} container {c["name"]}'
            binary = os.path.basename(c.get("command", ["?"])[0])
            if binary not in binaries:
                problem(cw, f"runs {c.get('command')}, not one of the binaries {sorted(binaries)}")
                continue
            env = {e["name"] for e in c.get("env", [])}
            args = flag_args(c.get("args", []))
            flags = {}
            for flag, value in args:
                if flag is None:
                    problem(cw, f"argument {value!r} is not --flag=value")
                    continue
                if flag not in binaries[binary]:
                    problem(cw, f"--{flag} is not a flag of {binary} (its --help lists no such flag)")
                flags.setdefault(flag, []).append(value)
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value):
                    if var not in env:
                        problem(cw, f"--{flag}={value} uses $({var}), which is not in its env")
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
            for path, m in mounts.items():
                mounted.add(m["name"])
                if m["name"] not in volumes and m["name"] not in claims:
                    problem(cw, f"mounts {m['name']} at {path}, a volume the pod does not have")
            # Every absolute path a flag names is on a mount; every mount is used.
            used = set()
            for flag, values in flags.items():
                for value in values:
                    for path in value.split(","):
                        if not path.startswith("/"):
                            continue
                        holders = [mp for mp in mounts if under(path, mp)]
                        if not holders:
                            problem(cw, f"--{flag}={path} is on no volume (the image's root is "
                                    "read-only and not kept)")
                        used.update(holders)
                        for mp in holders:
                            volume = volumes.get(mounts[mp]["name"], {})
                            if "secret" in volume:
                                name = os.path.basename(path).replace("$(NODE_NAME)", "node1")
                                if name not in pki:
                                    problem(cw, f"--{flag}={path}: {name} is no file "
                                            "scripts/make_pki.sh makes")
            for path in mounts:
                if path not in used and path not in SCRATCH:
                    problem(cw, f"mounts {path}, which no flag names")
            # Ports and probes.
            listens = {f: port_of(v[-1]) for f, v in flags.items() if f.endswith("listen")}
            container_ports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
            if not host_network:
                for port in container_ports:
                    if port not in listens.values():
                        problem(cw, f"containerPort {port} is the port of no --*listen flag")
                for flag, port in listens.items():
                    if port not in container_ports:
                        problem(cw, f"--{flag} port {port} is not a containerPort")
            probes = {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c}
            for kind, probe in probes.items():
                if "grpc" not in probe:
                    problem(cw, f"{kind} is not a gRPC probe")
                    continue
                port = probe["grpc"]["port"]
                if port != listens.get("health_listen"):
                    problem(cw, f"{kind} probes port {port}, not --health_listen's "
                            f"{listens.get('health_listen')}")
                if port == listens.get("listen") and "tls_cert" in flags:
                    problem(cw, f"{kind} probes the TLS port {port}: kubelet's probe has no TLS")
            if binary == "coordinator":
                for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if kind not in probes:
                        problem(cw, f"has no {kind}")
                state = flags.get("state_dir", [None])[-1]
                holder = [mp for mp in mounts if state and under(state, mp)]
                if not holder or mounts[holder[0]]["name"] not in claims:
                    problem(cw, f"--state_dir={state} is not on a volumeClaimTemplate")
                governing = services.get((ns, w["spec"].get("serviceName")))
                if governing is None or governing["spec"].get("clusterIP") != "None":
                    problem(where, f"serviceName {w['spec'].get('serviceName')} is no headless "
                            "Service")
                coordinator_listen[(ns, frozenset(labels.items()))] = (
                    listens.get("listen"), container_ports)
            if binary == "worker":
                device = flags.get("device", ["auto"])[-1]
                gpus = int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                if device == "cuda":
                    if gpus < 1:
                        problem(cw, "--device=cuda but no nvidia.com/gpu is requested")
                    if not host_network:
                        problem(cw, "--device=cuda without hostNetwork: NCCL needs the nodes' "
                                "own networks")
                    if pod.get("dnsPolicy") != "ClusterFirstWithHostNet":
                        problem(cw, "hostNetwork without dnsPolicy ClusterFirstWithHostNet: "
                                "the coordinator's Service name would not resolve")
                elif gpus:
                    problem(cw, f"--device={device} but it requests {gpus} GPUs")
                slots = int(flags.get("slots", [gpus if device == "cuda" else 2])[-1])
                m = re.fullmatch(r"(\d+)-(\d+)", flags.get("port_range", [""])[-1])
                if not m or int(m.group(2)) - int(m.group(1)) + 1 < slots:
                    problem(cw, f"--port_range {flags.get('port_range')} has fewer than {slots} "
                            "ports (one per slot)")
                for value in flags.get("coordinator", []):
                    worker_targets.append((cw, value))
        for name, v in volumes.items():
            if name not in mounted:
                problem(where, f"volume {name} is mounted by no container")
            if "secret" in v and v["secret"]["secretName"] not in secrets_made:
                problem(where, f"Secret {v['secret']['secretName']} is created by no "
                        f"`kubectl create secret generic` of {readme}")
    # Services select pods and reach their ports.
    pods = [(w["metadata"].get("namespace"), w["spec"]["template"]) for w in workloads]
    for (ns, name), s in services.items():
        selected = [t for pns, t in pods if pns == ns and s["spec"].get("selector") and
                    all(t["metadata"].get("labels", {}).get(k) == v
                        for k, v in s["spec"]["selector"].items())]
        if not selected:
            problem(f"Service/{name}", "selects no pod template")
            continue
        names = {p.get("name"): p["containerPort"] for t in selected
                 for c in t["spec"]["containers"] for p in c.get("ports", [])}
        for p in s["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            if target not in names and target not in names.values():
                problem(f"Service/{name}", f"targetPort {target} is no port of its pods")
    # Workers reach the coordinator's Service, and through it the --listen port.
    for cw, value in worker_targets:
        m = re.fullmatch(r"([a-z0-9-]+)\.([a-z0-9-]+)\.svc(\.cluster\.local)?:(\d+)", value)
        if not m:
            problem(cw, f"--coordinator={value} is not SERVICE.NAMESPACE.svc:PORT")
            continue
        s = services.get((m.group(2), m.group(1)))
        if s is None:
            problem(cw, f"--coordinator={value}: no Service {m.group(1)} in {m.group(2)}")
            continue
        port = next((p for p in s["spec"]["ports"] if p["port"] == int(m.group(4))), None)
        if port is None:
            problem(cw, f"--coordinator={value}: Service {m.group(1)} has no port {m.group(4)}")
            continue
        reached = False
        for (ns, labels), (listen, ports) in coordinator_listen.items():
            if ns == m.group(2) and all((k, v) in labels for k, v in s["spec"]["selector"].items()):
                target = port.get("targetPort", port["port"])
                number = target if isinstance(target, int) else next(
                    (n for n, pname in ports.items() if pname == target), None)
                reached = reached or number == listen
        if not reached:
            problem(cw, f"--coordinator={value} does not reach the coordinator's --listen port")
    for line in problems:
        print("FAIL:", line)
    kinds = sorted(f'{o["kind"]}/{o["metadata"]["name"]}' for o in items)
    print(f"checked {len(items)} objects ({', '.join(kinds)}): {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
