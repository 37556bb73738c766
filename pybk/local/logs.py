"""`pybk local apply -f` for BookieLog manifests: the local platform's side of the log controller.

The same manifest the operator runs: the local platform keeps Secret manifests it is given under
DIR/secrets/<secret>/<key> (as a pod would see them mounted) and reads the log's password there,
remembers the log each
resource created or adopted in DIR/logs.json (the operator keeps it in status.logId), and carries
the controller's actions out directly with a client of the running local cluster.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any, Iterator

from pybk.client.errors import BKError
from pybk.cluster.bookielog import store as log_store
from pybk.cluster.bookielog.actions import SetCondition
from pybk.cluster.bookielog.controller import deletion_note, plan, plan_delete
from pybk.cluster.bookielog.observed import ClusterState, Observed, SecretState
from pybk.cluster.bookielog.spec import KIND, BookieLogSpec, SpecError
from pybk.cluster.bookielog.status import status as build_status
from pybk.cluster.spec import load_manifest

from .client import read_client
from .datadir import MANIFEST
from .errors import LocalClusterError

LOGS_JSON = "logs.json"


def documents(path: str | Path) -> list[dict[str, Any]]:
    """Every mapping document of a YAML file."""
    import yaml

    try:
        return [d for d in yaml.safe_load_all(Path(path).read_text()) if isinstance(d, dict)]
    except (OSError, yaml.YAMLError) as e:
        raise LocalClusterError(f"cannot read {path}: {e}") from None


def has_logs(path: str | Path) -> bool:
    return any(d.get("kind") == KIND for d in documents(path))


def has_cluster(path: str | Path) -> bool:
    return any(d.get("kind") == "BookieCluster" for d in documents(path))


def has_secrets(path: str | Path) -> bool:
    return any(d.get("kind") == "Secret" for d in documents(path))


def secret_path(data_dir: Path, name: str, key: str) -> Path:
    """Where the local platform keeps a Secret's key (as a pod would see it mounted)."""
    return data_dir / "secrets" / name / key


def store_secrets(path: str | Path, data_dir: Path) -> list[str]:
    """Keep every Secret document of the manifest under DIR/secrets/<name>/<key> (directories 0700,
    files 0600), as `kubectl apply` would store it; returns their names."""
    import os

    names = []
    for d in documents(path):
        if d.get("kind") != "Secret":
            continue
        name = (d.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise LocalClusterError(f"{path}: a Secret needs a metadata.name (a Kubernetes object name)")
        values = {k: str(v).encode() for k, v in (d.get("stringData") or {}).items()}
        values.update({k: base64.b64decode(v) for k, v in (d.get("data") or {}).items() if k not in values})
        folder = data_dir / "secrets" / name
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(folder.parent, 0o700)
        for key, value in values.items():
            if "/" in key or key.startswith("."):
                raise LocalClusterError(f"{path}: Secret {name!r} has a bad key {key!r}")
            target = secret_path(data_dir, name, key)
            fd = os.open(target.with_name(key + ".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(value)
            os.replace(target.with_name(key + ".tmp"), target)
        names.append(name)
    return names


def delete_secrets(path: str | Path, data_dir: Path) -> list[str]:
    """Forget every Secret document of the manifest that an earlier apply stored (kubectl delete
    -f); returns the names removed."""
    import shutil

    names = []
    for d in documents(path):
        name = (d.get("metadata") or {}).get("name") if d.get("kind") == "Secret" else None
        if isinstance(name, str) and name and "/" not in name and not name.startswith("."):
            folder = data_dir / "secrets" / name
            if folder.is_dir():
                shutil.rmtree(folder)
                names.append(name)
    return names


def password_of(spec: BookieLogSpec, data_dir: Path) -> tuple[SecretState, bytes | None]:
    """The password from the Secret stored by an earlier (or this) `pybk local apply`."""
    ref = spec.password_secret
    if not (data_dir / "secrets" / ref.name).is_dir():
        return SecretState.ABSENT, None
    path = secret_path(data_dir, ref.name, ref.key)
    if not path.is_file():
        return SecretState.KEY_MISSING, None
    return SecretState.PRESENT, path.read_bytes()


def _cluster_name(data_dir: Path) -> str | None:
    try:
        return load_manifest(data_dir / MANIFEST, validate=False).name
    except SpecError:
        return None


async def apply_one(spec: BookieLogSpec, password: bytes | None, secret: SecretState, data_dir: Path,
                    managed: int | None) -> tuple[dict[str, Any], int | None]:
    """Reconcile one BookieLog against the local cluster: (status, managed log id)."""
    from pybk.client import BookKeeper
    from pybk.log import Logs

    local = read_client(data_dir)
    cluster = ClusterState.PRESENT if _cluster_name(data_dir) == spec.cluster else ClusterState.ABSENT
    async with await BookKeeper.connect(local.metadata_uri, security=local.security) as bk:
        logs = Logs(bk)

        async def look() -> Observed:
            found = None
            if cluster is ClusterState.PRESENT and secret is SecretState.PRESENT and not spec.errors:
                found = await log_store.observe_log(logs, spec.log, password)
            return Observed(cluster=cluster, secret=secret, log=found, managed_id=managed,
                            now_ms=int(time.time() * 1000))

        observed = await look()
        actions = plan(spec, observed)
        steps = [a for a in actions if not isinstance(a, SetCondition)]
        if steps:
            managed = await log_store.execute(logs, spec, password, steps, managed)
            observed = await look()
            actions = plan(spec, observed)
    return build_status(spec, observed, actions, None, managed), managed


def apply_logs(path: str | Path, data_dir: Path) -> list[dict[str, Any]]:
    """Apply every BookieLog of the manifest; returns [{name, status}] (status as the operator writes it)."""
    state = _load_state(data_dir)
    out = []
    for spec, key, secret, password in _bookielogs(path, data_dir, validate=True):
        try:
            st, managed = asyncio.run(apply_one(spec, password, secret, data_dir, state.get(key)))
        except BKError as e:
            raise LocalClusterError(f"BookieLog {spec.name}: {e}") from None
        if managed is not None:
            state[key] = managed
            _save_state(data_dir, state)
        out.append({"name": spec.name, "status": st})
    return out


def _bookielogs(path: str | Path, data_dir: Path, validate: bool
                ) -> Iterator[tuple[BookieLogSpec, str, SecretState, bytes | None]]:
    """Each BookieLog of the manifest: its spec, its key in DIR/logs.json (namespace/name), and
    its password as the stored Secret gives it. `validate`: refuse a spec the CRD would refuse."""
    for doc in documents(path):
        if doc.get("kind") != KIND:
            continue
        try:
            spec = BookieLogSpec.from_manifest(doc, validate=validate)
        except SpecError as e:
            raise LocalClusterError(f"{path}: {e}") from None
        yield (spec, f"{spec.namespace}/{spec.name}", *password_of(spec, data_dir))


def _load_state(data_dir: Path) -> dict[str, int]:
    """DIR/logs.json: the log id each BookieLog (namespace/name) created or adopted."""
    try:
        return json.loads((data_dir / LOGS_JSON).read_text())
    except (OSError, ValueError):
        return {}


def _save_state(data_dir: Path, state: dict[str, int]) -> None:
    (data_dir / LOGS_JSON).write_text(json.dumps(state, indent=2, sort_keys=True))


async def delete_one(spec: BookieLogSpec, password: bytes | None, secret: SecretState, data_dir: Path,
                     managed: int | None) -> tuple[bool, str]:
    """Delete one BookieLog as the operator does (`plan_delete`): (gone, what happened to its log).
    Not gone while the log must wait (its writer has it open)."""
    from pybk.client import BookKeeper
    from pybk.log import Logs

    local = read_client(data_dir)
    cluster = ClusterState.PRESENT if _cluster_name(data_dir) == spec.cluster else ClusterState.ABSENT
    async with await BookKeeper.connect(local.metadata_uri, security=local.security) as bk:
        logs = Logs(bk)
        found = None
        if cluster is ClusterState.PRESENT and managed is not None:
            found = await log_store.observe_log(logs, spec.log, password if secret is SecretState.PRESENT else None)
        observed = Observed(cluster=cluster, secret=secret, log=found, managed_id=managed,
                            now_ms=int(time.time() * 1000))
        actions, wait = plan_delete(spec, observed)
        if wait is not None:
            return False, wait.message
        if actions:
            await log_store.execute(logs, spec, password, actions, managed)
    return True, deletion_note(spec, observed)


def delete_logs(path: str | Path, data_dir: Path) -> list[dict[str, Any]]:
    """Delete every BookieLog of the manifest (`kubectl delete -f`): each log is retained or deleted
    as its deletionPolicy says, and forgotten by DIR/logs.json once gone; returns [{name, deleted,
    message}] (deleted false: it waits, e.g. for its writer, and stays remembered)."""
    state = _load_state(data_dir)
    out = []
    for spec, key, secret, password in _bookielogs(path, data_dir, validate=False):
        try:
            gone, message = asyncio.run(delete_one(spec, password, secret, data_dir, state.get(key)))
        except BKError as e:
            raise LocalClusterError(f"BookieLog {spec.name}: {e}") from None
        if gone and state.pop(key, None) is not None:
            _save_state(data_dir, state)
        out.append({"name": spec.name, "deleted": gone, "message": message})
    return out


def print_deleted(results: list[dict[str, Any]], output: str) -> int:
    """Say what happened to each log; 0 if every resource is gone."""
    if output == "json":
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"BookieLog {r['name']}: {'deleted' if r['deleted'] else 'NOT DELETED'} - {r['message']}")
    return 0 if all(r["deleted"] for r in results) else 1


def print_results(results: list[dict[str, Any]], output: str) -> int:
    """Print each log's status; 0 if every one is Ready."""
    ok = True
    for r in results:
        st = r["status"]
        c = next(c for c in st["conditions"] if c["type"] == "Ready")
        ok = ok and c["status"] == "True"
        if output == "text":
            print(f"BookieLog {r['name']}: {'ready' if c['status'] == 'True' else 'NOT READY'} ({c['reason']}) - "
                  f"{c['message']}")
            if "endOffset" in st:
                print(f"  log {st['logName']} id {st['logId']}: offsets {st['startOffset']}..{st['endOffset']}, "
                      f"{st['segments']} segments, {st['bytes']} bytes, epoch {st['epoch']}, "
                      f"writer {st['writer'] or '-'}")
    if output == "json":
        print(json.dumps(results, indent=2))
    return 0 if ok else 1
