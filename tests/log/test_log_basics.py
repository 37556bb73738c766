"""Named logs on real etcd and bookies: names, passwords, offsets, readers, cursors, truncation.
Each test shows one promise of docs/logs.md, asserting on the records read back."""
from __future__ import annotations

import asyncio
import time

import pytest
from polling import eventually

from pybk.client import BookKeeper, DigestType, UnauthorizedError
from pybk.log import (CursorError, LogConfig, LogExistsError, LogInUseError, LogNotFoundError, Logs,
                      LogTruncatedError, Retention, RetentionPolicy, Rollover, SegmentState, WriterOptions)

PW = b"log-password"
SMALL = LogConfig(rollover=Rollover(max_records=10))   # a segment per 10 records (at entry boundaries)


def body(i: int) -> bytes:
    return b"record-%06d" % i


async def read_all(logs: Logs, name: str, start="earliest") -> list:
    async with await logs.open_reader(name, start=start, end="latest") as r:
        return [rec async for rec in r]


async def test_append_then_read_back(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("orders", password=PW)
        async with await logs.open_writer("orders", password=PW) as w:
            offsets = [await w.append(b"r%d" % i, key=b"k" if i % 2 else None) for i in range(5)]
            offsets += list(await w.append_many([b"m%d" % i for i in range(100)]))
        assert offsets == list(range(105))
        recs = await read_all(logs, "orders")
        assert [r.offset for r in recs] == list(range(105))
        assert [r.payload for r in recs] == [b"r%d" % i for i in range(5)] + [b"m%d" % i for i in range(100)]
        assert [r.key for r in recs[:5]] == [None, b"k", None, b"k", None]


async def test_names_answer_with_errors_naming_the_cause(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("a", password=PW)
        with pytest.raises(LogExistsError, match=r"^log 'a' already exists"):
            await logs.create("a", password=PW)
        with pytest.raises(LogNotFoundError, match=r"^log 'missing' does not exist"):
            await logs.open_writer("missing", password=PW)
        with pytest.raises(LogNotFoundError, match=r"^log 'missing' does not exist"):
            await logs.open_reader("missing")
        with pytest.raises(UnauthorizedError, match=r"^writing to log 'a' needs its password: the one given is wrong"):
            await logs.open_writer("a", password=b"wrong")
        w = await logs.open_writer("a", password=PW)
        with pytest.raises(LogInUseError, match=r"^log 'a' is open for writing by"):
            await logs.delete("a", password=PW)
        await w.close()
        with pytest.raises(UnauthorizedError, match="^deleting log 'a' needs its password"):
            await logs.delete("a")
        await logs.delete("a", password=PW)
        assert await logs.list() == []
        with pytest.raises(LogNotFoundError):
            await logs.open_reader("a")


async def test_a_re_created_name_never_sees_the_old_data(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        old = await logs.create("events", password=PW)
        async with await logs.open_writer("events", password=PW) as w:
            await w.append_many([b"old"] * 20)
        await logs.delete("events", password=PW)
        new = await logs.create("events", password=PW)
        assert new.log_id != old.log_id
        assert await read_all(logs, "events") == []
        async with await logs.open_writer("events", password=PW) as w:
            assert await w.append(b"new") == 0
        assert [r.payload for r in await read_all(logs, "events")] == [b"new"]
        assert [lid async for lid in bk.list_ledgers()] == [s.ledger_id for s in (await logs.describe("events")).segments]


async def test_offsets_are_dense_across_rolls_and_writers(cluster):
    """Three writers in turn (one closes, one crashes, one takes over), each rolling every 10
    records: offsets run 0..N-1 without a gap and each holds what was appended there."""
    uri, _ = cluster
    opts = WriterOptions(batch_bytes=40)   # about one record per entry, so rolls happen often
    n = 0
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("dense", SMALL, password=PW)
        async with await logs.open_writer("dense", password=PW, options=opts) as w:
            for _ in range(35):
                assert await w.append(body(n)) == n
                n += 1
            assert w.rolls >= 2
        crashing = await logs.open_writer("dense", password=PW, options=opts)
        for _ in range(12):
            assert await crashing.append(body(n)) == n
            n += 1
        crashing.abandon()           # no close: the next writer recovers its open segment
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        async with await logs.open_writer("dense", password=PW, options=opts) as w:
            assert w.epoch == 3
            acked = await asyncio.gather(*(w.append_nowait(body(n + i)) for i in range(25)))
            assert acked == list(range(n, n + 25))
            n += 25
        recs = await read_all(logs, "dense")
        assert [(r.offset, r.payload) for r in recs] == [(i, body(i)) for i in range(n)]
        d = await logs.describe("dense")
        assert d.end_offset == n and d.start_offset == 0 and len(d.segments) >= 6
        assert all(s.state is SegmentState.CLOSED for s in d.segments)
        assert [s.first_offset for s in d.segments[1:]] == [s.end_offset for s in d.segments[:-1]]


async def test_takeover_fences_the_old_writer(cluster):
    """The old writer's pending appends either were acknowledged (and stay readable at their
    offsets) or fail with LogFencedError naming the new epoch; its later appends fail too."""
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk1, await BookKeeper.connect(uri) as bk2:
        logs1, logs2 = Logs(bk1), Logs(bk2)
        await logs1.create("t", password=PW)
        old = await logs1.open_writer("t", password=PW, options=WriterOptions(batch_bytes=200))
        pending = []
        loop = asyncio.get_running_loop()
        acked_at = []

        def note(p):
            if p.exception() is None:
                acked_at.append(loop.time())

        async def keep_appending():
            while True:
                pending.append(old.append_nowait(body(len(pending))))
                pending[-1].add_done_callback(note)
                if len(pending) % 100 == 0:
                    try:
                        await pending[-100]
                    except Exception:
                        return

        appending = asyncio.ensure_future(keep_appending())
        await eventually(lambda: len(pending) > 500, timeout=20, interval=0.01, what="appends under way")
        new = await logs2.open_writer("t", password=PW)
        registered = loop.time()
        await asyncio.wait_for(appending, 30)
        assert max(acked_at) <= registered, "the old writer got an ack after the new epoch was registered"
        assert new.epoch == old.epoch + 1
        results = await asyncio.gather(*pending, return_exceptions=True)
        acked = [r for r in results if isinstance(r, int)]
        failed = [r for r in results if isinstance(r, BaseException)]
        assert acked == list(range(len(acked))) and len(acked) >= 11
        assert failed, "the takeover came after every append was acknowledged: nothing was fenced"
        assert all(type(e).__name__ == "LogFencedError" and e.epoch == 2 and str(e).startswith(
            "log 't' was taken over by a writer of epoch 2") for e in failed)
        with pytest.raises(Exception, match="taken over by a writer of epoch 2"):
            await old.append(b"late")
        first_new = await new.append(b"new")
        assert first_new >= len(acked)
        await new.close()
        await old.close()
        recs = await read_all(logs2, "t")
        assert [r.offset for r in recs] == list(range(len(recs)))
        assert [r.payload for r in recs[:len(acked)]] == [body(i) for i in range(len(acked))]
        assert recs[-1].payload == b"new" and recs[-1].offset == first_new


async def test_an_idempotent_resend_is_stored_once_across_failover(cluster):
    uri, _ = cluster
    opts = WriterOptions(producer_id=7, batch_bytes=300)
    async with await BookKeeper.connect(uri) as bk1, await BookKeeper.connect(uri) as bk2:
        logs1, logs2 = Logs(bk1), Logs(bk2)
        await logs1.create("idem", SMALL, password=PW)
        a = await logs1.open_writer("idem", password=PW, options=opts)
        first = [a.append_nowait(body(s)) for s in range(200)]
        await first[150]
        a.abandon()                   # crashed: which of 151..199 are stored is unknown to the app
        b = await logs2.open_writer("idem", password=PW, options=opts)
        again = [await b.append(body(s), sequence=s) for s in range(200)]
        assert again[:151] == [p.offset for p in first[:151]]
        more = await b.append(body(200))   # the producer's next sequence continues after 199
        await b.close()
        recs = await read_all(logs2, "idem")
        assert [r.payload for r in recs] == [body(s) for s in range(201)]
        assert again + [more] == list(range(201))


async def test_a_tailing_reader_sees_new_records_as_they_are_appended(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("tail", SMALL, password=PW)
        reader = await logs.open_reader("tail")            # forever, from the start of an empty log
        got: list = []

        async def consume():
            async for rec in reader:
                got.append((rec.offset, rec.payload))

        task = asyncio.ensure_future(consume())
        async with await logs.open_writer("tail", password=PW) as w:
            for i in range(25):                            # rolls twice meanwhile
                await w.append(body(i))
                await eventually(lambda: len(got) == i + 1, timeout=20, interval=0.005, what=f"record {i} tailed")
        async with await logs.open_writer("tail", password=PW) as w:   # a new writer: a new segment
            await w.append(body(25))
        await eventually(lambda: len(got) == 26, timeout=20, interval=0.01, what="the new writer's record")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await reader.close()
        assert got == [(i, body(i)) for i in range(26)]


async def test_seek_by_time_finds_the_first_record_at_or_after(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("times", SMALL, password=PW)
        async with await logs.open_writer("times", password=PW, options=WriterOptions(batch_bytes=100)) as w:
            for i in range(40):
                await w.append(body(i), timestamp=1_000_000 + 10 * i)     # offset i at time 1000000 + 10 i
            await w.append(body(40), timestamp=5)                          # made monotonic: 1000390
        for t, want in [(0, 0), (1_000_000, 0), (1_000_001, 1), (1_000_155, 16), (1_000_390, 39), (1_000_391, 41)]:
            assert await logs.offset_at_time("times", t) == want, t
        async with await logs.open_reader("times", at_time=1_000_155, end="latest") as r:
            recs = [rec async for rec in r]
        assert recs[0].offset == 16 and recs[0].timestamp == 1_000_160
        assert recs[-1].offset == 40 and recs[-1].timestamp == 1_000_390


async def test_cursors_commit_by_cas_never_move_back_and_report_lag(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("c", password=PW)
        async with await logs.open_writer("c", password=PW) as w:
            await w.append_many([body(i) for i in range(50)])
        assert await logs.commit("c", "billing", 20) == 20
        await asyncio.gather(*(logs.commit("c", "audit", k) for k in (5, 30, 10)), return_exceptions=True)
        with pytest.raises(CursorError, match="^cursor 'billing' of log 'c' is at 20: committing 3 would move it back"):
            await logs.commit("c", "billing", 3)
        cursors = {c.name: (c.offset, c.lag) for c in await logs.cursors("c")}
        assert cursors["billing"] == (20, 30)
        assert cursors["audit"][0] >= 5 and cursors["audit"][1] == 50 - cursors["audit"][0]
        async with await logs.open_reader("c", cursor="billing", end="latest") as r:
            assert [rec.offset async for rec in r] == list(range(20, 50))


async def test_truncate_deletes_only_a_prefix_of_closed_segments(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("trunc", SMALL, password=PW)
        w = await logs.open_writer("trunc", password=PW, options=WriterOptions(batch_bytes=40))
        for i in range(35):
            await w.append(body(i))
        await w.roll()                          # no roll under way: the segments below stay as they are
        for i in range(35, 37):
            await w.append(body(i))
        before = await logs.describe("trunc")
        closed = [s for s in before.segments if s.state is SegmentState.CLOSED]
        assert len(closed) >= 3 and before.segments[-1].state is SegmentState.OPEN
        cut = closed[1].end_offset + 3          # inside the third segment: that one is kept whole
        with pytest.raises(UnauthorizedError):
            await logs.truncate("trunc", cut)
        start = await logs.truncate("trunc", cut, password=PW)
        assert start == closed[1].end_offset
        assert await logs.truncate("trunc", 10**9, password=PW) == before.segments[-1].first_offset  # never the open one
        assert await logs.truncate("trunc", 0, password=PW) == before.segments[-1].first_offset      # never back
        after = await logs.describe("trunc")
        assert [s.seq for s in after.segments] == [before.segments[-1].seq]
        with pytest.raises(LogTruncatedError, match=f"^offset 0 of log 'trunc' is below its start offset {after.start_offset}"):
            await logs.open_reader("trunc", start=0)
        for s in closed:
            with pytest.raises(Exception):
                await bk.ledger_metadata(s.ledger_id)
        await w.close()     # a reader sees the open segment to its LAC, which may trail the last ack
        recs = await read_all(logs, "trunc")
        assert [(r.offset, r.payload) for r in recs] == [(i, body(i)) for i in range(35, 37)]


async def test_an_idle_segment_is_rolled_so_retention_by_age_can_delete_it(cluster):
    uri, _ = cluster
    cfg = LogConfig(rollover=Rollover(max_records=10, max_idle=0.3),
                    retention=Retention(RetentionPolicy.LIMITS, max_age=3600))
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("aged", cfg, password=PW)
        async with await logs.open_writer("aged", password=PW, options=WriterOptions(batch_bytes=40)) as w:
            for i in range(25):
                await w.append(body(i), timestamp=1000 + i)      # from 1970: older than an hour

            async def last_record_sealed():
                segs = (await logs.describe("aged")).segments
                return [s for s in segs if s.state is SegmentState.CLOSED and s.end_offset == 25]
            await eventually(last_record_sealed, timeout=20, what="the idle segment rolled")
            assert await logs.enforce_retention("aged", password=PW) == 25
            assert await w.append(body(25)) == 25
        assert [r.offset for r in await read_all(logs, "aged")] == [25]


async def test_interest_retention_keeps_what_the_lowest_cursor_still_needs(cluster):
    uri, _ = cluster
    cfg = LogConfig(retention=Retention(RetentionPolicy.INTEREST))
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("i", cfg, password=PW)
        async with await logs.open_writer("i", password=PW, options=WriterOptions(batch_bytes=40)) as w:
            for i in range(35):
                await w.append(body(i))
                if i % 10 == 9:
                    await w.roll()   # segments of exactly 10: a roll by max_records lands where the next ledger is ready
        assert await logs.enforce_retention("i", password=PW) is None     # no cursor: nothing goes
        await logs.commit("i", "slow", 15)
        await logs.commit("i", "fast", 35)
        assert await logs.enforce_retention("i", password=PW) == 10
        assert [r.offset for r in await read_all(logs, "i")] == list(range(10, 35))
        async with await logs.open_reader("i", cursor="slow", end="latest") as r:
            assert [rec.payload async for rec in r] == [body(i) for i in range(15, 35)]


async def test_readers_need_no_password_unless_the_log_is_mac_signed(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("crc", password=PW)
        await logs.create("mac", LogConfig(digest=DigestType.MAC), password=PW)
        for name in ("crc", "mac"):
            async with await logs.open_writer(name, password=PW) as w:
                await w.append(name.encode())
        assert [r.payload for r in await read_all(logs, "crc")] == [b"crc"]
        with pytest.raises(UnauthorizedError, match="^reading the MAC-signed log 'mac' needs its password"):
            await logs.open_reader("mac")
        async with await logs.open_reader("mac", end="latest", password=PW) as r:
            assert [rec.payload async for rec in r] == [b"mac"]


async def test_acknowledged_records_survive_a_bookie_killed_under_load(cluster):
    """E3 Qw3 Qa2: with one of the three bookies killed -9 mid-stream, appends go on (degraded:
    every write quorum keeps two), rolls wait since no new ledger of three bookies can be made, and
    every acknowledged record reads back at its offset."""
    uri, procs = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("b", SMALL, password=PW)
        acked: dict[int, bytes] = {}
        async with await logs.open_writer("b", password=PW, options=WriterOptions(batch_bytes=500)) as w:
            for i in range(300):
                p = w.append_nowait(body(i))
                if i == 100:
                    await p
                    procs[0].kill()

                    async def two_left():
                        return len(await bk.store.registry.writable()) == 2
                    await eventually(two_left, timeout=30, what="the killed bookie unregistered")
                if i % 25 == 24:
                    await p
                acked[p.offset] = body(i)
            await w.flush()
            rolls = w.rolls
        assert rolls >= 1
        recs = await read_all(logs, "b")
        assert {r.offset: r.payload for r in recs} == acked and len(recs) == 300
