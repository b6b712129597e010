#!/usr/bin/env python3
"""A stand-in for a Kubernetes API server's discovery, for `kubectl --dry-run=client` offline.

kubectl's client-side dry run still asks a server which kinds exist (discovery) and, for
apply, whether each object exists already: this answers discovery for the built-in kinds of
KINDS only (any other kind stays unknown, so kubectl refuses it), "404 Not Found" for every
object, and 404 for the OpenAPI schema (so kubectl needs --validate=false: no schema is
checked here). A request that would change anything is answered 405 and recorded in the log
file, which the test checks is free of them.

Usage: kube_api_stub.py PORT_FILE LOG_FILE  (listens on 127.0.0.1, a free port)
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (group, version) -> [(plural, kind, namespaced)]
KINDS = {
    ("", "v1"): [("namespaces", "Namespace", False), ("services", "Service", True),
                 ("secrets", "Secret", True), ("configmaps", "ConfigMap", True),
                 ("persistentvolumeclaims", "PersistentVolumeClaim", True),
                 ("pods", "Pod", True), ("serviceaccounts", "ServiceAccount", True)],
    ("apps", "v1"): [("statefulsets", "StatefulSet", True), ("daemonsets", "DaemonSet", True),
                     ("deployments", "Deployment", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def resource_list(group, version):
    group_version = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": [{"name": plural, "singularName": kind.lower(), "namespaced": namespaced,
                           "kind": kind, "verbs": VERBS}
                          for plural, kind, namespaced in KINDS[(group, version)]]}


def discovery(path):
    if path == "/version":
        return {"major": "1", "minor": "20", "gitVersion": "v1.20.2"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
    if path == "/apis":
        groups = [{"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                   "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}}
                  for g, v in KINDS if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    if path == "/api/v1":
        return resource_list("", "v1")
    for group, version in KINDS:
        if group and path == f"/apis/{group}/{version}":
            return resource_list(group, version)
    return None


class Handler(BaseHTTPRequestHandler):
    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        found = discovery(path)
        if found is not None:
            self.answer(200, found)
        else:
            self.answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "reason": "NotFound", "code": 404, "message": f"{path} not found"})

    def refuse(self):
        with open(LOG, "a") as log:
            log.write(f"WRITE {self.command} {self.path}\n")
        self.answer(405, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": "MethodNotAllowed", "code": 405, "message": "dry run only"})

    do_POST = do_PUT = do_PATCH = do_DELETE = refuse

    def log_message(self, *args):  # Quiet: the test prints what matters.
        pass


if __name__ == "__main__":
    PORT_FILE, LOG = sys.argv[1], sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(PORT_FILE + ".tmp", "w") as f:
        f.write(f"{server.server_address[1]}\n")
    import os
    os.rename(PORT_FILE + ".tmp", PORT_FILE)
    server.serve_forever()
