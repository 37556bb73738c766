"""The Kubernetes API boundary: the only module of the operator that talks to the API server.

Everything else in the operator works on plain dicts and calls these five verbs. Tests
substitute a recorder with the same methods (the one stand-in the project allows: no API
server can run on the test machines).
"""
from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)

FIELD_MANAGER = "pybk-operator"


class KubeError(Exception):
    """An API call failed. `transient` errors (conflicts, throttling, 5xx, no connection) are
    worth retrying later; the others need a human."""

    def __init__(self, verb: str, what: str, status: int | None, message: str):
        self.status = status
        self.transient = status is None or status in (409, 429) or status >= 500
        super().__init__(f"{verb} {what} failed ({status or 'no answer'}): {message}")


class KubeApi(Protocol):
    async def get(self, api_version: str, kind: str, name: str, namespace: str | None = None
                  ) -> dict[str, Any] | None: ...
    async def list(self, api_version: str, kind: str, namespace: str, label_selector: str
                   ) -> list[dict[str, Any]]: ...
    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def patch(self, api_version: str, kind: str, name: str, namespace: str | None,
                    patch: dict[str, Any]) -> dict[str, Any]: ...
    async def delete(self, api_version: str, kind: str, name: str, namespace: str) -> bool: ...


class Kube:
    """The real client: `kubernetes.aio`'s dynamic client (kube config, or in-cluster)."""

    def __init__(self, dynamic_client):
        self._dyn = dynamic_client

    @classmethod
    async def connect(cls) -> "Kube":
        from kubernetes.aio import client, config, dynamic
        from kubernetes.aio.config.config_exception import ConfigException

        try:
            config.load_incluster_config()
        except ConfigException:
            await config.load_kube_config()
        return cls(await dynamic.DynamicClient(client.ApiClient()))

    async def _resource(self, api_version: str, kind: str):
        from kubernetes.aio.dynamic.exceptions import ResourceNotFoundError

        try:
            return await self._dyn.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError as e:
            # e.g. spec.tls.issuerRef without cert-manager installed: say which API is missing
            raise KubeError("discover", f"{api_version} {kind}", 404,
                            f"the API server does not serve {kind} ({api_version}): is its CRD installed"
                            + (" (cert-manager)?" if api_version.startswith("cert-manager.io/") else "?")) from e

    async def _call(self, verb: str, what: str, coro):
        from kubernetes.aio.client.rest import ApiException

        try:
            return await coro
        except ApiException as e:
            raise KubeError(verb, what, getattr(e, "status", None), str(getattr(e, "reason", e))) from e
        except OSError as e:
            raise KubeError(verb, what, None, str(e)) from e

    async def get(self, api_version, kind, name, namespace=None):
        from kubernetes.aio.dynamic.exceptions import NotFoundError

        res = await self._resource(api_version, kind)
        try:
            obj = await self._call("get", f"{kind} {name}", self._dyn.get(res, name=name, namespace=namespace))
        except KubeError as e:
            if isinstance(e.__cause__, NotFoundError) or e.status == 404:
                return None
            raise
        return obj.to_dict()

    async def list(self, api_version, kind, namespace, label_selector):
        res = await self._resource(api_version, kind)
        objs = await self._call("list", f"{kind} {label_selector}",
                                self._dyn.get(res, namespace=namespace, label_selector=label_selector))
        return [item for item in objs.to_dict().get("items", [])]

    async def apply(self, obj):
        res = await self._resource(obj["apiVersion"], obj["kind"])
        name = obj["metadata"]["name"]
        out = await self._call("apply", f"{obj['kind']} {name}", self._dyn.server_side_apply(
            res, body=obj, namespace=obj["metadata"].get("namespace"),
            field_manager=FIELD_MANAGER, force_conflicts=True))
        return out.to_dict()

    async def patch(self, api_version, kind, name, namespace, patch):
        res = await self._resource(api_version, kind)
        out = await self._call("patch", f"{kind} {name}", self._dyn.patch(
            res, body=patch, name=name, namespace=namespace,
            content_type="application/merge-patch+json"))
        return out.to_dict()

    async def delete(self, api_version, kind, name, namespace):
        res = await self._resource(api_version, kind)
        try:
            await self._call("delete", f"{kind} {name}", self._dyn.delete(res, name=name, namespace=namespace))
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True
