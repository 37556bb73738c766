"""`pybk shell log ...`: the real shell against real etcd and bookies, asserting on the records and
offsets it prints and on what the library reads back."""
from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys

import pytest
from polling import eventually

from pybk.client import BookKeeper
from pybk.log import Logs
from pybk.shell.top import log_rows

PW = "shell-log-password"


def shell(uri: str, *args, stdin: str | bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run([sys.executable, "-m", "pybk.cli", "shell", "log", *map(str, args), "--metadata-uri", uri],
                          input=data if data is not None else b"", capture_output=True, timeout=timeout)


def ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr.decode()
    return res.stdout.decode()


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def uri(bookies, metadata_uri) -> str:
    bookies(3)
    return metadata_uri


@pytest.fixture
def pwfile(tmp_path):
    p = tmp_path / "password"
    p.write_text(PW + "\n")
    return p


def test_create_append_read_describe(uri, pwfile):
    """Slow: eleven shell processes, each importing pybk and connecting (2-3 s apiece on a busy machine)."""
    created = json.loads(ok(shell(uri, "create", "orders", "--password-file", pwfile, "--roll-records", 3,
                                  "--retention", "limits", "--max-age", 3600, "-o", "json")))
    assert created["name"] == "orders" and created["config"]["retention"] == {
        "policy": "limits", "max_age": 3600.0, "max_bytes": None, "max_backlog_bytes": None}
    assert json.loads(ok(shell(uri, "list", "-o", "json"))) == [{"name": "orders", "log_id": created["log_id"]}]
    lines = ["order %d" % i for i in range(5)]
    res = shell(uri, "append", "orders", "--password-file", pwfile, "--print-offsets", stdin="\n".join(lines) + "\n")
    assert ok(res).splitlines() == ["0", "1", "2", "3", "4"]
    assert res.stderr == b""   # closing the writer (and the ledger it made ahead) is no warning
    binary = b"\xff\xfe raw\n"
    assert json.loads(ok(shell(uri, "append", "orders", "--password-file", pwfile, "--key", "k", "-o", "json",
                               stdin=binary))) == {"name": "orders", "records": 1, "first_offset": 5, "last_offset": 5}

    recs = jsonl(ok(shell(uri, "read", "orders")))
    assert [(r["offset"], r.get("payload"), r["key"]) for r in recs[:5]] == [(i, lines[i], None) for i in range(5)]
    assert recs[5]["key"] == "k" and base64.b64decode(recs[5]["payload_base64"]) == b"\xff\xfe raw"
    assert "payload" not in recs[5] and all(r["timestamp"] > 0 for r in recs)
    assert [r["offset"] for r in jsonl(ok(shell(uri, "read", "orders", "--from", 2, "--to", 4)))] == [2, 3]
    assert jsonl(ok(shell(uri, "read", "orders", "--from", "latest"))) == []

    ok(shell(uri, "cursors", "orders", "--commit", "billing", 4))
    d = json.loads(ok(shell(uri, "describe", "orders", "-o", "json")))
    assert (d["start_offset"], d["end_offset"], d["records"], d["writer"]) == (0, 6, 6, None)
    assert d["epoch"] == 2   # two appends, each a writer of its own
    # rolls happen at entry boundaries: the five lines went in one entry, the sixth in a later segment
    segs = d["segments"]
    assert segs[0]["first_offset"] == 0 and segs[0]["end_offset"] == 5 and segs[-1]["end_offset"] == 6
    assert all(a["end_offset"] == b["first_offset"] for a, b in zip(segs, segs[1:]))
    assert {s["state"] for s in segs} == {"CLOSED"}
    assert d["bytes"] == sum(s["bytes"] for s in d["segments"]) > 0
    assert d["cursors"] == [{"name": "billing", "offset": 4, "lag": 2}]
    text = ok(shell(uri, "describe", "orders"))
    assert "offsets:    0 .. 6 (6 records)" in text and "billing" in text


def test_append_prints_each_offset_as_soon_as_it_is_acknowledged(uri, pwfile):
    ok(shell(uri, "create", "live", "--password-file", pwfile))
    p = subprocess.Popen([sys.executable, "-m", "pybk.cli", "shell", "log", "append", "live", "--password-file",
                          str(pwfile), "--print-offsets", "--metadata-uri", uri],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for i in range(3):
            p.stdin.write(b"line %d\n" % i)
            p.stdin.flush()
            assert p.stdout.readline() == b"%d\n" % i   # printed while the input is still open
        p.stdin.close()
        assert p.wait(60) == 0, p.stderr.read().decode()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_tail_prints_records_appended_after_it_started(uri, pwfile):
    ok(shell(uri, "create", "feed", "--password-file", pwfile))
    ok(shell(uri, "append", "feed", "--password-file", pwfile, stdin="old\n"))
    p = subprocess.Popen([sys.executable, "-m", "pybk.cli", "shell", "log", "tail", "feed", "--from", "1",
                          "--count", "3", "--metadata-uri", uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    async def append_while_tailing() -> list[dict]:
        got = []
        async with await BookKeeper.connect(uri) as bk:
            async with await Logs(bk).open_writer("feed", password=PW.encode()) as w:
                await w.append(b"new 0")
                # the tail printed the first: it is following the log when the next two come
                got.append(json.loads(await asyncio.wait_for(asyncio.to_thread(p.stdout.readline), 60)))
                await w.append(b"new 1")
                await w.append(b"new 2")
        return got
    try:
        first = asyncio.run(append_while_tailing())
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err.decode()
    assert [(r["offset"], r["payload"]) for r in first + jsonl(out.decode())] == [
        (1, "new 0"), (2, "new 1"), (3, "new 2")]


def test_cursors_truncate_and_delete_need_what_docs_say(uri, pwfile, tmp_path):
    """Slow: fifteen shell processes, each importing pybk and connecting (2-3 s apiece on a busy machine)."""
    ok(shell(uri, "create", "events", "--password-file", pwfile, "--roll-records", 2))
    for i in range(3):
        ok(shell(uri, "append", "events", "--password-file", pwfile, stdin="a%d\nb%d\n" % (i, i)))
    ok(shell(uri, "cursors", "events", "--commit", "c1", 3))
    back = shell(uri, "cursors", "events", "--commit", "c1", 1)
    assert back.returncode == 1 and "is at 3" in back.stderr.decode()
    assert json.loads(ok(shell(uri, "cursors", "events", "-o", "json"))) == [{"name": "c1", "offset": 3, "lag": 3}]
    assert json.loads(ok(shell(uri, "cursors", "events", "--delete", "c1", "-o", "json"))) == []

    refused = shell(uri, "truncate", "events", "--before", 4, "--yes")
    assert refused.returncode == 1 and "needs the log's password" in refused.stderr.decode()
    wrong = tmp_path / "wrong"
    wrong.write_text("guess")
    refused = shell(uri, "truncate", "events", "--before", 4, "--yes", "--password-file", wrong)
    assert refused.returncode == 1 and "the one given is wrong" in refused.stderr.decode()
    unconfirmed = shell(uri, "truncate", "events", "--before", 4, "--password-file", pwfile)
    assert unconfirmed.returncode == 1 and "--yes" in unconfirmed.stderr.decode()
    got = json.loads(ok(shell(uri, "truncate", "events", "--before", 4, "--yes", "--password-file", pwfile,
                              "-o", "json")))
    assert got == {"name": "events", "start_offset": 4, "deleted_records": 4}
    below = shell(uri, "read", "events", "--from", 1)
    assert below.returncode == 1 and "start" in below.stderr.decode() and b"Traceback" not in below.stderr
    assert [r["payload"] for r in jsonl(ok(shell(uri, "read", "events")))] == ["a2", "b2"]

    assert ok(shell(uri, "delete", "events", "--force")).strip() == "deleted log events"
    missing = shell(uri, "describe", "events")
    assert missing.returncode == 1 and "log 'events' does not exist" in missing.stderr.decode()
    assert b"Traceback" not in missing.stderr


def test_top_ranks_logs_by_records_per_second_between_frames():
    rows = log_rows({"idle": 500, "busy": 40, "new": 0, "mac": None}, {"idle": 500, "busy": 20, "mac": None}, 2.0, 3)
    assert rows == [{"log": "busy", "end_offset": 40, "records_per_second": 10.0},
                    {"log": "idle", "end_offset": 500, "records_per_second": 0.0},
                    {"log": "new", "end_offset": 0, "records_per_second": None}]
    assert [r["records_per_second"] for r in log_rows({"a": 5}, {}, None, 5)] == [None]


def test_top_shows_the_busiest_logs(uri, pwfile):
    ok(shell(uri, "create", "quiet", "--password-file", pwfile))
    ok(shell(uri, "create", "busy", "--password-file", pwfile))

    async def top_while_appending() -> subprocess.CompletedProcess:
        async with await BookKeeper.connect(uri) as bk:
            async with await Logs(bk).open_writer("busy", password=PW.encode()) as w:
                task = asyncio.ensure_future(asyncio.to_thread(
                    subprocess.run, [sys.executable, "-m", "pybk.cli", "shell", "top", "--count", "2", "--interval",
                                     "1", "--logs", "1", "--metadata-uri", uri, "-o", "json"],
                    capture_output=True, text=True, timeout=120))
                while not task.done():
                    await w.append_many([b"x"] * 10)
                return await task
    res = asyncio.run(top_while_appending())
    assert res.returncode == 0, res.stderr
    frames = [json.loads(line) for line in res.stdout.splitlines()]
    assert frames[0]["logs"][0]["records_per_second"] is None   # no earlier frame to take a rate from
    assert [r["log"] for r in frames[1]["logs"]] == ["busy"] and frames[1]["logs"][0]["records_per_second"] > 0


def test_help_explains_every_action(child_processes):
    res = subprocess.run([sys.executable, "-m", "pybk.cli", "shell", "log", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0
    for action in ("create", "list", "describe", "append", "read", "tail", "cursors", "truncate", "delete"):
        assert f"\n  {action} " in res.stdout
    assert "payload_base64" in res.stdout
