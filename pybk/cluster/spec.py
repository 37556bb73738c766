"""The desired state of a bookie cluster: a `BookieCluster` manifest parsed and validated.

One manifest format serves both platforms: the Kubernetes operator receives it as a custom
resource, the local runner (`pybk local up -f cluster.yaml`) reads it from a YAML file.
Fields are described in docs/kubernetes.md; defaults match the CRD in `crds/bookiecluster.yaml`.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pybk.meta.cluster import LedgerDefaults

API_VERSION = "pybk.io/v1alpha1"
KIND = "BookieCluster"
GROUP = "pybk.io"
VERSION = "v1alpha1"
PLURAL = "bookieclusters"

DEFAULT_IMAGE = "pybk:0.1.0"
PVC_POLICIES = ("Retain", "Delete")
WHEN_UNSATISFIABLE = ("ScheduleAnyway", "DoNotSchedule")

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CONFIG_KEY = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]*$")
# a Kubernetes object name (DNS subdomain) and a host name clients expect in certificates
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CERT_MANAGER_GROUP = "cert-manager.io"
# Bookie options each platform sets itself; spec.config may not override them.
RESERVED_OPTIONS = frozenset({"metadata-uri", "bookie-id", "host", "port", "http-port", "journal-dir",
                              "ledger-dir", "zone", "config",
                              # spec.tls and spec.auth mount their Secrets and set these
                              "tls-cert", "tls-key", "tls-ca", "tls-server-name", "tls-client-auth",
                              "auth-file", "token-file"})
# StatefulSet pods get the label controller-revision-hash=<name>-<hash>, which must fit 63 chars.
MAX_NAME_LENGTH = 52


def option_name(key: str) -> str:
    """A spec.config key as the bookie's option name: `journalGroupWait`, `journal_group_wait` and
    `journal-group-wait` all mean `journal-group-wait` (flag `--journal-group-wait`,
    environment variable `PYBK_JOURNAL_GROUP_WAIT`)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", key).replace("_", "-").lower()


class SpecError(ValueError):
    """A manifest that cannot be used; `errors` lists every problem, each naming its field."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("invalid BookieCluster: " + "; ".join(self.errors))



def manifest_parts(doc: Any, api_version: str, kind: str, errors: list[str]) -> tuple[dict, dict]:
    """(metadata, spec) of a manifest that should be a `kind` of `api_version`, each a dict ({}
    when absent); what is wrong is added to `errors`. SpecError when `doc` is no mapping at all
    (a mapping such as kopf's Body view is taken as one)."""
    if not isinstance(doc, Mapping):
        raise SpecError([f"manifest must be a mapping, got {type(doc).__name__}"])
    doc = dict(doc)
    if doc.get("apiVersion") != api_version:
        errors.append(f"apiVersion must be {api_version!r}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != kind:
        errors.append(f"kind must be {kind!r}, got {doc.get('kind')!r}")
    parts = []
    for name in ("metadata", "spec"):
        value = doc.get(name) or {}
        if not isinstance(value, Mapping):
            errors.append(f"{name} must be a mapping, got {value!r}")
            value = {}
        parts.append(dict(value))
    return parts[0], parts[1]


@dataclass(frozen=True)
class VolumeSpec:
    """One persistent volume per bookie: size (a Kubernetes quantity) and storage class."""
    size: str = "10Gi"
    storage_class: str | None = None


@dataclass(frozen=True)
class StorageSpec:
    journal: VolumeSpec = field(default_factory=lambda: VolumeSpec(size="5Gi"))
    ledgers: VolumeSpec = field(default_factory=lambda: VolumeSpec(size="20Gi"))


@dataclass(frozen=True)
class AutorecoverySpec:
    replicas: int = 1


@dataclass(frozen=True)
class ZoneSpreadingSpec:
    """Spread bookies over zones (topologySpreadConstraints) and tell each bookie its zone."""
    enabled: bool = True
    topology_key: str = "topology.kubernetes.io/zone"
    max_skew: int = 1
    when_unsatisfiable: str = "ScheduleAnyway"


class IssuerKind(enum.Enum):
    """The two kinds of cert-manager issuer a Certificate can reference."""
    ISSUER = "Issuer"
    CLUSTER_ISSUER = "ClusterIssuer"


@dataclass(frozen=True)
class IssuerRef:
    """The cert-manager issuer the operator asks for the cluster's certificate."""
    name: str
    kind: IssuerKind = IssuerKind.ISSUER
    group: str = CERT_MANAGER_GROUP


@dataclass(frozen=True)
class TlsSpec:
    """TLS for every port of bookies and autorecovery: an existing kubernetes.io/tls Secret
    (`tls.crt`, `tls.key`, `ca.crt`), or a cert-manager issuer the operator requests one from.
    `server_name` is what clients expect in the servers' certificates (tls_server_name);
    `client_auth` makes the bookies' gRPC port require client certificates (mTLS)."""
    secret_name: str | None = None
    issuer_ref: IssuerRef | None = None
    server_name: str | None = None
    client_auth: bool = False


@dataclass(frozen=True)
class AuthSpec:
    """Client authentication: a Secret holding `auth.yaml` (who may call as which role) and
    `admin.token` (the token autorecovery and the operator present)."""
    secret_name: str = ""


@dataclass(frozen=True)
class BookieClusterSpec:
    """A parsed BookieCluster. `name`/`namespace`/`generation` come from metadata."""
    name: str
    namespace: str = "default"
    generation: int = 1
    replicas: int = 3
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    metadata_service_uri: str | None = None
    storage: StorageSpec = field(default_factory=StorageSpec)
    resources: dict[str, Any] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    autorecovery: AutorecoverySpec = field(default_factory=AutorecoverySpec)
    zone_spreading: ZoneSpreadingSpec = field(default_factory=ZoneSpreadingSpec)
    pvc_policy: str = "Retain"
    ledger_defaults: LedgerDefaults = field(default_factory=LedgerDefaults)
    tls: TlsSpec | None = None
    auth: AuthSpec | None = None
    metadata_service_secret: str | None = None

    @classmethod
    def from_manifest(cls, doc: dict[str, Any], *, validate: bool = True) -> "BookieClusterSpec":
        """Parse a BookieCluster manifest dict; raises SpecError naming every bad field."""
        errors: list[str] = []
        meta, spec = manifest_parts(doc, API_VERSION, KIND, errors)
        r = _Reader(errors)
        _unknown(errors, "spec", spec, {"replicas", "image", "imagePullPolicy", "metadataServiceUri",
                                        "storage", "resources", "config", "autorecovery",
                                        "zoneSpreading", "pvcPolicy", "ledgerDefaults", "tls", "auth",
                                        "metadataServiceSecret"})
        storage = r.mapping(spec, "storage", "spec")
        _unknown(errors, "spec.storage", storage, {"journal", "ledgers"})
        auto = r.mapping(spec, "autorecovery", "spec")
        _unknown(errors, "spec.autorecovery", auto, {"replicas"})
        zs = r.mapping(spec, "zoneSpreading", "spec")
        _unknown(errors, "spec.zoneSpreading", zs, {"enabled", "topologyKey", "maxSkew",
                                                     "whenUnsatisfiable"})
        ld = r.mapping(spec, "ledgerDefaults", "spec")
        _unknown(errors, "spec.ledgerDefaults", ld, {"ensemble", "writeQuorum", "ackQuorum"})
        d_zs, d_ld, d_st = ZoneSpreadingSpec(), LedgerDefaults(), StorageSpec()
        result = cls(
            name=r.string(meta, "name", "metadata", None) or "",
            namespace=r.string(meta, "namespace", "metadata", "default") or "default",
            generation=r.integer(meta, "generation", "metadata", 1),
            replicas=r.integer(spec, "replicas", "spec", 3),
            image=r.string(spec, "image", "spec", DEFAULT_IMAGE) or DEFAULT_IMAGE,
            image_pull_policy=r.string(spec, "imagePullPolicy", "spec", "IfNotPresent"),
            metadata_service_uri=r.string(spec, "metadataServiceUri", "spec", None) or None,
            storage=StorageSpec(journal=r.volume(storage, "journal", d_st.journal),
                                ledgers=r.volume(storage, "ledgers", d_st.ledgers)),
            resources=r.mapping(spec, "resources", "spec"),
            config=r.config(spec),
            autorecovery=AutorecoverySpec(replicas=r.integer(auto, "replicas", "spec.autorecovery", 1)),
            zone_spreading=ZoneSpreadingSpec(
                enabled=r.boolean(zs, "enabled", "spec.zoneSpreading", d_zs.enabled),
                topology_key=r.string(zs, "topologyKey", "spec.zoneSpreading", d_zs.topology_key),
                max_skew=r.integer(zs, "maxSkew", "spec.zoneSpreading", d_zs.max_skew),
                when_unsatisfiable=r.string(zs, "whenUnsatisfiable", "spec.zoneSpreading",
                                            d_zs.when_unsatisfiable)),
            pvc_policy=r.string(spec, "pvcPolicy", "spec", "Retain"),
            ledger_defaults=LedgerDefaults(
                ensemble=r.integer(ld, "ensemble", "spec.ledgerDefaults", d_ld.ensemble),
                write_quorum=r.integer(ld, "writeQuorum", "spec.ledgerDefaults", d_ld.write_quorum),
                ack_quorum=r.integer(ld, "ackQuorum", "spec.ledgerDefaults", d_ld.ack_quorum)),
            tls=r.tls(spec),
            auth=r.auth(spec),
            metadata_service_secret=r.string(spec, "metadataServiceSecret", "spec", None) or None,
        )
        if errors:
            raise SpecError(errors)
        if validate:
            result.validate()
        return result

    def problems(self) -> list[str]:
        """Every reason this spec cannot be realised (empty when it is fine)."""
        errs: list[str] = []
        if not self.name:
            errs.append("metadata.name is required")
        elif not _DNS_LABEL.match(self.name) or len(self.name) > MAX_NAME_LENGTH:
            errs.append(f"metadata.name {self.name!r} must be a DNS label (lower-case letters, digits, "
                        f"'-') of at most {MAX_NAME_LENGTH} characters")
        if self.replicas < 1:
            errs.append(f"spec.replicas must be >= 1, got {self.replicas}")
        ld = self.ledger_defaults
        if ld.ack_quorum < 1:
            errs.append(f"spec.ledgerDefaults.ackQuorum must be >= 1, got {ld.ack_quorum}")
        if ld.ack_quorum > ld.write_quorum:
            errs.append(f"spec.ledgerDefaults.ackQuorum ({ld.ack_quorum}) must be <= "
                        f"writeQuorum ({ld.write_quorum})")
        if ld.write_quorum > ld.ensemble:
            errs.append(f"spec.ledgerDefaults.writeQuorum ({ld.write_quorum}) must be <= "
                        f"ensemble ({ld.ensemble})")
        if ld.ensemble > self.replicas:
            errs.append(f"spec.replicas ({self.replicas}) must be >= spec.ledgerDefaults.ensemble "
                        f"({ld.ensemble}): a ledger needs that many bookies")
        if self.pvc_policy not in PVC_POLICIES:
            errs.append(f"spec.pvcPolicy must be one of {', '.join(PVC_POLICIES)}, got {self.pvc_policy!r}")
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            errs.append(f"spec.imagePullPolicy must be Always, IfNotPresent or Never, "
                        f"got {self.image_pull_policy!r}")
        if self.autorecovery.replicas < 0:
            errs.append(f"spec.autorecovery.replicas must be >= 0, got {self.autorecovery.replicas}")
        zs = self.zone_spreading
        if zs.max_skew < 1:
            errs.append(f"spec.zoneSpreading.maxSkew must be >= 1, got {zs.max_skew}")
        if zs.when_unsatisfiable not in WHEN_UNSATISFIABLE:
            errs.append(f"spec.zoneSpreading.whenUnsatisfiable must be one of "
                        f"{', '.join(WHEN_UNSATISFIABLE)}, got {zs.when_unsatisfiable!r}")
        for vol_name in ("journal", "ledgers"):
            vol: VolumeSpec = getattr(self.storage, vol_name)
            if not _QUANTITY.match(vol.size):
                errs.append(f"spec.storage.{vol_name}.size {vol.size!r} is not a quantity like 10Gi")
        for key in self.config:
            if not _CONFIG_KEY.match(key):
                errs.append(f"spec.config key {key!r} is not a bookie option name "
                            "(letters, digits, '-' or '_', starting with a letter)")
            elif option_name(key) in RESERVED_OPTIONS:
                errs.append(f"spec.config.{key} is set by the platform (it derives it from the pod or "
                            "the spec) and cannot be overridden")
        if self.metadata_service_uri:
            errs += _uri_problems(self.metadata_service_uri)
        errs += self._security_problems()
        return errs

    def _security_problems(self) -> list[str]:
        """spec.tls, spec.auth and spec.metadataServiceSecret: names Kubernetes accepts, one
        certificate source, and no tokens over plaintext."""
        errs: list[str] = []
        tls = self.tls
        if tls is not None:
            if (tls.secret_name is None) == (tls.issuer_ref is None):
                errs.append("spec.tls needs exactly one of secretName (an existing kubernetes.io/tls Secret) "
                            "and issuerRef (cert-manager issues one), got "
                            + ("both" if tls.secret_name else "neither"))
            if tls.secret_name is not None:
                errs += _object_name_problems("spec.tls.secretName", tls.secret_name)
            if tls.issuer_ref is not None:
                errs += _object_name_problems("spec.tls.issuerRef.name", tls.issuer_ref.name)
                if not tls.issuer_ref.group:
                    errs.append("spec.tls.issuerRef.group must not be empty (cert-manager's is cert-manager.io)")
            if tls.server_name is not None and (not _DNS_SUBDOMAIN.match(tls.server_name)
                                                or len(tls.server_name) > 253):
                errs.append(f"spec.tls.serverName {tls.server_name!r} must be a DNS name (lower-case letters, "
                            "digits, '-' and '.')")
        if self.auth is not None:
            errs += _object_name_problems("spec.auth.secretName", self.auth.secret_name)
            if tls is None:
                errs.append("spec.auth needs spec.tls: without TLS the tokens would cross the network in "
                            "plaintext, readable by anyone on it")
        if self.metadata_service_secret is not None:
            errs += _object_name_problems("spec.metadataServiceSecret", self.metadata_service_secret)
        return errs

    def validate(self) -> "BookieClusterSpec":
        """Raise SpecError listing every problem; return self when valid."""
        errs = self.problems()
        if errs:
            raise SpecError(errs)
        return self

    def resources_hash(self) -> str:
        """Hash of everything the platform renders except the bookie count (and metadata.generation)."""
        blob = json.dumps(dataclasses.asdict(dataclasses.replace(self, replicas=0, generation=0)),
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def restart_hash(self) -> str:
        """Hash of everything whose change needs a (rolling) bookie restart: image, config, resources."""
        blob = json.dumps({"image": self.image, "config": self.config, "resources": self.resources,
                           "zone": [self.zone_spreading.enabled, self.zone_spreading.topology_key],
                           **({"tls": dataclasses.asdict(self.tls)} if self.tls else {}),
                           **({"auth": dataclasses.asdict(self.auth)} if self.auth else {}),
                           **({"metadataServiceSecret": self.metadata_service_secret}
                              if self.metadata_service_secret else {})},
                          sort_keys=True, default=lambda v: v.value)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class _Reader:
    """Typed field access that collects errors instead of raising at the first one."""

    def __init__(self, errors: list[str]):
        self.errors = errors

    def _get(self, obj: dict, key: str, path: str, default: Any, types: tuple, what: str) -> Any:
        value = obj.get(key, None)
        if value is None:
            return default
        if isinstance(value, bool) and bool not in types:
            self.errors.append(f"{path}.{key} must be {what}, got {value!r}")
            return default
        if not isinstance(value, types):
            self.errors.append(f"{path}.{key} must be {what}, got {value!r}")
            return default
        return value

    def integer(self, obj: dict, key: str, path: str, default: int) -> int:
        return self._get(obj, key, path, default, (int,), "an integer")

    def string(self, obj: dict, key: str, path: str, default: str | None) -> Any:
        return self._get(obj, key, path, default, (str,), "a string")

    def boolean(self, obj: dict, key: str, path: str, default: bool) -> bool:
        return self._get(obj, key, path, default, (bool,), "true or false")

    def mapping(self, obj: dict, key: str, path: str) -> dict:
        return dict(self._get(obj, key, path, {}, (dict,), "a mapping"))

    def volume(self, storage: dict, key: str, default: VolumeSpec) -> VolumeSpec:
        vol = self.mapping(storage, key, "spec.storage")
        _unknown(self.errors, f"spec.storage.{key}", vol, {"size", "storageClass"})
        size = vol.get("size", default.size)
        if isinstance(size, int) and not isinstance(size, bool):
            size = str(size)
        if not isinstance(size, str):
            self.errors.append(f"spec.storage.{key}.size must be a quantity like 10Gi, got {size!r}")
            size = default.size
        return VolumeSpec(size=size,
                          storage_class=self.string(vol, "storageClass", f"spec.storage.{key}", None))

    def config(self, spec: dict) -> dict[str, str]:
        """Config overrides: bookie option -> value; scalars become strings as a flag would."""
        raw = self.mapping(spec, "config", "spec")
        out: dict[str, str] = {}
        for key, value in raw.items():
            if isinstance(value, bool):
                out[str(key)] = "true" if value else "false"
            elif isinstance(value, (str, int, float)):
                out[str(key)] = str(value)
            else:
                self.errors.append(f"spec.config.{key} must be a string, number or boolean, got {value!r}")
        return out

    def tls(self, spec: dict) -> TlsSpec | None:
        """spec.tls, or None when absent (plaintext)."""
        if spec.get("tls") is None:
            return None
        raw = self.mapping(spec, "tls", "spec")
        _unknown(self.errors, "spec.tls", raw, {"secretName", "issuerRef", "serverName", "clientAuth"})
        issuer = None
        if raw.get("issuerRef") is not None:
            ref = self.mapping(raw, "issuerRef", "spec.tls")
            _unknown(self.errors, "spec.tls.issuerRef", ref, {"name", "kind", "group"})
            kind_text = self.string(ref, "kind", "spec.tls.issuerRef", IssuerKind.ISSUER.value)
            try:
                kind = IssuerKind(kind_text)
            except ValueError:
                self.errors.append(f"spec.tls.issuerRef.kind must be one of "
                                   f"{', '.join(k.value for k in IssuerKind)}, got {kind_text!r}")
                kind = IssuerKind.ISSUER
            name = self.string(ref, "name", "spec.tls.issuerRef", "") or ""
            if not name:
                self.errors.append("spec.tls.issuerRef.name is required: the cert-manager Issuer or "
                                   "ClusterIssuer that signs the cluster's certificate")
            issuer = IssuerRef(name=name, kind=kind,
                               group=self.string(ref, "group", "spec.tls.issuerRef", CERT_MANAGER_GROUP))
        return TlsSpec(secret_name=self.string(raw, "secretName", "spec.tls", None),
                       issuer_ref=issuer, server_name=self.string(raw, "serverName", "spec.tls", None),
                       client_auth=self.boolean(raw, "clientAuth", "spec.tls", False))

    def auth(self, spec: dict) -> AuthSpec | None:
        """spec.auth, or None when absent (no authentication)."""
        if spec.get("auth") is None:
            return None
        raw = self.mapping(spec, "auth", "spec")
        _unknown(self.errors, "spec.auth", raw, {"secretName"})
        name = self.string(raw, "secretName", "spec.auth", None)
        if not name:
            self.errors.append("spec.auth.secretName is required: the Secret holding auth.yaml and admin.token")
        return AuthSpec(secret_name=name or "")


def _object_name_problems(path: str, name: str) -> list[str]:
    """Whether `name` can name a Kubernetes object (a DNS subdomain of at most 253 characters)."""
    if _DNS_SUBDOMAIN.match(name) and len(name) <= 253:
        return []
    return [f"{path} {name!r} must be a Kubernetes object name (lower-case letters, digits, '-' and '.', "
            "at most 253 characters)"]


def _uri_problems(uri: str) -> list[str]:
    """pybk.meta's own URI check, so a bad URI is refused when applied, not when first used."""
    if not uri.startswith("etcd://"):
        return [f"spec.metadataServiceUri must look like etcd://host:port[,host:port]/prefix, got {uri!r}"]
    try:
        from pybk.meta import BadMetadataUriError, parse_uri
    except ImportError:
        return []
    try:
        parse_uri(uri)
    except BadMetadataUriError as e:
        return [f"spec.metadataServiceUri: {e}"]
    return []


def _unknown(errors: list[str], path: str, obj: dict, known: set[str]) -> None:
    for key in obj:
        if key not in known:
            errors.append(f"{path}.{key} is not a known field (known: {', '.join(sorted(known))})")


def load_manifest(path: str | Path, *, validate: bool = True) -> BookieClusterSpec:
    """Read the BookieCluster from a YAML file (the first document of kind BookieCluster)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError([f"cannot read {p}: {e.strerror or e}"]) from e
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise SpecError([f"{p} is not valid YAML: {e}"]) from e
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == KIND:
            return BookieClusterSpec.from_manifest(doc, validate=validate)
    if len(docs) == 1:
        return BookieClusterSpec.from_manifest(docs[0], validate=validate)
    raise SpecError([f"{p} holds no document of kind {KIND}"])
