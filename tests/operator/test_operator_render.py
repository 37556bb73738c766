"""Every manifest the operator renders is valid Kubernetes (strict) for 1.29 and 1.33."""
from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pybk.cluster.spec import BookieClusterSpec, load_manifest
from pybk.operator import render
from pybk.security.settings import ENV

ROOT = Path(__file__).resolve().parents[2]
OWNER = {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "name": "x",
         "uid": "0b6d0d36-3c8e-4b0b-9b4a-6f4a3c1e2d10"}
SPECS = {
    "minimal": lambda: load_manifest(ROOT / "examples/bookiecluster-minimal.yaml"),
    "full": lambda: load_manifest(ROOT / "examples/bookiecluster-full.yaml"),
    "no-zones": lambda: BookieClusterSpec.from_manifest({
        "apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": "flat"},
        "spec": {"zoneSpreading": {"enabled": False}, "autorecovery": {"replicas": 0}}}),
    "secure": lambda: load_manifest(ROOT / "examples/bookiecluster-secure.yaml"),
}
BASE_KINDS = {"ServiceAccount", "Role", "RoleBinding", "Service", "ConfigMap", "StatefulSet",
              "PodDisruptionBudget", "Deployment"}
# what each workload's container runs as, in the pybk processes' option names
SECURE_ENV = {ENV["tls_cert"]: "/etc/pybk/tls/tls.crt", ENV["tls_key"]: "/etc/pybk/tls/tls.key",
              ENV["tls_ca"]: "/etc/pybk/tls/ca.crt", ENV["token_file"]: "/etc/pybk/auth/admin.token",
              render._env_name("auth_file"): "/etc/pybk/auth/auth.yaml"}


def workloads(spec: BookieClusterSpec) -> dict[str, dict]:
    """The pod templates' specs of the bookie StatefulSet and the autorecovery Deployment."""
    return {o["kind"]: o["spec"]["template"]["spec"] for o in render.render(spec, "etcd://e:2379/p")
            if o["kind"] in ("StatefulSet", "Deployment")}


def probes(container: dict) -> list[dict]:
    return [container[p]["httpGet"] for p in ("readinessProbe", "livenessProbe", "startupProbe") if p in container]


@pytest.mark.parametrize("version", ["1.29.0", "1.33.0"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_rendered_manifest_passes_strict_validation(name, version):
    spec = SPECS[name]()
    objs = render.render(spec, "etcd://etcd:2379/pybk", owner=OWNER)
    cert_manager = {"Certificate"} if spec.tls and spec.tls.issuer_ref else set()
    assert {o["kind"] for o in objs} == BASE_KINDS | cert_manager
    for obj in objs:
        if obj["kind"] not in cert_manager:  # cert-manager's kinds are not in kubernetes-validate
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


@pytest.mark.parametrize("name, secret, server_name", [
    ("full", "ledgers-tls", "ledgers.pybk.svc"),     # spec.tls.secretName and serverName
    ("secure", "secure-tls", "secure.default.svc"),  # the Certificate's Secret, its Service's name
])
def test_tls_and_auth_secrets_are_mounted_into_bookies_and_autorecovery(name, secret, server_name):
    spec = SPECS[name]()
    for kind, pod in workloads(spec).items():
        c = pod["containers"][0]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == secret, kind
        assert volumes["auth"]["secret"]["secretName"] == spec.auth.secret_name, kind
        assert all(v["secret"]["defaultMode"] == 0o440 for v in volumes.values() if "secret" in v), kind
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/pybk/tls", "readOnly": True}, kind
        assert mounts["auth"] == {"name": "auth", "mountPath": "/etc/pybk/auth", "readOnly": True}, kind
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert {k: env.get(k) for k in SECURE_ENV} == SECURE_ENV, kind
        assert env[ENV["tls_server_name"]] == server_name, kind
        assert {p["scheme"] for p in probes(c)} == {"HTTPS"}, kind
        assert {p["path"] for p in probes(c)} <= {"/heartbeat", "/api/v1/bookie/is_ready"}, kind


def test_client_auth_makes_bookies_require_client_certificates():
    client_auth = render._env_name("tls_client_auth")
    for name, expected in (("full", "true"), ("secure", None), ("minimal", None)):
        for kind, pod in workloads(SPECS[name]()).items():
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            assert env.get(client_auth) == expected, (name, kind)


def test_secrets_reach_pods_only_as_files():
    spec = SPECS["full"]()
    for kind, pod in workloads(spec).items():
        for e in pod["containers"][0]["env"]:
            assert "secretKeyRef" not in e.get("valueFrom", {}), (kind, e)
            assert "envFrom" not in pod["containers"][0], kind


def test_metadata_service_secret_is_mounted_where_the_uri_options_point():
    spec = SPECS["full"]()
    for kind, pod in workloads(spec).items():
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["etcd"]["secret"]["secretName"] == "etcd-client", kind
        assert {"name": "etcd", "mountPath": render.ETCD_DIR, "readOnly": True} in pod["containers"][0]["volumeMounts"]


def test_without_tls_or_auth_nothing_is_mounted_and_probes_stay_http():
    spec = SPECS["minimal"]()
    security = set(SECURE_ENV) | {ENV["tls_server_name"]}
    for kind, pod in workloads(spec).items():
        c = pod["containers"][0]
        assert [v["name"] for v in pod["volumes"]] == ["tmp"], kind
        assert [m["mountPath"] for m in c["volumeMounts"] if m["mountPath"].startswith("/etc/pybk")] == [], kind
        assert security.isdisjoint(e["name"] for e in c["env"]), kind
        assert {p["scheme"] for p in probes(c)} == {"HTTP"}, kind
    assert "tlsSecret" not in render.config_map(spec, "etcd://e:2379/p")["data"]


def test_issuer_ref_requests_a_certificate_for_every_pod_name():
    spec = SPECS["secure"]()
    cert = render.certificate(spec, OWNER)
    assert cert["apiVersion"] == "cert-manager.io/v1" and cert["kind"] == "Certificate"
    assert cert["metadata"]["ownerReferences"][0]["uid"] == OWNER["uid"]
    c = cert["spec"]
    assert c["secretName"] == "secure-tls"
    assert c["issuerRef"] == {"name": "pybk-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert {"server auth", "client auth"} <= set(c["usages"])
    names = set(c["dnsNames"])
    assert {"*.secure.default.svc", "*.secure.default.svc.cluster.local", "secure.default.svc",
            "secure-autorecovery.default.svc"} <= names
    # every bookie id's host is covered by the wildcard, and the default server name is in it
    host = render.bookie_id(spec, 7).rsplit(":", 1)[0]
    assert host.split(".", 1)[1] == "secure.default.svc" and render.server_name(spec) in names
    assert render.config_map(spec, "etcd://e:2379/p")["data"]["tlsServerName"] == "secure.default.svc"


def test_certificate_names_the_server_name_clients_check():
    import dataclasses

    from pybk.cluster.spec import TlsSpec
    spec = SPECS["secure"]()
    spec = dataclasses.replace(spec, tls=TlsSpec(issuer_ref=spec.tls.issuer_ref, server_name="bookies.example.com"))
    assert "bookies.example.com" in render.certificate(spec)["spec"]["dnsNames"]
    env = {e["name"]: e["value"] for e in workloads(spec)["StatefulSet"]["containers"][0]["env"] if "value" in e}
    assert env[ENV["tls_server_name"]] == "bookies.example.com"


def test_no_certificate_without_issuer_ref():
    assert render.certificate(SPECS["full"]()) is None and render.certificate(SPECS["minimal"]()) is None
    assert "Certificate" not in {k for _, k, _ in render.companions(SPECS["full"]())}
    assert ("cert-manager.io/v1", "Certificate", "secure-tls") in render.companions(SPECS["secure"]())


def test_turning_tls_on_rolls_the_bookies():
    plain = SPECS["minimal"]()
    import dataclasses

    from pybk.cluster.spec import TlsSpec
    secured = dataclasses.replace(plain, tls=TlsSpec(secret_name="demo-tls"))
    assert plain.restart_hash() != secured.restart_hash()
    assert render.stateful_set(secured, "etcd://e:2379/p", 3)["spec"]["template"]["metadata"]["annotations"][
        render.CONFIG_HASH] == secured.restart_hash()
