"""The local platform reads the same BookieCluster manifest as the operator and passes config through."""
from __future__ import annotations

from pathlib import Path

import pytest

from pybk.cluster.spec import load_manifest
from pybk.local.errors import LocalClusterError
from pybk.local.manifest import config_flags, load_spec, metadata_prefix

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"


def test_example_manifest_is_three_bookies_with_e3_qw3_qa2():
    spec = load_spec(EXAMPLE)
    assert spec.replicas == 3
    ld = spec.ledger_defaults
    assert (ld.ensemble, ld.write_quorum, ld.ack_quorum) == (3, 3, 2)


def test_config_overrides_become_bookie_flags():
    assert config_flags({"journal-group-wait-ms": "2", "diskHighWaterMark": "0.95",
                                "gc_interval_s": "60"}) == [
        "--disk-high-water-mark", "0.95", "--gc-interval-s", "60", "--journal-group-wait-ms", "2"]


def test_invalid_manifest_is_refused_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("replicas: 3", "replicas: 2", 1))
    with pytest.raises(LocalClusterError, match=r"spec.replicas \(2\) must be >= spec.ledgerDefaults"):
        load_spec(bad)


def test_secret_fields_are_refused_pointing_to_secure(tmp_path):
    secured = tmp_path / "secured.yaml"
    secured.write_text(EXAMPLE.read_text().replace("spec:\n", "spec:\n  tls:\n    secretName: pybk-tls\n"
                                                   "  auth:\n    secretName: pybk-auth\n", 1))
    with pytest.raises(LocalClusterError) as err:
        load_spec(secured)
    first = str(err.value).splitlines()[0]
    assert "spec.tls, spec.auth name Kubernetes Secrets" in first and "pybk local up --secure" in first


def test_missing_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(LocalClusterError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")


def test_metadata_prefix_comes_from_the_manifest_uri_path(tmp_path):
    spec = load_manifest(EXAMPLE)
    assert metadata_prefix(spec) == "pybk"
    import dataclasses
    assert metadata_prefix(dataclasses.replace(spec, metadata_service_uri="etcd://x:2379/team/a")) == "team/a"
