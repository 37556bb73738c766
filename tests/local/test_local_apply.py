"""`pybk local apply`: declarative scale up and safe scale down of a running local cluster."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from pybk.local import control
from pybk.local.datadir import read_local_json

PYBK = [sys.executable, "-m", "pybk.cli"]


def manifest(tmp_path: Path, replicas: int) -> Path:
    path = tmp_path / f"cluster-{replicas}.yaml"
    path.write_text("apiVersion: pybk.io/v1alpha1\nkind: BookieCluster\nmetadata: {name: t}\n"
                    f"spec:\n  replicas: {replicas}\n  autorecovery: {{replicas: 1}}\n")
    return path


def apply(tmp_path: Path, replicas: int, data_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*PYBK, "local", "apply", "-f", str(manifest(tmp_path, replicas)), "--data-dir",
                           str(data_dir), "--timeout", "240"], capture_output=True, text=True, timeout=300)


async def _all_replicas_written(doc: dict, lh, count: int) -> None:
    """Wait until every bookie of the ledger's ensemble holds entries 0..count-1: an ack needs only
    Qa of Qw, and the test's baseline is a fully replicated ledger."""
    from pybk.client.bookie_client import BookieClient
    grpc = {b["id"]: b["grpc"] for b in doc["bookies"]}
    for bookie_id in lh.metadata.fragments[0].bookies:
        c = await BookieClient.connect(grpc[bookie_id])
        try:
            for _ in range(600):
                if await c.list_entries(lh.ledger_id) == [(0, count - 1)]:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"{bookie_id} never got all {count} entries of ledger {lh.ledger_id}")
        finally:
            await c.close()


async def _write_ledgers(uri: str, must_use: str, doc: dict) -> dict[int, list[bytes]]:
    """E3/Qw3/Qa2 ledgers (empty password, which autorecovery always tries): closed ones until at
    least two have a replica on must_use, then one left open by a writer that went away."""
    from pybk.client import BookKeeper
    written: dict[int, list[bytes]] = {}
    on_it = 0
    async with await BookKeeper.connect(uri) as bk:
        while on_it < 2 and len(written) < 40:
            lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"")
            payloads = [f"{lh.ledger_id}:{i}".encode() * 8 for i in range(30)]
            await asyncio.gather(*(lh.add_entry_async(p) for p in payloads))
            await lh.close()
            await _all_replicas_written(doc, lh, len(payloads))
            written[lh.ledger_id] = payloads
            on_it += must_use in lh.metadata.fragments[0].bookies
        for _ in range(40):
            lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"")
            if must_use in lh.metadata.fragments[0].bookies:
                break
            await bk.delete_ledger(lh.ledger_id, b"")
        payloads = [f"open:{i}".encode() for i in range(20)]
        for p in payloads:
            await lh.add_entry(p)
        await _all_replicas_written(doc, lh, len(payloads))
        written[lh.ledger_id] = payloads  # never closed: autorecovery fences and recovers it
    assert on_it >= 2
    return written


async def _check(uri: str, doc: dict, written: dict[int, list[bytes]], gone: str) -> None:
    from pybk.client.bookie_client import BookieClient
    from pybk.client import BookKeeper
    async with await BookKeeper.connect(uri) as bk:
        for lid, payloads in written.items():
            md = await bk.ledger_metadata(lid)
            assert all(gone not in f.bookies for f in md.fragments), (lid, md.fragments)
            rh = await bk.open_ledger(lid, password=b"")
            assert [bytes(e.data) async for e in rh.read_entries(0, len(payloads) - 1)] == payloads
            await rh.close()
    for b in doc["bookies"]:  # E3 = Qw3 on 3 bookies: every bookie holds every entry again
        c = await BookieClient.connect(b["grpc"])
        try:
            for lid, payloads in written.items():
                assert await c.list_entries(lid) == [(0, len(payloads) - 1)], (b["id"], lid)
        finally:
            await c.close()


def test_apply_scales_up_then_down_draining_the_removed_bookie_first(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    # the open ledger's last fragment is left to its writer this long before autorecovery takes it
    with control.detached(manifest(tmp_path, 3), data_dir, env={"PYBK_OPEN_LEDGER_GRACE": "1"}) as doc:
        up = apply(tmp_path, 4, data_dir)
        assert up.returncode == 0, up.stdout + up.stderr
        four = read_local_json(data_dir)
        assert [b["id"] for b in four["bookies"]] == ["bookie-0", "bookie-1", "bookie-2", "bookie-3"]
        uri = doc["metadata_service_uri"]
        written = asyncio.run(_write_ledgers(uri, "bookie-3", four))

        down = apply(tmp_path, 3, data_dir)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "bookie-3" in down.stdout and "Decommission" in down.stdout
        three = read_local_json(data_dir)
        assert [b["id"] for b in three["bookies"]] == ["bookie-0", "bookie-1", "bookie-2"]
        assert not control.pid_alive(four["bookies"][3]["pid"])
        asyncio.run(_check(uri, three, written, "bookie-3"))

        again = apply(tmp_path, 4, data_dir)  # the drained ordinal comes back as a fresh bookie
        assert again.returncode == 0, again.stdout + again.stderr
        listed = subprocess.run([*PYBK, "shell", "listbookies", "--data-dir", str(data_dir), "-o", "json"],
                                capture_output=True, text=True, timeout=120)
        assert [(b["id"], b["state"]) for b in json.loads(listed.stdout)][-1] == ("bookie-3", "writable")


async def _open_ledger_on_four(uri: str):
    from pybk.client import BookKeeper
    bk = await BookKeeper.connect(uri)
    lh = await bk.create_ledger(ensemble=4, write_quorum=3, ack_quorum=2, password=b"")
    await lh.add_entry(b"x")
    return bk, lh


def test_apply_below_the_largest_open_ensemble_is_refused(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    with control.detached(manifest(tmp_path, 4), data_dir):
        loop = asyncio.new_event_loop()
        try:
            bk, lh = loop.run_until_complete(_open_ledger_on_four(read_local_json(data_dir)["metadata_service_uri"]))
            res = apply(tmp_path, 3, data_dir)
            loop.run_until_complete(bk.close())
        finally:
            loop.close()
        assert res.returncode == 1
        assert "refusing to scale down to 3 bookies: an open ledger uses an ensemble of 4" in res.stderr
        assert len(read_local_json(data_dir)["bookies"]) == 4
        assert "replicas: 4" in (data_dir / "cluster.yaml").read_text()


def test_apply_with_changed_config_restarts_bookies_one_at_a_time(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    with control.detached(manifest(tmp_path, 3), data_dir) as before:
        changed = tmp_path / "changed.yaml"
        changed.write_text(manifest(tmp_path, 3).read_text().replace(
            "  autorecovery", '  config: {journal-group-wait: "0.001"}\n  autorecovery'))
        res = subprocess.run([*PYBK, "local", "apply", "-f", str(changed), "--data-dir", str(data_dir)],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        order = [line.rsplit("restarting bookie ", 1)[1].split()[0] for line in res.stdout.splitlines()
                 if "restarting bookie " in line]
        assert order == ["bookie-2", "bookie-1", "bookie-0"]
        after = read_local_json(data_dir)
        for old, new in zip(before["bookies"], after["bookies"]):
            assert new["pid"] != old["pid"] and not control.pid_alive(old["pid"])
            assert (new["grpc"], new["http"]) == (old["grpc"], old["http"])
            cmdline = Path(f"/proc/{new['pid']}/cmdline").read_bytes().split(b"\0")
            assert cmdline[cmdline.index(b"--journal-group-wait") + 1] == b"0.001"


async def _closed_ledger_on_four(uri: str) -> None:
    from pybk.client import BookKeeper
    async with await BookKeeper.connect(uri) as bk:
        lh = await bk.create_ledger(ensemble=4, write_quorum=3, ack_quorum=2, password=b"")
        await lh.add_entry(b"x")
        await lh.close()


def test_apply_that_cannot_drain_a_bookie_is_refused_and_keeps_the_cluster(tmp_path, child_processes):
    data_dir = tmp_path / "d"
    with control.detached(manifest(tmp_path, 4), data_dir) as doc:
        asyncio.run(_closed_ledger_on_four(doc["metadata_service_uri"]))
        res = apply(tmp_path, 3, data_dir)
        assert res.returncode == 1
        assert "cannot drain bookie-3: a ledger on it has an ensemble of 4" in res.stderr
        after = read_local_json(data_dir)
        assert [b["pid"] for b in after["bookies"]] == [b["pid"] for b in doc["bookies"]]
        assert all(control.pid_alive(b["pid"]) for b in after["bookies"])
        assert "replicas: 4" in (data_dir / "cluster.yaml").read_text()
