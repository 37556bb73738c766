"""Every example BookieCluster fits the CRD; invalid ones are refused by its CEL rules."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pybk.cluster.spec import BookieClusterSpec
from pybk.operator import crd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml")
                  if any((d or {}).get("kind") == "BookieCluster" for d in yaml.safe_load_all(p.read_text())))
VALID = [p for p in EXAMPLES if "invalid" not in p.name]
INVALID = [p for p in EXAMPLES if "invalid" in p.name]


def test_crd_is_structural_with_status_scale_and_printer_columns():
    doc = crd.load_crd()
    assert doc["spec"]["names"]["shortNames"] == ["bkc"] and doc["spec"]["group"] == "pybk.io"
    v = doc["spec"]["versions"][0]
    assert v["subresources"]["status"] == {}
    assert v["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    cols = {c["name"] for c in v["additionalPrinterColumns"]}
    assert {"Replicas", "Ready", "Under-Replicated", "Age"} <= cols

    def walk(s, path):
        # structural: every node has a type (or is int-or-string / preserve-unknown)
        assert "type" in s or s.get("x-kubernetes-int-or-string"), path
        for name, sub in s.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        if isinstance(s.get("items"), dict):
            walk(s["items"], f"{path}[]")
        if isinstance(s.get("additionalProperties"), dict):
            walk(s["additionalProperties"], f"{path}{{}}")
    walk(crd.schema(), "")


def test_examples_exist():
    assert VALID and INVALID


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_every_example_validates_against_the_crd_schema(path):
    obj = yaml.safe_load(path.read_text())
    defaulted, errors = crd.admit(obj)
    assert errors == []
    # and the operator's own parser agrees with the API server's defaults
    spec = BookieClusterSpec.from_manifest(defaulted)
    assert spec.problems() == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_examples_are_rejected_by_cel_rules(path):
    assert crd.cel_available(), "cel-python is in the operator extra"
    obj = yaml.safe_load(path.read_text())
    defaulted, errors = crd.admit(obj)
    assert crd.schema_errors(defaulted) == []  # plain schema accepts it: only CEL catches it
    assert errors, "CEL rules should refuse this example"
    spec = BookieClusterSpec.from_manifest(defaulted, validate=False)
    assert spec.problems(), "the operator refuses it too"


def test_ack_above_write_message_names_the_rule():
    obj = yaml.safe_load((ROOT / "examples/bookiecluster-invalid-ack-above-write.yaml").read_text())
    _, errors = crd.admit(obj)
    assert errors == [".spec: ledgerDefaults.ackQuorum must be <= ledgerDefaults.writeQuorum"]


def test_storage_layout_is_immutable_on_update():
    old = yaml.safe_load((ROOT / "examples/bookiecluster-full.yaml").read_text())
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 6
    assert crd.admit(new, old)[1] == []
    new["spec"]["storage"]["ledgers"]["size"] = "400Gi"
    errors = crd.admit(new, old)[1]
    assert len(errors) == 1 and "storage layout is immutable" in errors[0]


def test_schema_rejects_wrong_types_and_enums():
    obj = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": "x"},
           "spec": {"replicas": "3", "pvcPolicy": "Keep", "config": {"a": 1}}}
    errors = crd.admit(obj)[1]
    joined = "\n".join(errors)
    assert "spec.replicas" in joined and "spec.pvcPolicy" in joined and "spec.config.a" in joined


@pytest.mark.parametrize("spec, message", [
    ({"ledgerDefaults": {"ensemble": 3, "writeQuorum": 2, "ackQuorum": 3}},
     "ledgerDefaults.ackQuorum must be <= ledgerDefaults.writeQuorum"),
    ({"ledgerDefaults": {"ensemble": 2, "writeQuorum": 3, "ackQuorum": 2}},
     "ledgerDefaults.writeQuorum must be <= ledgerDefaults.ensemble"),
    ({"replicas": 4, "ledgerDefaults": {"ensemble": 5, "writeQuorum": 3, "ackQuorum": 2}},
     "replicas must be >= ledgerDefaults.ensemble"),
    ({"replicas": 2}, "replicas must be >= ledgerDefaults.ensemble"),  # against the defaulted ensemble 3
])
def test_each_quorum_rule_rejects_its_case(spec, message):
    obj = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": "x"}, "spec": spec}
    errors = crd.admit(obj)[1]
    assert len(errors) == 1 and message in errors[0]


@pytest.mark.parametrize("spec, message", [
    ({"tls": {"secretName": "a", "issuerRef": {"name": "ca"}}}, "tls needs exactly one of secretName and issuerRef"),
    ({"tls": {"serverName": "demo.default.svc"}}, "tls needs exactly one of secretName and issuerRef"),
    ({"auth": {"secretName": "a"}}, "auth needs tls: without TLS the tokens would cross the network in plaintext"),
])
def test_each_security_rule_rejects_its_case(spec, message):
    obj = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": "x"}, "spec": spec}
    errors = crd.admit(obj)[1]
    assert len(errors) == 1 and message in errors[0]


def test_schema_rejects_unknown_issuer_kinds_and_bad_secret_names():
    obj = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": "x"},
           "spec": {"tls": {"issuerRef": {"name": "ca", "kind": "Vault"}}, "auth": {"secretName": "Bad_Name"}}}
    joined = "\n".join(crd.admit(obj)[1])
    assert "spec.tls.issuerRef.kind" in joined and "'Vault' is not one of ['Issuer', 'ClusterIssuer']" in joined
    assert "spec.auth.secretName" in joined


def test_issuer_ref_defaults_to_a_cert_manager_issuer():
    obj = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": "x"},
           "spec": {"tls": {"issuerRef": {"name": "ca"}}}}
    defaulted, errors = crd.admit(obj)
    assert errors == []
    assert defaulted["spec"]["tls"]["issuerRef"] == {"name": "ca", "kind": "Issuer", "group": "cert-manager.io"}
