"""`pybk spark submit`: run a Spark job over a BookieCluster's ledgers inside Kubernetes.

The driver runs in the pod of a Kubernetes Job (`spark-submit --deploy-mode client`); a headless
Service gives it a DNS name executors connect back to; executors are pods Spark's driver starts
with the image's entrypoint (`spark_image/entrypoint.sh`). Executors reach etcd and every bookie by
in-cluster DNS: the metadata URI names etcd's Service, and bookie ids are
`<pod>.<cluster>.<namespace>.svc:3181`.

`job_manifests` is the pure part (Service + Job for a `SparkJob`); the Kubernetes reads and the
apply are at the edge (`run`). Who may call it: anyone whose kube credentials may read the
BookieCluster and its ConfigMap (and, with --apply, create Services and Jobs in its namespace).

A secured cluster (docs/security.md): `--tls-secret`, `--token-secret` and `--etcd-secret` mount
Secrets read-only into the driver and every executor and set the client's `PYBK_*` variables to
the files; the TLS server name defaults to the one the operator published in the ConfigMap.
Every driver and executor pod is labelled `app.kubernetes.io/name: pybk-spark`, which the chart's
NetworkPolicy admits to bookies and etcd.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from pybk.cluster.spec import GROUP, VERSION
from pybk.security.settings import ENV as CLIENT_ENV
from pybk.spark.jvm import classpath_conf

IMAGE = "pybk-spark:0.1.0"
IMAGE_JOBS_DIR = "/opt/pybk/spark"
IMAGE_JAR = "/opt/pybk/pybk-spark.jar"   # pybk's Spark jar in the image (Dockerfile: PYBK_SPARK_JAR)
SERVICE_ACCOUNT = "pybk-spark"
MASTER = "k8s://https://kubernetes.default.svc"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
DRIVER_LABEL = "pybk.io/spark-driver"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
APP_LABEL = ("app.kubernetes.io/name", "pybk-spark")
TLS_DIR = "/etc/pybk/tls"       # a kubernetes.io/tls Secret: tls.crt, tls.key, ca.crt
TOKEN_DIR = "/etc/pybk/token"   # a Secret with the key `token`
ETCD_DIR = "/etc/pybk/etcd"     # the files the metadata URI's options name


class SubmitError(Exception):
    """The job cannot be built or submitted; the message names the cause."""


@dataclass(frozen=True)
class SparkJob:
    """One Spark job over a BookieCluster's ledgers, driver in a Job's pod."""

    cluster: str
    namespace: str
    metadata_uri: str
    job_file: str
    args: tuple[str, ...] = ()
    image: str = IMAGE
    service_account: str = SERVICE_ACCOUNT
    executors: int = 2
    executor_cores: int = 1
    executor_memory: str = "1g"
    name: str = ""
    conf: dict[str, str] = field(default_factory=dict)
    tls_secret: str | None = None
    tls_server_name: str | None = None
    token_secret: str | None = None
    etcd_secret: str | None = None

    @property
    def secrets(self) -> dict[str, str]:
        """Secret name -> where the driver and executors mount it."""
        return {name: path for name, path in ((self.tls_secret, TLS_DIR), (self.token_secret, TOKEN_DIR),
                                              (self.etcd_secret, ETCD_DIR)) if name}

    @property
    def client_env(self) -> dict[str, str]:
        """The client security variables (file names only) the job's pybk client reads."""
        env = {}
        if self.tls_secret:
            env.update({CLIENT_ENV["tls_ca"]: f"{TLS_DIR}/ca.crt", CLIENT_ENV["tls_cert"]: f"{TLS_DIR}/tls.crt",
                        CLIENT_ENV["tls_key"]: f"{TLS_DIR}/tls.key"})
            if self.tls_server_name:
                env[CLIENT_ENV["tls_server_name"]] = self.tls_server_name
        if self.token_secret:
            env[CLIENT_ENV["token_file"]] = f"{TOKEN_DIR}/token"
        return env

    @property
    def job_name(self) -> str:
        return self.name or job_name(self.cluster, self.job_file)

    @property
    def job_path(self) -> str:
        """The job file's path in the image: a bare file name is one of the image's jobs."""
        return self.job_file if "/" in self.job_file else f"{IMAGE_JOBS_DIR}/{self.job_file}"


def job_name(cluster: str, job_file: str) -> str:
    """`<cluster>-<job file stem>` as a DNS label (it names the Job, its Service and pods)."""
    stem = job_file.rsplit("/", 1)[-1].removesuffix(".py")
    name = re.sub(r"[^a-z0-9-]+", "-", f"{cluster}-{stem}".lower()).strip("-")
    return name[:52].rstrip("-")


def spark_conf(job: SparkJob) -> dict[str, str]:
    """The Spark settings for a client-mode driver in a pod, executors started by it."""
    ns = job.namespace
    conf = {
        "spark.kubernetes.namespace": ns,
        "spark.kubernetes.container.image": job.image,
        "spark.kubernetes.driver.pod.name": "$(POD_NAME)",
        "spark.kubernetes.authenticate.caCertFile": f"{SA_DIR}/ca.crt",
        "spark.kubernetes.authenticate.oauthTokenFile": f"{SA_DIR}/token",
        "spark.kubernetes.executor.podNamePrefix": job.job_name,
        "spark.driver.host": f"{job.job_name}.{ns}.svc",
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.executor.instances": str(job.executors),
        "spark.executor.cores": str(job.executor_cores),
        "spark.executor.memory": job.executor_memory,
        f"spark.kubernetes.executor.label.{APP_LABEL[0]}": APP_LABEL[1],
        # pybk's JVM log reader (docs/spark.md), as the image has it; an image without it: the Python reader
        **classpath_conf(IMAGE_JAR),
    }
    for secret, path in job.secrets.items():
        conf[f"spark.kubernetes.executor.secrets.{secret}"] = path
    for name, value in job.client_env.items():
        conf[f"spark.executorEnv.{name}"] = value
    conf.update(job.conf)
    return conf


def submit_command(job: SparkJob) -> list[str]:
    """The driver container's command: spark-submit in client mode, then the job and its args."""
    cmd = ["spark-submit", "--master", MASTER, "--deploy-mode", "client", "--name", job.job_name]
    for key, value in spark_conf(job).items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, job.job_path, "-m", job.metadata_uri, *job.args]


def _labels(job: SparkJob) -> dict[str, str]:
    return {APP_LABEL[0]: APP_LABEL[1], "app.kubernetes.io/instance": job.job_name,
            "pybk.io/cluster": job.cluster}


def job_manifests(job: SparkJob) -> list[dict[str, Any]]:
    """The headless Service executors reach the driver through, and the driver's Job."""
    labels = _labels(job)
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": job.job_name, "namespace": job.namespace, "labels": labels},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {DRIVER_LABEL: job.job_name},
                 "ports": [{"name": "driver-rpc", "port": DRIVER_PORT, "targetPort": DRIVER_PORT},
                           {"name": "blockmanager", "port": BLOCK_MANAGER_PORT,
                            "targetPort": BLOCK_MANAGER_PORT}]},
    }
    container = {
        "name": "driver", "image": job.image, "args": submit_command(job),
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                *({"name": k, "value": v} for k, v in job.client_env.items())],
        "ports": [{"name": "driver-rpc", "containerPort": DRIVER_PORT},
                  {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT}],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    }
    pod_spec: dict[str, Any] = {"serviceAccountName": job.service_account, "restartPolicy": "Never",
                                "containers": [container]}
    if job.secrets:
        volumes = {secret: f"secret-{i}" for i, secret in enumerate(job.secrets)}
        container["volumeMounts"] = [{"name": volumes[secret], "mountPath": path, "readOnly": True}
                                     for secret, path in job.secrets.items()]
        pod_spec["volumes"] = [{"name": volumes[secret], "secret": {"secretName": secret}}
                               for secret in job.secrets]
    job_obj = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job.job_name, "namespace": job.namespace, "labels": labels},
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                 "template": {"metadata": {"labels": {**labels, DRIVER_LABEL: job.job_name}},
                              "spec": pod_spec}},
    }
    return [service, job_obj]


def metadata_uri_of(cluster: dict[str, Any] | None, config_map: dict[str, Any] | None,
                    name: str, namespace: str) -> str:
    """The cluster's metadata URI: the one the operator published in ConfigMap `<name>-config`
    (it resolves an empty spec.metadataServiceUri to the operator's default), else the spec's."""
    if cluster is None:
        raise SubmitError(f"BookieCluster {namespace}/{name} not found")
    uri = ((config_map or {}).get("data") or {}).get("metadataServiceUri") \
        or (cluster.get("spec") or {}).get("metadataServiceUri")
    if not uri:
        raise SubmitError(f"BookieCluster {namespace}/{name} has no metadata URI yet: its ConfigMap "
                          f"{name}-config is missing and spec.metadataServiceUri is empty "
                          "(is the operator running?); pass --metadata-uri")
    return uri


async def _lookup(name: str, namespace: str) -> tuple[str, str | None]:
    """(metadata URI, TLS server name or None) of the BookieCluster, from its ConfigMap."""
    from pybk.operator.kube import Kube
    kube = await Kube.connect()
    cluster = await kube.get(f"{GROUP}/{VERSION}", "BookieCluster", name, namespace)
    cm = await kube.get("v1", "ConfigMap", f"{name}-config", namespace) if cluster else None
    return metadata_uri_of(cluster, cm, name, namespace), ((cm or {}).get("data") or {}).get("tlsServerName")


async def _apply(objs: list[dict[str, Any]]) -> None:
    from pybk.operator.kube import Kube
    kube = await Kube.connect()
    for obj in objs:
        await kube.apply(obj)
        print(f"applied {obj['kind']} {obj['metadata']['namespace']}/{obj['metadata']['name']}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="spark_command", metavar="COMMAND", required=True)
    s = sub.add_parser(
        "submit", help="print or apply the Kubernetes Job that runs a Spark job against a BookieCluster",
        description="Build the Job (driver: spark-submit --deploy-mode client in its pod) and the "
                    "headless Service executors use to reach the driver, for a job file in the Spark "
                    "image, against BookieCluster CLUSTER's metadata service. Prints YAML unless "
                    "--apply. Needs kube credentials that may read the BookieCluster and its "
                    "ConfigMap (unless --metadata-uri), and create Services and Jobs for --apply. The "
                    "Job's service account must be allowed to manage executor pods (chart value "
                    "spark.rbac.create, or examples/spark/rbac.yaml).",
        epilog="example: pybk spark submit -n default demo ledger_stats.py --ledgers all -o json")
    s.add_argument("cluster", metavar="CLUSTER", help="the BookieCluster's name")
    s.add_argument("job_file", metavar="JOB_FILE",
                   help=f"job file in the image; a bare name is under {IMAGE_JOBS_DIR} "
                        "(ledger_stats.py, export_parquet.py, log_counts.py)")
    s.add_argument("job_args", nargs=argparse.REMAINDER, metavar="JOB_ARGS",
                   help="everything after JOB_FILE goes to the job, which gets `-m <metadata URI>` first "
                        "(so give this command's options before CLUSTER)")
    s.add_argument("-n", "--namespace", default="default", help="the BookieCluster's namespace")
    s.add_argument("--metadata-uri", help="skip the lookup and use this metadata URI")
    s.add_argument("--image", default=IMAGE, help=f"the Spark image (Dockerfile target spark; default {IMAGE})")
    s.add_argument("--service-account", default=SERVICE_ACCOUNT,
                   help=f"the driver's service account (default {SERVICE_ACCOUNT}, the chart's)")
    s.add_argument("--executors", type=int, default=2, help="executor pods (default 2)")
    s.add_argument("--executor-cores", type=int, default=1, help="cores per executor (default 1)")
    s.add_argument("--executor-memory", default="1g", help="memory per executor (default 1g)")
    s.add_argument("--name", default="", help="the Job's name (default <cluster>-<job file stem>)")
    s.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting (repeatable)")
    s.add_argument("--tls-secret", metavar="SECRET",
                   help=f"a kubernetes.io/tls Secret (ca.crt; tls.crt and tls.key presented as client certificate) "
                        f"mounted at {TLS_DIR} in the driver and executors: the job talks TLS")
    s.add_argument("--tls-server-name", metavar="NAME",
                   help="name expected in the bookies' certificates (default: the cluster's, from its ConfigMap)")
    s.add_argument("--token-secret", metavar="SECRET",
                   help=f"a Secret whose key `token` is the job's bearer token, mounted at {TOKEN_DIR}")
    s.add_argument("--etcd-secret", metavar="SECRET",
                   help=f"a Secret with the etcd client files the metadata URI's options name, mounted at {ETCD_DIR}")
    s.add_argument("--apply", action="store_true", help="create the Service and Job instead of printing them")
    s.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="printed format")


def _job_args(rest: list[str]) -> tuple[str, ...]:
    return tuple(rest[1:] if rest[:1] == ["--"] else rest)


def _conf(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SubmitError(f"--conf {pair!r} is not KEY=VALUE")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    try:
        for flag, value in (("--executors", args.executors), ("--executor-cores", args.executor_cores)):
            if value < 1:
                raise SubmitError(f"{flag} must be at least 1, got {value}")
        named = [n for n in (args.tls_secret, args.token_secret, args.etcd_secret) if n]
        if len(set(named)) != len(named):
            raise SubmitError("--tls-secret, --token-secret and --etcd-secret must name different Secrets "
                              "(Spark mounts each Secret once)")
        uri, server_name = (args.metadata_uri, None) if args.metadata_uri else \
            asyncio.run(_lookup(args.cluster, args.namespace))
        job = SparkJob(cluster=args.cluster, namespace=args.namespace, metadata_uri=uri,
                       job_file=args.job_file, args=_job_args(args.job_args), image=args.image,
                       service_account=args.service_account, executors=args.executors,
                       executor_cores=args.executor_cores, executor_memory=args.executor_memory,
                       name=args.name, conf=_conf(args.conf), tls_secret=args.tls_secret,
                       tls_server_name=args.tls_server_name or server_name, token_secret=args.token_secret,
                       etcd_secret=args.etcd_secret)
        objs = job_manifests(job)
        if args.apply:
            asyncio.run(_apply(objs))
        elif args.output == "json":
            print(json.dumps(objs, indent=2))
        else:
            print(yaml.safe_dump_all(objs, sort_keys=False), end="")
        return 0
    except SubmitError as e:
        print(f"pybk spark submit: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        message = _kube_problem(e)
        if message is None:
            raise
        print(f"pybk spark submit: {message}", file=sys.stderr)
        return 1


def _kube_problem(e: Exception) -> str | None:
    """What went wrong talking to Kubernetes (the user's environment, not a bug), else None."""
    from kubernetes.aio.config.config_exception import ConfigException
    from kubernetes.aio.dynamic.exceptions import ResourceNotFoundError
    from pybk.operator.kube import KubeError
    if isinstance(e, ResourceNotFoundError):
        return f"the cluster does not serve that resource (is the BookieCluster CRD installed?): {e}"
    if isinstance(e, ConfigException):
        return (f"no Kubernetes credentials (not in a pod, and kube config: {e}); "
                "pass --metadata-uri to skip the lookup")
    if isinstance(e, KubeError):
        return f"Kubernetes API: {e}"
    return None
