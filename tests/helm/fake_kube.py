"""A minimal in-memory Kubernetes API server, just enough for Helm's install action: version and
discovery for the kinds the chart uses, release storage in Secrets, and create / get / update of
objects. It records every object Helm creates, so a test gets the manifests the real Helm
engine rendered. Loopback only; no validation (tests validate with kubernetes-validate)."""

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# group/version -> [(resource, kind, namespaced)]
RESOURCES = {
    "v1": [("services", "Service", True), ("secrets", "Secret", True),
           ("configmaps", "ConfigMap", True), ("pods", "Pod", True),
           ("serviceaccounts", "ServiceAccount", True), ("namespaces", "Namespace", False),
           ("persistentvolumeclaims", "PersistentVolumeClaim", True)],
    "apps/v1": [("deployments", "Deployment", True), ("statefulsets", "StatefulSet", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "monitoring.coreos.com/v1": [("servicemonitors", "ServiceMonitor", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


class FakeKube:
    def __init__(self):
        self.objects = {}  # path -> object
        self.created = []  # objects in creation order (Secrets of the release storage too)
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_GET(self):
                fake.get(self)

            def do_POST(self):
                fake.post(self)

            def do_PUT(self):
                fake.put(self)

            def do_PATCH(self):
                fake.put(self)

            def do_DELETE(self):
                self.send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self):
        return (
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters:\n- name: fake\n  cluster:\n    server: {self.url}\n"
            "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
            "users:\n- name: fake\n  user:\n    token: fake\n")

    @staticmethod
    def kubeconfig_placeholder():
        """A kubeconfig naming no cluster, for actions that need none (lint)."""
        return "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def not_found(h):
        h.send(404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "reason": "NotFound", "code": 404, "message": "not found"})

    def get(self, h):
        url = urllib.parse.urlparse(h.path)
        path = url.path.rstrip("/")
        if path == "/version":
            return h.send(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0",
                                "platform": "linux/amd64"})
        if path == "/api":
            return h.send(200, {"kind": "APIVersions", "versions": ["v1"],
                                "serverAddressByClientCIDRs": []})
        if path == "/apis":
            groups = []
            for gv in RESOURCES:
                if "/" not in gv:
                    continue
                g, v = gv.split("/")
                ver = {"groupVersion": gv, "version": v}
                groups.append({"name": g, "versions": [ver], "preferredVersion": ver})
            return h.send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for gv, res in RESOURCES.items():
            prefix = "/api/v1" if gv == "v1" else f"/apis/{gv}"
            if path == prefix:
                return h.send(200, {
                    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                    "resources": [{"name": r, "singularName": k.lower(), "namespaced": ns,
                                   "kind": k, "verbs": VERBS} for r, k, ns in res]})
        with self.lock:
            obj = self.objects.get(path)
            if obj is not None:
                return h.send(200, obj)
            # A list: every stored object directly under this collection path.
            parts = path.split("/")
            if parts[-1] in {r for res in RESOURCES.values() for r, _, _ in res}:
                items = [o for p, o in self.objects.items() if p.rsplit("/", 1)[0] == path]
                return h.send(200, {"kind": "List", "apiVersion": "v1", "metadata": {},
                                    "items": items})
        self.not_found(h)

    def post(self, h):
        obj = h.body()
        path = urllib.parse.urlparse(h.path).path.rstrip("/")
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{len(self.created)}")
        meta["resourceVersion"] = "1"
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        with self.lock:
            self.objects[f"{path}/{meta['name']}"] = obj
            self.created.append(obj)
        h.send(201, obj)

    def put(self, h):
        obj = h.body()
        path = urllib.parse.urlparse(h.path).path.rstrip("/")
        with self.lock:
            if "kind" in obj:
                self.objects[path] = obj
            stored = self.objects.get(path, obj)
        h.send(200, stored)

    def manifests(self):
        """The chart's objects (Helm's release-storage Secrets left out)."""
        return [o for o in self.created
                if not (o.get("kind") == "Secret" and o.get("type") == "helm.sh/release.v1")]


def install(chart, values):
    """`helm install fleet CHART` with `values` into a fresh FakeKube through helm-sdkpy.
    Helm's release driver must be `memory` (HELM_DRIVER, read by the embedded Go runtime from
    the process's initial environment: run this in a process started with it)."""
    import asyncio

    import helm_sdkpy as helm

    kube = FakeKube()
    try:
        cfg = helm.Configuration(namespace="default", kubeconfig=kube.kubeconfig())
        release = asyncio.run(helm.Install(cfg).run("fleet", chart, values=values, wait=False,
                                                    timeout=60))
        return {"manifest": release["manifest"], "sent": kube.manifests()}
    except helm.HelmError as e:
        return {"error": str(e)}
    finally:
        kube.stop()


if __name__ == "__main__":
    import sys

    print(json.dumps(install(sys.argv[1], json.loads(sys.stdin.read() or "null"))))
