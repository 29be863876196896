"""Just enough of a Kubernetes API server for `kubectl apply
--dry-run=client`: kubectl maps each manifest's kind to a resource through
the server's discovery documents (/api, /apis, /api/v1, /apis/GROUP/VERSION)
and asks for the live object (404 here: "created (dry run)"), so without a
cluster it cannot run at all. The resources listed are the real API's
names for the kinds a kvc deployment uses; a kind not listed is an error
in kubectl, as on a real cluster without it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RESOURCES = {
    "v1": [("secrets", "Secret", True), ("services", "Service", True), ("configmaps", "ConfigMap", True),
           ("persistentvolumeclaims", "PersistentVolumeClaim", True), ("serviceaccounts", "ServiceAccount", True),
           ("namespaces", "Namespace", False)],
    "apps/v1": [("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True)],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True), ("ingresses", "Ingress", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


class FakeKubeApi:
    def __init__(self):
        self.paths: list[str] = []

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.paths.append(self.path)
                code, body = outer.answer(self.path.split("?")[0])
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "namespace": "default", "user": "u"}}],
            "users": [{"name": "u", "user": {}}],
        }))
        return path

    @staticmethod
    def answer(path: str):
        if path == "/version":
            return 200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0"}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"],
                         "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if path == "/apis":
            groups = []
            for gv in RESOURCES:
                if "/" in gv:
                    group, version = gv.split("/")
                    v = {"groupVersion": gv, "version": version}
                    groups.append({"name": group, "versions": [v], "preferredVersion": v})
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        gv = path.removeprefix("/apis/") if path.startswith("/apis/") else path.removeprefix("/api/")
        if gv in RESOURCES:
            return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
                {"name": n, "singularName": k.lower(), "namespaced": ns, "kind": k, "verbs": VERBS}
                for n, k, ns in RESOURCES[gv]]}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                     "message": f"{path} not found"}
