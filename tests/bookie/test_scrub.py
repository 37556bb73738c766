"""The scrubber gives up exactly the entries a bookie can no longer read (bytes flipped, an entry log
cut short or deleted) and says so: ListEntries omits them, reads answer NO_ENTRY, the ledger is marked
under-replicated naming the bookie. Shown on real bookie processes, real files and real etcd."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieError, Status
from pybk.bookie.index import KEY, LOCATION, Index
from pybk.ledger import entry_ranges
from pybk.meta import MetadataStore

from allocation import allocate
from entrylog_files import records

MASTER_KEY = entry.master_key(b"scrub")


def body(ledger: int, eid: int, size: int = 1024) -> bytes:
    return entry.encode(ledger, eid, eid - 1, bytes([eid % 251]) * size)


def entry_logs(b) -> list[Path]:
    return sorted((b.ledger_dirs[0] / "entrylogs").glob("entrylog-*.log"))


async def write(b, ledger: int, count: int) -> None:
    async with await BookieClient.connect(b.address) as c:
        await asyncio.gather(*(c.add(ledger, e, body(ledger, e), master_key=MASTER_KEY) for e in range(count)))


async def restart(b) -> None:
    """A clean stop checkpoints the write cache: afterwards every entry is in the entry logs only."""
    await asyncio.to_thread(b.stop)
    await asyncio.to_thread(b.start)


async def scrub(b) -> dict:
    return await asyncio.to_thread(b.http_json, "/api/v1/bookie/scrub", "POST", None, 60)


async def read_status(c: BookieClient, ledger: int, eid: int) -> Status:
    try:
        await c.read(ledger, eid)
        return Status.OK
    except BookieError as exc:
        return exc.code


async def assert_dropped_exactly(b, written: dict[int, int], bad: dict[int, set[int]], result: dict) -> None:
    """The scrub result names exactly `bad`; ListEntries omits exactly those; they read as NO_ENTRY
    and every other entry reads back intact."""
    assert result["bad_by_ledger"] == {str(lid): [list(r) for r in entry_ranges(sorted(ids))]
                                       for lid, ids in sorted(bad.items()) if ids}, result
    assert result["bad_entries"] == sum(map(len, bad.values()))
    async with await BookieClient.connect(b.address) as c:
        for lid, count in written.items():
            good = [e for e in range(count) if e not in bad.get(lid, set())]
            assert await c.list_entries(lid) == entry_ranges(good)
            for e in bad.get(lid, ()):
                assert await read_status(c, lid, e) is Status.NO_ENTRY
            for e in good:
                assert await c.read(lid, e) == body(lid, e)


async def test_flipped_bytes_drop_exactly_their_entries_and_mark_the_ledger(bookies, metadata_uri):
    b, = bookies(1)
    await allocate(metadata_uri, [1, 2], MASTER_KEY)
    await write(b, 1, 200)
    await write(b, 2, 200)
    await restart(b)
    log, = entry_logs(b)
    where = {(l, e): (off, n) for l, e, off, n in records(log)}
    with open(log, "r+b") as f:
        off, n = where[(1, 50)]
        f.seek(off + n - 10)  # inside the body: the CRC32C no longer matches
        f.write(b"\xff\x00\xff")
        off, _ = where[(1, 120)]
        f.seek(off + 16)  # the record's entry id: the record is not the entry the index names
        f.write((999).to_bytes(8, "big"))
    async with await BookieClient.connect(b.address) as c:
        assert await read_status(c, 1, 50) is Status.IO_ERROR  # before the scrub: listed, unreadable
    result = await scrub(b)
    await assert_dropped_exactly(b, {1: 200, 2: 200}, {1: {50, 120}}, result)
    assert result["marked_under_replicated"] == [1] and not result["mark_error"]
    assert result["entries_checked"] == 400 and not result["files_missing"] and not result["error"]
    store = await MetadataStore.connect(metadata_uri)
    try:
        marker = await store.underreplication.get(1)
        assert marker is not None and marker.missing == [b.bookie_id]
        assert await store.underreplication.get(2) is None
    finally:
        await store.close()
    again = await scrub(b)  # what was dropped stays dropped; nothing else goes
    assert again["bad_entries"] == 0 and again["entries_checked"] == 398


async def test_a_truncated_entry_log_drops_the_entries_past_the_cut(bookies, metadata_uri):
    b, = bookies(1)
    await allocate(metadata_uri, [1], MASTER_KEY)
    await write(b, 1, 300)
    await restart(b)
    log, = entry_logs(b)
    recs = records(log)
    _, _, off, _ = next(r for r in recs if r[:2] == (1, 200))
    cut = off + 30  # mid-record: entry 200's header is whole, its body is not
    os.truncate(log, cut)
    result = await scrub(b)
    await assert_dropped_exactly(b, {1: 300}, {1: set(range(200, 300))}, result)


async def test_a_deleted_entry_log_drops_every_entry_it_held(bookies, metadata_uri):
    b, = bookies(1, entrylog_max_file_size="1KiB")  # every checkpoint starts a new log
    await allocate(metadata_uri, [1, 2], MASTER_KEY)
    await write(b, 1, 100)
    await restart(b)
    await write(b, 2, 100)
    await restart(b)
    first, second = entry_logs(b)
    assert {r[0] for r in records(first)} == {1} and {r[0] for r in records(second)} == {2}
    first.unlink()
    result = await scrub(b)
    await assert_dropped_exactly(b, {1: 100, 2: 100}, {1: set(range(100))}, result)
    assert result["files_missing"] == [str(first)]


@pytest.mark.private_etcd
async def test_a_ledger_marking_that_failed_is_retried_until_etcd_takes_it(bookies, etcd, metadata_uri):
    b, = bookies(1)
    await allocate(metadata_uri, [1], MASTER_KEY)
    await write(b, 1, 50)
    await restart(b)
    log, = entry_logs(b)
    _, _, off, length = next(r for r in records(log) if r[:2] == (1, 49))
    os.truncate(log, off + length - 1)  # entry 1:49 is cut short
    await asyncio.to_thread(etcd.stop)
    try:
        result = await scrub(b)
    finally:
        await asyncio.to_thread(etcd.start)
    assert result["bad_by_ledger"] == {"1": [[49, 49]]}
    assert result["marked_under_replicated"] == [] and "marking ledger 1 failed" in result["mark_error"]
    store = await MetadataStore.connect(metadata_uri)
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while (marker := await store.underreplication.get(1)) is None:
            assert asyncio.get_running_loop().time() < deadline, "the failed marking was not retried in 60s"
            await asyncio.sleep(0.3)
        assert marker.missing == [b.bookie_id]
    finally:
        await store.close()


async def test_a_scrub_that_cannot_look_drops_nothing_and_says_why(bookies):
    """A ledger dir whose entrylogs directory is gone (an unmounted disk) is no verdict on its
    entries: the scrub stops, naming the directory, and the entries come back with the disk."""
    b, = bookies(1, metadata_uri=None)
    await write(b, 1, 100)
    await restart(b)
    logs = b.ledger_dirs[0] / "entrylogs"
    logs.rename(b.ledger_dirs[0] / "elsewhere")
    try:
        result = await scrub(b)
    finally:
        (b.ledger_dirs[0] / "elsewhere").rename(logs)
    assert str(logs) in result["error"] and "not judging" in result["error"]
    assert result["bad_entries"] == 0 and result["entries_checked"] == 0
    await assert_dropped_exactly(b, {1: 100}, {}, await scrub(b))


async def test_a_healthy_bookie_scrubs_clean_while_adds_and_checkpoints_go_on(bookies):
    b, = bookies(1, checkpoint_interval=0.05, metadata_uri=None)
    stop = asyncio.Event()
    written = {1: 0, 2: 0}

    async def writer(ledger: int) -> None:
        async with await BookieClient.connect(b.address) as c:
            while not stop.is_set() and written[ledger] < 20000:
                e = written[ledger]
                await asyncio.gather(*(c.add(ledger, i, body(ledger, i, 256), master_key=MASTER_KEY)
                                       for i in range(e, e + 200)))
                written[ledger] = e + 200
                await asyncio.sleep(0.05)  # a steady stream of adds, not a flood no scrub could keep up with

    writers = asyncio.gather(*(writer(lid) for lid in written))
    results = []
    try:
        while sum(1 for r in results if r["entries_checked"]) < 3 and not writers.done():
            results.append(await scrub(b))
    finally:
        stop.set()
        await writers
    assert sum(1 for r in results if r["entries_checked"]) >= 3, "the scrubs did not overlap the adds"
    assert all(r["bad_entries"] == 0 and not r["error"] for r in results), results
    async with await BookieClient.connect(b.address) as c:
        for lid, count in written.items():
            assert await c.list_entries(lid) == [(0, count - 1)]
            got = [(e, bd) async for e, bd in c.read_range(lid, 0, count - 1)]
            assert got == [(e, body(lid, e, 256)) for e in range(count)]


async def test_the_scrub_runs_by_itself_every_scrub_interval(bookies):
    b, = bookies(1, scrub_interval=1, metadata_uri=None)
    await write(b, 1, 50)
    await restart(b)
    log, = entry_logs(b)
    _, _, off, n = next(r for r in records(log) if r[:2] == (1, 7))
    with open(log, "r+b") as f:
        f.seek(off + n - 1)
        last_byte = f.read(1)
        f.seek(off + n - 1)
        f.write(bytes([last_byte[0] ^ 0xFF]))

    async def dropped():
        last = (await asyncio.to_thread(b.http_json, "/api/v1/bookie/scrub"))["last"]
        return last if last and last["bad_entries"] else None

    deadline = asyncio.get_running_loop().time() + 30
    while not (last := await dropped()):
        assert asyncio.get_running_loop().time() < deadline, "no periodic scrub dropped the bad entry in 30s"
        await asyncio.sleep(0.2)
    assert last["bad_by_ledger"] == {"1": [[7, 7]]}
    assert "--metadata-uri" in last["mark_error"]  # no metadata store: nothing to mark in
    metrics = (await asyncio.to_thread(b.http_get, "/metrics"))[1].decode()
    assert "pybk_scrub_bad_entries_total 1.0" in metrics
    assert "pybk_scrub_last_run_timestamp_seconds" in metrics and "pybk_scrub_runs_total" in metrics
    async with await BookieClient.connect(b.address) as c:
        assert await c.list_entries(1) == [(0, 6), (8, 49)]


def test_an_entry_moved_since_it_was_checked_is_not_dropped(tmp_path):
    """A checkpoint or compaction that repointed an entry after the scrubber read its old location
    wins: only locations the index still holds are dropped."""
    index = Index(tmp_path)
    try:
        old, new = LOCATION.pack(0, 1, 0), LOCATION.pack(0, 2, 0)
        index.commit([(KEY.pack(1, 0), old), (KEY.pack(1, 1), old)], [])
        checked = index.locations_after(None, 10)
        index.commit([(KEY.pack(1, 1), new)], [])  # entry 1:1 moved meanwhile
        assert index.delete_locations(checked) == [KEY.pack(1, 0)]
        assert index.location(1, 0) is None and index.location(1, 1) == (0, 2, 0)
    finally:
        index.close()


@pytest.mark.parametrize("after, want", [(None, [(1, 0), (1, 1)]), (KEY.pack(1, 0), [(1, 1), (2, 5)])],
                         ids=["from-the-start", "after-a-key"])
def test_the_index_is_walked_in_bounded_steps_in_key_order(tmp_path, after, want):
    index = Index(tmp_path)
    try:
        loc = LOCATION.pack(0, 1, 0)
        index.commit([(KEY.pack(2, 5), loc), (KEY.pack(1, 1), loc), (KEY.pack(1, 0), loc)], [])
        assert [KEY.unpack(k) for k, _ in index.locations_after(after, 2)] == want
    finally:
        index.close()
