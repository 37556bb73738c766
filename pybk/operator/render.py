"""Kubernetes manifests of a BookieCluster: pure functions of the spec.

Names: StatefulSet and headless Service `<name>` (pods `<name>-<ordinal>`), bookie id
`<name>-<ordinal>.<name>.<namespace>.svc:3181`, volumes `journal-<name>-<ordinal>` and
`ledgers-<name>-<ordinal>`, ConfigMap `<name>-config` (what clients need: metadata URI and
ledger defaults), autorecovery Deployment `<name>-autorecovery`, PDB `<name>`, ServiceAccount,
Role and RoleBinding `<name>-bookie`; with `spec.tls.issuerRef`, the cert-manager Certificate
`<name>-tls` whose Secret is also `<name>-tls`.

Security (docs/security.md): the TLS Secret is mounted read-only at /etc/pybk/tls, the auth Secret
at /etc/pybk/auth and the metadata service's Secret at /etc/pybk/etcd, into bookies and
autorecovery; the processes get the file names through `PYBK_*` variables, never the contents.

The StatefulSet uses `updateStrategy: OnDelete`: a config change never restarts pods by itself;
the controller restarts them one at a time (RestartBookie), and each pod's
`pybk.io/config-hash` annotation says which config it runs.
"""
from __future__ import annotations

from typing import Any

from pybk.cluster.spec import CERT_MANAGER_GROUP, BookieClusterSpec, option_name
from pybk.security.settings import ENV as CLIENT_ENV

GRPC_PORT = 3181
HTTP_PORT = 8000
RECOVERY_HTTP_PORT = 8001
CONFIG_HASH = "pybk.io/config-hash"
RESOURCES_HASH = "pybk.io/resources-hash"
ZONE_ANNOTATION = "pybk.io/zone"
ZONE_KEY_ANNOTATION = "pybk.io/zone-topology-key"  # which node label holds the zone
CLUSTER_LABEL = "pybk.io/cluster"
RUN_AS = 10001
JOURNAL_DIR = "/pybk/journal"
LEDGERS_DIR = "/pybk/ledgers"
TLS_DIR = "/etc/pybk/tls"
AUTH_DIR = "/etc/pybk/auth"
ETCD_DIR = "/etc/pybk/etcd"
# kubernetes.io/tls Secret keys (cert-manager writes the same three)
TLS_FILES = {"tls_cert": "tls.crt", "tls_key": "tls.key", "tls_ca": "ca.crt"}
AUTH_FILE = "auth.yaml"
ADMIN_TOKEN = "admin.token"
SECRET_MODE = 0o440  # owner and the pod's fsGroup may read; nobody else
CERTIFICATE_DURATION = "2160h"  # 90 days, renewed 30 days before expiry (bookies reload it)
CERTIFICATE_RENEW_BEFORE = "720h"


def labels(spec: BookieClusterSpec, component: str) -> dict[str, str]:
    return {**selector(spec, component), "app.kubernetes.io/managed-by": "pybk-operator",
            "app.kubernetes.io/part-of": "pybk"}


def selector(spec: BookieClusterSpec, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "pybk", "app.kubernetes.io/instance": spec.name,
            "app.kubernetes.io/component": component, CLUSTER_LABEL: spec.name}


def selector_string(spec: BookieClusterSpec) -> str:
    """The bookie pods' label selector as a string (scale subresource's status.selector)."""
    return ",".join(f"{k}={v}" for k, v in selector(spec, "bookie").items())


def pod_name(spec: BookieClusterSpec, ordinal: int) -> str:
    return f"{spec.name}-{ordinal}"


def bookie_id(spec: BookieClusterSpec, ordinal: int) -> str:
    """The id the bookie at `ordinal` registers under (stable DNS name + gRPC port)."""
    return f"{pod_name(spec, ordinal)}.{spec.name}.{spec.namespace}.svc:{GRPC_PORT}"


def ordinal_of(spec: BookieClusterSpec, bookie: str) -> int | None:
    """Inverse of bookie_id (None for a bookie that is not one of this cluster's slots)."""
    host = bookie.split(".", 1)[0]
    prefix = spec.name + "-"
    if not host.startswith(prefix) or not host[len(prefix):].isdigit():
        return None
    o = int(host[len(prefix):])
    return o if bookie_id(spec, o) == bookie else None


def pvc_names(spec: BookieClusterSpec, ordinal: int) -> list[str]:
    return [f"journal-{pod_name(spec, ordinal)}", f"ledgers-{pod_name(spec, ordinal)}"]


def _meta(spec: BookieClusterSpec, name: str, component: str, owner: dict | None,
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "namespace": spec.namespace, "labels": labels(spec, component)}
    if annotations:
        m["annotations"] = annotations
    if owner:
        m["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                 "name": owner["name"], "uid": owner["uid"],
                                 "controller": True, "blockOwnerDeletion": True}]
    return m


def _security() -> tuple[dict, dict]:
    pod = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
           "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                 "capabilities": {"drop": ["ALL"]}}
    return pod, container


def _env_name(key: str) -> str:
    return "PYBK_" + option_name(key).replace("-", "_").upper()


def tls_secret_name(spec: BookieClusterSpec) -> str | None:
    """The Secret holding the cluster's certificate: spec.tls.secretName, or the one cert-manager
    writes for the operator's Certificate; None without TLS."""
    if spec.tls is None:
        return None
    return spec.tls.secret_name or f"{spec.name}-tls"


def server_name(spec: BookieClusterSpec) -> str | None:
    """The name clients expect in the servers' certificates: spec.tls.serverName; for a
    certificate the operator requests, the headless Service's name, which it contains (clients
    reach autorecovery and bookies' admin HTTP by pod IP, which no certificate names)."""
    if spec.tls is None:
        return None
    if spec.tls.server_name:
        return spec.tls.server_name
    return f"{spec.name}.{spec.namespace}.svc" if spec.tls.issuer_ref else None


def certificate_dns_names(spec: BookieClusterSpec) -> list[str]:
    """Every name the cluster's pods are reached by: each bookie (`<pod>.<name>.<ns>.svc`), the
    headless Service, the autorecovery service name, short and cluster.local forms, and
    spec.tls.serverName (the name clients check)."""
    out = [spec.name, f"{spec.name}.{spec.namespace}"]
    for host in (spec.name, f"*.{spec.name}", f"{spec.name}-autorecovery"):
        out += [f"{host}.{spec.namespace}.svc", f"{host}.{spec.namespace}.svc.cluster.local"]
    if spec.tls is not None and spec.tls.server_name and spec.tls.server_name not in out:
        out.append(spec.tls.server_name)  # what the clients will check
    return out


def certificate(spec: BookieClusterSpec, owner: dict | None = None) -> dict[str, Any] | None:
    """The cert-manager Certificate for spec.tls.issuerRef (None otherwise): one key pair for
    every bookie and autorecovery pod, usable as server and as client certificate (mTLS)."""
    if spec.tls is None or spec.tls.issuer_ref is None:
        return None
    ref = spec.tls.issuer_ref
    return {"apiVersion": f"{CERT_MANAGER_GROUP}/v1", "kind": "Certificate",
            "metadata": _meta(spec, f"{spec.name}-tls", "tls", owner),
            "spec": {"secretName": tls_secret_name(spec),
                     "commonName": f"{spec.name}.{spec.namespace}.svc",
                     "dnsNames": certificate_dns_names(spec),
                     "duration": CERTIFICATE_DURATION, "renewBefore": CERTIFICATE_RENEW_BEFORE,
                     "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                     "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
                     "issuerRef": {"name": ref.name, "kind": ref.kind.value, "group": ref.group}}}


def _secret_volumes(spec: BookieClusterSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the TLS, auth and metadata-service Secrets the spec names: whole
    directories, read-only, so that Kubernetes' in-place Secret updates reach the processes."""
    volumes, mounts = [], []
    for name, secret, path in (("tls", tls_secret_name(spec), TLS_DIR),
                               ("auth", spec.auth.secret_name if spec.auth else None, AUTH_DIR),
                               ("etcd", spec.metadata_service_secret, ETCD_DIR)):
        if secret:
            volumes.append({"name": name, "secret": {"secretName": secret, "defaultMode": SECRET_MODE}})
            mounts.append({"name": name, "mountPath": path, "readOnly": True})
    return volumes, mounts


def security_env(spec: BookieClusterSpec) -> list[dict[str, Any]]:
    """File names of the mounted Secrets as the processes' options (server and client side)."""
    env = []
    if spec.tls is not None:
        env += [{"name": CLIENT_ENV[opt], "value": f"{TLS_DIR}/{key}"} for opt, key in TLS_FILES.items()]
        if (name := server_name(spec)) is not None:
            env.append({"name": CLIENT_ENV["tls_server_name"], "value": name})
        if spec.tls.client_auth:
            env.append({"name": _env_name("tls_client_auth"), "value": "true"})
    if spec.auth is not None:
        env += [{"name": _env_name("auth_file"), "value": f"{AUTH_DIR}/{AUTH_FILE}"},
                {"name": CLIENT_ENV["token_file"], "value": f"{AUTH_DIR}/{ADMIN_TOKEN}"}]
    return env


def _probe_scheme(spec: BookieClusterSpec) -> str:
    """Admin HTTP serves HTTPS with the cluster's certificate when TLS is on (kubelet does not
    verify it; the probed paths stay open to anonymous callers)."""
    return "HTTPS" if spec.tls is not None else "HTTP"


def service(spec: BookieClusterSpec, owner: dict | None = None) -> dict[str, Any]:
    """Headless Service giving each bookie a stable DNS name (published before readiness so a
    starting bookie can register under its name)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(spec, spec.name, "bookie", owner),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": selector(spec, "bookie"),
                     "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
                               {"name": "http", "port": HTTP_PORT, "targetPort": "http"}]}}


def config_map(spec: BookieClusterSpec, metadata_uri: str, owner: dict | None = None) -> dict[str, Any]:
    """What clients of this cluster need (mount it into applications and Spark jobs)."""
    ld = spec.ledger_defaults
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(spec, f"{spec.name}-config", "config", owner),
            "data": {"metadataServiceUri": metadata_uri, "ensemble": str(ld.ensemble),
                     "writeQuorum": str(ld.write_quorum), "ackQuorum": str(ld.ack_quorum),
                     "bookieService": f"{spec.name}.{spec.namespace}.svc",
                     **_client_security_data(spec)}}


def _client_security_data(spec: BookieClusterSpec) -> dict[str, str]:
    """What a client must set up to talk to this cluster (names only: the Secrets stay Secrets)."""
    out = {}
    if spec.tls is not None:
        out["tlsSecret"] = tls_secret_name(spec) or ""
        if (name := server_name(spec)) is not None:
            out["tlsServerName"] = name
    if spec.metadata_service_secret:
        out["metadataServiceSecret"] = spec.metadata_service_secret
    return out


def _bookie_env(spec: BookieClusterSpec, metadata_uri: str) -> list[dict[str, Any]]:
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    env = [{"name": "POD_NAME", **field("metadata.name")},
           {"name": "POD_NAMESPACE", **field("metadata.namespace")},
           {"name": "NODE_NAME", **field("spec.nodeName")},
           {"name": "POD_IP", **field("status.podIP")},
           {"name": "PYBK_SERVICE", "value": spec.name},
           {"name": "PYBK_METADATA_URI", "value": metadata_uri},
           {"name": "PYBK_PORT", "value": str(GRPC_PORT)},
           {"name": "PYBK_HTTP_PORT", "value": str(HTTP_PORT)},
           {"name": "PYBK_JOURNAL_DIR", "value": JOURNAL_DIR},
           {"name": "PYBK_LEDGER_DIR", "value": LEDGERS_DIR},
           {"name": "PYBK_ZONE_WAIT", "value": "30" if spec.zone_spreading.enabled else "0"}]
    env += security_env(spec)
    fixed = {e["name"] for e in env}
    env += [{"name": _env_name(k), "value": v} for k, v in sorted(spec.config.items())
            if _env_name(k) not in fixed]
    return env


def _pod_annotations(spec: BookieClusterSpec) -> dict[str, str]:
    out = {CONFIG_HASH: spec.restart_hash()}
    if spec.zone_spreading.enabled:
        out[ZONE_KEY_ANNOTATION] = spec.zone_spreading.topology_key
    return out


def stateful_set(spec: BookieClusterSpec, metadata_uri: str, replicas: int,
                 owner: dict | None = None) -> dict[str, Any]:
    """The bookies: one pod per ordinal, a journal and a ledgers volume each."""
    pod_sec, ctr_sec = _security()
    http = {"port": "http", "scheme": _probe_scheme(spec)}
    secret_volumes, secret_mounts = _secret_volumes(spec)
    container: dict[str, Any] = {
        "name": "bookie", "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
        "command": ["/usr/local/bin/bookie-entrypoint"],
        "env": _bookie_env(spec, metadata_uri),
        "ports": [{"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
                  {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/api/v1/bookie/is_ready", **http},
                           "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 3},
        "livenessProbe": {"httpGet": {"path": "/heartbeat", **http},
                          "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 5},
        "startupProbe": {"httpGet": {"path": "/heartbeat", **http},
                         "periodSeconds": 5, "failureThreshold": 120, "timeoutSeconds": 5},
        "volumeMounts": [{"name": "journal", "mountPath": JOURNAL_DIR},
                         {"name": "ledgers", "mountPath": LEDGERS_DIR},
                         {"name": "tmp", "mountPath": "/tmp"}, *secret_mounts],
        "securityContext": ctr_sec,
    }
    if spec.resources:
        container["resources"] = spec.resources
    pod_spec: dict[str, Any] = {
        "serviceAccountName": f"{spec.name}-bookie",
        "securityContext": pod_sec,
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *secret_volumes],
    }
    zs = spec.zone_spreading
    if zs.enabled:
        pod_spec["topologySpreadConstraints"] = [
            {"maxSkew": zs.max_skew, "topologyKey": zs.topology_key,
             "whenUnsatisfiable": zs.when_unsatisfiable,
             "labelSelector": {"matchLabels": selector(spec, "bookie")}},
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
             "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": selector(spec, "bookie")}}]
    claims = []
    for vol_name, vol in (("journal", spec.storage.journal), ("ledgers", spec.storage.ledgers)):
        claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                      "resources": {"requests": {"storage": vol.size}}}
        if vol.storage_class:
            claim_spec["storageClassName"] = vol.storage_class
        claims.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": vol_name, "labels": selector(spec, "bookie")},
                       "spec": claim_spec})
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(spec, spec.name, "bookie", owner,
                          {RESOURCES_HASH: spec.resources_hash()}),
        "spec": {
            "serviceName": spec.name, "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Retain",
                                                     "whenDeleted": spec.pvc_policy},
            "selector": {"matchLabels": selector(spec, "bookie")},
            "template": {"metadata": {"labels": labels(spec, "bookie"),
                                      "annotations": _pod_annotations(spec)},
                         "spec": pod_spec},
            "volumeClaimTemplates": claims,
        },
    }


def pod_disruption_budget(spec: BookieClusterSpec, owner: dict | None = None) -> dict[str, Any]:
    """At most one bookie voluntarily down at a time (drains, node upgrades)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(spec, spec.name, "bookie", owner),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(spec, "bookie")}}}


def autorecovery(spec: BookieClusterSpec, owner: dict | None = None) -> dict[str, Any]:
    """Auditor + replication workers (`pybk autorecovery`); they elect one auditor in etcd."""
    pod_sec, ctr_sec = _security()
    http = {"port": "http", "scheme": _probe_scheme(spec)}
    secret_volumes, secret_mounts = _secret_volumes(spec)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(spec, f"{spec.name}-autorecovery", "autorecovery", owner),
        "spec": {
            "replicas": spec.autorecovery.replicas,
            "selector": {"matchLabels": selector(spec, "autorecovery")},
            "template": {
                "metadata": {"labels": labels(spec, "autorecovery"),
                             "annotations": {CONFIG_HASH: spec.restart_hash()}},
                "spec": {
                    "serviceAccountName": f"{spec.name}-bookie",
                    "securityContext": pod_sec,
                    "containers": [{
                        "name": "autorecovery", "image": spec.image,
                        "imagePullPolicy": spec.image_pull_policy,
                        "command": ["pybk", "autorecovery"],
                        "env": [{"name": "PYBK_METADATA_URI", "valueFrom": {"configMapKeyRef": {
                                    "name": f"{spec.name}-config", "key": "metadataServiceUri"}}},
                                # the auditor advertises host:port in its election, so the operator
                                # can reach it to trigger audits: bind the pod IP
                                {"name": "PYBK_RECOVERY_HTTP_HOST",
                                 "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                                {"name": "PYBK_RECOVERY_HTTP_PORT", "value": str(RECOVERY_HTTP_PORT)},
                                {"name": "PYBK_RECOVERY_NAME",
                                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                *security_env(spec)],
                        "ports": [{"name": "http", "containerPort": RECOVERY_HTTP_PORT, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": "/heartbeat", **http},
                                           "periodSeconds": 10},
                        "livenessProbe": {"httpGet": {"path": "/heartbeat", **http},
                                          "periodSeconds": 20, "failureThreshold": 6},
                        "securityContext": ctr_sec,
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *secret_mounts],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {}}, *secret_volumes],
                },
            },
        },
    }


def rbac(spec: BookieClusterSpec, owner: dict | None = None) -> list[dict[str, Any]]:
    """The bookie pods' identity: read their own pod (the zone annotation the operator sets)."""
    name = f"{spec.name}-bookie"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(spec, name, "bookie", owner)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": _meta(spec, name, "bookie", owner),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(spec, name, "bookie", owner),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": spec.namespace}]},
    ]


def render(spec: BookieClusterSpec, metadata_uri: str, replicas: int | None = None,
           owner: dict | None = None) -> list[dict[str, Any]]:
    """Every object of the cluster, in apply order (the StatefulSet with `replicas`, default spec's).

    The StatefulSet comes last: its resources-hash annotation then says that everything before
    it was applied from that spec too."""
    cert = certificate(spec, owner)
    return [*rbac(spec, owner), *([cert] if cert else []), service(spec, owner),
            config_map(spec, metadata_uri, owner), pod_disruption_budget(spec, owner), autorecovery(spec, owner),
            stateful_set(spec, metadata_uri, spec.replicas if replicas is None else replicas, owner)]


def companions(spec: BookieClusterSpec) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every object besides the StatefulSet, to notice deleted ones."""
    return [(o["apiVersion"], o["kind"], o["metadata"]["name"])
            for o in render(spec, "etcd://placeholder:2379/pybk", replicas=0) if o["kind"] != "StatefulSet"]
