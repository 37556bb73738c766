"""End-to-end tests against a real Kubernetes cluster (kind). Skipped unless one is reachable.

Run: see e2e/README.md. Needs `kubectl`, a cluster in KUBECONFIG, and the pybk image loaded
into it (PYBK_E2E_IMAGE, default pybk:0.1.0).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("PYBK_E2E_IMAGE", "pybk:0.1.0")


def _cluster_reason() -> str | None:
    """Why there is no cluster to test against, or None when there is one."""
    if not shutil.which("kubectl"):
        return "kubectl is not installed"
    config = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if not any(Path(p).exists() for p in config.split(os.pathsep)):
        return f"no kube config ({config}); set KUBECONFIG to a kind cluster's"
    try:
        out = subprocess.run(["kubectl", "get", "--raw", "/readyz"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "the cluster in KUBECONFIG did not answer within 15 s"
    if out.returncode != 0:
        return f"the cluster in KUBECONFIG is not reachable: {out.stderr.strip()[:200]}"
    return None


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    mine = [item for item in items if here in Path(str(item.fspath)).resolve().parents]
    reason = _cluster_reason() if mine else None
    if reason:
        for item in mine:  # this hook sees the whole session's items: skip only e2e's own
            item.add_marker(pytest.mark.skip(reason=f"e2e needs a Kubernetes cluster: {reason}"))


def kubectl(*args: str, input: str | None = None, check: bool = True, timeout: float = 300) -> str:
    out = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def wait_for(what: str, predicate, timeout: float = 900, interval: float = 5):
    """Poll until predicate() returns something truthy; fail naming `what` after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def render_chart(values: dict, namespace: str) -> list[dict]:
    """The chart's templates rendered by Helm's Go SDK (helm-python-sdk)."""
    import helm_python as helm

    with helm.Chart.load(str(ROOT / "charts" / "pybk")) as chart:
        out = chart.render(values, name="pybk", namespace=namespace)
    return [d for name, text in sorted(out.items()) if name.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="session")
def namespace():
    ns = f"pybk-e2e-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    try:
        yield ns
    finally:
        kubectl("delete", "bookieclusters", "--all", "-n", ns, "--wait=true", check=False, timeout=600)
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="session")
def operator(namespace):
    """The chart installed: CRD, operator (watching only the test namespace), single-node etcd."""
    repo, _, tag = IMAGE.rpartition(":")
    kubectl("apply", "--server-side", "-f", str(ROOT / "charts" / "pybk" / "crds" / "bookiecluster.yaml"))
    kubectl("wait", "--for=condition=Established", "crd/bookieclusters.pybk.io", "--timeout=60s")
    docs = render_chart({"image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
                         "etcd": {"enabled": True, "storage": ""},
                         "operator": {"watchNamespaces": [namespace], "refreshInterval": 5}}, namespace)
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
    kubectl("rollout", "status", "-n", namespace, "deployment/pybk-operator", "--timeout=300s")
    kubectl("rollout", "status", "-n", namespace, "statefulset/pybk-etcd", "--timeout=300s")
    try:
        yield f"etcd://pybk-etcd.{namespace}.svc:2379/pybk"
    finally:
        kubectl("delete", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(
            [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]), check=False)


def cluster_status(namespace: str, name: str) -> dict:
    out = kubectl("get", "bookiecluster", name, "-n", namespace, "-o", "json", check=False)
    return (json.loads(out).get("status") or {}) if out else {}


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def ready_with(namespace: str, name: str, replicas: int):
    """A wait_for predicate: BookieCluster name is Ready with exactly `replicas` writable bookies."""
    def check():
        st = cluster_status(namespace, name)
        ok = (condition(st, "Ready").get("status") == "True" and st.get("readyReplicas") == replicas
              and st.get("replicas") == replicas and len(st.get("writableBookies") or []) == replicas)
        return st if ok else None
    return check


def run_job(namespace: str, name: str, script: str, metadata_uri: str, timeout: float = 600) -> str:
    """Run a Python script in the pybk image inside the cluster; return its stdout."""
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"backoffLimit": 0, "template": {"spec": {
               "restartPolicy": "Never",
               "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
               "containers": [{"name": "client", "image": IMAGE, "imagePullPolicy": "Never",
                               "command": ["python", "-c", script],
                               "env": [{"name": "PYBK_METADATA_URI", "value": metadata_uri}]}]}}}}
    kubectl("apply", "-f", "-", input=json.dumps(job))
    kubectl("wait", "-n", namespace, f"job/{name}", "--for=condition=Complete", f"--timeout={int(timeout)}s",
            timeout=timeout + 30)
    return kubectl("logs", "-n", namespace, f"job/{name}")
