"""Retention run by the elected autorecovery process (a real `pybk autorecovery`): a log whose
writer is gone has its OPEN segment sealed so its age counts, its expired segments deleted as a
prefix, and the bookies' garbage collection then frees their bytes."""
from __future__ import annotations

import asyncio
import urllib.request

import pytest
from polling import eventually
from prometheus_client.parser import text_string_to_metric_families

from pybk.client import BookKeeper
from pybk.log import (LogConfig, Logs, LogTruncatedError, Retention, RetentionPolicy, Rollover, SegmentState,
                      WriterOptions)
from pybk.log.layout import ledger_owner
from pybk.local.autorecovery import AutoRecoveryProcess

PW = b"log-password"


def metric(url: str, name: str, log: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and s.labels.get("log") == log)


async def test_the_auditor_ages_out_an_abandoned_log_and_bookies_free_its_bytes(bookies, metadata_uri, tmp_path,
                                                                                 monkeypatch):
    # entries reach entry log files at once, and the files rotate every 8 KiB: the bytes of deleted
    # segments are in files of their own, which garbage collection deletes
    procs = bookies(3, gc_interval=0, checkpoint_interval=0.2, entrylog_max_file_size="8KiB")
    expiring = LogConfig(rollover=Rollover(max_records=50, max_idle=1.0),
                         retention=Retention(RetentionPolicy.LIMITS, max_age=1.0))
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        await logs.create("expiring", expiring, password=PW)
        await logs.create("kept", password=PW)   # no retention: untouched
        async with await logs.open_writer("kept", password=PW) as w:
            await w.append_many([b"keep"] * 10)
        w = await logs.open_writer("expiring", password=PW, options=WriterOptions(batch_bytes=1000))
        for _ in range(4):
            await w.append_many([b"x" * 100] * 50)
            await w.roll()
        await w.append_many([b"y" * 100] * 30)   # in the OPEN segment when the writer dies
        ref = await logs.ref("expiring")
    w.abandon()   # the client's session (and the writer key on it) is gone with the client: no live writer

    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        await eventually(lambda: _no_writer(logs, ref.log_id), timeout=60, what="the dead writer's key to expire")
        before = (await logs.describe("expiring")).segments
        assert before[-1].state is SegmentState.OPEN and len(before) == 5
        ledgers = {s.ledger_id for s in before}

        monkeypatch.setenv("PYBK_LOG_RETENTION_INTERVAL", "0.5")
        recovery = AutoRecoveryProcess(tmp_path / "autorecovery.log", metadata_uri).start()
        try:
            # counted once the truncation has deleted the ledgers too (the start moves first)
            await eventually(lambda: metric(recovery.http_url, "pybk_log_retention_deleted_segments_total",
                                            "expiring") == 5, timeout=90,
                             what="retention to delete every segment of the expired log")
            assert metric(recovery.http_url, "pybk_log_retention_idle_rolls_total", "expiring") == 1
            # the closed segments' bytes, and the sealed one's: 30 records of 104 B (100 and a length:
            # append_many's entries are uniform) and its entries' headers
            deleted_bytes = metric(recovery.http_url, "pybk_log_retention_deleted_bytes_total", "expiring")
            assert sum(s.bytes for s in before[:-1]) + 30 * 104 < deleted_bytes < sum(
                s.bytes for s in before[:-1]) + 30 * 104 + 1000
        finally:
            recovery.kill()

        d = await logs.describe("expiring")
        assert (d.start_offset, d.end_offset) == (230, 230) and d.segments == []
        with pytest.raises(LogTruncatedError, match="start"):
            await logs.open_reader("expiring", start=0)
        left = {md.ledger_id async for md in bk.store.ledgers.list_metadata()
                if (ledger_owner(md.custom) or (0,))[0] == ref.log_id}
        assert not left & ledgers
        async with await logs.open_reader("kept", end="latest") as r:
            assert [rec.payload async for rec in r] == [b"keep"] * 10
        # entries written after: a bookie's next checkpoint puts them in a new entry log, so the
        # one holding the expired log's entries (full by now) is no longer the current one, which
        # compaction never rewrites
        await logs.create("later", password=PW)
        async with await logs.open_writer("later", password=PW) as w:
            await w.append_many([b"later"] * 10)

    # the bookies drop the deleted ledgers and free their bytes
    freed = dropped = 0
    for p in procs:
        result = await asyncio.to_thread(p.http_json, "/api/v1/bookie/gc", "POST")
        assert set(result["deleted_ledgers"]) & ledgers
        freed += result["reclaimed_bytes"]
        dropped += result["dropped_entries"]
    # three copies (E3/Qw3) were stored; at least one copy's worth of entry log files is gone
    assert dropped > 0 and freed >= deleted_bytes, (dropped, freed, deleted_bytes)


async def _no_writer(logs: Logs, log_id: int) -> bool:
    return await logs.meta.writer_key(log_id) is None


async def test_retention_reads_a_long_log_only_as_far_as_its_decision_needs(metadata_uri):
    from pybk.log.layout import Head, Segment
    from pybk.meta.etcd import op_put
    now = 10_000_000
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        by_age = await logs.create("aged", LogConfig(retention=Retention(RetentionPolicy.LIMITS, max_age=60)),
                                   password=PW)
        by_size = await logs.create("sized", LogConfig(retention=Retention(RetentionPolicy.LIMITS, max_age=60,
                                                                           max_bytes=10_000)), password=PW)
        for ref in (by_age, by_size):
            k = logs.meta.keys
            # 1,200 closed segments of 100 records; the first 700 are older than max_age
            for start in range(0, 1200, 100):
                await logs.meta.etcd.txn([], [op_put(k.segment(ref.log_id, s), Segment(
                    s, 1 << 40 | s, SegmentState.CLOSED, 1, s * 100, 100, 1000, 0,
                    now - (120_000 if s < 700 else 1000), 0, 0).to_bytes()) for s in range(start, start + 100)])
            await logs.meta.etcd.put(k.head(ref.log_id), Head(1, "test", last_seq=1199).to_bytes())
        before, read = await logs.retention_point(by_age, now)
        assert before == 700 * 100 and len(read) == 1000   # two pages of 500: the second holds the first kept
        before, read = await logs.retention_point(by_size, now)
        assert before == 1190 * 100 and len(read) == 1200   # keeping 10,000 bytes needs every segment's size


async def test_a_pass_under_interest_never_deletes_at_or_above_the_lowest_cursor(cluster):
    from pybk.log.retention_service import RetentionService
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("consumed", LogConfig(rollover=Rollover(max_records=10),
                                                retention=Retention(RetentionPolicy.INTEREST)), password=PW)
        async with await logs.open_writer("consumed", password=PW, options=WriterOptions(batch_bytes=100)) as w:
            for i in range(6):
                await w.append_many([b"r%d" % i] * 10)
                await w.roll()
        service = RetentionService(logs, "test")
        assert (await service.run_pass()).deleted_segments == {}   # no cursor: nothing goes
        await logs.commit("consumed", "slow", 25)
        await logs.commit("consumed", "fast", 60)
        report = await service.run_pass()
        assert report.deleted_segments == {"consumed": 2} and report.errors == {}
        assert await logs.start_offset("consumed") == 20           # the segment holding 25 stays whole
        async with await logs.open_reader("consumed", cursor="slow", end="latest") as r:
            assert [rec.offset for rec in [x async for x in r]] == list(range(25, 60))
