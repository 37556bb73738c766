"""pybk's CRDs (BookieCluster, BookieLog) as data: load them, apply defaults, check objects.

What the API server does on create/update, done offline: structural defaults, the
openAPIV3Schema (via `jsonschema`) and the `x-kubernetes-validations` CEL rules (via
`cel-python`, when installed), including transition rules that compare with `oldSelf`.
Used by tests and by anyone who wants to check a manifest without a cluster.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import yaml

# The repository's crds/ (a source checkout), or $PYBK_CRD (the image ships it in /opt/pybk/crds).
CRD_PATH = Path(os.environ.get("PYBK_CRD") or Path(__file__).resolve().parents[2] / "crds" / "bookiecluster.yaml")
# every kind's CRD, from the same directory
CRD_PATHS = {"BookieCluster": CRD_PATH, "BookieLog": CRD_PATH.parent / "bookielog.yaml"}
DEFAULT_KIND = "BookieCluster"


@lru_cache(maxsize=4)
def load_crd(path: str | None = None) -> dict[str, Any]:
    """The CustomResourceDefinition document (the BookieCluster's unless `path` names another)."""
    return yaml.safe_load(Path(path or CRD_PATH).read_text())


def crd_of(kind: str) -> dict[str, Any]:
    """The CRD of `kind` (BookieCluster or BookieLog)."""
    if kind not in CRD_PATHS:
        raise KeyError(f"no pybk CRD for kind {kind!r} (known: {', '.join(sorted(CRD_PATHS))})")
    return load_crd(str(CRD_PATHS[kind]))


def schema(version: str = "v1alpha1", kind: str = DEFAULT_KIND) -> dict[str, Any]:
    """The openAPIV3Schema of one served version of `kind`'s CRD."""
    for v in crd_of(kind)["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{kind} CRD has no version {version}")


def apply_defaults(obj: Any, sch: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: fill absent properties that have a default."""
    if isinstance(obj, dict) and sch.get("type") == "object":
        props = sch.get("properties", {})
        for name, sub in props.items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(obj[name], sub)
        extra = sch.get("additionalProperties")
        if isinstance(extra, dict):
            for name in obj:
                if name not in props:
                    obj[name] = apply_defaults(obj[name], extra)
    elif isinstance(obj, list) and isinstance(sch.get("items"), dict):
        return [apply_defaults(item, sch["items"]) for item in obj]
    return obj


@dataclass(frozen=True)
class Violation:
    """One rejected rule: where, the rule and its message (as kubectl would show it)."""
    path: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _rules(sch: dict[str, Any], path: str, value: Any, old: Any) -> Iterator[tuple[str, dict, Any, Any]]:
    """Every (path, rule, value, oldValue) the CEL rules of `sch` apply to, depth first."""
    for rule in sch.get("x-kubernetes-validations", []):
        yield path, rule, value, old
    if isinstance(value, dict):
        for name, sub in sch.get("properties", {}).items():
            if name in value:
                old_sub = old.get(name) if isinstance(old, dict) else None
                yield from _rules(sub, f"{path}.{name}", value[name], old_sub)


def cel_available() -> bool:
    try:
        import celpy  # noqa: F401
    except ImportError:
        return False
    return True


def cel_violations(obj: dict[str, Any], old: dict[str, Any] | None = None,
                   version: str = "v1alpha1", kind: str | None = None) -> list[Violation]:
    """Evaluate the CRD's CEL rules on a defaulted object (and the old one for transition rules).

    Transition rules (those that mention `oldSelf`) are only checked on updates, where both the
    new and old value exist, like the API server does.
    """
    import celpy

    env = celpy.Environment()
    out: list[Violation] = []
    for path, rule, value, old_value in _rules(schema(version, kind or obj.get("kind") or DEFAULT_KIND),
                                               "", obj, old):
        expr = rule["rule"]
        transition = "oldSelf" in expr
        if transition and (old is None or old_value is None):
            continue
        act = {"self": celpy.json_to_cel(value)}
        if transition:
            act["oldSelf"] = celpy.json_to_cel(old_value)
        try:
            ok = env.program(env.compile(expr)).evaluate(act)
        except celpy.CELEvalError as e:
            out.append(Violation(path or ".", expr, f"rule {expr!r} could not be evaluated: {e}"))
            continue
        if not bool(ok):
            out.append(Violation(path or ".", expr, rule.get("message", f"failed rule: {expr}")))
    return out


def schema_errors(obj: dict[str, Any], version: str = "v1alpha1", kind: str | None = None) -> list[str]:
    """openAPIV3Schema errors (jsonschema), each with its JSON path."""
    import jsonschema

    validator = jsonschema.Draft7Validator(schema(version, kind or obj.get("kind") or DEFAULT_KIND))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '.'}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))]


def admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """What the API server would store and every reason it would refuse: (defaulted object, errors)."""
    version = obj.get("apiVersion", "").rpartition("/")[2] or "v1alpha1"
    kind = obj.get("kind") or DEFAULT_KIND
    defaulted = apply_defaults(copy.deepcopy(obj), schema(version, kind))
    errors = schema_errors(defaulted, version, kind)
    if not errors and cel_available():
        old_defaulted = apply_defaults(copy.deepcopy(old), schema(version, kind)) if old else None
        errors = [str(v) for v in cel_violations(defaulted, old_defaulted, version, kind)]
    return defaulted, errors
