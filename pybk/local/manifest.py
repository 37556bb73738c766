"""A BookieCluster manifest as the local platform reads it: the spec, its etcd key prefix and
the `pybk bookie` flags its config becomes."""
from __future__ import annotations

from pathlib import Path

from pybk.cluster.spec import BookieClusterSpec, SpecError, load_manifest

from .errors import LocalClusterError

DEFAULT_PREFIX = "pybk"


def load_spec(path: str | Path) -> BookieClusterSpec:
    """Read and validate a BookieCluster manifest file; LocalClusterError says what is wrong.
    Fields that name Kubernetes Secrets (spec.tls, spec.auth, spec.metadataServiceSecret) are
    refused: a local cluster cannot mount them, and ignoring them would run it open unawares."""
    try:
        spec = load_manifest(path)
    except SpecError as e:
        raise LocalClusterError(f"{path}: {e}") from None
    secret_fields = [name for name, value in (("spec.tls", spec.tls), ("spec.auth", spec.auth),
                                              ("spec.metadataServiceSecret", spec.metadata_service_secret))
                     if value is not None]
    if secret_fields:
        raise LocalClusterError(f"{path}: {', '.join(secret_fields)} name Kubernetes Secrets, which a local "
                                "cluster cannot mount; remove them and run `pybk local up --secure` for a "
                                "local cluster with TLS and authentication")
    return spec


def metadata_prefix(spec: BookieClusterSpec) -> str:
    """The etcd key prefix: the path of spec.metadataServiceUri if given (its hosts are ignored:
    the local platform runs its own etcd), else "pybk"."""
    uri = spec.metadata_service_uri
    if uri and "/" in uri[len("etcd://"):]:
        prefix = uri[len("etcd://"):].split("/", 1)[1].strip("/")
        if prefix:
            return prefix
    return DEFAULT_PREFIX


def _kebab(key: str) -> str:
    return "".join("-" + c.lower() if c.isupper() else c for c in key).replace("_", "-").lstrip("-")


def bookie_options(config: dict[str, str]) -> dict[str, str]:
    """spec.config as `pybk bookie` options: `journal-group-wait-ms: "2"` becomes
    `--journal-group-wait-ms 2` (camelCase and snake_case keys become kebab-case too)."""
    return {_kebab(k): v for k, v in sorted(config.items())}


def config_flags(config: dict[str, str]) -> list[str]:
    """spec.config as the bookie command-line flags it turns into."""
    flags: list[str] = []
    for key, value in bookie_options(config).items():
        flags += [f"--{key}", value]
    return flags
