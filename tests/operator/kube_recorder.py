"""A recorder at the Kubernetes API boundary (`pybk.operator.kube.KubeApi`): the one stand-in
the project allows, because no API server can run here. It keeps objects in memory so that a
handler's reads see earlier writes, and records every call for the tests to assert on."""
from __future__ import annotations

import copy
from typing import Any


def merge(dst: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch."""
    for k, v in patch.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


class RecordingKube:
    def __init__(self, objects: list[dict[str, Any]] = ()):
        self.objects: dict[tuple, dict] = {}
        self.calls: list[tuple[str, str, str, Any]] = []
        for obj in objects:
            self.put(obj)

    @staticmethod
    def _key(api_version, kind, name, namespace):
        return (api_version, kind, namespace or "", name)

    def put(self, obj: dict) -> None:
        m = obj["metadata"]
        self.objects[self._key(obj["apiVersion"], obj["kind"], m["name"], m.get("namespace"))] = copy.deepcopy(obj)

    def find(self, kind: str, name: str) -> dict | None:
        for (_, k, _, n), obj in self.objects.items():
            if k == kind and n == name:
                return obj
        return None

    def verbs(self, *verbs: str) -> list[tuple[str, str, str, Any]]:
        return [c for c in self.calls if c[0] in verbs]

    async def get(self, api_version, kind, name, namespace=None):
        self.calls.append(("get", kind, name, None))
        obj = self.objects.get(self._key(api_version, kind, name, namespace))
        return copy.deepcopy(obj) if obj else None

    async def list(self, api_version, kind, namespace, label_selector):
        self.calls.append(("list", kind, label_selector, None))
        want = dict(part.split("=", 1) for part in label_selector.split(",") if part)
        return [copy.deepcopy(o) for (av, k, ns, _), o in sorted(self.objects.items())
                if av == api_version and k == kind and ns == namespace
                and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in want.items())]

    async def apply(self, obj):
        self.calls.append(("apply", obj["kind"], obj["metadata"]["name"], copy.deepcopy(obj)))
        self.put(obj)
        return copy.deepcopy(obj)

    async def patch(self, api_version, kind, name, namespace, patch):
        self.calls.append(("patch", kind, name, copy.deepcopy(patch)))
        obj = self.objects[self._key(api_version, kind, name, namespace)]
        return copy.deepcopy(merge(obj, patch))

    async def delete(self, api_version, kind, name, namespace):
        self.calls.append(("delete", kind, name, None))
        return self.objects.pop(self._key(api_version, kind, name, namespace), None) is not None
