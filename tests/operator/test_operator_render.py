"""Every manifest the operator renders is valid Kubernetes (strict) for 1.29 and 1.33."""
from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pybk.cluster.spec import BookieClusterSpec, load_manifest
from pybk.operator import render

ROOT = Path(__file__).resolve().parents[2]
OWNER = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "name": "x",
         "uid": "0b6d0d36-3c8e-4b0b-9b4a-6f4a3c1e2d10"}
SPECS = {
    "minimal": lambda: load_manifest(ROOT / "examples/bookiecluster-minimal.yaml"),
    "full": lambda: load_manifest(ROOT / "examples/bookiecluster-full.yaml"),
    "no-zones": lambda: BookieClusterSpec.from_manifest({
        "apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": "flat"},
        "spec": {"zoneSpreading": {"enabled": False}, "autorecovery": {"replicas": 0}}}),
}


@pytest.mark.parametrize("version", ["1.29.0", "1.33.0"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_rendered_manifest_passes_strict_validation(name, version):
    spec = SPECS[name]()
    objs = render.render(spec, "etcd://etcd:2379/pybk", owner=OWNER)
    assert {o["kind"] for o in objs} == {"ServiceAccount", "Role", "RoleBinding", "Service", "ConfigMap",
                                         "StatefulSet", "PodDisruptionBudget", "Deployment"}
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


def test_crd_passes_strict_validation():
    doc = yaml.safe_load((ROOT / "crds/bookiecluster.yaml").read_text())
    for version in ("1.29.0", "1.33.0"):
        kubernetes_validate.validate(doc, version, strict=True)


def test_statefulset_carries_volumes_probes_zone_and_manual_rollout():
    spec = SPECS["full"]()
    sts = render.stateful_set(spec, "etcd://e:2379/p", 5)
    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/api/v1/bookie/is_ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/heartbeat"
    claims = {t["metadata"]["name"]: t["spec"] for t in sts["spec"]["volumeClaimTemplates"]}
    assert claims["journal"]["storageClassName"] == "fast-ssd"
    assert claims["ledgers"]["resources"]["requests"]["storage"] == "200Gi"
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["PYBK_JOURNAL_GROUP_WAIT"] == "0.002" and env["PYBK_ZONE_WAIT"] == "30"
    assert sts["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH] == spec.restart_hash()
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_bookie_ids_map_back_to_ordinals():
    spec = SPECS["full"]()
    assert render.bookie_id(spec, 4) == "ledgers-4.ledgers.pybk.svc:3181"
    assert render.ordinal_of(spec, render.bookie_id(spec, 12)) == 12
    assert render.ordinal_of(spec, "other-1.other.pybk.svc:3181") is None
    assert render.pvc_names(spec, 2) == ["journal-ledgers-2", "ledgers-ledgers-2"]


def test_spec_changes_the_crd_allows_never_touch_immutable_statefulset_fields():
    base = SPECS["full"]()
    import dataclasses

    from pybk.cluster.spec import AutorecoverySpec, LedgerDefaults, ZoneSpreadingSpec
    changed = dataclasses.replace(
        base, replicas=7, image="pybk:0.2.0", config={"journal-group-wait": "0.01"},
        resources={"requests": {"cpu": "2"}}, pvc_policy="Retain", autorecovery=AutorecoverySpec(3),
        zone_spreading=ZoneSpreadingSpec(enabled=False), ledger_defaults=LedgerDefaults(5, 3, 2),
        metadata_service_uri="etcd://other:2379/pybk")
    a = render.stateful_set(base, "etcd://a:2379/p", 5)["spec"]
    b = render.stateful_set(changed, "etcd://b:2379/p", 7)["spec"]
    for immutable in ("selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy"):
        assert a[immutable] == b[immutable], immutable
    assert a["template"] != b["template"]
