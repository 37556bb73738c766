"""Faults at every step of open, roll, truncate and delete: a client process is killed with -9
at a failpoint between an etcd step and a bookie step, and the log must still hold every
acknowledged record at its offset, with dense offsets, no segment pointing at a deleted ledger,
and every orphan ledger found and deleted."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from polling import eventually

from pybk.client import BookKeeper
from pybk.local.process import ChildProcess
from pybk.log import LogConfig, Logs, Rollover, SegmentState, WriterOptions, failpoints

PW = b"log-password"
SMALL = LogConfig(rollover=Rollover(max_records=10))
HERE = Path(__file__).parent


def body(i: int) -> bytes:
    return b"record-%06d" % i


class LogChild(ChildProcess):
    """log_child.py in its own process group."""

    def __init__(self, uri: str, name: str, point: str, action: str, arg: int, log: Path):
        super().__init__("log-child", [sys.executable, str(HERE / "log_child.py"), uri, name, PW.decode(), point,
                                       action, str(arg)], log)

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def acked(self, base: int) -> dict[int, bytes]:
        return {int(o): body(base + int(i)) for o, i in re.findall(r"^ACK (\d+) (\d+)$", self.text(), re.M)}

    async def wait_at(self, point: str) -> None:
        def there():
            assert self.alive(), f"the child exited:\n{self.log_tail()}"
            return f"AT {point}" in self.text()
        await eventually(there, timeout=60, interval=0.02, what=f"the child at {point}")


async def check_log(bk: BookKeeper, logs: Logs, name: str, acked: dict[int, bytes]) -> None:
    """Every acknowledged record at its offset, offsets dense from the start, orphans reclaimed,
    and the ledgers left are exactly those of the log's segments."""
    async with await logs.open_reader(name, end="latest") as r:
        recs = [rec async for rec in r]
    start = await logs.start_offset(name)
    assert [x.offset for x in recs] == list(range(start, start + len(recs)))
    stored = {x.offset: x.payload for x in recs}
    assert {o: stored.get(o) for o in acked if o >= start} == {o: p for o, p in acked.items() if o >= start}
    await logs.reclaim_orphans(log_name=name, password=PW)
    segments = (await logs.describe(name)).segments
    assert all(s.state is not SegmentState.TRUNCATED for s in segments)
    assert sorted([lid async for lid in bk.list_ledgers()]) == sorted(s.ledger_id for s in segments)


@pytest.mark.parametrize("point", ["open.after_epoch", "open.after_recover", "open.after_create",
                                   "roll.after_close", "roll.after_commit"])
async def test_a_writer_killed_at_each_step_of_open_and_roll_loses_nothing(cluster, tmp_path, point):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("f", SMALL, password=PW)
        first = await logs.open_writer("f", password=PW, options=WriterOptions(batch_bytes=60))
        acked = {await first.append(body(i)): body(i) for i in range(25)}
        first.abandon()              # its open segment is left for the next writer to recover
        child = LogChild(uri, "f", point, "append", 1000, tmp_path / "child.log").start()
        try:
            await child.wait_at(point)
            if point.startswith("roll"):
                await eventually(lambda: child.acked(1000), timeout=10, what="the child's acks")
        finally:
            child.kill()
        acked.update(child.acked(1000))
        async with await logs.open_writer("f", password=PW) as w:
            for i in range(5):
                acked[await w.append(body(2000 + i))] = body(2000 + i)
        await check_log(bk, logs, "f", acked)


@pytest.mark.parametrize("point", ["truncate.after_mark", "truncate.after_ledgers"])
async def test_a_truncation_killed_at_each_step_finishes_when_run_again(cluster, tmp_path, point):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("f", SMALL, password=PW)
        async with await logs.open_writer("f", password=PW, options=WriterOptions(batch_bytes=60)) as w:
            acked = {await w.append(body(i)): body(i) for i in range(35)}
        segments = (await logs.describe("f")).segments
        child = LogChild(uri, "f", point, "truncate", 25, tmp_path / "child.log").start()
        try:
            await child.wait_at(point)
        finally:
            child.kill()
        assert await logs.start_offset("f") == 20            # the start moved with the marks
        assert await logs.truncate("f", 25, password=PW) == 20
        for s in segments[:2]:
            assert not [lid async for lid in bk.list_ledgers() if lid == s.ledger_id]
        await check_log(bk, logs, "f", acked)


async def test_a_delete_killed_after_freeing_the_name_is_finished_by_orphan_reclaim(cluster, tmp_path):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("f", SMALL, password=PW)
        async with await logs.open_writer("f", password=PW) as w:
            await w.append_many([body(i) for i in range(30)])
        child = LogChild(uri, "f", "delete.after_name", "delete", 0, tmp_path / "child.log").start()
        try:
            await child.wait_at("delete.after_name")
        finally:
            child.kill()
        assert await logs.list() == []
        await logs.create("f", password=PW)
        async with await logs.open_reader("f", end="latest") as r:
            assert [rec async for rec in r] == []
        reclaimed = await logs.reclaim_orphans(force=True)
        assert reclaimed and all(why == "its log is being deleted" for _, why in reclaimed)
        assert [lid async for lid in bk.list_ledgers()] == []
        keys = await bk.store.etcd.range(logs.meta.keys.logs, logs.meta.keys.logs + b"\xff", keys_only=True)
        assert all(b"/head" in kv.key or b"/config" in kv.key for kv in keys.kvs)   # the new log's only


async def test_the_ledger_of_an_open_that_lost_its_commit_is_an_orphan_and_is_reclaimed(cluster):
    """A writer that made its segment ledger and died before committing it leaves an orphan; a
    later writer commits the same sequence with its own ledger; reclaim finds and deletes the first."""
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("o", password=PW)
        failpoints.arm("open.after_create", failpoints.crash)
        with pytest.raises(failpoints.Crash):
            await logs.open_writer("o", password=PW)
        failpoints.disarm()
        [orphan] = [lid async for lid in bk.list_ledgers()]
        async with await logs.open_writer("o", password=PW) as w:
            await w.append(b"x")
        reclaimed = await logs.reclaim_orphans(log_name="o", password=PW)
        assert reclaimed == [(orphan, "segment 0 was committed with ledger %d"
                              % (await logs.describe("o")).segments[0].ledger_id)]
        await check_log(bk, logs, "o", {0: b"x"})
