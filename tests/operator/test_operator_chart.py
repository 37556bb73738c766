"""The Helm chart renders (Helm's own Go SDK, via helm-python-sdk) with default and documented
values, and everything it renders is valid Kubernetes; its CRD is the repository's CRD."""
from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pybk.operator import crd

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (a Helm renderer from PyPI) is not installed")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pybk"
VALUES = {
    "defaults": {},
    "try-it-out": {"etcd": {"enabled": True}, "cluster": {"enabled": True}},
    "ephemeral-etcd-namespaced": {"etcd": {"enabled": True, "storage": ""},
                                  "operator": {"watchNamespaces": ["team-a", "team-b"], "extraArgs": ["--verbose"],
                                               "defaultMetadataUri": "etcd://etcd.infra:2379/pybk"},
                                  "serviceAccount": {"create": False, "name": "existing"},
                                  "imagePullSecrets": [{"name": "registry"}]},
}


def rendered(values: dict) -> list[dict]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name="pybk", namespace="pybk-system")
    docs = []
    for name, text in sorted(out.items()):
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def test_chart_lints_clean():
    assert helm.lint(str(CHART))["errors"] == []


def test_chart_crd_is_the_repository_crd():
    assert (CHART / "crds" / "bookiecluster.yaml").read_text() == crd.CRD_PATH.read_text()


@pytest.mark.parametrize("name", sorted(VALUES))
def test_chart_renders_valid_manifests(name):
    docs = rendered(VALUES[name])
    kinds = [d["kind"] for d in docs]
    assert "Deployment" in kinds and "ClusterRole" in kinds
    for doc in docs:
        if doc["kind"] == "BookieCluster":
            assert crd.admit(doc)[1] == []
            continue
        for version in ("1.29.0", "1.33.0"):
            kubernetes_validate.validate(doc, version, strict=True)


def test_bundled_etcd_becomes_the_default_metadata_service():
    docs = rendered(VALUES["try-it-out"])
    op = next(d for d in docs if d["kind"] == "Deployment")
    args = op["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--default-metadata-uri=etcd://pybk-etcd.pybk-system.svc:2379/pybk" in args
    cluster = next(d for d in docs if d["kind"] == "BookieCluster")
    assert cluster["spec"]["metadataServiceUri"] == "etcd://pybk-etcd.pybk-system.svc:2379/pybk"
