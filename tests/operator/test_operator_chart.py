"""The Helm chart renders (Helm's own Go SDK, via helm-python-sdk) with default and documented
values, and everything it renders is valid Kubernetes; its CRD is the repository's CRD."""
from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pybk.cluster.spec import load_manifest
from pybk.operator import crd, render
from pybk.spark.submit import SparkJob, job_manifests

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
    "secure": {"etcd": {"enabled": True, "tls": {"enabled": True}, "auth": {"enabled": True}},
               "certManager": {"createIssuer": True}, "cluster": {"enabled": True},
               "networkPolicy": {"enabled": True, "clientNamespaceSelector": {"matchLabels": {"team": "a"}}},
               "operator": {"authSecretName": "bookies-auth", "tls": {"serverName": "bookies.pybk-system.svc"}}},
    "secure-own-secrets": {"etcd": {"enabled": True, "tls": {"enabled": True, "secretName": "etcd-tls"},
                                    "clientSecretName": "etcd-client"},
                           "networkPolicy": {"enabled": True},
                           "operator": {"tls": {"secretName": "operator-tls"}}},
}
CERT_MANAGER_KINDS = {"Certificate", "Issuer"}  # not in kubernetes-validate's schemas


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


@pytest.mark.parametrize("kind", sorted(crd.CRD_PATHS))
def test_chart_crds_are_the_repository_crds(kind):
    path = crd.CRD_PATHS[kind]
    assert (CHART / "crds" / path.name).read_text() == path.read_text()


def test_operator_may_manage_bookielogs_and_read_only_named_secrets():
    role = next(d for d in rendered({}) if d["kind"] == "ClusterRole")
    rules = [(set(r["apiGroups"]), set(r["resources"]), set(r["verbs"])) for r in role["rules"]]
    logs = [v for g, r, v in rules if "pybk.io" in g and {"bookielogs", "bookielogs/status", "bookielogs/finalizers"} <= r]
    assert logs and {"get", "list", "watch", "patch"} <= logs[0]
    assert [v for g, r, v in rules if "" in g and "secrets" in r] == [{"get"}]     # by name: no list, no watch


@pytest.mark.parametrize("name", sorted(VALUES))
def test_chart_renders_valid_manifests(name):
    docs = rendered(VALUES[name])
    kinds = [d["kind"] for d in docs]
    assert "Deployment" in kinds and "ClusterRole" in kinds
    for doc in docs:
        if doc["kind"] == "BookieCluster":
            assert crd.admit(doc)[1] == []
            continue
        if doc["kind"] in CERT_MANAGER_KINDS:
            assert doc["apiVersion"] == "cert-manager.io/v1" and doc["spec"], doc["metadata"]["name"]
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


def one(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def container(docs: list[dict], kind: str, name: str) -> dict:
    return one(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]


def selects(selector: dict, labels: dict) -> bool:
    """A matchLabels label selector (all the chart uses) against a pod's labels."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def admitted(policy: dict, labels: dict, same_namespace: bool = True, namespace_labels: dict | None = None) -> bool:
    """Whether a pod with `labels` may connect to the pods `policy` selects (ingress rules)."""
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                ns_ok = selects(peer["namespaceSelector"], namespace_labels or {})
            else:
                ns_ok = same_namespace
            if ns_ok and selects(peer.get("podSelector", {}), labels):
                return True
    return False


def pod_labels() -> dict[str, dict]:
    """The labels of every kind of pod near pybk, as their manifests set them."""
    docs = rendered(VALUES["secure"])
    spec = load_manifest(ROOT / "examples/bookiecluster-secure.yaml")
    spark = job_manifests(SparkJob(cluster="secure", namespace="pybk-system", metadata_uri="etcd://e:2379/p",
                                   job_file="ledger_stats.py"))
    return {
        "operator": one(docs, "Deployment", "pybk-operator")["spec"]["template"]["metadata"]["labels"],
        "autorecovery": render.autorecovery(spec)["spec"]["template"]["metadata"]["labels"],
        "bookie": render.stateful_set(spec, "etcd://e:2379/p", 3)["spec"]["template"]["metadata"]["labels"],
        "spark-driver": spark[1]["spec"]["template"]["metadata"]["labels"],
        "client": {"app": "orders", "pybk.io/client": "true"},
        "etcd": one(docs, "StatefulSet", "pybk-etcd")["spec"]["template"]["metadata"]["labels"],
        "etcd-auth": one(docs, "Job", "pybk-etcd-auth")["spec"]["template"]["metadata"]["labels"],
        "stranger": {"app": "orders"},
    }


def test_network_policy_admits_only_pybk_pods_to_bookies():
    docs, pods = rendered(VALUES["secure"]), pod_labels()
    policy = one(docs, "NetworkPolicy", "pybk-bookies")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert selects(policy["spec"]["podSelector"], pods["bookie"])
    assert not selects(policy["spec"]["podSelector"], pods["autorecovery"])
    allowed = {name for name, labels in pods.items() if admitted(policy, labels)}
    assert allowed == {"operator", "autorecovery", "spark-driver", "client", "etcd-auth"}
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} == {render.GRPC_PORT, render.HTTP_PORT}


def test_network_policy_admits_bookies_and_pybk_pods_to_etcd():
    docs, pods = rendered(VALUES["secure"]), pod_labels()
    policy = one(docs, "NetworkPolicy", "pybk-etcd")
    assert selects(policy["spec"]["podSelector"], pods["etcd"])
    allowed = {name for name, labels in pods.items() if admitted(policy, labels)}
    assert allowed == {"operator", "autorecovery", "spark-driver", "client", "bookie", "etcd-auth"}
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [2379]


def test_network_policy_admits_labelled_clients_of_other_namespaces_only_when_selected():
    docs, pods = rendered(VALUES["secure"]), pod_labels()
    policy = one(docs, "NetworkPolicy", "pybk-bookies")
    assert admitted(policy, pods["client"], same_namespace=False, namespace_labels={"team": "a"})
    assert not admitted(policy, pods["client"], same_namespace=False, namespace_labels={"team": "b"})
    assert not admitted(policy, pods["stranger"], same_namespace=False, namespace_labels={"team": "a"})
    own = one(rendered(VALUES["secure-own-secrets"]), "NetworkPolicy", "pybk-bookies")
    assert not admitted(own, pods["client"], same_namespace=False, namespace_labels={"team": "a"})


def test_network_policy_only_when_enabled():
    for name in ("defaults", "try-it-out"):
        assert "NetworkPolicy" not in {d["kind"] for d in rendered(VALUES[name])}, name


def test_cert_manager_issuer_is_the_one_the_secure_example_names():
    docs = rendered(VALUES["secure"])
    ref = load_manifest(ROOT / "examples/bookiecluster-secure.yaml").tls.issuer_ref
    issuer = one(docs, "Issuer", ref.name)
    ca = one(docs, "Certificate", "pybk-ca")
    assert issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    assert ca["spec"]["isCA"] is True
    assert "selfSigned" in one(docs, "Issuer", ca["spec"]["issuerRef"]["name"])["spec"]
    assert "Issuer" not in {d["kind"] for d in rendered(VALUES["try-it-out"])}


def test_bundled_etcd_serves_tls_and_clients_use_its_credentials_files():
    docs = rendered(VALUES["secure"])
    etcd = container(docs, "StatefulSet", "pybk-etcd")
    assert "--listen-client-urls=https://0.0.0.0:2379" in etcd["command"]
    assert {"--cert-file=/etc/etcd/tls/tls.crt", "--key-file=/etc/etcd/tls/tls.key"} <= set(etcd["command"])
    assert etcd["readinessProbe"]["httpGet"]["port"] == "metrics"  # probes stay off the TLS port
    volumes = one(docs, "StatefulSet", "pybk-etcd")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "pybk-etcd-tls", "defaultMode": 0o440}} in volumes
    cert = one(docs, "Certificate", "pybk-etcd-tls")["spec"]
    assert "pybk-etcd.pybk-system.svc" in cert["dnsNames"] and cert["issuerRef"]["name"] == "pybk-ca"
    uri = "etcd://pybk-etcd.pybk-system.svc:2379/pybk?tls_ca=/etc/pybk/etcd/ca.crt&user=pybk&" \
          "password_file=/etc/pybk/etcd/password"
    assert f"--default-metadata-uri={uri}" in container(docs, "Deployment", "pybk-operator")["args"]
    cluster = one(docs, "BookieCluster", "bookies")["spec"]
    assert (cluster["metadataServiceUri"], cluster["metadataServiceSecret"]) == (uri, "pybk-etcd-client")


def test_operator_mounts_its_client_credentials_as_files():
    docs = rendered(VALUES["secure"])
    op = one(docs, "Deployment", "pybk-operator")["spec"]["template"]["spec"]
    c = op["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {"PYBK_TLS_CA": "/etc/pybk/tls/ca.crt", "PYBK_TLS_CERT": "/etc/pybk/tls/tls.crt",
                   "PYBK_TLS_KEY": "/etc/pybk/tls/tls.key", "PYBK_TLS_SERVER_NAME": "bookies.pybk-system.svc",
                   "PYBK_TOKEN_FILE": "/etc/pybk/auth/admin.token"}
    secrets = {v["name"]: v["secret"] for v in op["volumes"] if "secret" in v}
    assert secrets["tls"]["secretName"] == "pybk-operator-tls"  # the chart's Certificate
    assert one(docs, "Certificate", "pybk-operator-tls")["spec"]["usages"][-1] == "client auth"
    assert secrets["auth"]["secretName"] == "bookies-auth"
    assert secrets["auth"]["items"] == [{"key": "admin.token", "path": "admin.token"}]
    assert secrets["etcd"]["secretName"] == "pybk-etcd-client"
    assert {m["mountPath"] for m in c["volumeMounts"] if m.get("readOnly")} == {
        "/etc/pybk/tls", "/etc/pybk/auth", "/etc/pybk/etcd"}
    own = one(rendered(VALUES["secure-own-secrets"]), "Deployment", "pybk-operator")["spec"]["template"]["spec"]
    assert {v["name"]: v["secret"]["secretName"] for v in own["volumes"] if "secret" in v} == {
        "tls": "operator-tls", "etcd": "etcd-client"}


def test_without_security_values_nothing_is_mounted_or_set():
    docs = rendered(VALUES["try-it-out"])
    op = one(docs, "Deployment", "pybk-operator")["spec"]["template"]["spec"]
    assert "env" not in op["containers"][0] and [v["name"] for v in op["volumes"]] == ["tmp"]
    etcd = container(docs, "StatefulSet", "pybk-etcd")
    assert "--listen-client-urls=http://0.0.0.0:2379" in etcd["command"]
    assert not [a for a in etcd["command"] if a.startswith("--cert-file")]
    assert "metadataServiceSecret" not in one(docs, "BookieCluster", "bookies")["spec"]
    assert not {"Certificate", "Issuer", "NetworkPolicy"} & {d["kind"] for d in docs}


def test_etcd_tls_without_a_certificate_source_is_refused():
    with pytest.raises(Exception, match="etcd.tls.enabled needs etcd.tls.secretName"):
        rendered({"etcd": {"enabled": True, "tls": {"enabled": True}}})


def test_etcd_auth_job_turns_auth_on_with_password_files():
    docs = rendered(VALUES["secure"])
    job = one(docs, "Job", "pybk-etcd-auth")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["python", "-m", "pybk.meta.etcd_auth"]
    assert c["args"] == ["--metadata-uri=etcd://pybk-etcd.pybk-system.svc:2379/pybk?tls_ca=/etc/pybk/etcd/ca.crt",
                         "--root-password-file=/etc/pybk/etcd-root/password",
                         "--user=pybk=/etc/pybk/etcd/password:readwrite"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"etcd": "pybk-etcd-client", "etcd-root": "pybk-etcd-root"}
    assert "env" not in c  # passwords only as files
    no_job = {"etcd": {"enabled": True, "auth": {"enabled": True, "setupJob": False}}}
    for values in (VALUES["try-it-out"], VALUES["secure-own-secrets"], no_job):
        assert "Job" not in {d["kind"] for d in rendered(values)}
