"""`pybk local up|down|status|apply` with real etcd and real bookie processes."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pybk.local import control
from pybk.local.datadir import read_local_json
from pybk.local.slots import port_free

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"
PYBK = [sys.executable, "-m", "pybk.cli"]


def pybk(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*PYBK, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def manifest(tmp_path: Path, replicas: int = 3, ensemble: int = 3, config: dict | None = None,
             autorecovery: int = 0) -> Path:
    qw = min(ensemble, 3)
    text = (f"apiVersion: pybk.io/v1alpha1\nkind: BookieCluster\nmetadata: {{name: t}}\n"
            f"spec:\n  replicas: {replicas}\n"
            f"  ledgerDefaults: {{ensemble: {ensemble}, writeQuorum: {qw}, ackQuorum: {min(qw, 2)}}}\n"
            f"  config: {json.dumps(config or {})}\n"
            f"  autorecovery: {{replicas: {autorecovery}}}\n")
    path = tmp_path / f"cluster-{replicas}-{autorecovery}.yaml"
    path.write_text(text)
    return path


def _alive(pid: int) -> bool:
    return control.pid_alive(pid)


async def _bookie_answers(grpc: str) -> str:
    from pybk.client.bookie_client import BookieClient
    c = await BookieClient.connect(grpc)
    try:
        return (await c.info())["bookie_id"]
    finally:
        await c.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, child_processes):
    """One 3-bookie cluster from examples/cluster.yaml for the read-only checks of this module."""
    data_dir = tmp_path_factory.mktemp("local")
    with control.detached(EXAMPLE, data_dir) as doc:
        yield data_dir, doc


def test_up_detach_writes_local_json_in_the_documented_shape(cluster):
    data_dir, doc = cluster
    assert doc == json.loads((data_dir / "local.json").read_text())
    assert set(doc) == {"metadata_service_uri", "etcd", "bookies", "autorecovery"}
    assert doc["metadata_service_uri"].startswith("etcd://127.0.0.1:") and doc["metadata_service_uri"].endswith("/pybk")
    assert set(doc["etcd"]) == {"pid", "client_url", "restarts", "last_exit_code"} and _alive(doc["etcd"]["pid"])
    assert (doc["etcd"]["restarts"], doc["etcd"]["last_exit_code"]) == (0, None)
    assert [b["id"] for b in doc["bookies"]] == ["bookie-0", "bookie-1", "bookie-2"]
    for b in doc["bookies"]:
        assert set(b) == {"id", "pid", "grpc", "http", "journal_dir", "ledger_dirs", "restarts", "last_exit_code"}
        assert _alive(b["pid"])
        assert Path(b["journal_dir"]) == data_dir.resolve() / b["id"] / "journal"
        assert [Path(d) for d in b["ledger_dirs"]] == [data_dir.resolve() / b["id"] / "ledgers"]
        assert (data_dir / f"{b['id']}.log").exists()
    assert [(r["id"], _alive(r["pid"])) for r in doc["autorecovery"]] == [("autorecovery-0", True)]


async def test_every_bookie_answers_on_its_recorded_ports(cluster):
    _, doc = cluster
    import urllib.request
    for b in doc["bookies"]:
        assert await _bookie_answers(b["grpc"]) == b["id"]
        with urllib.request.urlopen(f"http://{b['http']}/heartbeat", timeout=10) as resp:
            assert resp.status == 200


def test_status_lists_every_process_running(cluster):
    data_dir, doc = cluster
    res = pybk("local", "status", "--data-dir", data_dir, "-o", "json")
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert status["etcd"]["alive"] and [b["alive"] for b in status["bookies"]] == [True, True, True]
    assert [r["alive"] for r in status["autorecovery"]] == [True]
    assert status["supervisor_pid"] and _alive(status["supervisor_pid"])


def test_second_up_on_a_running_data_dir_is_refused(cluster):
    data_dir, _ = cluster
    res = pybk("local", "up", "-f", EXAMPLE, "--data-dir", data_dir, "--detach")
    assert res.returncode == 1 and "already runs" in res.stderr


def test_down_stops_every_recorded_process(tmp_path, child_processes):
    with control.detached(manifest(tmp_path, replicas=1, ensemble=1, autorecovery=1), tmp_path / "d") as doc:
        assert len(doc["autorecovery"]) == 1
        supervisor = control.running_supervisor(tmp_path / "d")
        res = pybk("local", "down", "--data-dir", tmp_path / "d")
        assert res.returncode == 0, res.stderr
    pids = [doc["etcd"]["pid"], supervisor] + [b["pid"] for b in doc["bookies"] + doc["autorecovery"]]
    assert [p for p in pids if _alive(p)] == []
    assert not (tmp_path / "d" / "local.json").exists()


def test_local_json_appears_only_once_the_cluster_serves(tmp_path, child_processes):
    """local.json announces a cluster that serves: until then a Ctrl-C aborts the start (exit
    130) instead of stopping the cluster cleanly, and the Ctrl-C test sends its signal once the
    file is there. The start's own pass of the controller acts (here the ledger defaults) and
    must announce nothing before."""
    from pybk.local.manifest import load_spec
    from pybk.local.platform import LocalCluster
    cluster = LocalCluster(load_spec(manifest(tmp_path, 1, 1)), tmp_path / "d")
    seen = []
    try:
        cluster.start(serving=lambda: seen.append((tmp_path / "d" / "local.json").exists()))
    finally:
        cluster.stop()
    assert seen == [False]


def test_ctrl_c_in_the_foreground_stops_everything(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    proc = subprocess.Popen([*PYBK, "local", "up", "-f", str(manifest(tmp_path, 1, 1)), "--data-dir", str(data_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (data_dir / "local.json").exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.1)
        doc = read_local_json(data_dir)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) == 0
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        control.down(data_dir) if (data_dir / "local.json").exists() else None
    assert "local cluster ready" in out and "Ctrl-C" in out
    assert [p for p in [doc["etcd"]["pid"]] + [b["pid"] for b in doc["bookies"]] if _alive(p)] == []


def test_restart_keeps_ids_ports_and_data_dirs(tmp_path, child_processes):
    m = manifest(tmp_path, replicas=1, ensemble=1)
    with control.detached(m, tmp_path / "d") as first:
        pass
    with control.detached(m, tmp_path / "d") as second:
        assert second["metadata_service_uri"] == first["metadata_service_uri"]
        strip = lambda d: [{k: v for k, v in b.items() if k != "pid"} for b in d["bookies"]]
        assert strip(second) == strip(first)


def test_config_overrides_reach_the_bookie_command_line(tmp_path, child_processes):
    m = manifest(tmp_path, replicas=1, ensemble=1, config={"journalGroupWait": "0.003"})
    with control.detached(m, tmp_path / "d") as doc:
        cmdline = Path(f"/proc/{doc['bookies'][0]['pid']}/cmdline").read_bytes().split(b"\0")
        i = cmdline.index(b"--journal-group-wait")
        assert cmdline[i + 1] == b"0.003"


def _lease_ttl(client_url: str, key: bytes) -> int:
    """The TTL etcd granted the lease that `key` is bound to (etcd's JSON gateway)."""
    import base64
    import urllib.request

    def call(path: str, body: dict) -> dict:
        req = urllib.request.Request(client_url + path, json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())
    found = call("/v3/kv/range", {"key": base64.b64encode(key).decode()})
    return int(call("/v3/lease/timetolive", {"ID": found["kvs"][0]["lease"]})["grantedTTL"])


async def _auditor(metadata_uri: str) -> str | None:
    from pybk.meta import MetadataStore
    store = await MetadataStore.connect(metadata_uri)
    try:
        return await store.election.leader()
    finally:
        await store.close()


def test_each_process_takes_its_own_settings_from_the_one_environment(tmp_path, child_processes):
    """`pybk local` hands one environment to every child: a bookie-only setting and an
    autorecovery-only one each reach their process, and neither stops the other."""
    env = {"PYBK_REGISTRATION_TTL": "3", "PYBK_RECOVERY_NO_WORKER": "true"}
    with control.detached(manifest(tmp_path, replicas=1, ensemble=1, autorecovery=1), tmp_path / "d", env=env) as doc:
        key = f"/pybk/bookies/writable/{doc['bookies'][0]['id']}".encode()
        assert _lease_ttl(doc["etcd"]["client_url"], key) == 3
        deadline = time.monotonic() + 30
        while (leader := asyncio.run(_auditor(doc["metadata_service_uri"]))) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leader is not None, "no autorecovery process campaigned"
        import urllib.request
        with urllib.request.urlopen(f"http://{json.loads(leader)['http']}/api/v1/autorecovery/status", timeout=10) as resp:
            status = json.loads(resp.read())
        assert status["id"] == "autorecovery-0" and status["replicates"] is False
        assert [r["restarts"] for r in doc["autorecovery"]] == [0]


def test_up_with_an_invalid_manifest_fails_naming_the_field(tmp_path, child_processes):
    bad = manifest(tmp_path, replicas=2, ensemble=3)
    res = pybk("local", "up", "-f", bad, "--data-dir", tmp_path / "d", "--detach")
    assert res.returncode == 1
    assert "spec.replicas (2) must be >= spec.ledgerDefaults.ensemble (3)" in res.stderr


def test_down_with_nothing_running_says_so(tmp_path, child_processes):
    res = pybk("local", "down", "--data-dir", tmp_path)
    assert res.returncode == 1 and "no local cluster is running" in res.stderr


def test_down_after_the_supervisor_was_killed_stops_the_orphans(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    with control.detached(manifest(tmp_path, replicas=1, ensemble=1, autorecovery=1), data_dir) as doc:
        supervisor = control.running_supervisor(data_dir)
        os.kill(supervisor, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.05)
        children = [doc["etcd"]["pid"]] + [p["pid"] for p in doc["bookies"] + doc["autorecovery"]]
        assert all(_alive(p) for p in children)  # orphans keep running, in their own sessions
        refused = pybk("local", "up", "--data-dir", data_dir, "--detach")
        assert refused.returncode == 1 and "still run" in refused.stderr
        res = pybk("local", "down", "--data-dir", data_dir)
        assert res.returncode == 0, res.stderr
    assert [p for p in children if _alive(p)] == []


def test_a_bookie_that_cannot_start_fails_up_with_its_error_and_leaves_nothing(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    res = pybk("local", "up", "-f", manifest(tmp_path, 1, 1, config={"no-such-option": "1"}), "--data-dir", data_dir,
               "--detach", "--timeout", "60")
    assert res.returncode == 1
    assert "bookie-0" in res.stderr and "no-such-option" in res.stderr
    assert control.running_supervisor(data_dir) is None and not (data_dir / "local.json").exists()
    etcd_pid = [line for line in (data_dir / "local.log").read_text().splitlines() if "starting etcd" in line]
    assert etcd_pid  # etcd was started, and stopped again: no etcd answers on the recorded port
    port = json.loads((data_dir / "ports.json").read_text())["etcd"]["client"]
    assert port_free("127.0.0.1", port)


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and control.pid_alive(int(entry.name)) and control.process_mentions(int(entry.name), text):
            found.append(int(entry.name))
    return found


def test_ctrl_c_during_start_up_stops_what_was_started(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    proc = subprocess.Popen([*PYBK, "local", "up", "-f", str(manifest(tmp_path, 3, 3)), "--data-dir", str(data_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if "starting bookie-0" in line:
                break
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_mentioning(str(data_dir)) == []
    assert not (data_dir / "local.json").exists() and control.running_supervisor(data_dir) is None


async def test_up_stores_the_manifests_ledger_defaults_where_clients_find_them(cluster):
    from pybk.client import BookKeeper
    from pybk.meta.cluster import LedgerDefaults
    _, doc = cluster
    async with await BookKeeper.connect(doc["metadata_service_uri"]) as bk:
        assert await bk.store.cluster.ledger_defaults() == LedgerDefaults(3, 3, 2)  # examples/cluster.yaml
        lh = await bk.create_ledger(password=b"defaults")
        md = await bk.ledger_metadata(lh.ledger_id)
        assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (3, 3, 2)
        await lh.close()
        await bk.delete_ledger(lh.ledger_id, b"defaults")


def test_a_bookie_killed_hard_is_started_again_with_back_off_and_status_counts_its_restarts(tmp_path, child_processes):
    """As a StatefulSet restarts its pod: kill -9 of a bookie brings it back after a second, with
    its data; killed again soon after, it comes back after twice the delay; `pybk local status`
    shows the restarts and the last exit code.

    Slow: a local cluster and two kill-and-restart cycles of its bookie, 1 s and 2 s of back-off
    (about 25 s with the machine loaded)."""
    import asyncio
    from pybk.client import BookKeeper
    from pybk.local.client import read_client
    from polling import eventually
    data_dir = tmp_path / "d"
    with control.detached(manifest(tmp_path, replicas=1, ensemble=1), data_dir) as doc:
        assert doc["bookies"][0]["restarts"] == 0 and doc["bookies"][0]["last_exit_code"] is None

        async def write() -> int:
            async with await BookKeeper.connect(doc["metadata_service_uri"]) as bk:
                lh = await bk.create_ledger(ensemble=1, password=b"pw")
                for i in range(10):
                    await lh.add_entry(b"entry %d" % i)
                await lh.close()
                return lh.ledger_id

        async def read(ledger_id: int) -> list[bytes]:
            async with await BookKeeper.connect(read_client(data_dir).metadata_uri) as bk:
                rh = await bk.open_ledger(ledger_id, password=b"pw")
                return [bytes(e.data) async for e in rh.read_entries(0, 9)]

        ledger_id = asyncio.run(write())
        for n, delay in ((1, 1), (2, 2)):
            pid = read_local_json(data_dir)["bookies"][0]["pid"]
            os.killpg(pid, signal.SIGKILL)
            killed = time.monotonic()
            back = asyncio.run(eventually(lambda: (b := read_local_json(data_dir)["bookies"][0])["pid"] != pid and b,
                                          timeout=30, interval=0.05, what=f"bookie-0 started again ({n})"))
            assert time.monotonic() - killed >= delay * 0.9
            assert back["restarts"] == n and back["last_exit_code"] == -signal.SIGKILL
            assert asyncio.run(eventually(lambda: _ready(back["http"]), timeout=60, what="bookie-0 ready"))
        assert asyncio.run(read(ledger_id)) == [b"entry %d" % i for i in range(10)]
        status = pybk("local", "status", "--data-dir", data_dir, "-o", "json")
        assert status.returncode == 0, status.stderr
        got = json.loads(status.stdout)["bookies"][0]
        assert (got["restarts"], got["last_exit_code"], got["alive"]) == (2, -9, True)
        text = pybk("local", "status", "--data-dir", data_dir)
        assert "RESTARTS" in text.stdout and "2 (last exit -9)" in text.stdout, text.stdout
        log = (data_dir / "local.log").read_text()
        assert "bookie-0 (pid" in log and "starting it again in 1s (restart 1)" in log
        assert "starting it again in 2s (restart 2)" in log


def _ready(http: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{http}/api/v1/bookie/is_ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
