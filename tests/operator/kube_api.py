"""A Kubernetes API server for the operator-process tests: kmock's emulator, with small shims.

KMock (PyPI `kmock`) keeps objects, serves discovery, lists, watch streams, merge patches and
finalizers. Where it differs from a real API server in a way the operator or kopf notices, a
shim below fills the gap; each names it (worth reporting upstream). Gaps left unfilled, which
the tests work around: no ownerReference garbage collection, no StatefulSet controller or
kubelet (tests/operator/test_operator_process.py plays them), PUT answers 404.

The server runs on its own event loop in a thread, so the tests and the `pybk operator`
process can both talk to it over HTTP; `kubeconfig()` writes a kube config that points there.
"""
from __future__ import annotations

import asyncio
import datetime
import itertools
import threading
import uuid
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import yaml
from kmock import KubernetesEmulator, ResourceInfo, Server, action

NAMESPACE = "default"

# group/version/plural -> (kind, namespaced, subresources): what the operator and kopf touch
RESOURCES: dict[str, tuple[str, bool, set[str]]] = {
    "pybk.io/v1alpha1/bookieclusters": ("BookieCluster", True, {"status", "scale"}),
    "pybk.io/v1alpha1/bookielogs": ("BookieLog", True, {"status"}),
    "v1/secrets": ("Secret", True, set()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, set()),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", True, set()),
    "v1/services": ("Service", True, set()),
    "v1/configmaps": ("ConfigMap", True, set()),
    "v1/serviceaccounts": ("ServiceAccount", True, set()),
    "v1/nodes": ("Node", False, set()),
    "v1/events": ("Event", True, set()),
    "v1/namespaces": ("Namespace", False, set()),
    "apps/v1/statefulsets": ("StatefulSet", True, {"status", "scale"}),
    "apps/v1/deployments": ("Deployment", True, {"status", "scale"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, set()),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True, set()),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True, set()),
    "cert-manager.io/v1/certificates": ("Certificate", True, set()),
}


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selector (`a=b,c!=d,e`), what kopf and the operator send."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k) != v.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@attrs.define(kw_only=True)
class Emulator(KubernetesEmulator):
    """KubernetesEmulator plus the shims; `calls` counts requests by (method, plural, subresource)."""

    _rv: Any = attrs.field(factory=lambda: itertools.count(1), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, (kind, namespaced, subs) in RESOURCES.items():
            self.resources[key] = ResourceInfo(kind=kind, namespaced=namespaced, subresources=subs,
                                               verbs={"get", "list", "watch", "create", "patch", "delete"})

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock gap: its path parser fails on `/api/v1/namespaces` (a namespace-less list of the
        # `namespaces` resource); answer it here with the one namespace the tests use
        if raw_request.path.rstrip("/") == "/api/v1/namespaces":
            if raw_request.query.get("watch") == "true":
                resp = aiohttp.web.StreamResponse()
                await resp.prepare(raw_request)
                await asyncio.Event().wait()
            return aiohttp.web.json_response({
                "apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": "1"},
                "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]})
        return await super().__call__(raw_request)

    def _now(self) -> str:
        return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    async def _handle(self, request):
        if request.resource is not None and isinstance(request.data, dict):
            request = await self._shim_write(request)
        return await super()._handle(request)

    async def _shim_write(self, request):
        data = request.data
        meta = data.setdefault("metadata", {})
        rv = str(next(self._rv))
        key = (request.resource, request.namespace, request.name)
        exists = key in self.objects and not self.objects[key].deleted
        content_type = request.headers.get("Content-Type", "")
        if request.action == action.UPDATE and not exists and "apply-patch" in content_type:
            # kmock gap: server-side apply of a missing object should create it (created here;
            # kmock then applies the patch to it as to any existing object)
            meta.update(uid=str(uuid.uuid4()), resourceVersion=rv, generation=1,
                        creationTimestamp=self._now(), namespace=request.namespace)
            async with self._lock:
                self.objects[key] = data
                await self._buses[request.resource].put({"type": "ADDED", "object": data})
        elif request.action == action.CREATE:
            # kmock gap: created objects get no uid/resourceVersion/generation/creationTimestamp
            meta.update(uid=str(uuid.uuid4()), resourceVersion=rv, generation=1,
                        creationTimestamp=self._now())
            meta.setdefault("namespace", request.namespace)
        elif request.action == action.UPDATE and exists:
            # kmock gap: resourceVersion is never bumped, generation never follows spec changes
            meta["resourceVersion"] = rv
            if request.subresource == "status":
                # kmock gap: a /status patch may change spec and metadata; only status counts
                for k in [k for k in data if k != "status"]:
                    del data[k]
                data["metadata"] = {"resourceVersion": rv}
            elif "spec" in data:
                old = self.objects[key].get("metadata", {}).get("generation") or 1
                if any(self.objects[key].get("spec", {}).get(k) != v for k, v in data["spec"].items()):
                    meta["generation"] = old + 1
        return request

    async def _serve_list(self, request):
        out = await super()._serve_list(request)
        info = self.resources[request.resource]
        # kmock gap: list responses carry no kind/apiVersion and ignore label and field selectors
        gv = "/".join(p for p in (request.resource.group, request.resource.version) if p)
        items = [i for i in out["items"]
                 if _matches(i.get("metadata", {}).get("labels") or {}, request.params.get("labelSelector", ""))]
        fs = request.params.get("fieldSelector", "")
        if fs.startswith("metadata.name="):
            items = [i for i in items if i["metadata"].get("name") == fs.split("=", 1)[1]]
        return {"apiVersion": gv, "kind": f"{info.kind}List",
                "metadata": {"resourceVersion": str(next(self._rv))}, "items": items}


class KubeApiServer:
    """The emulator on a loopback port, served from a thread; `run(coro)` runs on its loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.emulator: Emulator | None = None
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),),
                                        daemon=True, name="kmock")

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with Emulator() as emulator, Server(emulator) as server:
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def start(self) -> "KubeApiServer":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the kmock API server did not start within 30s")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kubeconfig(self, path: Path) -> Path:
        """A kube config with the emulator as the current context's server."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "kmock", "user": {"token": "test"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock",
                                                        "namespace": NAMESPACE}}]}))
        return path
