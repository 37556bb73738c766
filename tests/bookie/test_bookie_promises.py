"""The bookie's promises, shown with real `pybk bookie` processes and a real etcd."""
from __future__ import annotations

import asyncio
import os
import random

import grpc
import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieError, Status
from pybk.bookie.journal import RecordType, journal_files, read_mark, scan_file
from pybk.meta import MetadataStore
from pybk.meta.registry import RegistryState
from pybk.proto import pb

from allocation import allocate
from polling import eventually

KEY = entry.master_key(b"secret")
TTL = 2  # registration lease, so a restart after kill -9 re-registers quickly


def body(ledger: int, eid: int, lac: int = -1, size: int = 200) -> bytes:
    rnd = random.Random(ledger * 1_000_003 + eid)
    return entry.encode(ledger, eid, lac, rnd.randbytes(size))

async def read_all(client: BookieClient, expected: dict[tuple[int, int], bytes]) -> None:
    for (ledger, eid), b in sorted(expected.items()):
        assert await client.read(ledger, eid) == b, f"entry {ledger}:{eid} differs"


async def test_acked_adds_survive_kill_9_mid_stream(bookies, metadata_uri):
    """An add is acknowledged only after its journal record is fsync'd."""
    bk, = bookies(1, registration_ttl=TTL, checkpoint_interval=0.5)
    await allocate(metadata_uri, [11, 12, 13, 14], KEY)
    client = await BookieClient.connect(bk.address, wait=30)
    acked: dict[tuple[int, int], bytes] = {}
    failed = 0
    ledgers = [11, 12, 13, 14]

    async def writer(ledger: int) -> None:
        nonlocal failed
        eid = 0
        window: list[tuple[int, asyncio.Future]] = []
        while True:
            while len(window) < 200:
                fut = client.add_nowait(ledger, eid, body(ledger, eid, eid - 1), KEY)
                window.append((eid, fut))
                eid += 1
            e, fut = window.pop(0)
            try:
                await fut
                acked[(ledger, e)] = body(ledger, e, e - 1)
            except BookieError:
                failed += 1
                for _, f in window:
                    try:
                        await f
                    except BookieError:
                        pass
                return

    tasks = [asyncio.ensure_future(writer(lg)) for lg in ledgers]
    await eventually(lambda: len(acked) >= 4000, what="4000 acks")
    await asyncio.to_thread(bk.kill)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    await client.close()
    assert failed == len(ledgers)
    await asyncio.to_thread(bk.start)
    client = await BookieClient.connect(bk.address, wait=30)
    try:
        await read_all(client, acked)
        for ledger in ledgers:
            assert await client.read_lac(ledger) >= max(e for lg, e in acked if lg == ledger) - 1
    finally:
        await client.close()


def _journal_with_records(bk):
    files = [p for _, p in journal_files(bk.journal_dir) if p.stat().st_size > 0]
    assert files, "no journal data"
    return files[0]


async def test_torn_journal_tail_replays_and_corrupt_middle_refuses_start(bookies, metadata_uri):
    """A torn last record is cut off and start-up goes on; a damaged middle record stops start-up
    with a message naming the file and the offset (files not preallocated: their size is their end)."""
    bk, = bookies(1, registration_ttl=TTL, checkpoint_interval=3600, journal_prealloc_size=0)
    await allocate(metadata_uri, [21], KEY)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await asyncio.gather(*(c.add(21, i, body(21, i, i - 1), master_key=KEY) for i in range(99)))
        await c.add(21, 99, body(21, 99, 98), master_key=KEY)  # a record of its own, the last
    await asyncio.to_thread(bk.kill)
    path = _journal_with_records(bk)
    records = []
    offset = read_mark(bk.journal_dir).offset if read_mark(bk.journal_dir).seq else 0
    for rec in scan_file(path, offset, is_last=False):
        records.append((offset, rec))
        offset += 25 + len(rec.body)
    assert offset == path.stat().st_size
    last_offset, last = records[-1]
    assert (last.type, last.entry, last.body[:8]) == (RecordType.ADD_RUN, 1, (99).to_bytes(8, "big"))
    with open(path, "r+b") as f:
        f.truncate(last_offset + 25 + len(last.body) // 2)  # cut mid-record
    await asyncio.to_thread(bk.start)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await read_all(c, {(21, i): body(21, i, i - 1) for i in range(99)})
        with pytest.raises(BookieError) as err:
            await c.read(21, 99)
        assert err.value.code is Status.NO_ENTRY
    await asyncio.to_thread(bk.kill)

    mid_offset, mid = records[len(records) // 2]
    with open(path, "r+b") as f:
        f.seek(mid_offset + 25 + len(mid.body) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    await asyncio.to_thread(bk.start, wait=False)
    code = await asyncio.to_thread(bk.exit_code)
    assert code != 0
    log = bk.log_path.read_text()
    assert f"journal file {path} is corrupt at offset {mid_offset}" in log


async def test_fence_blocks_normal_adds_allows_recovery_adds_and_survives_restart(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL)
    await allocate(metadata_uri, [31, 32], KEY)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        for i in range(5):
            await c.add(31, i, body(31, i, i - 1), master_key=KEY)
        assert await c.fence(31, KEY) == 3
        with pytest.raises(BookieError) as err:
            await c.add(31, 5, body(31, 5, 4), master_key=KEY)
        assert err.value.code is Status.FENCED
        await c.add(31, 5, body(31, 5, 4), master_key=KEY, recovery=True)
        assert await c.fence(32, KEY) == -1  # fencing a ledger it never saw records the fence too
    await asyncio.to_thread(bk.kill)
    await asyncio.to_thread(bk.start)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        for ledger in (31, 32):
            with pytest.raises(BookieError) as err:
                await c.add(ledger, 6, body(ledger, 6, 5), master_key=KEY)
            assert err.value.code is Status.FENCED
        await c.add(31, 6, body(31, 6, 5), master_key=KEY, recovery=True)
        await read_all(c, {(31, i): body(31, i, i - 1) for i in range(7)})


async def test_wrong_key_unauthorized_and_bad_requests_keep_server_up(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL, max_entry_size=4096)
    await allocate(metadata_uri, [41], KEY)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await c.add(41, 0, body(41, 0), master_key=KEY)
        other = entry.master_key(b"wrong")
        cases = [
            (41, 1, body(41, 1), other, Status.UNAUTHORIZED),
            (41, 1, b"short", KEY, Status.BAD_REQUEST),
            (41, 1, body(41, 2), KEY, Status.BAD_REQUEST),           # body header names another entry
            (42, 1, body(41, 1), KEY, Status.BAD_REQUEST),           # ... another ledger
            (41, 1, body(41, 1, size=10_000), KEY, Status.BAD_REQUEST),  # oversized
            (43, 0, body(43, 0), b"", Status.BAD_REQUEST),           # no master key
        ]
        with pytest.raises(BookieError) as err:
            await c.add(-1, 0, body(41, 0), master_key=KEY)  # not even representable on the wire
        assert err.value.code is Status.BAD_REQUEST
        futs = [c.add_nowait(lg, e, b, k) for lg, e, b, k, _ in cases]
        good = c.add_nowait(41, 1, body(41, 1, 0), KEY)
        for fut, case in zip(futs, cases):
            with pytest.raises(BookieError) as err:
                await fut
            assert err.value.code is case[-1], case
        await good
        with pytest.raises(BookieError) as err:
            await c.fence(41, other)
        assert err.value.code is Status.UNAUTHORIZED
        with pytest.raises(BookieError) as err:
            await c.write_lac(41, 1, other)
        assert err.value.code is Status.UNAUTHORIZED
        with pytest.raises(BookieError) as err:
            async for _ in c.read_range(41, 5, 2):
                pass
        assert err.value.code is Status.BAD_REQUEST
        # undecodable bytes straight onto the wire: INVALID_ARGUMENT, saying so
        async with grpc.aio.insecure_channel(bk.address) as ch:
            raw = ch.unary_stream("/pybk.Bookie/Read", request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.aio.AioRpcError) as rpc_err:
                async for _ in raw(b"\xff\xff\xff\xff\x0f"):
                    pass
            assert rpc_err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "undecodable Read request" in rpc_err.value.details()
            raw_add = ch.stream_stream("/pybk.Bookie/Add", request_serializer=None, response_deserializer=None)
            call = raw_add()
            good_batch = pb.AddBatch(entries=[pb.AddEntry(request_id=7, ledger_id=41, entry_id=2, master_key=KEY,
                                                          body=body(41, 2, 1))])
            await call.write(good_batch.SerializeToString())
            await call.write(b"\x0a\xff\xff")
            answers = []
            with pytest.raises(grpc.aio.AioRpcError) as rpc_err:
                async for r in call:
                    answers.append(pb.AddResults.FromString(r))
            assert rpc_err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "undecodable Add request" in rpc_err.value.details()
            assert [(r.request_id, r.status) for a in answers for r in a.results] == [(7, pb.OK)]
        assert bk.alive()
        await read_all(c, {(41, 0): body(41, 0), (41, 1): body(41, 1, 0), (41, 2): body(41, 2, 1)})
        await c.add(41, 3, body(41, 3, 2), master_key=KEY)


async def test_read_only_past_high_water_mark_and_writable_below_low(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL, disk_capacity=8 * 1024 * 1024, high_water_mark=0.5,
                  low_water_mark=0.4, disk_check_interval=0.1, journal_prealloc_size="1MiB")  # counts as used
    await allocate(metadata_uri, [51], KEY)
    store = await MetadataStore.connect(metadata_uri)
    try:
        async with await BookieClient.connect(bk.address, wait=30) as c:
            await c.add(51, 0, body(51, 0), master_key=KEY)
            filler = bk.ledger_dirs[0] / "filler"
            filler.write_bytes(os.urandom(5 * 1024 * 1024))
            await eventually(lambda: bk.http_json("/api/v1/bookie/state")["readOnly"], what="read-only")
            with pytest.raises(BookieError) as err:
                await c.add(51, 1, body(51, 1, 0), master_key=KEY)
            assert err.value.code is Status.READ_ONLY
            assert await c.read(51, 0) == body(51, 0)
            await eventually(lambda: _registered(store, bk.bookie_id, "readonly"), what="readonly/ registration")
            assert (await c.info())["read_only"]
            filler.unlink()
            await eventually(lambda: not bk.http_json("/api/v1/bookie/state")["readOnly"], what="writable")
            await eventually(lambda: _registered(store, bk.bookie_id, "writable"), what="writable/ registration")
            await c.add(51, 1, body(51, 1, 0), master_key=KEY)
            # and by request through the admin API
            assert bk.http_json("/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})["readOnly"]
            await eventually(lambda: _registered(store, bk.bookie_id, "readonly"), what="readonly/ registration")
            with pytest.raises(BookieError) as err:
                await c.add(51, 2, body(51, 2, 1), master_key=KEY)
            assert err.value.code is Status.READ_ONLY
            bk.http_json("/api/v1/bookie/state/readonly", "PUT", {"readOnly": False})
            await c.add(51, 2, body(51, 2, 1), master_key=KEY)
            await read_all(c, {(51, i): body(51, i, i - 1) for i in range(3)})
    finally:
        await store.close()


async def _registered(store: MetadataStore, bookie_id: str, where: str) -> bool:
    found = await (store.registry.readonly() if where == "readonly" else store.registry.writable())
    return bookie_id in found


async def test_cookie_mismatch_refuses_start_saying_what_differs(bookies, tmp_path):
    from pybk.local.bookie import BookieProcess

    first, = bookies(1, registration_ttl=TTL)
    await asyncio.to_thread(first.stop)
    intruder = BookieProcess(tmp_path / "intruder", metadata_uri=first.metadata_uri,
                             ledger_dirs=first.ledger_dirs, registration_ttl=TTL)
    try:
        intruder.start(wait=False)
        assert await asyncio.to_thread(intruder.exit_code) != 0
        log = intruder.log_path.read_text()
        assert "refusing to start" in log and "cookie" in log
        assert first.bookie_id in log and intruder.bookie_id in log  # what differs
        assert "To fix" in log
    finally:
        intruder.kill()
    # the rightful owner still starts on its dirs
    await asyncio.to_thread(first.start)


async def test_reads_after_checkpoint_come_from_entry_log_also_after_restart(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL, checkpoint_interval=0.3, journal_max_file_size=64 * 1024)
    await allocate(metadata_uri, [61], KEY)
    expected = {(61, i): body(61, i, i - 1, size=1000) for i in range(300)}
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await asyncio.gather(*(c.add(lg, e, b, master_key=KEY) for (lg, e), b in expected.items()))

        def checkpointed() -> bool:
            mark = read_mark(bk.journal_dir)
            return (mark.seq > 1 and bk.http_json("/api/v1/bookie/state")["writeCacheEntries"] == 0
                    and all(seq >= mark.seq for seq, _ in journal_files(bk.journal_dir)))

        # the journal rotated, a checkpoint emptied the write cache and deleted the files before its mark
        await eventually(checkpointed, what="checkpoint")
        await read_all(c, expected)
    await asyncio.to_thread(bk.kill)
    mark = read_mark(bk.journal_dir)
    for seq, path in journal_files(bk.journal_dir):
        assert seq >= mark.seq
    await asyncio.to_thread(bk.start)
    assert bk.http_json("/api/v1/bookie/state")["writeCacheEntries"] == 0
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await read_all(c, expected)
        assert await c.list_entries(61) == [(0, 299)]
        assert [(61, e, b) async for e, b in c.read_range(61, 0, 299)] == \
            [(lg, e, b) for (lg, e), b in sorted(expected.items())]
    metrics = bk.http_get("/metrics")[1].decode()
    assert "pybk_bookie_reads_total 600.0" in metrics


@pytest.mark.private_etcd
async def test_bookie_serves_through_etcd_outage_and_registers_again(bookies, etcd, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL)
    await allocate(metadata_uri, [71, 72], KEY)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await c.add(71, 0, body(71, 0), master_key=KEY)
        store = await MetadataStore.connect(metadata_uri)
        key = store.registry.key(RegistryState.WRITABLE, bk.bookie_id)
        lease_before = (await store.etcd.get(key)).lease
        await store.close()
        await asyncio.to_thread(etcd.kill)
        await asyncio.sleep(TTL + 1)
        for i in range(1, 50):
            await c.add(71, i, body(71, i, i - 1), master_key=KEY)
        with pytest.raises(BookieError) as err:  # a first key cannot be checked against the metadata now
            await c.fence(72, KEY)
        assert err.value.code is Status.IO_ERROR and "against the metadata" in str(err.value)
        assert await c.fence(72, b"") == -1  # a keyless fence (an admin's: open mode) needs no metadata
        await read_all(c, {(71, i): body(71, i, i - 1 if i else -1) for i in range(50)})
        assert bk.alive()
        await asyncio.to_thread(etcd.start)
        store = await MetadataStore.connect(metadata_uri)
        try:
            # on a new lease: the restarted etcd keeps the old registration until its lease expires
            async def registered_again() -> bool:
                kv = await store.etcd.get(key)
                return kv is not None and kv.lease != lease_before
            await eventually(registered_again, what="registration on a new lease after the outage")
        finally:
            await store.close()
        await c.add(71, 50, body(71, 50, 49), master_key=KEY)
