"""A full disk never loses or hides an acknowledged entry, shown on a real small file system
(a tmpfs with a size): the bookie turns read-only instead of writing half records, becomes
writable by itself when space returns, and every acked entry reads back before and after a
restart."""
from __future__ import annotations

import asyncio
import errno
import os
import contextlib
import random
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieError, Status
from pybk.bookie.entrylog import EntryLog
from pybk.bookie.index import LOCATION
from polling import eventually
from pybk.bookie.journal import Journal, JournalOptions, Mark, RecordType, encode_record, replay

KEY = entry.master_key(b"secret")
MiB = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB tmpfs, unmounted after the test (skipped where mounting is impossible)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(path: Path, leave: int = 0) -> int:
    """Write a ballast file until the file system has at most `leave` bytes free; its size."""
    written = 0
    chunk = b"\xa5" * MiB
    with open(path, "ab", buffering=0) as f:
        while True:
            free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
            if free <= leave:
                return written
            try:
                written += f.write(chunk[:max(min(len(chunk), free - leave), 1)])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return written


def body(ledger: int, eid: int, size: int = 4096) -> bytes:
    return entry.encode(ledger, eid, eid - 1, random.Random(ledger * 1_000_003 + eid).randbytes(size))


def test_a_failed_entry_log_append_leaves_the_log_as_it_was(small_disk):
    """An append that runs out of space leaves no partial record behind: the next append's
    locations point at the records it wrote."""
    log = EntryLog(small_disk / "ledgers")
    first = log.append_sorted([(1, e, body(1, e)) for e in range(10)])
    size_before = log.path(log.current).stat().st_size
    fill(small_disk / "ballast", leave=20_000)
    with pytest.raises(OSError) as err:
        log.append_sorted([(2, e, body(2, e)) for e in range(100)])
    assert err.value.errno == errno.ENOSPC
    assert log.path(log.current).stat().st_size == size_before
    (small_disk / "ballast").unlink()
    after = log.append_sorted([(3, e, body(3, e)) for e in range(10)])
    assert_reads_back(log, first + after, [(1, e) for e in range(10)] + [(3, e) for e in range(10)])
    log.close()


def assert_reads_back(log: EntryLog, locations, ids) -> None:
    for (_, loc), (ledger, e) in zip(locations, ids, strict=True):
        _, log_id, offset = LOCATION.unpack(loc)
        assert log.read(log_id, offset, ledger, e) == body(ledger, e)


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Writes past `limit` bytes fail with EFBIG after writing what fits: a write that fails midway,
    after the space check passed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_an_entry_log_write_that_fails_midway_is_cut_back(tmp_path):
    """A batch whose write fails after part of it reached the file leaves no partial record: the
    next batch's locations point at its records."""
    log = EntryLog(tmp_path / "ledgers")
    first = log.append_sorted([(1, e, body(1, e)) for e in range(10)])
    size_before = log.path(log.current).stat().st_size
    with file_size_limit(size_before + 10_000), pytest.raises(OSError) as err:
        log.append_sorted([(2, e, body(2, e)) for e in range(100)])
    assert err.value.errno == errno.EFBIG
    assert log.path(log.current).stat().st_size == size_before
    after = log.append_sorted([(3, e, body(3, e)) for e in range(10)])
    assert_reads_back(log, first + after, [(1, e) for e in range(10)] + [(3, e) for e in range(10)])
    log.close()


async def test_a_journal_group_that_fails_midway_is_cut_back_and_the_journal_goes_on(tmp_path):
    """A group commit that fails after writing part of its records fails its waiters, leaves no
    partial record, and the next group is written and replays in order."""
    failures: list[tuple[BaseException, bool]] = []
    journal = Journal(tmp_path, JournalOptions(prealloc_size=0),  # the file grows with each write
                      on_error=lambda exc, recoverable: failures.append((exc, recoverable)))
    journal.open()
    try:
        await journal.append([encode_record(RecordType.ADD, 1, e, body(1, e)) for e in range(5)])
        end = journal.position.offset
        with file_size_limit(end + 10_000), pytest.raises(OSError):
            await journal.append([encode_record(RecordType.ADD, 2, e, body(2, e)) for e in range(10)])
        assert [(exc.errno, recoverable) for exc, recoverable in failures] == [(errno.EFBIG, True)]
        await journal.append([encode_record(RecordType.ADD, 3, e, body(3, e)) for e in range(5)])
    finally:
        await journal.close()
    records = [(r.ledger, r.entry, r.body) for r in replay(tmp_path, Mark(0, 0))]
    assert records == [(lg, e, body(lg, e)) for lg in (1, 3) for e in range(5)]


async def _write_until(client: BookieClient, ledgers: list[int], next_eid: dict[int, int],
                       acked: dict[tuple[int, int], bytes], stop: asyncio.Event) -> dict[Status, int]:
    """Keep a window of adds in flight on each ledger until `stop`; record every acked entry."""
    refused: dict[Status, int] = {}

    async def one(ledger: int) -> None:
        window: list[tuple[int, asyncio.Future]] = []
        while not stop.is_set() or window:
            while not stop.is_set() and len(window) < 32:
                e = next_eid[ledger]
                next_eid[ledger] += 1
                window.append((e, client.add_nowait(ledger, e, body(ledger, e), KEY)))
            e, fut = window.pop(0)
            try:
                await fut
                acked[(ledger, e)] = body(ledger, e)
            except BookieError as exc:
                refused[exc.code] = refused.get(exc.code, 0) + 1
                await asyncio.sleep(0.01)

    await asyncio.gather(*(one(lg) for lg in ledgers))
    return refused

async def test_a_full_disk_loses_no_acknowledged_entry(bookies, small_disk):
    """The disk fills up under a steady load: adds are refused (never half written), the bookie
    turns read-only, becomes writable again by itself once space returns, and every entry it
    acknowledged reads back, before and after a restart."""
    bk, = bookies(1, metadata_uri=None, journal_dir=small_disk / "journal",
                  ledger_dirs=[small_disk / "ledgers"], checkpoint_interval=0.2, disk_check_interval=5,
                  journal_max_file_size="4MiB", entrylog_max_file_size="8MiB")
    client = await BookieClient.connect(bk.address, wait=30)
    ledgers = [31, 32, 33]
    next_eid = {lg: 0 for lg in ledgers}
    acked: dict[tuple[int, int], bytes] = {}
    try:
        stop = asyncio.Event()
        writer = asyncio.ensure_future(_write_until(client, ledgers, next_eid, acked, stop))
        await eventually(lambda: len(acked) >= 300, 60, what="300 acks before the disk fills")
        await asyncio.to_thread(fill, small_disk / "ballast", 64 * 1024)  # faster than a disk check
        count_full = len(acked)
        await eventually(lambda: bk.http_json("/api/v1/bookie/state").get("readOnly"), 30, what="read-only")
        await asyncio.sleep(1.0)  # adds go on hitting the full disk for a while
        (small_disk / "ballast").unlink()
        await eventually(lambda: not bk.http_json("/api/v1/bookie/state").get("readOnly"), 30,
                         what="writable again once space returned")
        await eventually(lambda: len(acked) >= count_full + 300, 60, what="300 more acks after space returned")
        stop.set()
        refused = await asyncio.wait_for(writer, 60)
        assert refused, "the full disk refused no add"
        for (lg, e), b in sorted(acked.items()):
            assert await client.read(lg, e) == b, f"entry {lg}:{e} differs before the restart"
    finally:
        await client.close()
    await asyncio.to_thread(bk.restart)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        for (lg, e), b in sorted(acked.items()):
            assert await c.read(lg, e) == b, f"entry {lg}:{e} lost or changed by the full disk"
