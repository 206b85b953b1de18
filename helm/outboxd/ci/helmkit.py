"""Helm's own engine (helm-sdkpy, which embeds Helm's Go library) for CI: lint a
chart with a given values file, and render it without a cluster.

helm-sdkpy has no `template` or dry-run action: its Install always talks to a
Kubernetes API. So `render` points it at a small API stand-in on 127.0.0.1 that
answers discovery and lookups ("nothing exists yet") and refuses every write.
With HELM_DRIVER=memory the release record lives in the Helm library's memory:
Helm loads the chart, merges the values, validates them against
values.schema.json, renders every template, sorts out hooks and NOTES, stores the
release, and only then fails at its first write. `Status` then returns exactly
what Helm rendered (manifest, hooks, notes). Nothing leaves this machine.

`fake_api(existing=[...])` makes the stand-in answer with those objects, as a
cluster holding an earlier release would: what a template's `lookup` finds on an
upgrade. Give them Helm's ownership labels and annotations (`owned_by`), or Helm
refuses to install over them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import yaml

import helm_sdkpy

# The Go runtime inside helm-sdkpy reads the environment the process started
# with, so HELM_DRIVER cannot be set from here: scripts/check-helm exports it.
if os.environ.get("HELM_DRIVER") != "memory":
    raise RuntimeError("helmkit needs HELM_DRIVER=memory in the environment the process starts with "
                       "(run it through scripts/check-helm)")

# Lint severities in Helm's support package.
SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}

_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
# The API groups and kinds the chart may render, as discovery reports them.
_RESOURCES: dict[str, list[tuple[str, str]]] = {
    "v1": [
        ("secrets", "Secret"),
        ("configmaps", "ConfigMap"),
        ("services", "Service"),
        ("serviceaccounts", "ServiceAccount"),
        ("pods", "Pod"),
    ],
    "apps/v1": [("deployments", "Deployment")],
    "batch/v1": [("jobs", "Job")],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget")],
    "autoscaling/v2": [("horizontalpodautoscalers", "HorizontalPodAutoscaler")],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy")],
    "monitoring.coreos.com/v1": [("servicemonitors", "ServiceMonitor"), ("prometheusrules", "PrometheusRule")],
    "cert-manager.io/v1": [("certificates", "Certificate")],
}
KUBE_VERSION = ("1", "31")


class RenderError(Exception):
    """Helm refused the chart or values before storing a release."""


def _discovery(path: str) -> dict[str, Any] | None:
    if path == "/version":
        major, minor = KUBE_VERSION
        return {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"]}
    if path == "/apis":
        groups = []
        for gv in _RESOURCES:
            if "/" in gv:
                group, version = gv.split("/")
                entry = {"groupVersion": gv, "version": version}
                groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    gv = path.removeprefix("/api/").removeprefix("/apis/")
    if path.startswith(("/api/", "/apis/")) and gv in _RESOURCES:
        return {
            "kind": "APIResourceList",
            "groupVersion": gv,
            "resources": [
                {"name": name, "singularName": kind.lower(), "namespaced": True, "kind": kind, "verbs": _VERBS}
                for name, kind in _RESOURCES[gv]
            ],
        }
    return None


def _object_path(obj: dict[str, Any]) -> str:
    """Where the API serves `obj`: /api/v1/namespaces/NS/PLURAL/NAME (or /apis/GROUP/...)."""
    gv, kind = obj["apiVersion"], obj["kind"]
    plural = next(name for name, k in _RESOURCES[gv] if k == kind)
    root = "/api/v1" if gv == "v1" else f"/apis/{gv}"
    meta = obj["metadata"]
    return f"{root}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


def owned_by(obj: dict[str, Any], release: str = "outboxd", namespace: str = "outboxd-test") -> dict[str, Any]:
    """`obj` with the labels and annotations Helm puts on what a release created."""
    meta = obj.setdefault("metadata", {})
    meta.setdefault("namespace", namespace)
    meta.setdefault("labels", {})["app.kubernetes.io/managed-by"] = "Helm"
    meta.setdefault("annotations", {}).update(
        {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace})
    return obj


class _ReadOnlyAPI(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": reason, "code": code, "message": message})

    def _drain(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        found = _discovery(path)
        if found is not None:
            return self._reply(200, found)
        if path in self.server.objects:
            return self._reply(200, self.server.objects[path])
        if path.rsplit("/", 1)[-1] in {name for items in _RESOURCES.values() for name, _ in items}:
            items = [o for p, o in self.server.objects.items() if p.rsplit("/", 1)[0] == path]
            return self._reply(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items})
        return self._status(404, "NotFound", "render-only API: nothing exists")

    def _refuse(self) -> None:
        self._drain()
        self._status(403, "Forbidden", "render-only API: writes are refused")

    do_POST = do_PUT = do_PATCH = do_DELETE = _refuse  # noqa: N815


class _Server(ThreadingHTTPServer):
    # client-go discovers API groups in parallel; the default backlog of 5 drops
    # connection attempts, which then wait a second for a SYN retransmit.
    request_queue_size = 128
    daemon_threads = True
    # What exists already, by the path the API serves it at.
    objects: dict[str, dict[str, Any]] = {}


@contextmanager
def fake_api(existing: list[dict[str, Any]] | None = None) -> Iterator[str]:
    """A read-only Kubernetes API stand-in on loopback that holds `existing` (and
    nothing else); yields a kubeconfig YAML."""
    server = _Server(("127.0.0.1", 0), _ReadOnlyAPI)
    server.objects = {_object_path(o): o for o in existing or []}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "render", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
            "users": [{"name": "render", "user": {"token": "render-only"}}],
            "contexts": [{"name": "render", "context": {"cluster": "render", "user": "render"}}],
            "current-context": "render",
        })
    finally:
        server.shutdown()
        server.server_close()


def load_values(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a values file must be a mapping")
    return data


def render(chart: Path, values: dict[str, Any], kubeconfig: str, *,
           release: str = "outboxd", namespace: str = "outboxd-test") -> dict[str, Any]:
    """Renders `chart` with `values` (merged over the chart's defaults by Helm, like
    `-f`). Returns {"manifests": [docs], "hooks": [docs], "notes": str, "manifest": str}."""
    config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    install_error = None
    try:
        asyncio.run(helm_sdkpy.Install(config).run(release, str(chart), values=values or None,
                                                   wait=False, timeout=30))
    except helm_sdkpy.HelmError as err:  # expected: the stand-in refuses writes
        install_error = str(err)
    try:
        rel = asyncio.run(helm_sdkpy.Status(config).run(release))
    except helm_sdkpy.HelmError as err:
        raise RenderError(install_error or str(err)) from None
    manifest = rel.get("manifest") or ""
    hooks = []
    for hook in rel.get("hooks") or []:
        doc = yaml.safe_load(hook["manifest"])
        if doc:
            hooks.append(doc)
    return {
        "manifest": manifest,
        "manifests": [d for d in yaml.safe_load_all(manifest) if d],
        "hooks": hooks,
        "hook_manifests": [h["manifest"] for h in rel.get("hooks") or []],
        "notes": (rel.get("info") or {}).get("notes") or "",
    }


def _deep_merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is None:
                merged.pop(key, None)  # Helm: null removes a default
            else:
                merged[key] = _deep_merge(base.get(key), value) if key in base else value
        return merged
    return override


def lint(chart: Path, values_file: Path | None, workdir: Path) -> list[tuple[str, str]]:
    """`helm lint` with a values file. helm-sdkpy's Lint takes no values, so the
    chart is copied with the values file merged into its values.yaml (what `-f`
    does). Returns (severity, path) for each message; helm-sdkpy drops the texts."""
    config = helm_sdkpy.Configuration(namespace="default", kubeconfig=str(workdir / "no-kubeconfig"))
    target = chart
    if values_file is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        target = Path(tempfile.mkdtemp(prefix="lint-", dir=workdir)) / chart.name
        shutil.copytree(chart, target)
        merged = _deep_merge(load_values(chart / "values.yaml"), load_values(values_file))
        (target / "values.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    try:
        result = asyncio.run(helm_sdkpy.Lint(config).run(str(target)))
    finally:
        if target != chart:
            shutil.rmtree(target.parent, ignore_errors=True)
    return [(SEVERITY.get(m.get("Severity"), str(m.get("Severity"))), m.get("Path", ""))
            for m in result.get("Messages") or []]
