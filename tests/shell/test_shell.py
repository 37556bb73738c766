"""`pybk shell` against a running local cluster: the right data in -o json, clear failures."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pybk.local import control
from pybk.local.process import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"
PASSWORD = b"shell-test"


def shell(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pybk.cli", "shell", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def shell_json(*args):
    res = shell(*args, "-o", "json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


async def _write(uri: str) -> dict:
    """A closed ledger of 10 entries and an open one of 5; returns ids and payloads."""
    from pybk.client import BookKeeper
    async with await BookKeeper.connect(uri) as bk:
        closed = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD,
                                        metadata={"app": b"shell-test"})
        closed_payloads = [f"event-{i}".encode() for i in range(10)]
        for p in closed_payloads:
            await closed.add_entry(p)
        await closed.close()
        open_ = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD)
        open_payloads = [bytes([i]) * 3 for i in range(5)]
        for p in open_payloads:
            await open_.add_entry(p)
        # leave it open: the writer's process is gone when this returns, like a crashed writer
        return {"closed": (closed.ledger_id, closed_payloads), "open": (open_.ledger_id, open_payloads)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, child_processes):
    data_dir = tmp_path_factory.mktemp("shell")
    with control.detached(EXAMPLE, data_dir) as doc:
        yield data_dir, doc


@pytest.fixture(scope="module")
def ledgers(cluster):
    import asyncio
    return asyncio.run(_write(cluster[1]["metadata_service_uri"]))


def test_listbookies_shows_every_bookie_with_its_endpoints(cluster):
    data_dir, doc = cluster
    got = shell_json("listbookies", "--data-dir", data_dir)
    assert [(b["id"], b["state"], b["grpc"], b["http"].removeprefix("http://")) for b in got] == [
        (b["id"], "writable", b["grpc"], b["http"]) for b in doc["bookies"]]


def test_listbookies_info_asks_every_bookie(cluster):
    got = shell_json("listbookies", "--info", "--data-dir", cluster[0])
    assert [b["info"]["bookie_id"] for b in got] == ["bookie-0", "bookie-1", "bookie-2"]
    assert all(b["info"]["total_bytes"] >= b["info"]["free_bytes"] > 0 for b in got)


def test_listbookies_text_is_a_table(cluster):
    res = shell("listbookies", "--data-dir", cluster[0])
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert lines[0].split()[:3] == ["BOOKIE", "STATE", "GRPC"] and len(lines) == 4


def test_listledgers_shows_state_and_size(cluster, ledgers):
    got = {r["ledger_id"]: r for r in shell_json("listledgers", "--data-dir", cluster[0])}
    cid, cpay = ledgers["closed"]
    oid, _ = ledgers["open"]
    assert got[cid]["state"] == "CLOSED" and got[cid]["last_entry_id"] == 9
    assert got[cid]["length"] == sum(len(p) for p in cpay)
    assert got[oid]["state"] == "OPEN" and got[oid]["write_quorum"] == 2
    ids_only = shell_json("listledgers", "--ids-only", "--data-dir", cluster[0])
    assert {r["ledger_id"] for r in ids_only} == set(got)


def test_ledgermetadata_shows_quorums_fragments_and_custom_metadata(cluster, ledgers):
    cid, _ = ledgers["closed"]
    md = shell_json("ledgermetadata", cid, "--data-dir", cluster[0])
    assert (md["ensemble_size"], md["write_quorum"], md["ack_quorum"]) == (3, 3, 2)
    assert md["state"] == "CLOSED" and md["last_entry_id"] == 9
    assert md["fragments"][0]["first_entry_id"] == 0 and md["fragments"][-1]["last_entry_id"] == 9
    assert sorted(md["fragments"][0]["bookies"]) == ["bookie-0", "bookie-1", "bookie-2"]
    assert base64.b64decode(md["custom"]["app"]) == b"shell-test"
    assert "password_hash" not in md


def test_ledgermetadata_shows_no_key(cluster, ledgers):
    from pybk.entry import key_check, master_key
    cid, _ = ledgers["closed"]
    res = shell("ledgermetadata", cid, "--data-dir", cluster[0], "-o", "json")
    assert res.returncode == 0, res.stderr
    for secret in (master_key(PASSWORD), key_check(master_key(PASSWORD))):
        assert secret.hex() not in res.stdout and base64.b64encode(secret).decode() not in res.stdout
    assert "master_key" not in json.loads(res.stdout) and "key_check" not in json.loads(res.stdout)


def test_readledger_returns_the_written_payloads(cluster, ledgers):
    cid, cpay = ledgers["closed"]
    got = shell_json("readledger", cid, "--password", PASSWORD.decode(), "--data-dir", cluster[0])
    assert [base64.b64decode(e["payload_base64"]) for e in got["entries"]] == cpay
    assert [e["entry_id"] for e in got["entries"]] == list(range(10))
    part = shell_json("readledger", cid, "--first", 3, "--last", 5, "--password", PASSWORD.decode(),
                      "--data-dir", cluster[0])
    assert [(e["entry_id"], e["payload_text"]) for e in part["entries"]] == [(i, f"event-{i}") for i in (3, 4, 5)]


def test_readledger_of_an_open_ledger_reads_up_to_its_lac_without_closing_it(cluster, ledgers):
    oid, opay = ledgers["open"]
    got = shell_json("readledger", oid, "--password", PASSWORD.decode(), "--data-dir", cluster[0])
    # entries up to the LAC the bookies know (the last add's LAC is piggybacked on a later add)
    payloads = [base64.b64decode(e["payload_base64"]) for e in got["entries"]]
    assert payloads == opay[:len(payloads)] and len(payloads) >= len(opay) - 1
    assert shell_json("ledgermetadata", oid, "--data-dir", cluster[0])["state"] == "OPEN"


def test_simpletest_writes_reads_back_and_deletes(cluster):
    got = shell_json("simpletest", "-n", 50, "--data-dir", cluster[0])
    assert got["ok"] and got["entries"] == 50 and got["deleted"]
    ids = {r["ledger_id"] for r in shell_json("listledgers", "--ids-only", "--data-dir", cluster[0])}
    assert got["ledger_id"] not in ids


def test_delete_needs_the_password_from_a_file_or_force_as_an_admin(cluster, tmp_path):
    secret, wrong = tmp_path / "password", tmp_path / "wrong"
    secret.write_text("simple-secret\n")
    wrong.write_text("guess\n")
    lid = shell_json("simpletest", "-n", 3, "--keep", "--password", "simple-secret", "--data-dir",
                     cluster[0])["ledger_id"]
    refused = shell("delete", lid, "--data-dir", cluster[0])
    assert refused.returncode == 1 and f"deleting ledger {lid} needs its password" in refused.stderr
    refused = shell("delete", lid, "--password-file", wrong, "--yes", "--data-dir", cluster[0])
    assert refused.returncode == 1 and f"wrong password for ledger {lid}" in refused.stderr
    unconfirmed = shell("delete", lid, "--password-file", secret, "--data-dir", cluster[0])
    assert unconfirmed.returncode == 1 and "--yes" in unconfirmed.stderr
    assert shell_json("ledgermetadata", lid, "--data-dir", cluster[0])["ledger_id"] == lid  # still there
    assert shell_json("delete", lid, "--password-file", secret, "--yes", "--data-dir", cluster[0]) == \
        {"ledger_id": lid, "deleted": True}
    res = shell("ledgermetadata", lid, "--data-dir", cluster[0])
    assert res.returncode == 1 and f"ledger {lid} does not exist" in res.stderr
    # --force: no password, no question; an admin action (every caller is one with security off)
    other = shell_json("simpletest", "-n", 3, "--keep", "--password", "simple-secret", "--data-dir",
                       cluster[0])["ledger_id"]
    assert shell_json("delete", other, "--force", "--data-dir", cluster[0]) == {"ledger_id": other, "deleted": True}


def test_metadata_uri_from_the_environment(cluster):
    env = dict(os.environ, PYBK_METADATA_URI=cluster[1]["metadata_service_uri"])
    res = shell("listbookies", "-o", "json", env=env)
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)) == 3


def test_unreachable_etcd_is_a_clear_error(child_processes):
    port = free_port()
    res = shell("listbookies", "--metadata-uri", f"etcd://127.0.0.1:{port}/pybk")
    assert res.returncode == 1
    assert f"127.0.0.1:{port}" in res.stderr and "Traceback" not in res.stderr


def test_bad_metadata_uri_is_a_clear_error(child_processes):
    res = shell("listledgers", "--metadata-uri", "http://127.0.0.1:2379")
    assert res.returncode == 1 and "expected etcd://HOST:PORT" in res.stderr


def test_missing_ledger_is_a_clear_error(cluster):
    res = shell("readledger", "999999999", "--data-dir", cluster[0])
    assert res.returncode == 1 and "999999999" in res.stderr and "Traceback" not in res.stderr
