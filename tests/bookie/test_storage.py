"""The storage core with no server: journal, group commit, replay, checkpoint, index, state."""
from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from pybk import entry
from pybk.bookie.bookie import Bookie, BookieStorageError, StorageOptions
from pybk.bookie.entrylog import LOG_HEADER
from pybk.bookie.gc import Housekeeping
from pybk.bookie.journal import (FILE_HEADER_SIZE, Journal, JournalCorruptError, JournalOptions, Mark, RecordType, encode_record,
                                 encode_run, journal_files, replay)
from pybk.bookie.state import LedgerKeys, LedgerState, admit_new_key
from pybk.bookie.writecache import WriteCache
from pybk.proto import pb

NO_PREALLOC = JournalOptions(prealloc_size=0)

KEY = entry.master_key(b"pw")


def statuses(errors, n):
    """Per-entry statuses from add_batch's refusals."""
    out = [pb.OK] * n
    for i, status, _ in errors:
        out[i] = status
    return out


def adds(ledger, first, n, lac=-1, key=KEY, flags=0, size=100):
    return [pb.AddEntry(request_id=i, ledger_id=ledger, entry_id=i, master_key=key, flags=flags,
                        body=entry.encode(ledger, i, lac if lac != -2 else i - 1, bytes([i % 256]) * size))
            for i in range(first, first + n)]


async def test_group_commit_completes_all_queued_appends_with_one_write(tmp_path):
    syncs = []
    j = Journal(tmp_path, on_sync=lambda s, b, n: syncs.append(n))
    j.open()
    futs = [j.append(encode_record(RecordType.ADD, 1, i, b"x" * 10)) for i in range(50)]
    await asyncio.gather(*futs)
    await j.close()
    assert sum(syncs) == 50 and len(syncs) <= 2
    recs = list(replay(tmp_path, Mark(0, 0)))
    assert [r.entry for r in recs] == list(range(50))


class _ThreadRecordingJournal(Journal):
    """A journal that notes which thread ran each group commit."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads: list[int] = []

    def _write(self, parts, size):
        self.threads.append(threading.get_ident())
        return super()._write(parts, size)


async def test_small_groups_sync_on_the_loop_big_groups_and_slow_disks_in_a_thread(tmp_path):
    loop_thread = threading.get_ident()
    j = _ThreadRecordingJournal(tmp_path, JournalOptions(inline_bytes=1000))
    j.open()
    await j.append(encode_record(RecordType.ADD, 1, 0, b"x" * 10))
    await j.append(encode_record(RecordType.ADD, 1, 1, b"x" * 5000))
    j._sync_seconds = 1.0  # the disk has been slow: even a small group must not stall the loop
    await j.append(encode_record(RecordType.ADD, 1, 2, b"x" * 10))
    await j.close()
    assert [t == loop_thread for t in j.threads] == [True, False, False]
    assert [r.entry for r in replay(tmp_path, Mark(0, 0))] == [0, 1, 2]


async def test_a_busy_loop_does_not_keep_small_groups_off_it(tmp_path):
    loop_thread = threading.get_ident()
    j = _ThreadRecordingJournal(tmp_path, JournalOptions(inline_bytes=1000))
    j.open()
    big = j.append(encode_record(RecordType.ADD, 1, 0, b"x" * 5000))
    deadline = time.monotonic() + 10
    while not j.threads:  # until the big group is in its worker thread
        assert time.monotonic() < deadline, "the big group was never written"
        await asyncio.sleep(0)
    time.sleep(0.2)  # the loop is busy with other work meanwhile and picks the result up late
    await big
    await j.append(encode_record(RecordType.ADD, 1, 1, b"x" * 10))
    await j.close()
    assert [t == loop_thread for t in j.threads] == [False, True]
    assert [r.entry for r in replay(tmp_path, Mark(0, 0))] == [0, 1]


async def test_journal_rotates_by_size_and_replays_across_files(tmp_path):
    j = Journal(tmp_path, JournalOptions(max_file_size=1000))
    j.open()
    for i in range(40):
        await j.append(encode_record(RecordType.ADD, 7, i, b"y" * 100))
    await j.close()
    assert len(journal_files(tmp_path)) > 3
    assert [r.entry for r in replay(tmp_path, Mark(0, 0))] == list(range(40))


async def test_torn_tail_is_truncated_and_corrupt_middle_is_refused(tmp_path):
    j = Journal(tmp_path, NO_PREALLOC)  # a file cut short is then a torn tail
    j.open()
    for i in range(10):
        await j.append(encode_record(RecordType.ADD, 1, i, b"z" * 50))
    await j.close()
    (_, path), = journal_files(tmp_path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 20)
    assert [r.entry for r in replay(tmp_path, Mark(0, 0))] == list(range(9))
    assert path.stat().st_size == FILE_HEADER_SIZE + 9 * (25 + 50)
    with open(path, "r+b") as f:
        f.seek(FILE_HEADER_SIZE + 3 * 75 + 30)
        f.write(b"!")
    with pytest.raises(JournalCorruptError) as err:
        list(replay(tmp_path, Mark(0, 0)))
    assert str(path) in str(err.value) and f"offset {FILE_HEADER_SIZE + 225}" in str(err.value)


async def test_a_run_is_one_record_of_its_bodies_as_given_replayed_as_its_entries_in_order(tmp_path):
    ids, bodies = [5, 3, 9, 4], [b"a" * 10, b"", b"c" * 300, b"d"]
    packed = b"".join(bodies)
    parts = encode_run(7, ids, [len(b) for b in bodies], packed)
    assert parts[-1] is packed  # the bodies are passed on, not copied
    j = Journal(tmp_path, NO_PREALLOC)  # a file cut short is then a torn tail
    j.open()
    await j.append([encode_record(RecordType.MASTER_KEY, 7, -1, b"k"), *parts])
    await j.append(encode_run(8, [0], [2], b"zz"))
    await j.close()
    assert [(r.type, r.ledger, r.entry, r.body) for r in replay(tmp_path, Mark(0, 0))] == [
        (RecordType.MASTER_KEY, 7, -1, b"k"), *[(RecordType.ADD, 7, e, b) for e, b in zip(ids, bodies)],
        (RecordType.ADD, 8, 0, b"zz")]


def test_write_cache_counts_each_entry_once_even_when_rewritten():
    cache = WriteCache()
    cache.put_many(1, {0: b"aaaa", 1: b"bb"})
    cache.put_many(1, {1: b"b" * 10, 2: b"c"})  # entry 1 rewritten (a recovery add)
    cache.put(2, 0, b"zzz")
    assert cache.count == 4 and cache.get(1, 1) == b"b" * 10
    assert cache.bytes >= 4 + 10 + 1 + 3  # never under the bytes held: checkpoints are not late
    assert cache.drop_ledger(1) == 3
    assert cache.count == 1 and cache.get(1, 0) is None
    assert cache.drop_ledger(1) == 0


def test_write_cache_knows_each_ledger_s_highest_entry_whatever_the_order_of_adds():
    cache = WriteCache()
    assert cache.last_entry(1) is None
    cache.put_many(1, {5: b"e", 6: b"f"})
    cache.put_many(1, {2: b"c", 3: b"d"})  # older entries arriving late (a recovery add)
    cache.put(1, 4, b"x")
    cache.put(2, 9, b"y")
    assert (cache.last_entry(1), cache.last_entry(2)) == (6, 9)
    assert cache.last_entry(1) == max(cache.entry_ids(1))
    cache.drop_ledger(1)
    assert cache.last_entry(1) is None and cache.last_entry(2) == 9


def test_write_cache_bytes_are_exact_without_rewrites():
    cache = WriteCache()
    cache.put_many(1, {0: b"aaaa", 1: b"bb"})
    cache.put_many(1, {2: b"c" * 7})
    cache.put_many(3, {0: b"d"})
    assert (cache.count, cache.bytes) == (4, 4 + 2 + 7 + 1)
    cache.drop_ledger(1)
    assert (cache.count, cache.bytes) == (1, 1)


async def test_adds_survive_restart_via_replay_and_via_checkpoint(tmp_path, child_processes):
    opts = StorageOptions(checkpoint_interval=3600, journal=JournalOptions(prealloc_size=0))  # file size = end of its records
    b = Bookie(tmp_path / "j", [tmp_path / "l1", tmp_path / "l2"], opts)
    await b.start()
    res, fut = b.add_batch(adds(1, 0, 20, lac=-2) + adds(2, 0, 5))
    assert res == []
    await fut
    await b.checkpoint()
    res, fut = b.add_batch(adds(1, 20, 10, lac=-2) + adds(6, 0, 3))
    await fut
    assert b.lac(1) == 28
    (_, current), = [(s, p) for s, p in journal_files(tmp_path / "j") if s == b.storage.journal.position.seq]
    assert b.storage.journal.position.offset == current.stat().st_size  # marks point at record boundaries
    # simulate a crash: no final checkpoint
    await b.storage.journal.close()
    b.storage.started = False
    await b.close()
    b2 = Bookie(tmp_path / "j", [tmp_path / "l1", tmp_path / "l2"], opts)
    await b2.start()
    try:
        assert b2.storage.replayed > 0
        for e in adds(1, 0, 30, lac=-2):
            assert b2.read_entry(1, e.entry_id) == e.body
        assert b2.read_entry(2, 4) == adds(2, 4, 1)[0].body
        assert b2.read_entry(1, 30) is None
        assert b2.lac(1) == 28
        assert b2.list_entries(1) == [(0, 29)]
        await b2.checkpoint()
        assert b2.storage.cache.count == 0
        assert b2.read_entry(1, 25) == adds(1, 25, 1, lac=-2)[0].body
    finally:
        await b2.close()


async def test_a_rotted_entry_log_record_is_refused_and_the_others_still_read(tmp_path):
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    try:
        batch = adds(3, 0, 10, size=300)
        await b.add_batch(batch)[1]
        await b.checkpoint()
        _, log_id, offset = b.storage.index.location(3, 4)
        with open(b.storage.entrylogs[0].path(log_id), "r+b") as f:  # one bit flips in entry 4's body
            f.seek(offset + LOG_HEADER + 100)
            byte = f.read(1)
            f.seek(offset + LOG_HEADER + 100)
            f.write(bytes([byte[0] ^ 0x10]))
        with pytest.raises(BookieStorageError, match="3:4 fails its checksum"):
            b.read_entry(3, 4)
        with pytest.raises(BookieStorageError, match="checksum"):
            await b.read_chunk(3, 0, 9, 1 << 20, 100)
        assert [b.read_entry(3, i) for i in range(10) if i != 4] == [e.body for e in batch if e.entry_id != 4]
    finally:
        await b.close()


async def test_master_key_enforced_and_fence_durable(tmp_path, child_processes):
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    await b.add_batch(adds(3, 0, 2, lac=-2))[1]
    res, _ = b.add_batch(adds(3, 2, 1, key=entry.master_key(b"other")))
    assert statuses(res, 1) == [pb.UNAUTHORIZED]
    assert (await b.fence(3, entry.master_key(b"other")))[0] == pb.UNAUTHORIZED
    assert await b.fence(3, KEY) == (pb.OK, 0)
    res, _ = b.add_batch(adds(3, 2, 1))
    assert statuses(res, 1) == [pb.FENCED]
    res, fut = b.add_batch(adds(3, 2, 1, flags=pb.RECOVERY_ADD))
    assert res == []
    await fut
    await b.storage.journal.close()
    b.storage.started = False
    await b.close()
    b2 = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b2.start()
    try:
        assert b2.ledgers[3].fenced and b2.ledgers[3].master_key == KEY
        assert statuses(b2.add_batch(adds(3, 3, 1))[0], 1) == [pb.FENCED]
    finally:
        await b2.close()


async def test_bad_requests_are_refused_per_entry(tmp_path):
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(max_entry_size=1000))
    await b.start()
    try:
        good = adds(4, 0, 1)[0]
        short = pb.AddEntry(ledger_id=4, entry_id=1, master_key=KEY, body=b"abc")
        wrong = pb.AddEntry(ledger_id=4, entry_id=2, master_key=KEY, body=entry.encode(4, 9, -1, b"p"))
        big = adds(4, 3, 1, size=2000)[0]
        res, fut = b.add_batch([good, short, wrong, big])
        assert statuses(res, 4) == [pb.OK, pb.BAD_REQUEST, pb.BAD_REQUEST, pb.BAD_REQUEST]
        await fut
    finally:
        await b.close()


async def test_long_poll_wakes_on_new_lac(tmp_path):
    b = Bookie(tmp_path / "j", [tmp_path / "l"])
    await b.start()
    try:
        await b.add_batch(adds(5, 0, 1))[1]
        waiter = asyncio.ensure_future(b.wait_lac(5, -1, 10))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        b.add_batch(adds(5, 1, 1, lac=0))
        assert await asyncio.wait_for(waiter, 5) == 0
        assert await b.wait_lac(5, 0, 0.05) == 0
    finally:
        await b.close()


def test_ledger_state_round_trips():
    st = LedgerState(master_key=KEY, fenced=True, lac=5, explicit_lac=7)
    assert LedgerState.from_bytes(st.to_bytes()) == st


async def test_interleaved_ledgers_with_a_refused_one_keep_every_lac(tmp_path):
    b = Bookie(tmp_path / "j", [tmp_path / "l"])
    await b.start()
    try:
        await b.add_batch(adds(8, 0, 1))[1]
        other = entry.master_key(b"other")
        batch = adds(7, 0, 2, lac=-2) + adds(8, 1, 1, key=other) + adds(7, 2, 3, lac=-2) + adds(9, 0, 2, lac=-2)
        res, fut = b.add_batch(batch)
        await fut
        assert statuses(res, len(batch)) == [pb.OK, pb.OK, pb.UNAUTHORIZED, pb.OK, pb.OK, pb.OK, pb.OK, pb.OK]
        assert (b.lac(7), b.lac(8), b.lac(9)) == (3, -1, 0)
        assert b.list_entries(7) == [(0, 4)]
    finally:
        await b.close()


async def test_compaction_rewrites_mostly_dead_entry_logs_and_keeps_live_entries(tmp_path, child_processes):
    opts = StorageOptions(checkpoint_interval=3600, entrylog_max_file_size=1)  # a new log per checkpoint
    b = Bookie(tmp_path / "j", [tmp_path / "l"], opts)
    await b.start()
    try:
        await b.add_batch(adds(1, 0, 10) + adds(2, 0, 90))[1]
        await b.checkpoint()
        await b.add_batch(adds(3, 0, 50))[1]
        await b.checkpoint()
        logs_before = b.storage.entrylogs[0].log_ids()
        assert len(logs_before) >= 2
        assert await b.delete_ledgers({2}) == 90
        result = await b.compact(Housekeeping().compaction_threshold)
        assert result["rewritten_logs"] == 1 and result["copied_entries"] == 10 and result["reclaimed_bytes"] > 0
        assert logs_before[0] not in b.storage.entrylogs[0].log_ids()
        for e in adds(1, 0, 10) + adds(3, 0, 50):
            assert b.read_entry(e.ledger_id, e.entry_id) == e.body
        assert b.read_entry(2, 0) is None and not b.has_ledger(2)
    finally:
        await b.close()
    b2 = Bookie(tmp_path / "j", [tmp_path / "l"], opts)
    await b2.start()
    try:
        assert sorted(b2.ledgers) == [1, 3]
        assert b2.list_entries(1) == [(0, 9)] and b2.read_entry(1, 9) == adds(1, 9, 1)[0].body
    finally:
        await b2.close()


async def test_full_write_cache_answers_too_many_requests_until_a_checkpoint(tmp_path):
    opts = StorageOptions(checkpoint_interval=3600, checkpoint_bytes=1 << 40, max_write_cache_bytes=10_000)
    b = Bookie(tmp_path / "j", [tmp_path / "l"], opts)
    await b.start()
    try:
        await b.add_batch(adds(1, 0, 100, size=200))[1]
        res, fut = b.add_batch(adds(1, 100, 2))
        assert fut is None and statuses(res, 2) == [pb.TOO_MANY_REQUESTS] * 2
        await b.checkpoint()
        res, fut = b.add_batch(adds(1, 100, 2))
        assert res == []
        await fut
    finally:
        await b.close()


async def test_failed_journal_write_turns_the_bookie_read_only(tmp_path):
    b = Bookie(tmp_path / "j", [tmp_path / "l"])
    await b.start()
    try:
        await b.add_batch(adds(1, 0, 1))[1]
        os.close(b.storage.journal._fd)  # the disk goes away under the writer
        res, fut = b.add_batch(adds(1, 1, 1))
        with pytest.raises(OSError):
            await fut
        assert b.read_only and b.disk.journal_failed
        assert statuses(b.add_batch(adds(1, 2, 1))[0], 1) == [pb.READ_ONLY]
        assert b.read_entry(1, 0) == adds(1, 0, 1)[0].body
        b.storage.journal._fd = os.open(os.devnull, os.O_WRONLY)  # let close() release something valid
    finally:
        await b.close()


async def test_read_chunks_come_from_entry_log_then_cache_in_order(tmp_path):
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    try:
        await b.add_batch(adds(1, 0, 300))[1]
        await b.checkpoint()
        await b.add_batch(adds(1, 300, 5))[1]
        got, eid = [], 0
        while True:
            chunk = await b.read_chunk(1, eid, 400, 1 << 20, 4096)
            if not chunk:
                break
            got.extend(chunk)
            eid += len(chunk)
        assert got == [(e.entry_id, e.body) for e in adds(1, 0, 305)] and eid == 305
        assert await b.read_chunk(2, 0, 5, 1 << 20, 10) == []
    finally:
        await b.close()


async def test_read_chunks_with_a_step_return_exactly_the_strided_entries(tmp_path):
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    try:
        held = [a for a in adds(1, 0, 330) if a.entry_id % 3 != 1]   # a striped replica's share
        await b.add_batch([a for a in held if a.entry_id < 300])[1]
        await b.checkpoint()
        await b.add_batch([a for a in held if a.entry_id >= 300])[1]
        for start in (0, 2):
            got, eid = [], start
            while True:
                chunk = await b.read_chunk(1, eid, 329, 1 << 20, 7, step=3)
                if not chunk:
                    break
                got.extend(chunk)
                eid += 3 * len(chunk)
            assert got == [(a.entry_id, a.body) for a in held if a.entry_id % 3 == start]
        assert await b.read_chunk(1, 1, 329, 1 << 20, 100, step=3) == []
        assert [e for e, _ in await b.read_chunk(1, 0, 329, 1 << 20, 100, step=2)] == [0, 2]  # 4 is not
    finally:
        await b.close()


async def test_keyless_recovery_adds_and_fences_need_the_keyless_right(tmp_path):
    """An empty key is keyless recovery: accepted (recording no key) only from a caller that may
    do it (admin); others get BAD_REQUEST saying so. A wrong non-empty key stays UNAUTHORIZED."""
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    try:
        res, fut = b.add_batch(adds(5, 0, 2, key=b"", flags=pb.RECOVERY_ADD, lac=-2))
        assert fut is None and statuses(res, 2) == [pb.BAD_REQUEST] * 2
        assert all("keyless recovery" in message for _, _, message in res)
        assert 5 not in b.ledgers
        status, _ = await b.fence(5, b"")
        assert status == pb.BAD_REQUEST and 5 not in b.ledgers

        res, fut = b.add_batch(adds(5, 0, 2, key=b"", flags=pb.RECOVERY_ADD, lac=-2), keyless=True)
        assert res == []
        await fut
        assert b.ledgers[5].master_key == b""  # no key recorded: the owner's key is checked later
        res, _ = b.add_batch(adds(5, 2, 1, key=b"", lac=-2), keyless=True)  # not a recovery add
        assert statuses(res, 1) == [pb.BAD_REQUEST] and "keyless recovery" in res[0][2]
        assert await b.fence(5, b"", keyless=True) == (pb.OK, 0)
        assert b.ledgers[5].fenced and b.ledgers[5].master_key == b""

        await b.add_batch(adds(6, 0, 1))[1]
        res, _ = b.add_batch(adds(6, 1, 1, key=entry.master_key(b"other"), flags=pb.RECOVERY_ADD), keyless=True)
        assert statuses(res, 1) == [pb.UNAUTHORIZED]
        assert (await b.fence(6, entry.master_key(b"other"), keyless=True))[0] == pb.UNAUTHORIZED
        assert b.read_entry(6, 0) == adds(6, 0, 1)[0].body and b.read_entry(6, 1) is None
    finally:
        await b.close()


async def test_a_refused_first_key_leaves_no_ledger_state_behind(tmp_path):
    """The admission decides a ledger's first key; a refusal records nothing (the id stays free
    for its owner), and a key admitted later is recorded."""
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    try:
        def refuse(ledger, key):
            return admit_new_key(ledger, key, None)
        res, fut = b.add_batch(adds(7, 0, 3, lac=-2), admit=refuse)
        assert fut is None and statuses(res, 3) == [pb.UNAUTHORIZED] * 3
        assert "not allocated in the metadata" in res[0][2]
        assert 7 not in b.ledgers
        keys = LedgerKeys(key_check=entry.key_check(KEY))
        res, fut = b.add_batch(adds(7, 0, 3, lac=-2, key=entry.key_check(KEY)),
                               admit=lambda ledger, key: admit_new_key(ledger, key, keys))
        assert statuses(res, 3) == [pb.UNAUTHORIZED] * 3 and 7 not in b.ledgers
        res, fut = b.add_batch(adds(7, 0, 3, lac=-2), admit=lambda ledger, key: admit_new_key(ledger, key, keys))
        assert res == []
        await fut
        assert b.ledgers[7].master_key == KEY
    finally:
        await b.close()


def test_first_key_admission_follows_the_metadata():
    ledger, key = 9, entry.master_key(b"pw")
    status, why = admit_new_key(ledger, key, None)
    assert status == pb.UNAUTHORIZED and why.startswith("ledger 9 is not allocated in the metadata")
    assert admit_new_key(ledger, key, LedgerKeys(key_check=entry.key_check(key))) == (pb.OK, "")
    status, why = admit_new_key(ledger, entry.key_check(key), LedgerKeys(key_check=entry.key_check(key)))
    assert status == pb.UNAUTHORIZED and "does not match the ledger's metadata" in why
    assert admit_new_key(ledger, key, LedgerKeys(master_key=key)) == (pb.OK, "")  # an earlier release's ledger
    assert admit_new_key(ledger, b"x", LedgerKeys(master_key=key))[0] == pb.UNAUTHORIZED
    assert admit_new_key(ledger, b"x", LedgerKeys())[0] == pb.OK  # metadata that stores neither


def _entry(ledger: int, eid: int, payload: bytes, key: bytes = KEY, flags: int = 0) -> pb.AddEntry:
    return pb.AddEntry(request_id=eid, ledger_id=ledger, entry_id=eid, master_key=key, flags=flags,
                       body=entry.encode(ledger, eid, eid - 1, payload))


async def test_entries_are_write_once_in_the_cache_in_flight_and_in_the_index(tmp_path, child_processes):
    """The same bytes again are accepted (a retry, a recovery add), other bytes refused
    ENTRY_EXISTS and the stored entry kept: in the write cache, during a checkpoint, in the
    index; within one batch and one run too; ids above the highest held pass without a lookup."""
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    try:
        first = [_entry(5, i, b"v1-%d" % i) for i in range(4)]
        await b.add_batch(first)[1]
        again = [_entry(5, 1, b"v1-1"), _entry(5, 2, b"v2-2"), _entry(5, 4, b"v1-4"),
                 _entry(5, 4, b"v1-4"), _entry(5, 5, b"v1-5"), _entry(5, 5, b"v2-5"),
                 _entry(5, 3, b"v2-3", flags=pb.RECOVERY_ADD)]
        errors, fut = b.add_batch(again)
        assert statuses(errors, 7) == [pb.OK, pb.ENTRY_EXISTS, pb.OK, pb.OK, pb.OK, pb.ENTRY_EXISTS, pb.ENTRY_EXISTS]
        assert errors[0][2] == "entry 5:2 is stored here with other bytes: entries are write-once, the stored one stays"
        await fut
        held = {i: b.read_entry(5, i) for i in range(6)}
        assert held == {**{e.entry_id: e.body for e in first}, 4: _entry(5, 4, b"v1-4").body,
                        5: _entry(5, 5, b"v1-5").body}
        checkpoint = asyncio.ensure_future(b.checkpoint())
        await asyncio.sleep(0)  # the checkpoint has taken the cache: its entries are in flight
        assert b.storage.flushing is not None and not b.storage.cache.count
        assert statuses(b.add_batch([_entry(5, 0, b"v2-0")])[0], 1) == [pb.ENTRY_EXISTS]
        await checkpoint
        assert b.storage.index.location(5, 0) is not None and b.storage.cache.get(5, 0) is None
        errors, fut = b.add_batch([_entry(5, 0, b"v1-0"), _entry(5, 1, b"v2-1"), _entry(5, 6, b"v1-6")])
        assert statuses(errors, 3) == [pb.OK, pb.ENTRY_EXISTS, pb.OK]
        await fut
        assert [b.read_entry(5, i) for i in range(7)] == [held[i] for i in range(6)] + [_entry(5, 6, b"v1-6").body]
    finally:
        await b.close()
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    try:
        assert statuses(b.add_batch([_entry(5, 6, b"v2-6"), _entry(5, 2, b"v2-2")])[0], 2) == [pb.ENTRY_EXISTS] * 2
        assert b.read_entry(5, 6) == _entry(5, 6, b"v1-6").body and b.read_entry(5, 2) == held[2]
    finally:
        await b.close()


async def test_a_rotted_copy_of_an_entry_is_replaced_by_an_add(tmp_path):
    """An entry whose record fails its checksum is as good as missing: an add stores it again."""
    b = Bookie(tmp_path / "j", [tmp_path / "l"], StorageOptions(checkpoint_interval=3600))
    await b.start()
    try:
        good = _entry(6, 0, b"x" * 300)
        await b.add_batch([good])[1]
        await b.checkpoint()
        _, log_id, offset = b.storage.index.location(6, 0)
        with open(b.storage.entrylogs[0].path(log_id), "r+b") as f:
            f.seek(offset + LOG_HEADER + 100)
            f.write(b"y")
        errors, fut = b.add_batch([good])
        assert errors == []
        await fut
        assert b.read_entry(6, 0) == good.body
    finally:
        await b.close()
