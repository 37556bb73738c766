"""A missing or cut journal file is noticed at start: the bookie refuses, naming the file and what
to do, unless the operator accepts the loss, which the bookie then reports to the metadata store.
A torn tail after a crash is still accepted. Real bookie processes on real files."""
from __future__ import annotations

import asyncio
import random
import subprocess

import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieError, Status
from pybk.bookie.journal import FILE_HEADER_SIZE, Journal, JournalOptions, Mark, RecordType, encode_record, journal_files, replay
from pybk.meta import MetadataStore

KEY = entry.master_key(b"journal")
ENTRIES = 2000


def body(ledger: int, eid: int) -> bytes:
    return entry.encode(ledger, eid, eid - 1, random.Random(ledger * 7919 + eid).randbytes(300))


async def write_and_kill(bk, ledger: int = 5) -> dict[int, bytes]:
    """Acknowledged adds that are only in the journal (no checkpoint ran), then kill -9."""
    acked = {e: body(ledger, e) for e in range(ENTRIES)}
    async with await BookieClient.connect(bk.address, wait=30) as c:
        for first in range(0, ENTRIES, 200):
            await asyncio.gather(*(c.add(ledger, e, acked[e], master_key=KEY) for e in range(first, first + 200)))
    await asyncio.to_thread(bk.kill)
    return acked


def refused_start(bk) -> tuple[int, str]:
    """Run the bookie's command line once; (exit code, first stderr line) of a refused start."""
    res = subprocess.run(bk._argv(), capture_output=True, text=True, timeout=120)
    return res.returncode, (res.stderr.strip().splitlines() or [""])[0]


def says(first_line: str, path, *words: str) -> bool:
    """The line names path and, after it, every word (the path itself may contain any of them)."""
    head, _, rest = first_line.partition(str(path))
    return bool(_) and all(w in rest for w in words)


def bookie_options(**extra):
    return dict(metadata_uri=None, checkpoint_interval=3600, journal_max_file_size="64KiB",
                journal_prealloc_size="64KiB", **extra)


async def test_a_deleted_journal_file_refuses_start_naming_the_file(bookies):
    bk, = bookies(1, **bookie_options())
    await write_and_kill(bk)
    files = journal_files(bk.journal_dir)
    assert len(files) > 4
    _, gone = files[len(files) // 2]
    gone.unlink()
    code, first_line = refused_start(bk)
    assert code == 3
    assert says(first_line, gone, "is missing", "--accept-journal-loss")


async def test_the_newest_journal_file_deleted_refuses_start(bookies):
    bk, = bookies(1, **bookie_options())
    await write_and_kill(bk)
    _, newest = journal_files(bk.journal_dir)[-1]
    newest.unlink()
    code, first_line = refused_start(bk)
    assert code == 3 and says(first_line, newest, "is missing")


@pytest.mark.parametrize("which", ["older", "newest"])
async def test_a_journal_file_cut_mid_file_refuses_start(bookies, which):
    """Cut in the middle (not at a record boundary, as a torn tail would be): an older file is
    shorter than the next file's header says; the newest, preallocated, ends inside its data."""
    bk, = bookies(1, **bookie_options())
    await write_and_kill(bk)
    files = [p for _, p in journal_files(bk.journal_dir) if p.stat().st_size > FILE_HEADER_SIZE]
    path = files[0] if which == "older" else files[-1]
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2 + 7)
    code, first_line = refused_start(bk)
    assert code == 3 and says(first_line, path, "cut")


async def test_accepted_journal_loss_starts_and_marks_the_bookies_ledgers_under_replicated(bookies, metadata_uri):
    bk, = bookies(1, **{**bookie_options(), "metadata_uri": metadata_uri})
    async with await MetadataStore.connect(metadata_uri) as store:
        md = await store.ledgers.create([bk.bookie_id], 1, 1, key_check=entry.key_check(KEY))
        other = await store.ledgers.create(["127.0.0.1:1"], 1, 1, key_check=entry.key_check(KEY))
        acked = await write_and_kill(bk, md.ledger_id)
        files = journal_files(bk.journal_dir)
        _, gone = files[len(files) // 2]
        gone.unlink()
        assert refused_start(bk)[0] == 3
        bk.options["accept_journal_loss"] = True
        await asyncio.to_thread(bk.start)
        marker = await store.underreplication.get(md.ledger_id)
        assert marker is not None and marker.missing == [bk.bookie_id]
        assert await store.underreplication.get(other.ledger_id) is None
        assert "journal loss accepted" in bk.log_path.read_text() and str(gone) in bk.log_path.read_text()
        async with await BookieClient.connect(bk.address, wait=30) as c:
            held = await c.list_entries(md.ledger_id)
            with pytest.raises(BookieError) as err:  # a fence in the lost range must not be forgotten
                await c.add(md.ledger_id, ENTRIES, body(md.ledger_id, ENTRIES), master_key=KEY)
            assert err.value.code is Status.FENCED
        kept = {e for first, last in held for e in range(first, last + 1)}
        assert kept and len(kept) < len(acked)
        # the loss is recorded once: a plain restart is clean, without the flag
        bk.options.pop("accept_journal_loss")
        await asyncio.to_thread(bk.restart)
        async with await BookieClient.connect(bk.address, wait=30) as c:
            for e in sorted(kept):
                assert await c.read(md.ledger_id, e) == acked[e]


async def test_a_torn_tail_in_a_preallocated_journal_file_is_accepted(tmp_path):
    """A crash mid-group leaves a record half written and zeros after it: replay cuts it off and
    keeps every record before it (the torn one was never acknowledged)."""
    j = Journal(tmp_path, JournalOptions(prealloc_size=64 * 1024))
    j.open()
    for i in range(10):
        await j.append(encode_record(RecordType.ADD, 1, i, b"z" * 50))
    await j.close()
    (_, path), = journal_files(tmp_path)
    assert path.stat().st_size == 64 * 1024
    last = FILE_HEADER_SIZE + 9 * 75
    with open(path, "r+b") as f:
        f.seek(last + 40)
        f.write(bytes(35))
    assert [r.entry for r in replay(tmp_path, Mark(0, 0))] == list(range(9))
    assert path.stat().st_size == 64 * 1024
    assert [r.entry for r in replay(tmp_path, Mark(0, 0))] == list(range(9))


async def test_entries_lost_with_the_journal_are_copied_back_by_autorecovery(bookies, metadata_uri):
    """After an accepted loss the bookie's ledgers are marked under-replicated and autorecovery
    (embedded in the bookies) copies every entry it lost back to it, byte for byte."""
    from pybk.client import BookKeeper

    procs = bookies(3, **{**bookie_options(), "metadata_uri": metadata_uri, "autorecovery": True,
                          "lost_bookie_delay": 600, "poll_interval": 0.2, "audit_interval": 0})
    async with await BookKeeper.connect(metadata_uri) as client:
        lh = await client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2)
        for first in range(0, ENTRIES, 200):
            await asyncio.gather(*(lh.add_entry_async(random.Random(e).randbytes(300))
                                   for e in range(first, first + 200)))
        await lh.close()
    victim, healthy = procs[0], procs[1]
    await asyncio.to_thread(victim.kill)
    files = journal_files(victim.journal_dir)
    files[len(files) // 2][1].unlink()
    victim.options["accept_journal_loss"] = True
    await asyncio.to_thread(victim.start)
    assert "journal loss reported: 1 ledgers marked under-replicated" in victim.log_path.read_text()
    async with await BookieClient.connect(victim.address, wait=30) as c:
        deadline = asyncio.get_running_loop().time() + 120
        while await c.list_entries(lh.ledger_id) != [(0, ENTRIES - 1)]:
            assert asyncio.get_running_loop().time() < deadline, "autorecovery did not copy the lost entries back"
            await asyncio.sleep(0.3)
        async with await BookieClient.connect(healthy.address, wait=30) as h:
            for e in range(ENTRIES):
                assert await c.read(lh.ledger_id, e) == await h.read(lh.ledger_id, e), f"entry {e} differs"


@pytest.mark.parametrize("left", ["empty", "preallocated", "header-only"])
async def test_a_journal_file_left_unused_by_a_stop_mid_roll_is_not_a_gap(tmp_path, left, child_processes):
    """A stop between creating a journal file and recording it in journal.head leaves a file
    without records: the next start removes it and goes on; every acked entry is there."""
    from pybk.bookie.bookie import Bookie, StorageOptions
    from pybk.bookie.journal import encode_file_header, journal_path, read_head
    from pybk.proto import pb

    opts = StorageOptions(checkpoint_interval=3600, journal=JournalOptions(prealloc_size=64 * 1024))
    b = Bookie(tmp_path / "j", [tmp_path / "l"], opts)
    await b.start()
    errors, fut = b.add_batch([pb.AddEntry(ledger_id=3, entry_id=e, master_key=KEY, body=body(3, e))
                               for e in range(50)])
    await fut
    await b.storage.journal.close()
    b.storage.started = False  # a crash: no final checkpoint
    await b.close()
    seq = read_head(tmp_path / "j").seq + 1
    with open(journal_path(tmp_path / "j", seq), "wb") as f:
        if left == "preallocated":
            f.truncate(64 * 1024)
        elif left == "header-only":
            f.write(encode_file_header(seq, 0, 0))
    b2 = Bookie(tmp_path / "j", [tmp_path / "l"], opts)
    await b2.start()
    try:
        assert all(b2.read_entry(3, e) == body(3, e) for e in range(50))
    finally:
        await b2.close()
