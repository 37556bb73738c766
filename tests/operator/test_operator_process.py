"""The real `pybk operator` process against a Kubernetes API (kmock, see kube_api.py), a real etcd
and real bookie processes standing in for the StatefulSet's pods.

The test plays the StatefulSet controller and the kubelet (`Kubelet`): when the StatefulSet says
N replicas it keeps bookies 0..N-1 running under the ids the pods would have, creates their pods
and volume claims, marks pods ready from each bookie's readiness endpoint, and stops the highest
ones when it shrinks.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kube_api import NAMESPACE, RESOURCES
from polling import eventually
from pybk.cluster.controller import BELOW_ENSEMBLE, INVALID_SPEC
from pybk.cluster.spec import API_VERSION, GROUP, PLURAL, VERSION, BookieClusterSpec
from pybk.client import BookKeeper
from pybk.local.bookie import BookieProcess
from pybk.local.process import ChildProcess, free_port
from pybk.meta import MetadataStore
from pybk.operator import render
from pybk.local.autorecovery import AutoRecoveryProcess
from pybk.security.settings import ENV

NAME = "demo"
CLUSTER = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
STS = f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{NAME}"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
PVCS = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}-autorecovery"
CERTIFICATES = f"/apis/cert-manager.io/v1/namespaces/{NAMESPACE}/certificates"
FINALIZER = f"{GROUP}/finalizer"
PASSWORD = b"operator-test"
# what the autorecovery Deployment's pod runs, quick enough for a test
RECOVERY = dict(lost_bookie_delay=1.0, open_ledger_grace=2.0, poll_interval=0.2, audit_interval=0,
                ledger_password=PASSWORD.decode())
TIMEOUT = 60.0


class Api:
    """Plain HTTP calls to the emulator (what kubectl would do)."""

    def __init__(self, url: str):
        self.url = url

    def call(self, method: str, path: str, body: dict | None = None,
             content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": content_type if method == "PATCH"
                                              else "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, None

    def get(self, path: str) -> dict | None:
        status, obj = self.call("GET", path)
        return obj if status == 200 else None

    def items(self, path: str) -> list[dict]:
        return (self.get(path) or {}).get("items", [])

    def patch(self, path: str, body: dict) -> dict:
        status, obj = self.call("PATCH", path, body)
        assert status == 200, f"PATCH {path}: {status}"
        return obj

    def create(self, path: str, body: dict) -> dict:
        status, obj = self.call("POST", path, body)
        assert status in (200, 201), f"POST {path}: {status}"
        return obj

    def delete(self, path: str) -> int:
        return self.call("DELETE", path)[0]

    def cluster(self) -> dict | None:
        return self.get(f"{CLUSTER}/{NAME}")


def condition(cluster: dict | None, kind: str) -> dict:
    for c in ((cluster or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


@dataclass(frozen=True)
class Restart:
    """A bookie pod the operator deleted, and what the cluster looked like then."""
    ordinal: int
    others_ready: bool
    under_replicated: int | None


class Kubelet:
    """The StatefulSet controller and kubelet for one BookieCluster's bookies (see module doc)."""

    def __init__(self, api: Api, base: Path, metadata_uri: str):
        self.api, self.base, self.metadata_uri = api, base, metadata_uri
        self.bookies: dict[int, BookieProcess] = {}
        self.error: Exception | None = None
        self.recovery: AutoRecoveryProcess | None = None
        self.recovery_paused = False
        self.restarts: list[Restart] = []
        self._stepping = threading.Lock()  # a step runs in a thread: kill_all waits for it to end
        self._closed = False

    def bookie_id(self, ordinal: int) -> str:
        return render.bookie_id(SPEC, ordinal)

    def _start(self, ordinal: int, template: dict) -> None:
        meta = template.get("metadata") or {}
        self.api.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": render.pod_name(SPEC, ordinal), "namespace": NAMESPACE,
            "labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {}},
            "spec": {}, "status": {}})
        for name in render.pvc_names(SPEC, ordinal):
            if self.api.get(f"{PVCS}/{name}") is None:
                self.api.create(PVCS, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
                    "name": name, "namespace": NAMESPACE, "labels": meta.get("labels") or {}}})
        proc = self.bookies.get(ordinal) or BookieProcess(
            self.base / f"bookie-{ordinal}", metadata_uri=self.metadata_uri, bookie_id=self.bookie_id(ordinal))
        self.bookies[ordinal] = proc
        proc.start(wait=False)

    @staticmethod
    def _ready(pod: dict) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (pod.get("status") or {}).get("conditions") or [])

    def _stop(self, ordinal: int) -> None:
        self.bookies[ordinal].stop()
        self.api.delete(f"{PODS}/{render.pod_name(SPEC, ordinal)}")

    def step(self) -> None:
        """One pass: pods for ordinals below the StatefulSet's replicas, none above; readiness."""
        with self._stepping:
            if not self._closed:
                self._step()

    def _step(self) -> None:
        sts = self.api.get(STS)
        if sts is None:
            return
        replicas = int(sts["spec"].get("replicas") or 0)
        pods = {p["metadata"]["name"]: p for p in self.api.items(PODS)}
        for o in range(replicas):
            name = render.pod_name(SPEC, o)
            pod, proc = pods.get(name), self.bookies.get(o)
            if pod is None and proc is not None and proc.alive():
                # someone deleted the pod (a restart): note whether the others were ready and what the
                # status said of under-replicated ledgers, then recreate it
                status = (self.api.get(f"{CLUSTER}/{NAME}") or {}).get("status") or {}
                self.restarts.append(Restart(o, all(self._ready(p) for n, p in pods.items() if n != name),
                                             status.get("underReplicatedLedgers")))
                proc.stop()
            if pod is None or proc is None or not proc.alive():
                if pod is not None:
                    self.api.delete(f"{PODS}/{name}")
                self._start(o, sts["spec"]["template"])
                continue
            try:
                ready = proc.is_ready()
            except OSError:  # not listening yet
                ready = False
            known = any(c["type"] == "Ready" for c in (pod.get("status") or {}).get("conditions") or [])
            if not known or self._ready(pod) != ready:
                self.api.patch(f"{PODS}/{name}/status", {"status": {"conditions": [
                    {"type": "Ready", "status": "True" if ready else "False"}]}})
        for o in sorted(self.bookies, reverse=True):
            if o >= replicas and self.bookies[o].alive():
                self._stop(o)
        if self.recovery is None and not self.recovery_paused and self.api.get(DEPLOYMENT) is not None:
            self.recovery = AutoRecoveryProcess(self.base / "autorecovery.log", self.metadata_uri, **RECOVERY)
            self.recovery.start()

    async def run(self) -> None:
        """Step until cancelled; the first failure is kept (`error`) and fails the test."""
        while True:
            try:
                await asyncio.to_thread(self.step)
            except Exception as e:  # noqa: BLE001 - reported by the fixture
                self.error = self.error or e
            await asyncio.sleep(0.2)

    def pause_recovery(self, paused: bool) -> None:
        """Hold autorecovery down (a drain then waits) or let it run again."""
        self.recovery_paused = paused
        if paused and self.recovery is not None:
            self.recovery.kill()
            self.recovery = None

    def kill_all(self) -> None:
        """Kill every process started, once the step in flight (cancelling `run` leaves its thread
        running) has ended, and start none after."""
        with self._stepping:
            self._closed = True
            for proc in [*self.bookies.values(), *([self.recovery] if self.recovery else [])]:
                proc.kill()


class Operator:
    """The real `pybk operator` process, pointed at the emulator by a kube config."""

    def __init__(self, kubeconfig: Path, log: Path):
        self.kubeconfig, self.log = kubeconfig, log
        self.proc: ChildProcess | None = None

    def start(self) -> "Operator":
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), PYTHONPATH=os.getcwd())
        self.proc = ChildProcess("operator", [
            sys.executable, "-m", "pybk.cli", "operator", "--namespace", NAMESPACE,
            # a free port of its own: kopf takes port 0 for its default, 80, which a second operator
            # running at the same time (another test worker) then cannot bind
            "--liveness", f"http://127.0.0.1:{free_port()}/healthz", "--refresh-interval", "1"],
            self.log, env).start()
        return self

    def stop(self) -> None:
        if self.proc:
            self.proc.stop(15)

    def lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if text in line]


def manifest(replicas: int, metadata_uri: str, **spec: Any) -> dict:
    return {"apiVersion": API_VERSION, "kind": "BookieCluster",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"replicas": replicas, "metadataServiceUri": metadata_uri, **spec}}


SPEC = BookieClusterSpec.from_manifest(manifest(3, "etcd://unused:2379/pybk"))  # for names only


@pytest.fixture
async def world(kube, tmp_path, metadata_uri):
    """(api, kubelet, operator): the emulator, the pods' stand-in running, the operator running."""
    api = Api(kube.url)
    kubelet = Kubelet(api, tmp_path, metadata_uri)
    task = asyncio.create_task(kubelet.run())
    operator = Operator(kube.kubeconfig(tmp_path / "kubeconfig"), tmp_path / "operator.log").start()
    try:
        yield api, kubelet, operator
    finally:
        operator.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        kubelet.kill_all()
    assert kubelet.error is None, f"the kubelet stand-in failed: {kubelet.error!r}"


async def ready(api: Api, replicas: int) -> dict:
    """The cluster once its status says Ready with `replicas` ready and writable bookies."""
    def check():
        c = api.cluster()
        st = (c or {}).get("status") or {}
        return c if (condition(c, "Ready").get("status") == "True" and st.get("readyReplicas") == replicas
                     and len(st.get("writableBookies") or []) == replicas) else None
    try:
        return await eventually(check, TIMEOUT, 0.2, f"Ready with {replicas} bookies")
    except AssertionError as e:
        raise AssertionError(f"{e}; status: {(api.cluster() or {}).get('status')}") from None


async def test_create_makes_every_object_and_becomes_ready(world, metadata_uri, store):
    api, kubelet, _ = world
    api.create(CLUSTER, manifest(3, metadata_uri))
    cluster = await ready(api, 3)
    assert FINALIZER in cluster["metadata"]["finalizers"]
    assert cluster["status"]["writableBookies"] == sorted(kubelet.bookie_id(o) for o in range(3))
    uid = cluster["metadata"]["uid"]
    kinds = {(gvp.rsplit("/", 1)[0], kind): gvp for gvp, (kind, _, _) in RESOURCES.items()}
    for api_version, kind, name in [*render.companions(SPEC), ("apps/v1", "StatefulSet", NAME)]:
        group_version, plural = kinds[api_version, kind].rsplit("/", 1)
        root = "/api" if "/" not in group_version else "/apis"
        obj = api.get(f"{root}/{group_version}/namespaces/{NAMESPACE}/{plural}/{name}")
        assert obj is not None, f"{kind} {name} was not created"
        assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid], f"{kind} {name}"
    assert api.get(STS)["spec"]["replicas"] == 3
    assert api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}-config")["data"][
        "metadataServiceUri"] == metadata_uri
    # no security asked for: nothing mounted, probes plain HTTP, no certificate requested
    for workload in (api.get(STS), api.get(DEPLOYMENT)):
        pod = workload["spec"]["template"]["spec"]
        assert [v["name"] for v in pod["volumes"]] == ["tmp"]
        assert pod["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert api.items(CERTIFICATES) == []
    # the spec's ledger defaults are stored with the cluster in etcd, where clients find them
    await eventually(store.cluster.ledger_defaults, TIMEOUT, 0.2, "ledger defaults in etcd")
    assert await store.cluster.ledger_defaults() == BookieClusterSpec.from_manifest(
        manifest(3, metadata_uri)).ledger_defaults


async def test_scale_up_adds_a_bookie(world, metadata_uri):
    api, kubelet, _ = world
    api.create(CLUSTER, manifest(3, metadata_uri))
    await ready(api, 3)
    api.patch(f"{CLUSTER}/{NAME}", {"spec": {"replicas": 4}})
    cluster = await ready(api, 4)
    assert api.get(STS)["spec"]["replicas"] == 4
    assert kubelet.bookie_id(3) in cluster["status"]["writableBookies"]
    assert cluster["status"]["replicas"] == 4


async def test_replicas_change_reconciles_once(world, metadata_uri):
    api, _, operator = world
    api.create(CLUSTER, manifest(3, metadata_uri))
    await ready(api, 3)
    before = len(operator.lines("Handler '"))
    api.patch(f"{CLUSTER}/{NAME}", {"spec": {"replicas": 4}})
    await ready(api, 4)
    handled = [line for line in operator.lines("Handler '")[before:]
               if "succeeded" in line and "on_bookie_pod" not in line]
    assert len(handled) == 1, handled


async def write_ledgers(metadata_uri: str, bookie_id: str) -> dict[int, list[bytes]]:
    """Closed ledgers (E=3, Qw=3, Qa=2), at least two of them on `bookie_id`; their entries."""
    written: dict[int, list[bytes]] = {}
    on_bookie = 0
    bk = await BookKeeper.connect(metadata_uri)
    try:
        while on_bookie < 2:
            lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
            entries = [f"ledger {lh.ledger_id} entry {i}".encode() for i in range(20)]
            for e in entries:
                await lh.add_entry(e)
            await lh.close()
            written[lh.ledger_id] = entries
            on_bookie += bookie_id in lh.metadata.bookies()
    finally:
        await bk.close()
    return written


async def shrinks_only_when_drained(api: Api, store, gone: str) -> set[str]:
    """Wait for the StatefulSet to go from 4 to 3, checking at each look that it shrinks only once
    no ledger references `gone`; the Decommissioning conditions seen meanwhile (reason: message),
    each about `gone`."""
    seen: set[str] = set()

    async def shrunk():
        cluster = api.cluster()
        decommissioning = condition(cluster, "Decommissioning")
        if decommissioning.get("status") == "True":
            progress = cluster["status"].get("decommissioning") or {}
            assert progress.get("bookie") in (None, gone), progress
            seen.add(f"{decommissioning['reason']}: {decommissioning['message']}")
        if api.get(STS)["spec"]["replicas"] == 4:
            return False
        async for md in store.ledgers.list_metadata():
            assert gone not in md.bookies(), f"ledger {md.ledger_id} still on {gone} after the shrink"
        return True

    await eventually(shrunk, TIMEOUT, 0.1, "the StatefulSet to shrink")
    return seen


async def assert_readable(metadata_uri: str, written: dict[int, list[bytes]]) -> None:
    bk = await BookKeeper.connect(metadata_uri)
    try:
        for ledger_id, entries in written.items():
            rh = await bk.open_ledger(ledger_id, password=PASSWORD)
            assert [e.data async for e in rh.read_entries(0, rh.last_add_confirmed)] == entries
    finally:
        await bk.close()


@pytest.fixture
async def store(metadata_uri):
    s = await MetadataStore.connect(metadata_uri)
    try:
        yield s
    finally:
        await s.close()


async def test_scale_down_drains_the_last_bookie_first(world, metadata_uri, store):
    api, kubelet, _ = world
    api.create(CLUSTER, manifest(4, metadata_uri, pvcPolicy="Delete"))
    await ready(api, 4)
    gone = kubelet.bookie_id(3)
    written = await write_ledgers(metadata_uri, gone)
    api.patch(f"{CLUSTER}/{NAME}", {"spec": {"replicas": 3}})
    seen = await shrinks_only_when_drained(api, store, gone)
    assert seen and all(gone in message for message in seen), seen
    cluster = await ready(api, 3)
    assert gone not in cluster["status"]["writableBookies"]
    assert condition(cluster, "Decommissioning")["status"] == "False"
    await eventually(lambda: not [p for p in api.items(PVCS) if p["metadata"]["name"].endswith(f"{NAME}-3")],
                     TIMEOUT, 0.2, "bookie 3's volume claims deleted (pvcPolicy Delete)")
    await assert_readable(metadata_uri, written)


async def test_operator_killed_mid_drain_resumes_it(world, metadata_uri, store):
    api, kubelet, operator = world
    api.create(CLUSTER, manifest(4, metadata_uri))
    await ready(api, 4)
    gone = kubelet.bookie_id(3)
    written = await write_ledgers(metadata_uri, gone)
    kubelet.pause_recovery(True)  # the drain is requested but cannot finish yet
    api.patch(f"{CLUSTER}/{NAME}", {"spec": {"replicas": 3}})
    record = await eventually(lambda: store.decommission.get(gone), TIMEOUT, 0.1, "the drain request")
    await eventually(lambda: condition(api.cluster(), "Decommissioning").get("status") == "True",
                     TIMEOUT, 0.1, "the Decommissioning condition")
    operator.proc.kill()
    resumed = len(operator.lines("Handler 'on_resume' succeeded"))
    operator.start()
    await eventually(lambda: len(operator.lines("Handler 'on_resume' succeeded")) > resumed, TIMEOUT, 0.2,
                     "the restarted operator to resume")
    again = await store.decommission.get(gone)
    assert again.requested_ms == record.requested_ms, "the restarted operator requested the drain again"
    assert api.get(STS)["spec"]["replicas"] == 4
    kubelet.pause_recovery(False)
    await shrinks_only_when_drained(api, store, gone)
    assert len(operator.lines(f"StartDecommission(bookie_id='{gone}'")) == 1, "decommissioned twice"
    await ready(api, 3)
    await assert_readable(metadata_uri, written)


async def test_scale_below_an_open_ensemble_is_refused(world, metadata_uri, store):
    api, kubelet, _ = world
    api.create(CLUSTER, manifest(4, metadata_uri))
    await ready(api, 4)
    bk = await BookKeeper.connect(metadata_uri)
    try:
        lh = await bk.create_ledger(ensemble=4, write_quorum=3, ack_quorum=2, password=PASSWORD)
        await lh.add_entry(b"open")
        api.patch(f"{CLUSTER}/{NAME}", {"spec": {"replicas": 3}})
        cluster = await eventually(lambda: (c := api.cluster()) and condition(c, "Degraded").get("status") == "True"
                                   and c, TIMEOUT, 0.2, "Degraded")
        degraded = condition(cluster, "Degraded")
        assert degraded["reason"] == BELOW_ENSEMBLE
        assert "ensemble of 4" in degraded["message"]
        assert api.get(STS)["spec"]["replicas"] == 4
        assert await store.decommission.get(kubelet.bookie_id(3)) is None
        await lh.add_entry(b"still writable")
    finally:
        await bk.close()


async def test_config_change_restarts_one_ready_bookie_at_a_time(world, metadata_uri):
    api, kubelet, _ = world
    api.create(CLUSTER, manifest(3, metadata_uri))
    await ready(api, 3)
    written = await write_ledgers(metadata_uri, kubelet.bookie_id(2))
    old_hash = api.get(STS)["spec"]["template"]["metadata"]["annotations"][render.CONFIG_HASH]
    api.patch(f"{CLUSTER}/{NAME}", {"spec": {"config": {"high-water-mark": "0.95"}}})

    def rolled():
        pods = api.items(PODS)
        hashes = {p["metadata"]["annotations"][render.CONFIG_HASH] for p in pods}
        return len(pods) == 3 and old_hash not in hashes and all(Kubelet._ready(p) for p in pods)

    await eventually(rolled, TIMEOUT, 0.2, "every bookie restarted with the new config")
    await ready(api, 3)
    assert [r.ordinal for r in kubelet.restarts] == [2, 1, 0]
    assert all(r.others_ready and r.under_replicated == 0 for r in kubelet.restarts), kubelet.restarts
    await assert_readable(metadata_uri, written)


async def test_bad_spec_is_degraded_without_spinning(world, metadata_uri):
    api, kubelet, operator = world
    api.create(CLUSTER, manifest(3, metadata_uri, ledgerDefaults={"ensemble": 3, "writeQuorum": 2,
                                                                    "ackQuorum": 3}))
    cluster = await eventually(lambda: (c := api.cluster()) and condition(c, "Degraded").get("status") == "True"
                               and c, TIMEOUT, 0.2, "Degraded")
    degraded = condition(cluster, "Degraded")
    assert degraded["reason"] == INVALID_SPEC
    assert "ackQuorum" in degraded["message"]
    assert api.get(STS) is None
    assert not kubelet.bookies
    # no spin: between refresh timer runs it reconciles (and logs the error) about once each
    timers = len(operator.lines("Timer 'refresh' succeeded"))
    errors = len(operator.lines("is invalid"))
    await eventually(lambda: len(operator.lines("Timer 'refresh' succeeded")) >= timers + 3, TIMEOUT, 0.2,
                     "three refresh timer runs")
    assert len(operator.lines("is invalid")) - errors <= 4
    assert condition(api.cluster(), "Degraded")["reason"] == INVALID_SPEC


async def test_delete_removes_the_finalizer(world, metadata_uri):
    api, _, _ = world
    api.create(CLUSTER, manifest(3, metadata_uri))
    await ready(api, 3)
    assert api.delete(f"{CLUSTER}/{NAME}") == 200
    await eventually(lambda: api.cluster() is None, TIMEOUT, 0.2, "the BookieCluster gone")


async def test_issuer_ref_gets_a_certificate_and_every_pod_mounts_it(world, metadata_uri):
    api, _, _ = world
    api.create(CLUSTER, manifest(3, metadata_uri, tls={"issuerRef": {"name": "pybk-ca", "kind": "ClusterIssuer"}},
                                 auth={"secretName": "demo-auth"}))
    cluster = await ready(api, 3)
    cert = api.get(f"{CERTIFICATES}/{NAME}-tls")
    assert cert is not None, "no Certificate requested"
    assert [r["uid"] for r in cert["metadata"]["ownerReferences"]] == [cluster["metadata"]["uid"]]
    assert cert["spec"]["issuerRef"] == {"name": "pybk-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert cert["spec"]["secretName"] == f"{NAME}-tls"
    assert f"*.{NAME}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert {"server auth", "client auth"} <= set(cert["spec"]["usages"])
    for workload in (api.get(STS), api.get(DEPLOYMENT)):
        pod = workload["spec"]["template"]["spec"]
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert secrets == {"tls": f"{NAME}-tls", "auth": "demo-auth"}, workload["kind"]
        c = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[ENV["tls_ca"]] == "/etc/pybk/tls/ca.crt" and env[ENV["token_file"]] == "/etc/pybk/auth/admin.token"
        assert env[ENV["tls_server_name"]] == f"{NAME}.{NAMESPACE}.svc"
        assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS", workload["kind"]


async def test_two_certificate_sources_are_refused_naming_the_field(world, metadata_uri):
    api, kubelet, _ = world
    api.create(CLUSTER, manifest(3, metadata_uri, tls={"secretName": "demo-tls", "issuerRef": {"name": "pybk-ca"}}))
    cluster = await eventually(lambda: (c := api.cluster()) and condition(c, "Degraded").get("status") == "True"
                               and c, TIMEOUT, 0.2, "Degraded")
    degraded = condition(cluster, "Degraded")
    assert degraded["reason"] == INVALID_SPEC
    assert "spec.tls needs exactly one of secretName" in degraded["message"] and "got both" in degraded["message"]
    assert api.get(STS) is None and api.items(CERTIFICATES) == []
    assert not kubelet.bookies
