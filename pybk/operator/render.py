"""Kubernetes manifests of a BookieCluster: pure functions of the spec.

Names: StatefulSet and headless Service `<name>` (pods `<name>-<ordinal>`), bookie id
`<name>-<ordinal>.<name>.<namespace>.svc:3181`, volumes `journal-<name>-<ordinal>` and
`ledgers-<name>-<ordinal>`, ConfigMap `<name>-config` (what clients need: metadata URI and
ledger defaults), autorecovery Deployment `<name>-autorecovery`, PDB `<name>`, ServiceAccount,
Role and RoleBinding `<name>-bookie`.

The StatefulSet uses `updateStrategy: OnDelete`: a config change never restarts pods by itself;
the controller restarts them one at a time (RestartBookie), and each pod's
`pybk.io/config-hash` annotation says which config it runs.
"""
from __future__ import annotations

from typing import Any

from pybk.cluster.spec import BookieClusterSpec, option_name

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
                     "bookieService": f"{spec.name}.{spec.namespace}.svc"}}


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
    http = {"port": "http", "scheme": "HTTP"}
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
                         {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": ctr_sec,
    }
    if spec.resources:
        container["resources"] = spec.resources
    pod_spec: dict[str, Any] = {
        "serviceAccountName": f"{spec.name}-bookie",
        "securityContext": pod_sec,
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
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
                                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "ports": [{"name": "http", "containerPort": RECOVERY_HTTP_PORT, "protocol": "TCP"}],
                        "readinessProbe": {"httpGet": {"path": "/heartbeat", "port": "http"},
                                           "periodSeconds": 10},
                        "livenessProbe": {"httpGet": {"path": "/heartbeat", "port": "http"},
                                          "periodSeconds": 20, "failureThreshold": 6},
                        "securityContext": ctr_sec,
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
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
    return [*rbac(spec, owner), service(spec, owner), config_map(spec, metadata_uri, owner),
            pod_disruption_budget(spec, owner), autorecovery(spec, owner),
            stateful_set(spec, metadata_uri, spec.replicas if replicas is None else replicas, owner)]


def companions(spec: BookieClusterSpec) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every object besides the StatefulSet, to notice deleted ones."""
    return [(o["apiVersion"], o["kind"], o["metadata"]["name"])
            for o in render(spec, "etcd://placeholder:2379/pybk", replicas=0) if o["kind"] != "StatefulSet"]
