"""`pybk local apply -f examples/bookielog.yaml`: the Kubernetes example BookieLog, unchanged, makes
its log on a local cluster started from examples/cluster.yaml; applying a changed manifest
reconfigures the log and enforces its retention, as the operator does."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import yaml

from pybk.client import BookKeeper
from pybk.cluster.bookielog.spec import BookieLogSpec
from pybk.local import control
from pybk.log import Logs

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster.yaml"
EXAMPLE = ROOT / "examples" / "bookielog.yaml"
SECRET = ROOT / "examples" / "bookielog-secret.yaml"
PYBK = [sys.executable, "-m", "pybk.cli"]


def apply(path: Path, data_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PYBK, "local", "apply", "-f", str(path), "--data-dir", str(data_dir), *extra],
                          capture_output=True, text=True, timeout=120)


async def write(uri: str, password: bytes, n: int) -> None:
    async with await BookKeeper.connect(uri) as bk:
        async with await Logs(bk).open_writer("orders", password=password) as w:
            for i in range(n):
                await w.append(b"record-%d" % i)
                if i % 10 == 9:
                    await w.roll()


async def describe(uri: str):
    async with await BookKeeper.connect(uri) as bk:
        return await Logs(bk).describe("orders")


def test_the_example_bookielog_applies_on_the_local_platform(tmp_path, child_processes):
    """Slow: a local cluster of three bookies started and stopped (about 20 s) around seven `pybk
    local apply` processes (2-3 s each)."""
    data_dir = tmp_path / "local"
    log = yaml.safe_load(EXAMPLE.read_text())
    spec = BookieLogSpec.from_manifest(log)
    secret = yaml.safe_load(SECRET.read_text())
    password = secret["stringData"]["password"].encode()
    with control.detached(CLUSTER, data_dir) as doc:
        uri = doc["metadata_service_uri"]
        res = apply(EXAMPLE, data_dir)
        assert res.returncode == 1 and "NOT READY (SecretNotFound)" in res.stdout, res.stdout + res.stderr
        res = apply(SECRET, data_dir)
        assert res.returncode == 0 and "stored Secret orders-log" in res.stdout, res.stdout + res.stderr
        assert (data_dir / "secrets" / "orders-log" / "password").stat().st_mode & 0o777 == 0o600
        res = apply(EXAMPLE, data_dir)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "BookieLog orders: ready (Ready)" in res.stdout
        d = asyncio.run(describe(uri))
        assert d.config == spec.config
        assert json.loads((data_dir / "logs.json").read_text()) == {"default/orders": d.log_id}

        asyncio.run(write(uri, password, 35))
        again = apply(EXAMPLE, data_dir, "-o", "json")
        assert again.returncode == 0, again.stderr
        st = json.loads(again.stdout)[0]["status"]
        assert (st["logId"], st["startOffset"], st["endOffset"], st["segments"]) == (d.log_id, 0, 35, 4)

        log["spec"]["retention"] = {"policy": "limits", "maxBytes": 0}
        changed = tmp_path / "bookielog.yaml"
        changed.write_text(yaml.safe_dump(log))
        res = apply(changed, data_dir, "-o", "json")
        assert res.returncode == 0, res.stderr
        st = json.loads(res.stdout)[0]["status"]
        assert st["startOffset"] == st["endOffset"] == 35        # every closed segment went (maxBytes 0)
        assert asyncio.run(describe(uri)).config.retention == BookieLogSpec.from_manifest(log).config.retention

        secret["stringData"]["password"] = "wrong"       # a Secret and the log in one file work too
        changed.write_text(yaml.safe_dump_all([secret, log]))
        res = apply(changed, data_dir)
        assert res.returncode == 1 and "NOT READY (PasswordMismatch)" in res.stdout


def delete(path: Path, data_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PYBK, "local", "delete", "-f", str(path), "--data-dir", str(data_dir), *extra],
                          capture_output=True, text=True, timeout=120)


async def delete_while_writing(uri: str, password: bytes, path: Path, data_dir: Path) -> subprocess.CompletedProcess:
    async with await BookKeeper.connect(uri) as bk:
        async with await Logs(bk).open_writer("orders", password=password) as w:
            await w.append(b"held open")
            return await asyncio.to_thread(delete, path, data_dir)


async def names(uri: str) -> list[str]:
    async with await BookKeeper.connect(uri) as bk:
        return await Logs(bk).list()


def test_local_delete_follows_the_deletion_policy_and_waits_for_the_writer(tmp_path, child_processes):
    """Slow: a local cluster of three bookies started and stopped (about 20 s) around eight `pybk
    local apply`/`delete` processes (2-3 s each)."""
    data_dir = tmp_path / "local"
    log = yaml.safe_load(EXAMPLE.read_text())
    password = yaml.safe_load(SECRET.read_text())["stringData"]["password"].encode()
    manifest = tmp_path / "bookielog.yaml"
    with control.detached(CLUSTER, data_dir) as doc:
        uri = doc["metadata_service_uri"]
        refused = delete(CLUSTER, data_dir)
        assert refused.returncode == 1
        assert refused.stderr.startswith("pybk local delete: error: ") and "pybk local down" in refused.stderr
        assert apply(SECRET, data_dir).returncode == 0
        assert apply(EXAMPLE, data_dir).returncode == 0
        log_id = json.loads((data_dir / "logs.json").read_text())["default/orders"]

        kept = delete(EXAMPLE, data_dir)                  # deletionPolicy Retain
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert "BookieLog orders: deleted - log 'orders' is retained (deletionPolicy Retain)" in kept.stdout
        assert asyncio.run(names(uri)) == ["orders"]
        assert json.loads((data_dir / "logs.json").read_text()) == {}

        log["spec"]["deletionPolicy"] = "Delete"
        manifest.write_text(yaml.safe_dump(log))
        assert apply(manifest, data_dir).returncode == 0  # adopts the retained log again
        assert json.loads((data_dir / "logs.json").read_text()) == {"default/orders": log_id}
        waiting = asyncio.run(delete_while_writing(uri, password, manifest, data_dir))
        assert waiting.returncode == 1, waiting.stdout + waiting.stderr
        assert "BookieLog orders: NOT DELETED - " in waiting.stdout and "waits for its writer" in waiting.stdout
        assert asyncio.run(names(uri)) == ["orders"]
        assert json.loads((data_dir / "logs.json").read_text()) == {"default/orders": log_id}

        gone = delete(manifest, data_dir, "-o", "json")
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert json.loads(gone.stdout) == [{"name": "orders", "deleted": True,
                                            "message": f"log 'orders' (id {log_id}) deleted (deletionPolicy Delete)"}]
        assert asyncio.run(names(uri)) == []
        assert json.loads((data_dir / "logs.json").read_text()) == {}

        forgot = delete(SECRET, data_dir)
        assert forgot.returncode == 0 and "forgot Secret orders-log" in forgot.stdout
        assert not (data_dir / "secrets" / "orders-log").exists()
