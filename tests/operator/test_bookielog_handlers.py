"""The Kubernetes side of the BookieLog handlers, on real resource bodies and the API recorder: the
password comes from the named Secret's key, the cluster's URI from the BookieCluster (or the
operator's default), and of two BookieLogs naming the same log the one that has it keeps it."""
from __future__ import annotations

import base64

from kube_recorder import RecordingKube

from pybk.cluster.bookielog.observed import ClusterState, SecretState
from pybk.cluster.bookielog.spec import BookieLogSpec
from pybk.operator import handlers, log_handlers


def bookielog(name: str, created: str = "2026-01-01T00:00:00Z", log_id: int | None = None, **spec) -> dict:
    body = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieLog",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "creationTimestamp": created},
            "spec": {"cluster": "demo", "passwordSecretRef": {"name": "pw", "key": "secret"}, **spec}}
    if log_id is not None:
        body["status"] = {"logId": log_id}
    return body


def secret(**data: bytes) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pw", "namespace": "team-a"},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


async def test_the_password_is_the_named_key_of_the_secret():
    spec = BookieLogSpec.from_manifest(bookielog("orders"))
    assert await log_handlers.read_password(RecordingKube(), spec) == (SecretState.ABSENT, None)
    assert await log_handlers.read_password(RecordingKube([secret(password=b"x")]), spec) == (
        SecretState.KEY_MISSING, None)
    kube = RecordingKube([secret(secret=b"s3cret")])
    assert await log_handlers.read_password(kube, spec) == (SecretState.PRESENT, b"s3cret")
    assert kube.verbs("list") == []          # one Secret read by name, never a listing


async def test_the_cluster_uri_is_the_clusters_or_the_default():
    spec = BookieLogSpec.from_manifest(bookielog("orders"))
    cluster = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster",
               "metadata": {"name": "demo", "namespace": "team-a"}, "spec": {"replicas": 3}}
    ctx = handlers.OperatorContext(kube=RecordingKube(), default_metadata_uri="etcd://default:2379/pybk")
    assert await log_handlers.cluster_uri(ctx, spec) == (ClusterState.ABSENT, None)
    ctx.kube.put(cluster)
    assert await log_handlers.cluster_uri(ctx, spec) == (ClusterState.PRESENT, "etcd://default:2379/pybk")
    cluster["spec"]["metadataServiceUri"] = "etcd://own:2379/x"
    cluster["metadata"]["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    ctx.kube.put(cluster)
    assert await log_handlers.cluster_uri(ctx, spec) == (ClusterState.DELETING, "etcd://own:2379/x")


def test_the_resource_managing_a_log_or_the_older_one_has_it():
    new = BookieLogSpec.from_manifest(bookielog("orders-b", "2026-01-02T00:00:00Z", logName="orders"))
    older = bookielog("orders", "2026-01-01T00:00:00Z")
    assert log_handlers.claimant(new, "2026-01-02T00:00:00Z", [older], 7) == "orders"
    # the one that manages the log's current id has it, whatever its age
    younger_owner = bookielog("orders-c", "2026-01-03T00:00:00Z", log_id=7, logName="orders")
    assert log_handlers.claimant(new, "2026-01-02T00:00:00Z", [younger_owner], 7) == "orders-c"
    # one that manages an older id of the name (deleted and re-created outside) has no claim
    stale = bookielog("orders-c", "2026-01-01T00:00:00Z", log_id=3, logName="orders")
    assert log_handlers.claimant(new, "2026-01-02T00:00:00Z", [stale], 7) is None
    # other logs, other clusters, itself and resources being deleted claim nothing
    others = [bookielog("payments", "2025-01-01T00:00:00Z"),
              bookielog("orders-d", "2025-01-01T00:00:00Z", logName="orders", cluster="other"),
              bookielog("orders-b", "2026-01-02T00:00:00Z", logName="orders"),
              {**bookielog("orders-e", "2025-01-01T00:00:00Z", logName="orders"),
               "metadata": {"name": "orders-e", "uid": "e", "deletionTimestamp": "2026-01-05T00:00:00Z"}}]
    assert log_handlers.claimant(new, "2026-01-02T00:00:00Z", others, 7) is None
