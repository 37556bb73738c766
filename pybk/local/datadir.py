"""The files a local cluster keeps under its data dir, and how they are read and written.

    DIR/cluster.yaml          the desired manifest (what `up -f` / `apply -f` were given)
    DIR/ports.json            ports chosen once per process, reused on every start (`slots`)
    DIR/local.json            written once the cluster is ready (processes, pids, endpoints)
    DIR/local.pid             the supervising `pybk local up` process
    DIR/apply.json            progress and outcome of the last `pybk local apply`
    DIR/etcd/, DIR/etcd.log, DIR/bookie-N/{journal,ledgers}, DIR/bookie-N.log, DIR/autorecovery-N.log
    DIR/security/             with `up --secure`: CA, certificates, tokens, auth file, etcd users (`secure`)
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import LocalClusterError

LOCAL_JSON = "local.json"
PID_FILE = "local.pid"
PORTS_JSON = "ports.json"
MANIFEST = "cluster.yaml"
APPLY_JSON = "apply.json"


def read_local_json(data_dir: str | Path) -> dict[str, Any]:
    """The local.json of a running (or crashed) local cluster; LocalClusterError if there is none."""
    path = Path(data_dir) / LOCAL_JSON
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LocalClusterError(f"no local cluster is running in {data_dir} ({path} does not exist); "
                                f"start one with `pybk local up -f cluster.yaml --data-dir {data_dir}`") from None
    except (OSError, ValueError) as e:
        raise LocalClusterError(f"cannot read {path}: {e}") from None


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Replace a JSON file atomically: a reader sees the old document or the new one, never half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def manifest_generation(data_dir: Path) -> int:
    """Identifies one version of DIR/cluster.yaml (its mtime in ns), echoed in DIR/apply.json."""
    try:
        return (Path(data_dir) / MANIFEST).stat().st_mtime_ns
    except OSError:
        return 0
