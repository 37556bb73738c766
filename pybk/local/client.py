"""What a client needs to reach a local cluster, read from its local.json: the metadata URI (with
its etcd options when the cluster runs `--secure`) and the credentials (`security`: file names of
the CA, the client certificate and key, the bearer token).

The shell, the demo, Spark jobs and the benchmarks use this, so a secured local cluster needs no
extra flags. The credential variables set in the environment (`PYBK_TLS_CA`, `PYBK_TOKEN_FILE`,
...) override local.json's values one by one (e.g. `PYBK_TOKEN_FILE=DIR/security/tokens/reader.token`
to act as a reader).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from pybk.security.settings import ClientSecurity

from .datadir import read_local_json

DEFAULT_DATA_DIR = ".pybk-local"


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The data dir of the default local cluster: $PYBK_LOCAL_DIR, else ./.pybk-local."""
    env = os.environ if environ is None else environ
    return Path(env.get("PYBK_LOCAL_DIR") or DEFAULT_DATA_DIR)


@dataclass(frozen=True)
class LocalClient:
    """How to reach one local cluster as a client."""

    metadata_uri: str
    security: ClientSecurity

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> "LocalClient":
        """From a local.json document (no `security` block: an insecure cluster)."""
        return cls(str(doc["metadata_service_uri"]), ClientSecurity.from_mapping(doc.get("security") or {}))


def read_client(data_dir: str | Path) -> LocalClient:
    """The client settings of the local cluster in data_dir (LocalClusterError if none runs there)."""
    return LocalClient.of(read_local_json(data_dir))


def overlay(base: ClientSecurity, environ: Mapping[str, str] | None = None) -> ClientSecurity:
    """base with every value that the environment sets (`PYBK_TLS_CA`, `PYBK_TOKEN_FILE`, ...) replaced."""
    env = ClientSecurity.from_env(environ)
    return replace(base, **{f.name: getattr(env, f.name) for f in fields(env) if getattr(env, f.name)})


def cluster_base(uri: str) -> str:
    """The part of a metadata URI that names the cluster (hosts and prefix, without options)."""
    return uri.partition("?")[0].rstrip("/")


def local_client_for(uri: str, environ: Mapping[str, str] | None = None) -> LocalClient | None:
    """The default local cluster's settings when `uri` names that cluster (same hosts and prefix),
    else None: a job given the local cluster's URI gets its credentials without more options."""
    path = default_data_dir(environ) / "local.json"
    if not path.exists():
        return None
    try:
        local = read_client(path.parent)
    except Exception:
        return None
    return local if cluster_base(local.metadata_uri) == cluster_base(uri) else None


def security_for(uri: str, environ: Mapping[str, str] | None = None) -> ClientSecurity:
    """The credentials a client of `uri` presents when none are given: the default local cluster's
    (if `uri` is its URI), each overridden by the environment's credential variables
    (`PYBK_TLS_CA`, `PYBK_TOKEN_FILE`, ...)."""
    local = local_client_for(uri, environ)
    return overlay(local.security if local else ClientSecurity(), environ)
