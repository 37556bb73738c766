"""BookieCluster manifests parse into a validated spec with defaults and clear errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from pybk.cluster.spec import (BookieClusterSpec, IssuerKind, IssuerRef, SpecError, TlsSpec, load_manifest,
                               option_name)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def manifest(**spec) -> dict:
    return {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster",
            "metadata": {"name": "demo"}, "spec": spec}


def test_defaults_fill_every_field_left_out():
    s = BookieClusterSpec.from_manifest(manifest())
    assert (s.replicas, s.pvc_policy, s.autorecovery.replicas) == (3, "Retain", 1)
    assert (s.ledger_defaults.ensemble, s.ledger_defaults.write_quorum, s.ledger_defaults.ack_quorum) == (3, 3, 2)
    assert s.storage.journal.size == "5Gi" and s.storage.ledgers.size == "20Gi"
    assert s.zone_spreading.enabled and s.metadata_service_uri is None


def test_full_example_parses_every_field():
    s = load_manifest(EXAMPLES / "bookiecluster-full.yaml")
    assert s.name == "ledgers" and s.namespace == "pybk" and s.replicas == 5
    assert s.storage.journal.storage_class == "fast-ssd" and s.storage.ledgers.size == "200Gi"
    assert s.config["journal-group-wait"] == "0.002" and s.pvc_policy == "Delete"
    assert s.autorecovery.replicas == 2 and s.resources["limits"]["memory"] == "2Gi"


@pytest.mark.parametrize("spec, needle", [
    ({"ledgerDefaults": {"ensemble": 3, "writeQuorum": 2, "ackQuorum": 3}}, "ackQuorum (3) must be <= writeQuorum (2)"),
    ({"ledgerDefaults": {"ensemble": 2, "writeQuorum": 3, "ackQuorum": 2}}, "writeQuorum (3) must be <= ensemble (2)"),
    ({"replicas": 2}, "spec.replicas (2) must be >= spec.ledgerDefaults.ensemble (3)"),
    ({"pvcPolicy": "Keep"}, "spec.pvcPolicy must be one of Retain, Delete"),
    ({"replicas": "three"}, "spec.replicas must be an integer"),
    ({"replica": 3}, "spec.replica is not a known field"),
    ({"storage": {"journal": {"size": "lots"}}}, "spec.storage.journal.size 'lots' is not a quantity"),
    ({"config": {"x": [1]}}, "spec.config.x must be a string"),
])
def test_invalid_specs_are_rejected_naming_the_field(spec, needle):
    with pytest.raises(SpecError) as err:
        BookieClusterSpec.from_manifest(manifest(**spec))
    assert needle in str(err.value)


def test_config_scalars_become_strings():
    s = BookieClusterSpec.from_manifest(manifest(config={"a": 1, "b": True, "c": "x"}))
    assert s.config == {"a": "1", "b": "true", "c": "x"}


def test_wrong_kind_and_missing_file_are_clear(tmp_path):
    with pytest.raises(SpecError, match="kind must be 'BookieCluster'"):
        BookieClusterSpec.from_manifest({**manifest(), "kind": "Pod"})
    with pytest.raises(SpecError, match="cannot read"):
        load_manifest(tmp_path / "missing.yaml")


def test_restart_hash_changes_with_config_not_replicas():
    a = BookieClusterSpec.from_manifest(manifest())
    assert a.restart_hash() == BookieClusterSpec.from_manifest(manifest(replicas=4)).restart_hash()
    assert a.restart_hash() != BookieClusterSpec.from_manifest(manifest(config={"k": "v"})).restart_hash()


def test_config_may_not_override_what_the_platform_sets():
    with pytest.raises(SpecError, match="spec.config.metadataUri is set by the platform"):
        BookieClusterSpec.from_manifest(manifest(config={"metadataUri": "etcd://x:1/p"}))
    assert option_name("journalGroupWait") == option_name("journal_group_wait") == "journal-group-wait"


def test_bad_metadata_uri_is_refused_when_applied():
    with pytest.raises(SpecError, match="spec.metadataServiceUri"):
        BookieClusterSpec.from_manifest(manifest(metadataServiceUri="etcd://host:notaport/pybk"))
    with pytest.raises(SpecError, match="must look like etcd://"):
        BookieClusterSpec.from_manifest(manifest(metadataServiceUri="http://etcd:2379"))


def test_tls_and_auth_parse_from_either_certificate_source():
    s = load_manifest(EXAMPLES / "bookiecluster-full.yaml")
    assert s.tls == TlsSpec(secret_name="ledgers-tls", server_name="ledgers.pybk.svc", client_auth=True)
    assert s.auth.secret_name == "ledgers-auth" and s.metadata_service_secret == "etcd-client"
    secure = load_manifest(EXAMPLES / "bookiecluster-secure.yaml")
    assert secure.tls == TlsSpec(issuer_ref=IssuerRef("pybk-ca", IssuerKind.ISSUER, "cert-manager.io"))
    cluster_issuer = BookieClusterSpec.from_manifest(manifest(tls={"issuerRef": {"name": "ca",
                                                                                 "kind": "ClusterIssuer"}}))
    assert cluster_issuer.tls.issuer_ref.kind is IssuerKind.CLUSTER_ISSUER
    assert BookieClusterSpec.from_manifest(manifest()).tls is None


@pytest.mark.parametrize("spec, needle", [
    ({"tls": {"secretName": "a", "issuerRef": {"name": "ca"}}},
     "spec.tls needs exactly one of secretName (an existing kubernetes.io/tls Secret) and issuerRef "
     "(cert-manager issues one), got both"),
    ({"tls": {}}, "spec.tls needs exactly one of secretName"),
    ({"tls": {"secretName": "My_TLS"}}, "spec.tls.secretName 'My_TLS' must be a Kubernetes object name"),
    ({"tls": {"issuerRef": {"kind": "Issuer"}}}, "spec.tls.issuerRef.name is required"),
    ({"tls": {"issuerRef": {"name": "ca", "kind": "Vault"}}},
     "spec.tls.issuerRef.kind must be one of Issuer, ClusterIssuer, got 'Vault'"),
    ({"tls": {"secretName": "t", "serverName": "Bookies!"}}, "spec.tls.serverName 'Bookies!' must be a DNS name"),
    ({"tls": {"secretName": "t", "ca": "x"}}, "spec.tls.ca is not a known field"),
    ({"tls": "on"}, "spec.tls must be a mapping"),
    ({"tls": {"secretName": "t", "clientAuth": "yes"}}, "spec.tls.clientAuth must be true or false"),
    ({"tls": {"secretName": "t"}, "auth": {}}, "spec.auth.secretName is required"),
    ({"auth": {"secretName": "a"}}, "spec.auth needs spec.tls: without TLS the tokens would cross the network"),
    ({"metadataServiceSecret": "etcd creds"}, "spec.metadataServiceSecret 'etcd creds' must be a Kubernetes"),
    ({"tls": {"secretName": "t"}, "config": {"tls-cert": "/x"}}, "spec.config.tls-cert is set by the platform"),
])
def test_invalid_tls_and_auth_are_rejected_naming_the_field(spec, needle):
    with pytest.raises(SpecError) as err:
        BookieClusterSpec.from_manifest(manifest(**spec))
    assert needle in str(err.value)
