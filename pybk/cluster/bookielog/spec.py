"""The desired state of a named log: a `BookieLog` manifest parsed and validated.

One manifest serves both platforms: the operator receives it as a custom resource, `pybk local
apply -f` reads it from a file. Fields are described in docs/kubernetes.md; defaults match
`crds/bookielog.yaml`. Sizes are Kubernetes quantities (`256Mi`) or byte counts, durations are
Go-style (`4h`, `30m`, `1d12h`).
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from pybk.cluster.spec import API_VERSION, GROUP, VERSION, SpecError
from pybk.entry import DigestType
from pybk.log.errors import InvalidLogConfigError
from pybk.log.options import LogConfig, Retention, RetentionPolicy, Rollover, check_name

KIND = "BookieLog"
PLURAL = "bookielogs"
DEFAULT_SECRET_KEY = "password"

__all__ = ["API_VERSION", "GROUP", "VERSION", "KIND", "PLURAL", "BookieLogSpec", "DeletionPolicy",
           "SecretRef", "SpecError", "parse_bytes", "parse_duration"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
          "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class DeletionPolicy(str, enum.Enum):
    """What deleting the resource does to the log."""
    RETAIN = "Retain"
    DELETE = "Delete"


def parse_bytes(value: int | str, path: str) -> int:
    """A byte count: an integer or a quantity such as 256Mi or 10G; SpecError names the field."""
    if isinstance(value, bool):
        raise SpecError([f"{path} must be a byte count or a quantity like 256Mi, got {value!r}"])
    if isinstance(value, int):
        if value < 0:
            raise SpecError([f"{path} must be >= 0, got {value}"])
        return value
    m = _QUANTITY.match(value) if isinstance(value, str) else None
    if not m:
        raise SpecError([f"{path} must be a byte count or a quantity like 256Mi, got {value!r}"])
    return int(m.group(1)) * _UNITS.get(m.group(2) or "", 1)


def parse_duration(value: str, path: str) -> float:
    """Seconds of a duration such as 4h, 30m, 1d12h or 500ms; SpecError names the field."""
    if not isinstance(value, str) or not _DURATION.match(value):
        raise SpecError([f"{path} must be a duration like 4h, 30m or 1d12h, got {value!r}"])
    return sum(float(n) * _SECONDS[u] for n, u in _DURATION_PART.findall(value))


@dataclass(frozen=True)
class SecretRef:
    """The Secret key holding the log's password (in the resource's namespace)."""
    name: str
    key: str = DEFAULT_SECRET_KEY


@dataclass(frozen=True)
class BookieLogSpec:
    """A parsed BookieLog; `name`/`namespace`/`generation`/`uid` come from metadata."""
    name: str
    cluster: str
    password_secret: SecretRef
    namespace: str = "default"
    generation: int = 1
    uid: str = ""
    log_name: str = ""
    config: LogConfig = field(default_factory=LogConfig)
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    errors: tuple[str, ...] = ()        # problems found while parsing (the spec is unusable if any)

    @property
    def log(self) -> str:
        """The log's name in the cluster: spec.logName, else metadata.name."""
        return self.log_name or self.name

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any], *, validate: bool = True) -> "BookieLogSpec":
        """Parse a BookieLog manifest; SpecError naming every bad field (with `validate=False` the
        problems are kept in `errors` instead, so that an operator can report them in status)."""
        errors: list[str] = []
        doc = dict(doc) if isinstance(doc, Mapping) else doc
        if not isinstance(doc, dict):
            raise SpecError([f"manifest must be a mapping, got {type(doc).__name__}"])
        if doc.get("apiVersion") != API_VERSION:
            errors.append(f"apiVersion must be {API_VERSION!r}, got {doc.get('apiVersion')!r}")
        if doc.get("kind") != KIND:
            errors.append(f"kind must be {KIND!r}, got {doc.get('kind')!r}")
        meta = _mapping(doc.get("metadata"), "metadata", errors)
        spec = _mapping(doc.get("spec"), "spec", errors)
        _unknown(errors, "spec", spec, {"cluster", "logName", "passwordSecretRef", "digest", "replication",
                                        "rollover", "retention", "deletionPolicy"})
        name = meta.get("name") if isinstance(meta.get("name"), str) else ""
        cluster = spec.get("cluster")
        if not isinstance(cluster, str) or not _DNS_LABEL.match(cluster):
            errors.append("spec.cluster is required: the name of a BookieCluster in this namespace"
                          + (f" (got {cluster!r})" if cluster is not None else ""))
            cluster = ""
        log_name = spec.get("logName") or ""
        try:
            check_name(log_name or name or "x")
        except InvalidLogConfigError as e:
            errors.append(f"spec.logName: {e}" if log_name else f"metadata.name: {e}")
        secret = _secret_ref(spec.get("passwordSecretRef"), errors)
        config = _config(spec, errors)
        policy_text = spec.get("deletionPolicy", DeletionPolicy.RETAIN.value)
        try:
            policy = DeletionPolicy(policy_text)
        except ValueError:
            errors.append(f"spec.deletionPolicy must be Retain or Delete, got {policy_text!r}")
            policy = DeletionPolicy.RETAIN
        if not name:
            errors.append("metadata.name is required")
        generation = meta.get("generation")
        result = cls(name=name, cluster=cluster, password_secret=secret,
                     namespace=meta.get("namespace") or "default",
                     generation=generation if isinstance(generation, int) else 1,
                     uid=str(meta.get("uid") or ""), log_name=log_name, config=config,
                     deletion_policy=policy, errors=tuple(errors))
        if validate and errors:
            raise SpecError(errors)
        return result


def _mapping(value: Any, path: str, errors: list[str]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.append(f"{path} must be a mapping, got {value!r}")
        return {}
    return dict(value)


def _unknown(errors: list[str], path: str, obj: dict, known: set[str]) -> None:
    for key in obj:
        if key not in known:
            errors.append(f"{path}.{key} is not a known field (known: {', '.join(sorted(known))})")


def _secret_ref(raw: Any, errors: list[str]) -> SecretRef:
    ref = _mapping(raw, "spec.passwordSecretRef", errors)
    _unknown(errors, "spec.passwordSecretRef", ref, {"name", "key"})
    name, key = ref.get("name"), ref.get("key") or DEFAULT_SECRET_KEY
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        errors.append("spec.passwordSecretRef.name is required: the Secret (in this namespace) holding the "
                      "log's password" + (f" (got {name!r})" if name is not None else ""))
        name = ""
    if not isinstance(key, str) or not _SECRET_KEY.match(key):
        errors.append(f"spec.passwordSecretRef.key must be a Secret key (letters, digits, '-', '_', '.'), "
                      f"got {key!r}")
        key = DEFAULT_SECRET_KEY
    return SecretRef(name, key)


def _int(obj: dict, key: str, path: str, default: int, errors: list[str]) -> int:
    v = obj.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        errors.append(f"{path}.{key} must be an integer, got {v!r}")
        return default
    return v


def _optional(errors: list[str], parse, value: Any, path: str, default: Any, zero_means_none: bool) -> Any:
    """`default` when absent; None when 0 and `zero_means_none`; else the parsed value."""
    if value is None:
        return default
    try:
        parsed = parse(value, path)
    except SpecError as e:
        errors.extend(e.errors)
        return default
    return None if (zero_means_none and parsed == 0) else parsed


def _config(spec: dict, errors: list[str]) -> LogConfig:
    """spec.digest, replication, rollover and retention as the log library's LogConfig."""
    d = LogConfig()
    digest_text = spec.get("digest", d.digest.value)
    try:
        digest = DigestType(digest_text)
    except ValueError:
        errors.append(f"spec.digest must be CRC32C or MAC, got {digest_text!r}")
        digest = d.digest
    rep = _mapping(spec.get("replication"), "spec.replication", errors)
    _unknown(errors, "spec.replication", rep, {"ensemble", "writeQuorum", "ackQuorum"})
    e = _int(rep, "ensemble", "spec.replication", d.ensemble, errors)
    qw = _int(rep, "writeQuorum", "spec.replication", d.write_quorum, errors)
    qa = _int(rep, "ackQuorum", "spec.replication", d.ack_quorum, errors)
    if qa < 1:
        errors.append(f"spec.replication.ackQuorum must be >= 1, got {qa}")
    if qa > qw:
        errors.append(f"spec.replication.ackQuorum ({qa}) must be <= writeQuorum ({qw})")
    if qw > e:
        errors.append(f"spec.replication.writeQuorum ({qw}) must be <= ensemble ({e})")

    ro = _mapping(spec.get("rollover"), "spec.rollover", errors)
    _unknown(errors, "spec.rollover", ro, {"maxBytes", "maxRecords", "maxAge", "maxIdle"})
    dr = d.rollover
    max_records = ro.get("maxRecords")
    if max_records is not None and (isinstance(max_records, bool) or not isinstance(max_records, int)
                                    or max_records < 0):
        errors.append(f"spec.rollover.maxRecords must be an integer >= 0, got {max_records!r}")
        max_records = None
    rollover = Rollover(
        max_bytes=_optional(errors, parse_bytes, ro.get("maxBytes"), "spec.rollover.maxBytes", dr.max_bytes, True),
        max_records=(max_records or None) if max_records is not None else dr.max_records,
        max_age=_optional(errors, parse_duration, ro.get("maxAge"), "spec.rollover.maxAge", dr.max_age, True),
        max_idle=_optional(errors, parse_duration, ro.get("maxIdle"), "spec.rollover.maxIdle", dr.max_idle, True))

    rt = _mapping(spec.get("retention"), "spec.retention", errors)
    _unknown(errors, "spec.retention", rt, {"policy", "maxAge", "maxBytes", "maxBacklogBytes"})
    policy_text = rt.get("policy", RetentionPolicy.NONE.value)
    try:
        policy = RetentionPolicy(policy_text)
    except ValueError:
        errors.append(f"spec.retention.policy must be none, limits or interest, got {policy_text!r}")
        policy = RetentionPolicy.NONE
    retention = Retention(
        policy=policy,
        max_age=_optional(errors, parse_duration, rt.get("maxAge"), "spec.retention.maxAge", None, False),
        max_bytes=_optional(errors, parse_bytes, rt.get("maxBytes"), "spec.retention.maxBytes", None, False),
        max_backlog_bytes=_optional(errors, parse_bytes, rt.get("maxBacklogBytes"),
                                    "spec.retention.maxBacklogBytes", None, False))
    if policy is RetentionPolicy.LIMITS and retention.max_age is None and retention.max_bytes is None:
        errors.append("spec.retention: policy limits needs maxAge or maxBytes")
    if policy is not RetentionPolicy.LIMITS and (retention.max_age is not None or retention.max_bytes is not None):
        errors.append("spec.retention: maxAge and maxBytes apply only to policy limits")
    if policy is not RetentionPolicy.INTEREST and retention.max_backlog_bytes is not None:
        errors.append("spec.retention: maxBacklogBytes applies only to policy interest")
    config = LogConfig(ensemble=e, write_quorum=qw, ack_quorum=qa, digest=digest, rollover=rollover,
                       retention=retention)
    if not errors:
        try:
            config.validate()
        except InvalidLogConfigError as exc:
            errors.append(f"spec: {exc}")
    return config
