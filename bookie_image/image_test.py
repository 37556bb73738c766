"""`make image-test`: build the pybk image from the real Dockerfile and run its own files as Kubernetes would.

No Kubernetes and no container registry are reachable here, so the closest real things stand in:
  base image  a stand-in for python:3.11-slim (debootstrap bookworm, `python3 -m venv /usr/local`,
              this machine's CA certificates and pip configuration so pip reaches PyPI through its
              proxy), built once and cached, tagged docker.io/library/python:3.11-slim.
  build       `podman build --isolation=chroot --network=host --pull=never`, every `FROM ... AS` stage.
  pods        `podman run` cannot start containers here (crun cannot setrlimit), so each pod is the
              image root mounted read-only (`podman image mount`) in its own mount and PID namespace
              (`unshare`), its volumes bound in, run as the image's user (`chroot --userspec`) with the
              command and environment the operator renders for the StatefulSet and the autorecovery
              Deployment. Pods share the host network: pod IPs are 127.0.0.x, and an /etc/hosts inside
              each pod maps the in-cluster names (demo-N.demo.default.svc, the etcd Service) to them.
  etcd        a real etcd on loopback, the one from this repo's .venv (the `local` extra).

Checks, each named on failure (exit 1): `pybk operator --check` on every BookieCluster example
(valid ones pass, invalid ones fail); three bookies through `bookie-entrypoint` register under their
in-cluster ids and pass their readiness probe; `pybk shell listbookies` shows them writable;
`pybk shell simpletest` passes; `pybk autorecovery` is elected auditor; SIGTERM to a bookie
deregisters it. Where it cannot run (not root, no apt-get) it says why and exits 0.

Needs root, apt-get and network access to the Debian mirror and PyPI. Run as: python bookie_image/image_test.py
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


REPO = Path(__file__).resolve().parent.parent
BASE_TAG = "docker.io/library/python:3.11-slim"
IMAGE_REPO = "localhost/pybk-image-test"
CACHE = Path(os.environ.get("PYBK_IMAGE_CACHE", "/var/cache/pybk-image"))
SUITE = "bookworm"
NAMESPACE = "default"
ETCD_HOST = "pybk-etcd"
BOOKIES = 3
# The machine's pip configuration files that carry its proxy CA (user-level ones point at local paths).
PIP_CONFIG = [Path("/etc/pip.conf"), Path("/etc/xdg/pip")]


class CheckFailed(Exception):
    """A named check did not hold; the message says what was seen."""


def log(msg: str) -> None:
    print(f"image-test: {msg}", flush=True)


@contextmanager
def check(name: str) -> Iterator[None]:
    """Run one named check: time it, and name it in the failure."""
    start = time.monotonic()
    log(f"check {name} ...")
    try:
        yield
    except CheckFailed as e:
        raise CheckFailed(f"check '{name}' failed: {e}") from None
    log(f"check {name}: ok ({time.monotonic() - start:.1f}s)")


def poll(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    """Call probe until it returns something truthy; CheckFailed naming `what` (and the last value) at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except (OSError, ValueError) as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise CheckFailed(f"{what} not within {timeout:.0f}s (last: {last!r})")
        time.sleep(0.5)


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a host command; its failure (with output) is an error, not a check."""
    out = subprocess.run(argv, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {out.returncode}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out


# ---------------------------------------------------------------------------------------------
# Can it run here?

def cannot_run() -> str | None:
    """Why this machine cannot run the image test (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (podman image mount, debootstrap, unshare and chroot); run it as root"
    missing = [tool for tool in ("podman", "debootstrap") if shutil.which(tool) is None]
    if missing and shutil.which("apt-get") is None:
        return f"needs {' and '.join(missing)} and there is no apt-get to install them"
    for tool in ("unshare", "chroot", "mount", "tar"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux/coreutils)"
    return None


def install_tools() -> None:
    missing = [tool for tool in ("podman", "debootstrap") if shutil.which(tool) is None]
    if not missing:
        return
    log(f"installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "podman", "debootstrap"], env=env)


# ---------------------------------------------------------------------------------------------
# The stand-in base image

def debian_mirror(sources: list[Path] | None = None) -> str:
    """The Debian mirror this machine's apt uses for the main suite (one-line or deb822 sources)."""
    if sources is None:
        sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text()
        for line in text.splitlines():
            parts = line.split("#", 1)[0].split()
            if len(parts) >= 3 and parts[0] == "deb":
                rest = [p for p in parts[1:] if not p.startswith("[")]
                if len(rest) >= 2 and rest[1] == SUITE:
                    return rest[0]
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            if SUITE in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                return fields["URIs"].split()[0]
    raise RuntimeError(f"no apt source for Debian {SUITE} in /etc/apt; cannot bootstrap the base image")


def podman_image_exists(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag]).returncode == 0


def unmount_under(path: Path) -> None:
    """Unmount what an interrupted debootstrap left mounted under path (before it is removed)."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(f"{path}/")), reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)


def build_base() -> None:
    """Build and import the python:3.11-slim stand-in unless it is already there."""
    if podman_image_exists(BASE_TAG):
        log(f"base {BASE_TAG}: present")
        return
    start = time.monotonic()
    rootfs = CACHE / f"{SUITE}-rootfs"
    if not (rootfs / ".pybk-complete").exists():
        unmount_under(rootfs)
        shutil.rmtree(rootfs, ignore_errors=True)
        rootfs.mkdir(parents=True)
        mirror = debian_mirror()
        log(f"base: debootstrap {SUITE} from {mirror} into {rootfs} (a few minutes)")
        run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             SUITE, str(rootfs), mirror])
        # the machine's CA bundle (it may carry the proxy's CA) and pip configuration
        shutil.copyfile("/etc/ssl/certs/ca-certificates.crt", rootfs / "etc/ssl/certs/ca-certificates.crt")
        for conf in PIP_CONFIG:
            if conf.is_dir():
                shutil.copytree(conf, rootfs / str(conf).lstrip("/"), dirs_exist_ok=True)
            elif conf.is_file():
                shutil.copyfile(conf, rootfs / str(conf).lstrip("/"))
        run(["chroot", str(rootfs), "python3", "-m", "venv", "/usr/local"])
        python = rootfs / "usr/local/bin/python"
        if not python.exists():
            python.symlink_to("python3")
        (rootfs / "etc/hosts").touch()
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)
        (rootfs / ".pybk-complete").touch()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--exclude=./.pybk-complete", "-c", "."],
                           stdout=subprocess.PIPE)
    run(["podman", "import", "--change", "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
         "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]', "-", BASE_TAG], stdin=tar.stdout)
    if tar.wait() != 0:
        raise RuntimeError(f"tar of {rootfs} failed")
    log(f"base {BASE_TAG}: built in {time.monotonic() - start:.0f}s")


# ---------------------------------------------------------------------------------------------
# The image targets

def dockerfile_stages(dockerfile: Path) -> list[str]:
    """The named stages (`FROM ... AS name`) of a Dockerfile, in order."""
    return re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", dockerfile.read_text(), re.M | re.I)


def image_tag(stage: str) -> str:
    return f"{IMAGE_REPO}:{stage}"


def build_images() -> dict[str, float]:
    """Build every stage of the Dockerfile; returns each stage's build seconds."""
    times = {}
    for stage in dockerfile_stages(REPO / "Dockerfile"):
        start = time.monotonic()
        log(f"podman build --target {stage}")
        run(["podman", "build", "--isolation=chroot", "--network=host", "--pull=never", "--quiet",
             "--target", stage, "-t", image_tag(stage), str(REPO)])
        times[stage] = time.monotonic() - start
        log(f"image {image_tag(stage)}: {image_size(image_tag(stage)) / 1e6:.0f} MB, built in {times[stage]:.0f}s")
    return times


def image_size(tag: str) -> int:
    return int(run(["podman", "image", "inspect", "--format", "{{.Size}}", tag]).stdout.strip())


def image_config(tag: str) -> dict[str, Any]:
    return json.loads(run(["podman", "image", "inspect", "--format", "{{json .Config}}", tag]).stdout)


# ---------------------------------------------------------------------------------------------
# Pods: the image root, read-only, in a mount and PID namespace of its own

@dataclass
class Pod:
    """One container of one pod, as the kubelet would start it from a rendered manifest."""
    name: str
    ip: str  # the pod IP (a loopback address); "" for a one-off command
    argv: list[str]
    env: dict[str, str]
    volumes: dict[str, Path] = field(default_factory=dict)  # mount path -> host dir
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.volumes["/tmp"].parent / f"{self.name}.log"


class Image:
    """A built image mounted read-only; runs pods from it."""

    def __init__(self, tag: str, work: Path, hosts: dict[str, str]) -> None:
        self.tag = tag
        self.work = work
        self.config = image_config(tag)
        self.root = Path(run(["podman", "image", "mount", tag]).stdout.strip())
        self.hosts = work / "hosts"
        self.hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in hosts.items()))
        self.pods: list[Pod] = []

    def user(self) -> str:
        return self.config.get("User") or "0:0"

    def base_env(self, hostname: str) -> dict[str, str]:
        env = dict(e.split("=", 1) for e in self.config.get("Env") or [])
        env.update(HOSTNAME=hostname, HOME="/tmp")
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        return env

    def _script(self, pod: Pod, newroot: Path) -> str:
        """Shell run inside the new namespaces: build the pod's root, then become the image's user."""
        binds = "".join(f'mount --bind "{host}" "$R{path}"\n' for path, host in pod.volumes.items() if path != "/tmp")
        return (f'set -e\nR="{newroot}"\n'
                f'mount --bind "{self.root}" "$R"\nmount -o remount,bind,ro "$R"\n'
                'mount -t proc proc "$R/proc"\nmount --rbind /dev "$R/dev"\n'
                f'mount --bind "{pod.volumes["/tmp"]}" "$R/tmp"\n'
                f'{binds}mount --bind "{self.hosts}" "$R/etc/hosts"\n'
                f'exec chroot --userspec={self.user()} "$R" "$@"\n')

    def _prepare(self, pod: Pod) -> list[str]:
        pod_dir = self.work / "pods" / pod.name
        newroot = pod_dir / "root"
        newroot.mkdir(parents=True, exist_ok=True)
        pod.volumes.setdefault("/tmp", pod_dir / "tmp")
        uid, gid = (int(x) for x in (self.user().split(":") + ["0"])[:2])
        for host in pod.volumes.values():
            host.mkdir(parents=True, exist_ok=True)
            os.chown(host, uid, gid)
        pod.volumes["/tmp"].chmod(0o1777)
        return ["unshare", "--mount", "--pid", "--fork", "--propagation", "private",
                "sh", "-c", self._script(pod, newroot), "pod", *pod.argv]

    def start(self, pod: Pod) -> Pod:
        argv = self._prepare(pod)
        env = {**self.base_env(pod.name), **pod.env}
        with open(pod.log_path, "wb") as log_file:
            pod.proc = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.pods.append(pod)
        return pod

    def exec(self, name: str, argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a one-off command in a fresh pod from the image; its output and exit code, whatever they are."""
        pod = Pod(name=name, ip="", argv=argv, env=env)
        full = self._prepare(pod)
        return subprocess.run(full, env={**self.base_env(name), **env}, capture_output=True, text=True,
                              timeout=timeout)

    def container_pid(self, pod: Pod) -> int:
        """Host pid of the pod's main process (PID 1 in its namespace: the child of `unshare`)."""
        assert pod.proc is not None
        children = Path(f"/proc/{pod.proc.pid}/task/{pod.proc.pid}/children").read_text().split()
        if not children:
            raise CheckFailed(f"pod {pod.name} has no running process; log:\n{tail(pod.log_path)}")
        return int(children[0])

    def close(self) -> None:
        for pod in self.pods:
            if pod.proc and pod.proc.poll() is None:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait(30)
        subprocess.run(["podman", "image", "unmount", self.tag], capture_output=True)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({e})"


# ---------------------------------------------------------------------------------------------
# Pods from the operator's own manifests

def resolve_env(env: list[dict[str, Any]], fields: dict[str, str], config: dict[str, str]) -> dict[str, str]:
    """A container's env as the kubelet resolves it (value, fieldRef, configMapKeyRef)."""
    out = {}
    for var in env:
        if "value" in var:
            out[var["name"]] = str(var["value"])
        elif "fieldRef" in var.get("valueFrom", {}):
            out[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        elif "configMapKeyRef" in var.get("valueFrom", {}):
            out[var["name"]] = config[var["valueFrom"]["configMapKeyRef"]["key"]]
        else:
            raise RuntimeError(f"cannot resolve env {var}")
    return out


def container_pod(workload: dict[str, Any], name: str, ip: str, config: dict[str, str], work: Path) -> Pod:
    """The first container of a StatefulSet's or Deployment's pod template, as pod `name` at `ip`."""
    template = workload["spec"]["template"]["spec"]
    ctr = template["containers"][0]
    fields = {"metadata.name": name, "metadata.namespace": NAMESPACE, "status.podIP": ip,
              "spec.nodeName": "image-test-node", "status.hostIP": "127.0.0.1"}
    env = resolve_env(ctr.get("env", []), fields, config)
    volumes = {m["mountPath"]: work / "volumes" / name / m["name"] for m in ctr.get("volumeMounts", [])}
    return Pod(name=name, ip=ip, argv=[*ctr.get("command", []), *ctr.get("args", [])], env=env, volumes=volumes)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_ready(pod: Pod, url: str, timeout: float = 120) -> None:
    """Poll the pod's readiness probe; CheckFailed (with its log) if it exits or stays unready."""
    def ready() -> bool:
        if pod.proc is not None and pod.proc.poll() is not None:
            raise CheckFailed(f"{pod.name} exited {pod.proc.returncode}")
        return http_ok(url)
    try:
        poll(f"{pod.name} ready at {url}", ready, timeout)
    except CheckFailed as e:
        raise CheckFailed(f"{e}\n{tail(pod.log_path)}") from None


def probe_url(ctr: dict[str, Any], ip: str, probe: str = "readinessProbe") -> str:
    get = ctr[probe]["httpGet"]
    port = get["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in ctr["ports"] if p["name"] == port)
    return f"http://{ip}:{port}{get['path']}"


# ---------------------------------------------------------------------------------------------
# The checks

def check_isolation(image: Image) -> None:
    """A pod runs as the image's user, as PID 1 of its own namespace, on a read-only image root."""
    with check("pods run as the image's user, PID 1, on a read-only root"):
        out = image.exec("isolation", ["sh", "-c", 'echo "$(id -u):$(id -g) $$"; touch /pybk-write-test 2>&1 || true'],
                         {})
        lines = out.stdout.splitlines()
        if out.returncode != 0 or not lines or lines[0] != f"{image.user()} 1" or "Read-only file system" not in out.stdout:
            raise CheckFailed(f"expected '{image.user()} 1' and a refused write to /, got (exit {out.returncode}):\n"
                              f"{out.stdout}{out.stderr}")


def check_examples(image: Image) -> None:
    """`pybk operator --check` inside the image: valid examples pass, invalid ones fail."""
    import yaml
    examples = [p for p in sorted((REPO / "examples").glob("*.yaml"))
                if (yaml.safe_load(p.read_text()) or {}).get("kind") == "BookieCluster"]
    if not examples:
        raise CheckFailed("no BookieCluster examples in examples/")
    for path in examples:
        invalid = "invalid" in path.name
        with check(f"operator --check {path.name} ({'invalid' if invalid else 'valid'})"):
            staged = image.work / "pods" / "check" / "tmp"
            staged.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, staged / path.name)
            inside = f"/tmp/{path.name}"
            out = image.exec("check", ["pybk", "operator", "--check", inside], {})
            said = f"(exit {out.returncode}):\n{out.stdout}{out.stderr}"
            if invalid and (out.returncode == 0 or f"{inside}: invalid BookieCluster\n  - " not in out.stderr):
                raise CheckFailed(f"not rejected with its reasons {said}")
            if not invalid and (out.returncode != 0 or out.stdout.strip() != f"{inside}: valid"):
                raise CheckFailed(f"not accepted {said}")


def shell(image: Image, metadata_uri: str, *args: str) -> Any:
    """`pybk shell ... -o json` from a client pod; its parsed output (CheckFailed on a non-zero exit)."""
    out = image.exec("client", ["pybk", "shell", *args, "-o", "json"], {"PYBK_METADATA_URI": metadata_uri})
    if out.returncode != 0:
        raise CheckFailed(f"pybk shell {' '.join(args)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    return json.loads(out.stdout)


def registered(image: Image, metadata_uri: str) -> dict[str, list[str]]:
    """Writable and read-only bookie ids, from `pybk shell listbookies` in the image."""
    rows = shell(image, metadata_uri, "listbookies")
    return {state: sorted(b["id"] for b in rows if b["state"] == state) for state in ("writable", "readonly")}


# A client pod writes these ledgers (entries each); the Spark job must count exactly them.
SPARK_LEDGER_ENTRIES = (120, 75, 200)
SPARK_PASSWORD = "image-test"
WRITE_LEDGERS = """
import asyncio, json, sys
from pybk.client import BookKeeper

async def main(uri, counts):
    written = {}
    async with await BookKeeper.connect(uri) as bk:
        for n in counts:
            lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=sys.argv[2].encode())
            await asyncio.gather(*(lh.add_entry_async(b"entry-%d" % i) for i in range(n)))
            await lh.close()
            written[lh.ledger_id] = n
    print(json.dumps(written))

asyncio.run(main(sys.argv[1], [int(n) for n in sys.argv[3:]]))
"""


def check_spark_job(image: Image, spark: Image, metadata_uri: str) -> None:
    """spark/ledger_stats.py from the Spark image (spark-submit --master local[2]) counts exactly
    the entries a client pod wrote."""
    with check("the Spark image's ledger_stats job counts what was written"):
        out = image.exec("writer", ["python", "-c", WRITE_LEDGERS, metadata_uri, SPARK_PASSWORD,
                                    *map(str, SPARK_LEDGER_ENTRIES)], {})
        if out.returncode != 0:
            raise CheckFailed(f"writing the ledgers failed ({out.returncode}):\n{out.stdout}{out.stderr}")
        written = {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
        job = ["sh", "-c", 'cd /tmp && exec /usr/local/bin/spark-entrypoint "$@"', "spark",
               "spark-submit", "--master", "local[2]", "/opt/pybk/spark/ledger_stats.py",
               "-m", metadata_uri, "--ledgers", ",".join(map(str, written)), "--password", SPARK_PASSWORD,
               "-o", "json"]
        # the pod's IP, as Kubernetes gives a driver pod (this sandbox shares the host's hostname,
        # which the pod's /etc/hosts does not list)
        res = spark.exec("spark-driver", job, {"SPARK_LOCAL_IP": "127.0.0.1"}, timeout=600)
        if res.returncode != 0:
            raise CheckFailed(f"ledger_stats exited {res.returncode}:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
        rows = json.loads(res.stdout.strip().splitlines()[-1])
        counted = {r["ledger_id"]: r["entries"] for r in rows}
        if counted != written:
            raise CheckFailed(f"ledger_stats counted {counted}, the writer wrote {written}")
        log(f"  ledger_stats: {counted}")


def check_json_log(pod: Pod) -> None:
    """Every line the pod wrote is one JSON object with a log line's fields (the image defaults
    to PYBK_LOG_FORMAT=json)."""
    lines = [line for line in pod.log_path.read_text(errors="replace").splitlines() if line.strip()]
    if not lines:
        raise CheckFailed(f"{pod.name} wrote no log")
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            raise CheckFailed(f"{pod.name} wrote a line that is not JSON: {line[:300]!r}") from None
        missing = [k for k in ("timestamp", "level", "logger", "message") if k not in obj]
        if missing:
            raise CheckFailed(f"{pod.name}: a log line lacks {missing}: {line[:300]!r}")
    if not any("bookie_id" in json.loads(line) for line in lines):
        raise CheckFailed(f"{pod.name}: no log line names the bookie")
    log(f"  {pod.name}: {len(lines)} JSON lines")


def run_cluster(image: Image, etcd_port: int, spark: Image | None = None) -> None:
    from pybk.cluster.spec import load_manifest
    from pybk.operator import render

    spec = load_manifest(REPO / "examples" / "bookiecluster-minimal.yaml")
    metadata_uri = f"etcd://{ETCD_HOST}:{etcd_port}/pybk-image-test"
    config = render.config_map(spec, metadata_uri)["data"]
    sts = render.stateful_set(spec, metadata_uri, BOOKIES)
    ctr = sts["spec"]["template"]["spec"]["containers"][0]
    bookies = []
    for ordinal in range(BOOKIES):
        pod = container_pod(sts, render.pod_name(spec, ordinal), f"127.0.0.{11 + ordinal}", config, image.work)
        bookies.append(image.start(pod))
    ids = sorted(render.bookie_id(spec, n) for n in range(BOOKIES))

    with check(f"{BOOKIES} bookies through bookie-entrypoint pass their readiness probe"):
        for pod in bookies:
            wait_ready(pod, probe_url(ctr, pod.ip))

    with check("pybk shell listbookies shows the in-cluster ids writable"):
        seen = poll("all bookies writable", lambda: (r := registered(image, metadata_uri))["writable"] == ids and r, 60)
        log(f"  writable: {seen['writable']}")

    with check("pybk shell simpletest"):
        result = shell(image, metadata_uri, "simpletest", "-n", "50")
        if result.get("ok") is not True or result.get("entries") != 50:
            raise CheckFailed(f"simpletest did not write and read back 50 entries: {result}")
        log(f"  simpletest: {json.dumps(result)[:300]}")

    if spark is not None:
        check_spark_job(image, spark, metadata_uri)

    auditor_pod = container_pod(render.autorecovery(spec), f"{spec.name}-autorecovery-0", "127.0.0.20", config,
                                image.work)
    image.start(auditor_pod)
    with check("pybk autorecovery is elected auditor"):
        who = poll("an elected auditor", lambda: shell(image, metadata_uri, "whoisauditor"), 90)
        if auditor_pod.name not in json.dumps(who):
            raise CheckFailed(f"whoisauditor names another process: {who}")
        log(f"  auditor: {json.dumps(who)}")

    with check("bookies log JSON lines in the image (timestamp, level, logger, message, bookie_id)"):
        for pod in bookies:
            check_json_log(pod)

    with check("SIGTERM to a bookie deregisters it"):
        victim = bookies[-1]
        os.kill(image.container_pid(victim), signal.SIGTERM)
        try:
            code = victim.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"{victim.name} still runs 60s after SIGTERM") from None
        gone = render.bookie_id(spec, BOOKIES - 1)
        left = registered(image, metadata_uri)
        if gone in left["writable"] + left["readonly"]:
            raise CheckFailed(f"{gone} still registered after it exited ({code}): {left}")
        if left["writable"] != ids[:-1]:
            raise CheckFailed(f"the other bookies are not all writable: {left}")
        log(f"  {victim.name} exited {code}; registered now: {left['writable']}")


def main() -> int:
    reason = cannot_run()
    if reason:
        log(f"skipped: {reason}")
        return 0
    if not (REPO / "Dockerfile").exists():
        log("no Dockerfile")
        return 1
    started = time.monotonic()
    try:
        install_tools()
        build_base()
        build_times = build_images()
        subprocess.run(["podman", "image", "prune", "--force"], capture_output=True)  # earlier builds' layers
        stages = dockerfile_stages(REPO / "Dockerfile")
        from pybk.local.etcd import EtcdProcess
        with tempfile.TemporaryDirectory(prefix="pybk-image-test-") as tmp:
            work = Path(tmp)
            work.chmod(0o755)
            etcd = EtcdProcess(work / "etcd").start()
            bookie_ips = {f"demo-{n}.demo.{NAMESPACE}.svc": f"127.0.0.{11 + n}" for n in range(BOOKIES)}
            hosts = {**bookie_ips, ETCD_HOST: "127.0.0.1"}
            image = Image(image_tag("pybk" if "pybk" in stages else stages[-1]), work, hosts)
            spark = Image(image_tag("spark"), work, hosts) if "spark" in stages else None
            try:
                checks_start = time.monotonic()
                check_isolation(image)
                check_examples(image)
                run_cluster(image, etcd.client_port, spark)
                log(f"checks took {time.monotonic() - checks_start:.0f}s")
            finally:
                image.close()
                if spark is not None:
                    spark.close()
                etcd.stop()
    except (CheckFailed, RuntimeError, subprocess.TimeoutExpired) as e:
        log(f"FAILED: {e}")
        return 1
    log("image sizes: " + ", ".join(f"{s} {image_size(image_tag(s)) / 1e6:.0f} MB" for s in stages))
    log("build seconds: " + ", ".join(f"{s} {t:.0f}" for s, t in build_times.items()))
    log(f"passed in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
