"""The kopf handlers, called directly with real BookieCluster bodies, make the right API calls
(recorded at the Kubernetes API boundary) and status patches. etcd and pybk.meta are real."""
from __future__ import annotations

import copy
import logging
from pathlib import Path

import jsonschema
import kopf
import pytest
import yaml

from pybk.cluster.spec import BookieClusterSpec
from pybk.local.process import free_port
from pybk.meta import BookieInfo, Cookie, MetadataStore
from pybk.operator import crd, handlers, render

from kube_recorder import RecordingKube
from polling import eventually

ROOT = Path(__file__).resolve().parents[2]
LOG = logging.getLogger("test-operator")
UID = "6f1c2a1e-8a57-4d0e-9a9e-0c3a1d2b3c4d"


def body(uri: str, **spec_changes) -> dict:
    """A BookieCluster as the API server hands it to kopf: defaulted, with uid and generation."""
    doc = yaml.safe_load((ROOT / "examples/bookiecluster-minimal.yaml").read_text())
    doc["metadata"].update(name="bk", namespace="default", uid=UID, generation=2,
                           creationTimestamp="2026-01-01T00:00:00Z")
    doc["spec"]["metadataServiceUri"] = uri
    doc["spec"].update(spec_changes)
    defaulted, _errors = crd.admit(doc)
    return kopf.Body(defaulted)


def running(b: dict, replicas: int, *, config_hash: str | None = None, ready=None,
            extra_pvcs=(), node: str | None = None) -> RecordingKube:
    """The objects a healthy cluster of `replicas` bookies has, as the API server would list them."""
    spec = BookieClusterSpec.from_manifest(b, validate=False)
    objs = render.render(spec, spec.metadata_service_uri, replicas=replicas)
    for o in list(range(replicas)):
        objs.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": render.pod_name(spec, o), "namespace": "default",
                                  "labels": render.labels(spec, "bookie"),
                                  "annotations": {**render.stateful_set(spec, "etcd://e:1/p", 1)["spec"]["template"]["metadata"]["annotations"],
                                                  render.CONFIG_HASH: config_hash or spec.restart_hash()}},
                     "spec": {"nodeName": node} if node else {},
                     "status": {"conditions": [{"type": "Ready", "status":
                                                "True" if ready is None or o in ready else "False"}]}})
    for o in list(range(replicas)) + list(extra_pvcs):
        for name in render.pvc_names(spec, o):
            objs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "metadata": {"name": name, "namespace": "default",
                                      "labels": render.selector(spec, "bookie")}})
    return RecordingKube(objs)


@pytest.fixture
async def operator():
    """Install an operator context around a recorder; its metadata stores are closed afterwards."""
    def use(kube: RecordingKube, default_uri: str | None = None) -> RecordingKube:
        handlers.CONTEXT = handlers.OperatorContext(kube=kube, default_metadata_uri=default_uri)
        return kube
    yield use
    ctx, handlers.CONTEXT = handlers.CONTEXT, None
    if ctx is not None:
        await ctx.stores.close()


@pytest.fixture
async def store(metadata_uri):
    s = await MetadataStore.connect(metadata_uri)
    yield s
    await s.close()


async def register(store, b: dict, ordinals) -> None:
    spec = BookieClusterSpec.from_manifest(b, validate=False)
    for o in ordinals:
        bid = render.bookie_id(spec, o)
        await store.registry.register(BookieInfo(bookie_id=bid, grpc=bid))


def dead_uri() -> str:
    return f"etcd://127.0.0.1:{free_port()}/pybk?timeout=0.5"


def condition(patch, type_):
    return next(c for c in patch["status"]["conditions"] if c["type"] == type_)


def check_status(patch) -> None:
    """The status patch, as stored (merge-patch nulls removed), fits the CRD's status schema."""
    stored = {k: v for k, v in patch["status"].items() if v is not None}
    jsonschema.validate(stored, crd.schema()["properties"]["status"])


async def test_create_applies_every_object_owned_by_the_cluster(operator):
    kube = operator(RecordingKube())
    patch = kopf.Patch()
    await handlers.on_create(body=body(dead_uri()), patch=patch, logger=LOG)
    applied = [c[3] for c in kube.verbs("apply")]
    assert [o["kind"] for o in applied] == ["ServiceAccount", "Role", "RoleBinding", "Service", "ConfigMap",
                                            "PodDisruptionBudget", "Deployment", "StatefulSet"]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == UID for o in applied)
    assert kube.find("StatefulSet", "bk")["spec"]["replicas"] == 3
    assert not kube.verbs("delete", "patch")
    assert condition(patch, "Progressing")["reason"] == "Creating"
    assert patch["status"]["observedGeneration"] == 2
    check_status(patch)


async def test_invalid_spec_sets_condition_and_makes_no_calls(operator):
    kube = operator(RecordingKube())
    patch = kopf.Patch()
    b = body(dead_uri())
    b["spec"]["replicas"] = 2  # below ensemble 3; the CEL rule would refuse it, the operator does too
    await handlers.on_create(body=b, patch=patch, logger=LOG)
    assert kube.calls == []
    deg = condition(patch, "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "InvalidSpec" and "spec.replicas (2)" in deg["message"]


async def test_missing_metadata_uri_without_default_is_a_clear_condition(operator):
    kube = operator(RecordingKube())
    patch = kopf.Patch()
    b = body(dead_uri())
    del b["spec"]["metadataServiceUri"]
    await handlers.on_create(body=b, patch=patch, logger=LOG)
    assert kube.calls == [] and "default-metadata-uri" in condition(patch, "Degraded")["message"]


async def test_scale_up_patches_statefulset_replicas(operator, metadata_uri, store):
    b = body(metadata_uri, replicas=5)
    kube = operator(running(b, 3))
    await register(store, b, range(3))
    patch = kopf.Patch()
    await handlers.on_update(old={"spec": {"replicas": 3}}, new={"spec": {"replicas": 5}},
                             body=b, patch=patch, logger=LOG)
    assert kube.verbs("patch", "delete", "apply") == [("patch", "StatefulSet", "bk", {"spec": {"replicas": 5}})]
    assert condition(patch, "Progressing")["reason"] == "ScalingUp"
    assert patch["status"]["writableBookies"] == [render.bookie_id(BookieClusterSpec.from_manifest(b), o)
                                                  for o in range(3)]
    check_status(patch)


async def test_scale_down_drains_then_shrinks_then_deletes_volumes(operator, metadata_uri, store):
    b = body(metadata_uri, replicas=3, pvcPolicy="Delete")
    kube = operator(running(b, 4))
    await register(store, b, range(4))
    bid3 = render.bookie_id(BookieClusterSpec.from_manifest(b), 3)
    # bookie 3 wrote its cookie, then (drained, stopped) restarted once and wrote it again
    await store.cookies.create(Cookie("instance", bid3, render.JOURNAL_DIR, (render.LEDGERS_DIR,)))

    patch = kopf.Patch()
    await handlers.on_update(old={"spec": {"replicas": 4}}, new={"spec": {"replicas": 3}},
                             body=b, patch=patch, logger=LOG)
    rec = await store.decommission.get(bid3)
    assert rec is not None and rec.state in ("requested", "draining")
    assert not kube.verbs("patch", "delete", "apply")  # nothing shrinks before the drain is done
    assert condition(patch, "Decommissioning")["status"] == "True" and bid3 in condition(patch, "Decommissioning")["message"]

    # the autorecovery side reports progress; the operator only waits
    rec = await store.decommission.update(await store.decommission.get(bid3), state="draining",
                                          ledgers_total=7, ledgers_remaining=4)
    patch = kopf.Patch()
    await handlers.refresh(body=b, patch=patch, logger=LOG)
    assert not kube.verbs("patch", "delete", "apply")
    assert "4 ledgers left" in condition(patch, "Decommissioning")["message"]
    assert patch["status"]["decommissioning"] == {"bookie": bid3, "ordinal": 3, "ledgersLeft": 4, "state": "in_progress"}

    # drained: shrink the StatefulSet, keep the volumes while the pod may still exist
    await store.decommission.update(rec, state="done", ledgers_remaining=0)
    await handlers.refresh(body=b, patch=kopf.Patch(), logger=LOG)
    assert kube.verbs("patch", "delete") == [("patch", "StatefulSet", "bk", {"spec": {"replicas": 3}})]

    # the StatefulSet controller removed pod 3: its volumes go (policy Delete) and the record too
    kube.objects = {k: v for k, v in kube.objects.items() if not (k[1] == "Pod" and k[3] == "bk-3")}
    kube.calls.clear()
    patch = kopf.Patch()
    await handlers.refresh(body=b, patch=patch, logger=LOG)
    assert kube.verbs("patch", "delete") == [("delete", "PersistentVolumeClaim", "journal-bk-3", None),
                                             ("delete", "PersistentVolumeClaim", "ledgers-bk-3", None)]
    assert await store.decommission.get(bid3) is None
    assert await store.cookies.get(bid3) is None
    assert condition(patch, "Decommissioning")["status"] == "False"


async def test_operator_restart_mid_scale_down_resumes(operator, metadata_uri, store):
    b = body(metadata_uri, replicas=3)
    spec = BookieClusterSpec.from_manifest(b)
    kube = operator(running(b, 5))
    await register(store, b, range(5))
    # before the restart: bookie 4 drained, bookie 3 not yet asked
    rec = await store.decommission.request(render.bookie_id(spec, 4))
    await store.decommission.update(rec, state="done", ledgers_remaining=0)
    await handlers.on_resume(body=b, patch=kopf.Patch(), logger=LOG)
    assert kube.verbs("patch", "delete") == [("patch", "StatefulSet", "bk", {"spec": {"replicas": 4}})]
    assert await store.decommission.get(render.bookie_id(spec, 3)) is None  # one bookie at a time


async def test_refuses_to_scale_below_largest_open_ensemble(operator, metadata_uri, store):
    b = body(metadata_uri, replicas=3)
    spec = BookieClusterSpec.from_manifest(b)
    kube = operator(running(b, 4))
    await register(store, b, range(4))
    await store.ledgers.create([render.bookie_id(spec, o) for o in range(4)], 3, 2)
    patch = kopf.Patch()
    await handlers.on_update(old={"spec": {"replicas": 4}}, new={"spec": {"replicas": 3}},
                             body=b, patch=patch, logger=LOG)
    assert not kube.verbs("patch", "delete", "apply")
    assert await store.decommission.list() == {}
    deg = condition(patch, "Degraded")
    assert deg["reason"] == "BelowLargestOpenEnsemble" and "ensemble of 4" in deg["message"]


async def test_config_change_restarts_one_bookie_at_a_time(operator, metadata_uri, store):
    old = body(metadata_uri)
    new = body(metadata_uri, config={"journalGroupWait": "0.005"})
    kube = operator(running(old, 3))
    await register(store, old, range(3))
    await handlers.on_update(body=new, patch=kopf.Patch(), logger=LOG)
    sts = kube.find("StatefulSet", "bk")
    assert sts["spec"]["replicas"] == 3
    env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PYBK_JOURNAL_GROUP_WAIT"] == "0.005"
    assert not kube.verbs("delete")  # the template first; pods roll once it is in place
    await handlers.refresh(body=new, patch=kopf.Patch(), logger=LOG)
    assert kube.verbs("delete") == [("delete", "Pod", "bk-2", None)]
    # bk-2 comes back with the new config but is not ready yet: nobody else is touched
    pod2 = copy.deepcopy(running(new, 3, ready={0, 1}).find("Pod", "bk-2"))
    kube.put(pod2)
    kube.calls.clear()
    patch = kopf.Patch()
    await handlers.refresh(body=new, patch=patch, logger=LOG)
    assert not kube.verbs("delete")
    assert "bk-2.bk.default.svc:3181 not ready" in condition(patch, "Progressing")["message"]
    # ready again: the next (highest stale) bookie restarts
    pod2["status"]["conditions"][0]["status"] = "True"
    kube.put(pod2)
    await handlers.refresh(body=new, patch=kopf.Patch(), logger=LOG)
    assert kube.verbs("delete") == [("delete", "Pod", "bk-1", None)]


async def test_unreachable_metadata_blocks_scale_down(operator):
    b = body(dead_uri(), replicas=3)
    kube = operator(running(b, 4))
    patch = kopf.Patch()
    await handlers.on_update(old={"spec": {"replicas": 4}}, new={"spec": {"replicas": 3}},
                             body=b, patch=patch, logger=LOG)
    assert not kube.verbs("patch", "delete")
    assert condition(patch, "Degraded")["reason"] == "MetadataUnavailable"


async def test_bookie_pods_get_their_node_zone(operator, metadata_uri, store):
    b = body(metadata_uri)
    kube = operator(running(b, 3, node="node-a"))
    kube.put({"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-1"}}})
    await register(store, b, range(3))
    await handlers.refresh(body=b, patch=kopf.Patch(), logger=LOG)
    zones = [c for c in kube.verbs("patch") if c[1] == "Pod"]
    assert len(zones) == 3
    assert all(c[3] == {"metadata": {"annotations": {render.ZONE_ANNOTATION: "zone-1"}}} for c in zones)


async def test_api_conflict_is_a_temporary_error(operator):
    class Conflicting(RecordingKube):
        async def apply(self, obj):
            from pybk.operator.kube import KubeError
            raise KubeError("apply", obj["kind"], 409, "conflict")

    operator(Conflicting())
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError) as err:
        await handlers.on_create(body=body(dead_uri()), patch=patch, logger=LOG)
    assert err.value.delay == handlers.RETRY_DELAY
    deg = condition(patch, "Degraded")
    assert deg["reason"] == "KubernetesApiError" and "409" in deg["message"]


async def test_forbidden_api_call_is_a_permanent_error_with_a_condition(operator):
    class Forbidden(RecordingKube):
        async def apply(self, obj):
            from pybk.operator.kube import KubeError
            raise KubeError("apply", obj["kind"], 403, "forbidden: the operator lacks RBAC for it")

    operator(Forbidden())
    patch = kopf.Patch()
    with pytest.raises(kopf.PermanentError):
        await handlers.on_create(body=body(dead_uri()), patch=patch, logger=LOG)
    assert "forbidden" in condition(patch, "Degraded")["message"]


async def test_scale_down_of_a_bookie_that_never_started_needs_no_drain(operator, metadata_uri, store):
    b = body(metadata_uri, replicas=3)
    kube = operator(running(b, 4, ready={0, 1, 2}))
    await register(store, b, range(3))  # bookie 3's pod never came up: etcd knows nothing of it
    await handlers.on_update(old={"spec": {"replicas": 4}}, new={"spec": {"replicas": 3}},
                             body=b, patch=kopf.Patch(), logger=LOG)
    rec = await store.decommission.get(render.bookie_id(BookieClusterSpec.from_manifest(b), 3))
    assert rec.state == "done" and "nothing to drain" in rec.message
    await handlers.refresh(body=b, patch=kopf.Patch(), logger=LOG)
    assert kube.verbs("patch", "delete") == [("patch", "StatefulSet", "bk", {"spec": {"replicas": 3}})]


async def test_audit_timer_triggers_the_elected_auditor(operator, metadata_uri, store, tmp_path):
    from pybk.local.autorecovery import AutoRecoveryProcess

    b = body(metadata_uri)
    operator(running(b, 3))
    patch = kopf.Patch()
    await handlers.audit(body=b, patch=patch, logger=LOG)  # no autorecovery yet: nothing, no error
    assert "status" not in patch
    proc = AutoRecoveryProcess(tmp_path / "autorecovery.log", metadata_uri).start()
    try:
        # the elected auditor may not answer for a moment after its election: the timer only warns
        async def audited():
            await handlers.audit(body=b, patch=patch, logger=LOG)
            return (patch.get("status") or {}).get("lastAudit")

        assert (await eventually(audited, 30, 0.1, "an audit triggered")).endswith("Z")
    finally:
        proc.stop()


async def test_a_deleted_companion_object_is_applied_again(operator, metadata_uri, store):
    b = body(metadata_uri)
    kube = operator(running(b, 3))
    await register(store, b, range(3))
    await handlers.refresh(body=b, patch=kopf.Patch(), logger=LOG)
    assert not kube.verbs("apply")
    kube.objects = {k: v for k, v in kube.objects.items() if k[1] != "PodDisruptionBudget"}
    await handlers.refresh(body=b, patch=kopf.Patch(), logger=LOG)
    assert kube.find("PodDisruptionBudget", "bk") is not None
    assert kube.find("StatefulSet", "bk")["spec"]["replicas"] == 3


def test_startup_keeps_kopf_state_out_of_the_status():
    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings)
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.finalizer == "pybk.io/finalizer"


async def test_a_scheduled_bookie_pod_gets_its_zone_from_the_pod_event(operator):
    b = body(dead_uri())
    kube = operator(running(b, 1, node="node-b"))
    kube.put({"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": "node-b", "labels": {"topology.kubernetes.io/zone": "zone-2"}}})
    pod = kube.find("Pod", "bk-0")
    assert pod["metadata"]["annotations"][render.ZONE_KEY_ANNOTATION] == "topology.kubernetes.io/zone"
    await handlers.on_bookie_pod(body=pod, logger=LOG)
    assert kube.verbs("patch") == [("patch", "Pod", "bk-0", {"metadata": {"annotations": {render.ZONE_ANNOTATION: "zone-2"}}})]
    await handlers.on_bookie_pod(body=kube.find("Pod", "bk-0"), logger=LOG)  # already labelled: nothing
    assert len(kube.verbs("patch")) == 1


async def test_volumes_of_a_bookie_removed_without_drain_are_kept(operator, metadata_uri, store):
    b = body(metadata_uri, replicas=3, pvcPolicy="Delete")
    spec = BookieClusterSpec.from_manifest(b)
    kube = operator(running(b, 3, extra_pvcs=(3,)))  # StatefulSet scaled 4 -> 3 by hand
    await register(store, b, range(3))
    await store.ledgers.create([render.bookie_id(spec, o) for o in (0, 1, 3)], 3, 2)
    patch = kopf.Patch()
    await handlers.refresh(body=b, patch=patch, logger=LOG)
    assert not kube.verbs("delete")
    assert condition(patch, "Degraded")["reason"] == "VolumesStillReferenced"
