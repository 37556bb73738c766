"""The BookieLog CRD: structural, printer columns for `kubectl get bkl`, the examples fit its schema
(jsonschema against openAPIV3Schema) and its CEL rules refuse what the operator would refuse."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pybk.cluster.bookielog.spec import BookieLogSpec
from pybk.operator import crd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml")
                  if any((d or {}).get("kind") == "BookieLog" for d in yaml.safe_load_all(p.read_text())))
VALID = [p for p in EXAMPLES if "invalid" not in p.name]
INVALID = [p for p in EXAMPLES if "invalid" in p.name]


def bookielog(**spec) -> dict:
    return {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieLog", "metadata": {"name": "orders"},
            "spec": {"cluster": "demo", "passwordSecretRef": {"name": "orders-log"}, **spec}}


def the_log(path: Path) -> dict:
    return next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "BookieLog")


def test_crd_is_structural_with_status_and_printer_columns():
    doc = crd.crd_of("BookieLog")
    names = doc["spec"]["names"]
    assert names["shortNames"] == ["bkl"] and names["plural"] == "bookielogs" and doc["spec"]["scope"] == "Namespaced"
    v = doc["spec"]["versions"][0]
    assert v["subresources"] == {"status": {}}
    cols = {c["name"]: c["jsonPath"] for c in v["additionalPrinterColumns"]}
    assert cols["Start"] == ".status.startOffset" and cols["End"] == ".status.endOffset"
    assert {"Cluster", "Segments", "Writer", "Ready", "Age"} <= set(cols)

    def walk(s, path):
        assert "type" in s or s.get("x-kubernetes-int-or-string"), path
        for name, sub in s.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        if isinstance(s.get("items"), dict):
            walk(s["items"], f"{path}[]")
    walk(crd.schema(kind="BookieLog"), "")


def test_examples_exist():
    assert VALID and INVALID


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_every_example_validates_and_parses(path):
    defaulted, errors = crd.admit(the_log(path))
    assert errors == []
    assert BookieLogSpec.from_manifest(defaulted).errors == ()


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_examples_are_refused_by_cel_and_by_the_operator(path):
    assert crd.cel_available()
    defaulted, errors = crd.admit(the_log(path))
    assert crd.schema_errors(defaulted) == [] and errors
    assert BookieLogSpec.from_manifest(defaulted, validate=False).errors


def test_defaults_are_the_operators():
    defaulted, errors = crd.admit(bookielog())
    assert errors == []
    s = defaulted["spec"]
    assert s["replication"] == {"ensemble": 3, "writeQuorum": 3, "ackQuorum": 2}
    assert s["retention"] == {"policy": "none"} and s["deletionPolicy"] == "Retain" and s["digest"] == "CRC32C"
    assert s["passwordSecretRef"]["key"] == "password"
    assert BookieLogSpec.from_manifest(defaulted).config == BookieLogSpec.from_manifest(bookielog()).config


@pytest.mark.parametrize("spec, message", [
    ({"replication": {"ensemble": 3, "writeQuorum": 2, "ackQuorum": 3}},
     "replication.ackQuorum must be <= replication.writeQuorum"),
    ({"replication": {"ensemble": 2, "writeQuorum": 3, "ackQuorum": 2}},
     "replication.writeQuorum must be <= replication.ensemble"),
    ({"retention": {"policy": "limits"}}, "retention policy limits needs maxAge or maxBytes"),
    ({"retention": {"policy": "interest", "maxBytes": "1Gi"}}, "maxAge and maxBytes apply only to policy limits"),
    ({"retention": {"policy": "limits", "maxAge": "1d", "maxBacklogBytes": 5}},
     "maxBacklogBytes applies only to policy interest"),
])
def test_each_cel_rule_refuses_its_case(spec, message):
    errors = crd.admit(bookielog(**spec))[1]
    assert len(errors) == 1 and message in errors[0], errors


def test_schema_refuses_bad_types_names_and_formats():
    obj = bookielog(deletionPolicy="Keep", digest="SHA1", rollover={"maxBytes": "lots", "maxAge": "4 hours"},
                    retention={"policy": "forever"})
    obj["spec"]["cluster"] = "Demo_Cluster"
    joined = "\n".join(crd.admit(obj)[1])
    for field in ("spec.deletionPolicy", "spec.digest", "spec.rollover.maxBytes", "spec.rollover.maxAge",
                  "spec.retention.policy", "spec.cluster"):
        assert field in joined, field
    missing = crd.admit({"apiVersion": "pybk.io/v1alpha1", "kind": "BookieLog", "metadata": {"name": "x"},
                         "spec": {"cluster": "demo"}})[1]
    assert any("'passwordSecretRef' is a required property" in e for e in missing)


@pytest.mark.parametrize("change, message", [
    ({"cluster": "other"}, "cluster is immutable"),
    ({"logName": "renamed"}, "logName is immutable"),
    ({"digest": "MAC"}, "digest is immutable"),
])
def test_identity_fields_are_immutable(change, message):
    old = the_log(ROOT / "examples" / "bookielog.yaml")
    new = copy.deepcopy(old)
    new["spec"]["retention"]["maxAge"] = "30d"
    assert crd.admit(new, old)[1] == []
    new["spec"].update(change)
    errors = crd.admit(new, old)[1]
    assert len(errors) == 1 and message in errors[0], errors


def test_status_written_by_the_operator_fits_the_schema():
    import jsonschema

    from pybk.cluster.bookielog.controller import plan
    from pybk.cluster.bookielog.observed import LogObservation, Observed, Replication
    from pybk.cluster.bookielog.status import status
    from pybk.log import CursorInfo, LogConfig

    spec = BookieLogSpec.from_manifest(bookielog())
    obs = Observed(log=LogObservation(7, LogConfig(), True, 2, "host:1", 0, 10, (), (CursorInfo("c", 3, 7),),
                                      Replication(3, 3, 2)), managed_id=7)
    jsonschema.validate(status(spec, obs, plan(spec, obs), None, 7),
                        crd.schema(kind="BookieLog")["properties"]["status"])
