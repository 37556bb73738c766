"""Spark jobs in the cluster, checked without a cluster: the Spark image's entrypoint builds the
commands Spark's own images run, the chart's Spark RBAC, the example Jobs (kubernetes-validate) and
SparkApplications (the Spark operator's CRD schema), and `pybk spark submit`'s manifests."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pybk.security.settings import ENV
from pybk.spark.submit import (APP_LABEL, BLOCK_MANAGER_PORT, DRIVER_LABEL, DRIVER_PORT, IMAGE_JAR, IMAGE_JOBS_DIR, MASTER,
                               SparkJob, SubmitError, job_manifests, job_name, metadata_uri_of,
                               spark_conf)

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "spark_image" / "entrypoint.sh"
EXAMPLES = ROOT / "examples" / "spark"
JOB_EXAMPLES = sorted(EXAMPLES.glob("job-*.yaml"))
APP_EXAMPLES = sorted(EXAMPLES.glob("sparkapplication-*.yaml"))
APP_SCHEMA = Path(__file__).parent / "fixtures" / "sparkapplication-v1beta2-schema.yaml"
K8S_VERSIONS = ("1.29.0", "1.33.0")
URI = "etcd://pybk-etcd.pybk-system.svc:2379/pybk"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def entrypoint(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """The entrypoint in dry-run mode (prints the command), with only the given variables set."""
    base = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYBK_SPARK_DRY_RUN": "1",
            "SPARK_HOME": "/opt/spark-home", "JAVA_HOME": "/usr/lib/jvm/java-17"}
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=30)


# What Spark's driver sets on an executor pod (BasicExecutorFeatureStep), 12 JVM options.
EXECUTOR_ENV = {
    "SPARK_USER": "pybk", "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@demo-ledger-stats.default.svc:7078",
    "SPARK_EXECUTOR_CORES": "1", "SPARK_EXECUTOR_MEMORY": "1024m", "SPARK_APPLICATION_ID": "spark-0f1e2d",
    "SPARK_CONF_DIR": "/opt/spark/conf", "SPARK_EXECUTOR_ID": "3", "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_EXECUTOR_POD_IP": "10.244.1.7", "SPARK_EXECUTOR_POD_NAME": "demo-ledger-stats-exec-3",
    **{f"SPARK_JAVA_OPT_{i}": f"-Dspark.opt{i}=v {i}" for i in range(12)},
}


def test_entrypoint_executor_runs_the_kubernetes_executor_backend():
    out = entrypoint(["executor"], EXECUTOR_ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "/usr/lib/jvm/java-17/bin/java",
        *[f"-Dspark.opt{i}=v {i}" for i in range(12)],          # numeric order, spaces kept
        "-Xms1024m", "-Xmx1024m",
        "-cp", f"/opt/spark/conf::/opt/spark-home/jars/*:{ROOT}:",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        "--driver-url", EXECUTOR_ENV["SPARK_DRIVER_URL"], "--executor-id", "3", "--cores", "1",
        "--app-id", "spark-0f1e2d", "--hostname", "10.244.1.7", "--resourceProfileId", "0",
        "--podName", "demo-ledger-stats-exec-3"]


def test_entrypoint_driver_submits_in_client_mode_bound_to_the_pod_ip():
    # The driver pod's arguments in cluster mode (DriverCommandFeatureStep), for a Python job.
    args = ["driver", "--properties-file", "/opt/spark/conf/spark.properties",
            "--class", "org.apache.spark.deploy.PythonRunner", "local:///opt/pybk/spark/ledger_stats.py",
            "-m", URI]
    out = entrypoint(args, {"SPARK_DRIVER_BIND_ADDRESS": "10.244.2.9"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "/opt/spark-home/bin/spark-submit",
        "--conf", "spark.driver.bindAddress=10.244.2.9",
        "--conf", "spark.executorEnv.SPARK_DRIVER_POD_IP=10.244.2.9",
        "--deploy-mode", "client", *args[1:]]


def test_entrypoint_refuses_an_executor_without_sparks_variables():
    env = {k: v for k, v in EXECUTOR_ENV.items() if k != "SPARK_DRIVER_URL"}
    out = entrypoint(["executor"], env)
    assert out.returncode == 2
    assert out.stderr.splitlines()[0].startswith("spark-entrypoint: SPARK_DRIVER_URL is not set")


def test_entrypoint_passes_other_commands_through():
    out = entrypoint(["spark-submit", "--master", MASTER, "job.py"], {})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["spark-submit", "--master", MASTER, "job.py"]


def test_entrypoint_finds_the_pip_pysparks_spark_submit():
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYBK_SPARK_DRY_RUN": "1",
           "SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1"}      # no SPARK_HOME, as in the image
    out = subprocess.run(["bash", str(ENTRYPOINT), "driver", "job.py"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    spark_submit = Path(out.stdout.splitlines()[0])
    import pyspark
    assert spark_submit == Path(pyspark.__file__).parent / "bin" / "spark-submit"
    assert os.access(spark_submit, os.X_OK)


def test_pip_pyspark_carries_the_executor_backend_the_entrypoint_starts():
    import pyspark
    jars = list((Path(pyspark.__file__).parent / "jars").glob("spark-kubernetes_*.jar"))
    assert jars, "pip PySpark has no spark-kubernetes jar"
    with zipfile.ZipFile(jars[0]) as jar:
        assert "org/apache/spark/scheduler/cluster/k8s/KubernetesExecutorBackend.class" in jar.namelist()


def test_image_jobs_are_the_repositorys_jobs():
    """Every job the examples run is one the Dockerfile's spark stage copies into the image."""
    lines = (ROOT / "Dockerfile").read_text().split("AS spark", 1)[1].splitlines()
    copy = next(line.split()[1:] for line in lines if line.startswith("COPY spark/"))
    in_image = {Path(src).name for src in copy[:-1]}
    assert copy[-1].rstrip("/") == IMAGE_JOBS_DIR and all((ROOT / src).is_file() for src in copy[:-1])
    used = {a["spec"]["mainApplicationFile"].removeprefix(f"local://{IMAGE_JOBS_DIR}/")
            for p in APP_EXAMPLES for a in docs(p)}
    used |= {arg.removeprefix(f"{IMAGE_JOBS_DIR}/") for p in JOB_EXAMPLES for d in docs(p)
             if d["kind"] == "Job" for arg in d["spec"]["template"]["spec"]["containers"][0]["args"]
             if arg.startswith(IMAGE_JOBS_DIR)}
    assert used == in_image == {"ledger_stats.py", "export_parquet.py", "log_counts.py"}


# --- the chart's Spark RBAC -------------------------------------------------------------------

def chart_docs(values: dict) -> list[dict]:
    helm = pytest.importorskip("helm_python",
                               reason="helm-python-sdk (a Helm renderer from PyPI) is not installed")
    with helm.Chart.load(str(ROOT / "charts" / "pybk")) as chart:
        out = chart.render(values, name="pybk", namespace="team-a")
    return [d for name, text in sorted(out.items()) if name.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]


def spark_rbac(objs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in objs if d["kind"] in ("ServiceAccount", "Role", "RoleBinding")
            and d["metadata"]["name"].endswith("spark")}


def test_chart_creates_the_spark_drivers_rbac_in_the_clusters_namespace():
    assert spark_rbac(chart_docs({})) == {}
    objs = spark_rbac(chart_docs({"spark": {"rbac": {"create": True}}, "cluster": {"enabled": True}}))
    assert set(objs) == {"ServiceAccount", "Role", "RoleBinding"}
    for obj in objs.values():
        assert obj["metadata"]["namespace"] == "team-a"      # where the chart's BookieCluster is
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    assert objs["ServiceAccount"]["metadata"]["name"] == "pybk-spark"   # pybk spark submit's default
    binding = objs["RoleBinding"]
    assert binding["roleRef"]["name"] == objs["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pybk-spark", "namespace": "team-a"}]
    granted = {(res, verb) for rule in objs["Role"]["rules"] if rule["apiGroups"] == [""]
               for res in rule["resources"] for verb in rule["verbs"]}
    for res in ("pods", "services", "configmaps", "persistentvolumeclaims"):
        for verb in ("create", "get", "list", "watch", "delete", "deletecollection"):
            assert (res, verb) in granted, (res, verb)


def test_example_rbac_grants_what_the_chart_grants():
    chart = spark_rbac(chart_docs({"spark": {"rbac": {"create": True}}}))
    example = spark_rbac(docs(EXAMPLES / "rbac.yaml"))
    assert example["Role"]["rules"] == chart["Role"]["rules"]
    assert example["RoleBinding"]["roleRef"] == chart["RoleBinding"]["roleRef"]
    for obj in example.values():
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


# --- driver Jobs: examples and pybk spark submit --------------------------------------------

def conf_of(args: list[str]) -> dict[str, str]:
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")


def assert_driver_job(objs: list[dict], service_account: str = "pybk-spark") -> dict[str, str]:
    """A driver Job executors can reach: valid objects; client-mode spark-submit; its headless
    Service selects the Job's pod on the ports and DNS name Spark is told. Returns the settings."""
    for obj in objs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    svc = next(d for d in objs if d["kind"] == "Service")
    job = next(d for d in objs if d["kind"] == "Job")
    pod = job["spec"]["template"]
    container = pod["spec"]["containers"][0]
    args = container["args"]
    assert args[:5] == ["spark-submit", "--master", MASTER, "--deploy-mode", "client"]
    conf = conf_of(args)
    ns = job["metadata"]["namespace"]
    assert svc["metadata"]["namespace"] == ns == conf["spark.kubernetes.namespace"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert conf["spark.driver.host"] == f"{svc['metadata']['name']}.{ns}.svc"
    ports = {p["port"] for p in svc["spec"]["ports"]}
    assert ports == {int(conf["spark.driver.port"]), int(conf["spark.driver.blockManager.port"])}
    assert {p["containerPort"] for p in container["ports"]} == ports
    assert conf["spark.kubernetes.container.image"] == container["image"]
    assert conf["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert pod["spec"]["serviceAccountName"] == service_account
    assert pod["spec"]["restartPolicy"] == "Never"
    return conf


@pytest.mark.parametrize("path", JOB_EXAMPLES, ids=lambda p: p.name)
def test_example_job_runs_a_reachable_client_mode_driver(path):
    objs = docs(path)
    conf = assert_driver_job(objs)
    job = next(d for d in objs if d["kind"] == "Job")
    built = spark_conf(SparkJob(cluster="demo", namespace="default", metadata_uri=URI,
                                job_file=path.stem.removeprefix("job-").replace("-", "_") + ".py"))
    assert conf.items() >= built.items(), "the example lacks settings `pybk spark submit` makes"
    assert job["metadata"]["name"] == job_name("demo", path.stem.removeprefix("job-"))
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    uri_env = next(e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
                   if e["name"] == "PYBK_METADATA_URI")
    assert uri_env["valueFrom"]["configMapKeyRef"] == {"name": "demo-config", "key": "metadataServiceUri"}
    assert args[args.index("-m") + 1] == "$(PYBK_METADATA_URI)"


def test_submit_builds_a_driver_job_for_a_cluster():
    job = SparkJob(cluster="demo", namespace="team-a", metadata_uri=URI, job_file="ledger_stats.py",
                   args=("--ledgers", "1-9", "-o", "json"), executors=3, conf={"spark.ui.enabled": "false"})
    objs = job_manifests(job)
    conf = assert_driver_job(objs)
    args = objs[1]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-7:] == [f"{IMAGE_JOBS_DIR}/ledger_stats.py", "-m", URI, "--ledgers", "1-9", "-o", "json"]
    assert conf["spark.executor.instances"] == "3" and conf["spark.ui.enabled"] == "false"
    # the image's jar (the JVM log reader) on the driver's and the executors' classpath
    assert conf["spark.driver.extraClassPath"] == conf["spark.executor.extraClassPath"] == IMAGE_JAR
    assert f"PYBK_SPARK_JAR={IMAGE_JAR}" in (ROOT / "Dockerfile").read_text()
    assert objs[1]["metadata"]["name"] == "demo-ledger-stats"
    assert objs[0]["spec"]["selector"] == {DRIVER_LABEL: "demo-ledger-stats"}
    assert {p["port"] for p in objs[0]["spec"]["ports"]} == {DRIVER_PORT, BLOCK_MANAGER_PORT}


def test_submit_runs_the_log_counts_job_from_the_image():
    job = SparkJob(cluster="demo", namespace="default", metadata_uri=URI, job_file="log_counts.py",
                   args=("--log", "orders.*", "/data/order-counts"))
    objs = job_manifests(job)
    assert_driver_job(objs)
    args = objs[1]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-6:] == [f"{IMAGE_JOBS_DIR}/log_counts.py", "-m", URI, "--log", "orders.*", "/data/order-counts"]
    assert objs[1]["metadata"]["name"] == "demo-log-counts"


def test_submit_reads_the_metadata_uri_the_operator_published():
    cluster = {"spec": {"metadataServiceUri": ""}}
    cm = {"data": {"metadataServiceUri": URI}}
    assert metadata_uri_of(cluster, cm, "demo", "default") == URI
    assert metadata_uri_of({"spec": {"metadataServiceUri": "etcd://e:2379/x"}}, None, "demo", "default") \
        == "etcd://e:2379/x"
    with pytest.raises(SubmitError, match="^BookieCluster default/demo not found"):
        metadata_uri_of(None, cm, "demo", "default")
    with pytest.raises(SubmitError, match="^BookieCluster default/demo has no metadata URI yet"):
        metadata_uri_of(cluster, None, "demo", "default")


def pybk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    return subprocess.run([sys.executable, "-m", "pybk", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**clean, **(env or {})})


def test_submit_command_prints_the_job_with_the_jobs_arguments(child_processes):
    out = pybk("spark", "submit", "-n", "team-a", "--metadata-uri", URI, "--executors", "4",
               "demo", "export_parquet.py", "/data/ledgers", "--ledgers", "all")
    assert out.returncode == 0, out.stderr
    printed = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert printed == job_manifests(SparkJob(cluster="demo", namespace="team-a", metadata_uri=URI,
                                             job_file="export_parquet.py", executors=4,
                                             args=("/data/ledgers", "--ledgers", "all")))


def test_submit_command_without_kubernetes_access_says_so(child_processes):
    out = pybk("spark", "submit", "demo", "ledger_stats.py", env={"KUBECONFIG": "/nonexistent/kubeconfig"})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("pybk spark submit: no Kubernetes credentials")


# --- SparkApplications against the Spark operator's CRD -----------------------------------

def app_validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(yaml.safe_load(APP_SCHEMA.read_text()))


@pytest.mark.parametrize("path", APP_EXAMPLES, ids=lambda p: p.name)
def test_example_sparkapplication_fits_the_spark_operators_crd(path):
    (app,) = docs(path)
    assert (app["apiVersion"], app["kind"]) == ("sparkoperator.k8s.io/v1beta2", "SparkApplication")
    assert [e.message for e in app_validator().iter_errors(app)] == []
    spec = app["spec"]
    assert spec["mainApplicationFile"].startswith(f"local://{IMAGE_JOBS_DIR}/")
    assert spec["arguments"][:2] == ["-m", URI]
    assert spec["driver"]["serviceAccount"] == "pybk-spark"


def test_sparkapplication_schema_catches_a_misspelt_field():
    (app,) = docs(APP_EXAMPLES[0])
    app["spec"]["executor"]["instance"] = app["spec"]["executor"].pop("instances")
    app["spec"]["mode"] = "local"
    messages = sorted(e.message for e in app_validator().iter_errors(app))
    assert any("'instance' was unexpected" in m for m in messages)
    assert any("'local' is not one of" in m for m in messages)


def test_submit_mounts_client_secrets_into_the_driver_and_every_executor():
    job = SparkJob(cluster="demo", namespace="default", metadata_uri=URI, job_file="ledger_stats.py",
                   tls_secret="spark-tls", tls_server_name="demo.default.svc", token_secret="spark-token",
                   etcd_secret="etcd-reader")
    objs = job_manifests(job)
    conf = assert_driver_job(objs)
    pod = objs[1]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    mounts = {v["secret"]["secretName"]: m["mountPath"] for v in pod["volumes"] for m in c["volumeMounts"]
              if m["name"] == v["name"] and m["readOnly"]}
    assert mounts == {"spark-tls": "/etc/pybk/tls", "spark-token": "/etc/pybk/token", "etcd-reader": "/etc/pybk/etcd"}
    expected = {ENV["tls_ca"]: "/etc/pybk/tls/ca.crt", ENV["tls_cert"]: "/etc/pybk/tls/tls.crt",
                ENV["tls_key"]: "/etc/pybk/tls/tls.key", ENV["tls_server_name"]: "demo.default.svc",
                ENV["token_file"]: "/etc/pybk/token/token"}
    assert {e["name"]: e["value"] for e in c["env"] if "value" in e} == expected
    assert {k.removeprefix("spark.kubernetes.executor.secrets."): v for k, v in conf.items()
            if k.startswith("spark.kubernetes.executor.secrets.")} == mounts
    assert {k.removeprefix("spark.executorEnv."): v for k, v in conf.items()
            if k.startswith("spark.executorEnv.")} == expected


def test_submit_without_secrets_mounts_nothing():
    objs = job_manifests(SparkJob(cluster="demo", namespace="default", metadata_uri=URI, job_file="ledger_stats.py"))
    conf = assert_driver_job(objs)
    pod = objs[1]["spec"]["template"]["spec"]
    assert "volumes" not in pod and [e["name"] for e in pod["containers"][0]["env"]] == ["POD_NAME"]
    assert not [k for k in conf if k.startswith(("spark.executorEnv.", "spark.kubernetes.executor.secrets."))]


@pytest.mark.parametrize("path", [*JOB_EXAMPLES, None], ids=lambda p: p.name if p else "pybk spark submit")
def test_every_spark_pod_carries_the_label_the_network_policy_admits(path):
    objs = docs(path) if path else job_manifests(SparkJob(cluster="demo", namespace="default", metadata_uri=URI,
                                                          job_file="ledger_stats.py"))
    job = next(d for d in objs if d["kind"] == "Job")
    key, value = APP_LABEL
    assert job["spec"]["template"]["metadata"]["labels"][key] == value  # the driver
    conf = conf_of(job["spec"]["template"]["spec"]["containers"][0]["args"])
    assert conf[f"spark.kubernetes.executor.label.{key}"] == value     # its executors


@pytest.mark.parametrize("path", APP_EXAMPLES, ids=lambda p: p.name)
def test_spark_operator_pods_carry_the_label_the_network_policy_admits(path):
    app = docs(path)[0]["spec"]
    key, value = APP_LABEL
    assert app["driver"]["labels"][key] == value and app["executor"]["labels"][key] == value


def test_submit_command_refuses_one_secret_for_two_purposes(child_processes):
    out = pybk("spark", "submit", "--metadata-uri", URI, "--tls-secret", "s", "--token-secret", "s",
               "demo", "ledger_stats.py")
    assert out.returncode == 2
    assert "must name different Secrets" in out.stderr.splitlines()[0]
