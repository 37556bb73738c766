"""A real `pybk bookie` process served over gRPC: adds, reads, LAC, listing (no etcd needed)."""
from __future__ import annotations

import asyncio

import pytest

import pybk

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieError, Status

from allocation import allocate

KEY = entry.master_key(b"pw")


def body(ledger, eid, lac=-1, size=64):
    return entry.encode(ledger, eid, lac, f"{ledger}:{eid}:".encode() * (size // 8))


async def test_adds_read_back_with_lac_and_listing(bookies):
    b, = bookies(1, metadata_uri=None)
    c = await BookieClient.connect(b.address)
    try:
        await asyncio.gather(*(c.add(9, i, body(9, i, i - 1), master_key=KEY) for i in range(500)))
        assert await c.read(9, 17) == body(9, 17, 16)
        got = [(e, bd) async for e, bd in c.read_range(9, 0, 499)]
        assert got == [(i, body(9, i, i - 1)) for i in range(500)]
        assert await c.read_lac(9) == 498
        assert await c.list_entries(9) == [(0, 499)]
        assert await c.list_ledgers() == [9]
        with pytest.raises(BookieError) as err:
            await c.read(9, 500)
        assert err.value.code is Status.NO_ENTRY
        with pytest.raises(BookieError) as err:
            await c.read(10, 0)
        assert err.value.code is Status.NO_LEDGER
        waiter = asyncio.ensure_future(c.wait_lac(9, 498, timeout=20))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        await c.add(9, 500, body(9, 500, 499), master_key=KEY)
        assert await waiter == 499
        await c.write_lac(9, 500, KEY)
        assert await c.read_lac(9) == 500
        info = await c.info()
        assert info["bookie_id"] == b.bookie_id and info["ledger_count"] == 1 and not info["read_only"]
        assert info["version"] == pybk.__version__
        metrics = (await asyncio.to_thread(b.http_get, "/metrics"))[1].decode()
        for line in ("pybk_bookie_adds_total 501.0", "pybk_bookie_add_batch_entries_sum 501.0",
                     "pybk_bookie_journal_fsync_seconds_count", "pybk_bookie_write_cache_bytes",
                     "pybk_bookie_reads_total 501.0", "pybk_bookie_ledgers 1.0"):
            assert line in metrics, line
        status, heartbeat = await asyncio.to_thread(b.http_get, "/heartbeat")
        assert status == 200
        admin = await asyncio.to_thread(b.http_json, "/api/v1/bookie/info")
        assert admin["grpc"] == b.address and admin["ledger_count"] == 1
    finally:
        await c.close()


async def test_bookie_registers_with_endpoints_and_zone(bookies, metadata_uri):
    from pybk.meta import MetadataStore
    b, = bookies(1, zone="z1")
    store = await MetadataStore.connect(metadata_uri)
    try:
        writable = await store.registry.writable()
        assert writable[b.bookie_id].grpc == b.address
        assert writable[b.bookie_id].http == b.http_url and writable[b.bookie_id].zone == "z1"
        assert (await store.cookies.get(b.bookie_id)).bookie_id == b.bookie_id
        b.stop()
        assert b.bookie_id not in await store.registry.writable()
    finally:
        await store.close()


async def test_gc_drops_ledgers_deleted_from_metadata_also_after_restart(bookies, metadata_uri):
    from pybk.meta import MetadataStore
    b, = bookies(1, registration_ttl=2, gc_interval=0)
    store = await MetadataStore.connect(metadata_uri)
    try:
        keep = await store.ledgers.create([b.bookie_id], 1, 1)
        drop = await store.ledgers.create([b.bookie_id], 1, 1)
        async with await BookieClient.connect(b.address) as c:
            for lid in (keep.ledger_id, drop.ledger_id):
                await asyncio.gather(*(c.add(lid, i, body(lid, i), master_key=KEY) for i in range(20)))
            listed = await asyncio.to_thread(b.http_json, "/api/v1/ledger/list?entries=true")
            assert [(x["ledger_id"], x["entries"]) for x in listed["ledgers"]] == \
                [(keep.ledger_id, [[0, 19]]), (drop.ledger_id, [[0, 19]])]
            md = await asyncio.to_thread(b.http_json, f"/api/v1/ledger/metadata?ledger_id={keep.ledger_id}")
            assert md["fragments"] == [{"first_entry_id": 0, "bookies": [b.bookie_id]}]
            await store.ledgers.delete(drop.ledger_id)
            result = await asyncio.to_thread(b.http_json, "/api/v1/bookie/gc", "POST")
            assert result["deleted_ledgers"] == [drop.ledger_id] and result["dropped_entries"] == 20
            status, page = b.http_get("/metrics")
            assert status == 200
            lines = page.decode().splitlines()
            assert "pybk_bookie_gc_runs_total 1.0" in lines and "pybk_bookie_gc_deleted_ledgers_total 1.0" in lines
            assert f"pybk_bookie_gc_reclaimed_bytes_total {float(result['reclaimed_bytes'])}" in lines
            with pytest.raises(BookieError) as err:
                await c.read(drop.ledger_id, 0)
            assert err.value.code is Status.NO_LEDGER
        await asyncio.to_thread(b.restart)
        async with await BookieClient.connect(b.address) as c:
            assert await c.list_ledgers() == [keep.ledger_id]
            assert [e async for e, _ in c.read_range(keep.ledger_id, 0, 19)] == list(range(20))
    finally:
        await store.close()


async def test_read_only_by_request_survives_restart(bookies, metadata_uri):
    from pybk.meta import MetadataStore
    b, = bookies(1, registration_ttl=2)
    await allocate(metadata_uri, [3], KEY)
    await asyncio.to_thread(b.http_json, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})
    await asyncio.to_thread(b.restart)
    store = await MetadataStore.connect(metadata_uri)
    try:
        assert b.bookie_id in await store.registry.readonly()
        async with await BookieClient.connect(b.address) as c:
            with pytest.raises(BookieError) as err:
                await c.add(3, 0, body(3, 0), master_key=KEY)
            assert err.value.code is Status.READ_ONLY
        await asyncio.to_thread(b.http_json, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": False})
        async with await BookieClient.connect(b.address) as c:
            await c.add(3, 0, body(3, 0), master_key=KEY)
    finally:
        await store.close()


async def test_client_reconnects_to_a_restarted_bookie(bookies):
    b, = bookies(1, metadata_uri=None)
    c = await BookieClient.connect(b.address, wait=30)
    try:
        await c.add(4, 0, body(4, 0), master_key=KEY)
        await asyncio.to_thread(b.kill)
        with pytest.raises(BookieError):
            await c.add(4, 1, body(4, 1, 0), master_key=KEY)
        await asyncio.sleep(3)  # let the channel back off while the bookie is down
        await asyncio.to_thread(b.start)
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            try:
                await c.add(4, 1, body(4, 1, 0), master_key=KEY)
                break
            except BookieError:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.2)
        assert [e async for e, _ in c.read_range(4, 0, 1)] == [0, 1]
    finally:
        await c.close()


async def test_range_read_with_step_returns_the_strided_entries_and_bad_steps_are_refused(bookies):
    b, = bookies(1, metadata_uri=None)
    c = await BookieClient.connect(b.address)
    try:
        held = [i for i in range(3000) if i % 3 != 1]     # a Qw2 replica at index 0 of an E3 ensemble
        await asyncio.gather(*(c.add(4, i, body(4, i), master_key=KEY) for i in held))
        for start in (0, 2):
            got = [(e, bd) async for e, bd in c.read_range(4, start, 2999, step=3)]
            assert got == [(i, body(4, i)) for i in range(start, 3000, 3)]
        got = []
        with pytest.raises(BookieError) as err:
            async for e, _ in c.read_range(4, 0, 2999, step=2):
                got.append(e)
        assert got == [0, 2] and err.value.code is Status.NO_ENTRY and "4:4" in str(err.value)
        with pytest.raises(BookieError) as err:
            [e async for e in c.read_range(4, 0, 2999, step=2**32 - 1)]
        assert err.value.code is Status.BAD_REQUEST and "step" in str(err.value)
        with pytest.raises(ValueError, match="step"):
            [e async for e in c.read_range(4, 0, 2999, step=-1)]
        assert await c.read(4, 2997) == body(4, 2997)       # the server is still up
        metrics = (await asyncio.to_thread(b.http_get, "/metrics"))[1].decode()
        assert "pybk_bookie_read_requests_total 4.0" in metrics   # the refused one is not a read
    finally:
        await c.close()


async def test_a_follow_stream_answers_each_rise_of_the_lac_with_the_entries_after_the_last_one(bookies):
    """readLastAddConfirmedAndEntry, one call for many LACs: each answer carries the bodies from the
    previous LAC + 1 on, up to the new LAC and to the first entry this bookie does not hold."""
    b, = bookies(1, metadata_uri=None)
    c = await BookieClient.connect(b.address)
    try:
        await asyncio.gather(*(c.add(5, i, body(5, i, i - 1), master_key=KEY) for i in range(10)))
        stream = c.follow_lac(5, 3, timeout=20)
        lac, first, bodies, sizes = await anext(stream)                      # LAC 8 (entry 9 carries it)
        assert (lac, first) == (8, 4) and list(sizes) == [len(body(5, i, i - 1)) for i in range(4, 9)]
        assert bodies == b"".join(body(5, i, i - 1) for i in range(4, 9))
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.2)
        assert not waiting.done()                                            # no rise: no answer
        await c.add(5, 12, body(5, 12, 11), master_key=KEY)                  # LAC 11; 10 and 11 not here
        lac, first, bodies, sizes = await waiting
        assert (lac, bodies) == (11, body(5, 9, 8)) and first == 9 and len(sizes) == 1   # up to the gap
        await c.add(5, 14, body(5, 14, 13), master_key=KEY)                  # LAC 13: from 12, 13 not here
        lac, first, bodies, sizes = await anext(stream)
        assert (lac, first, bodies, len(sizes)) == (13, 12, body(5, 12, 11), 1)
        await c.add(5, 16, body(5, 16, 15), master_key=KEY)                  # LAC 15: 14 here, 15 not
        lac, first, bodies, sizes = await anext(stream)
        assert (lac, first, bodies, list(sizes)) == (15, 14, body(5, 14, 13), [len(body(5, 14, 13))])
        await stream.aclose()
        assert await c.wait_lac(5, 8, timeout=5) == 15                       # a plain long-poll: the LAC
        answers = [a async for a in c.follow_lac(5, 15, timeout=0.3)]        # nothing newer: the LAC at the end
        assert [(lac, len(sizes)) for lac, _, _, sizes in answers] == [(15, 0)]
    finally:
        await c.close()


async def test_ready_means_the_data_port_serves_adds_and_reads(tmp_path, child_processes):
    """The first moment /api/v1/bookie/is_ready answers 200, an add and a read through the gRPC port
    succeed at once (no retry, no wait for the channel)."""
    import time

    from pybk.local.bookie import BookieProcess

    bk = BookieProcess(tmp_path / "b", checkpoint_interval=3600)
    bk.start(wait=False)
    try:
        deadline = time.monotonic() + 60
        while not await asyncio.to_thread(_answers_ready, bk):
            assert bk.alive() and time.monotonic() < deadline, bk.log_tail(20)
            await asyncio.sleep(0.01)
        async with BookieClient(bk.address, timeout=5) as c:
            await c.add(5, 0, body(5, 0), master_key=KEY)
            assert await c.read(5, 0) == body(5, 0)
        assert bk.http_json("/api/v1/bookie/is_ready") == {"ready": True, "reason": "serving"}
    finally:
        bk.kill()


def _answers_ready(bk) -> bool:
    try:
        return bk.is_ready()
    except OSError:
        return False


async def test_an_entry_is_write_once_in_the_cache_after_a_checkpoint_and_after_a_restart(bookies):
    """The same bytes again are accepted (a retry), other bytes refused with ENTRY_EXISTS naming
    the entry, and the stored entry reads back unchanged: while it is in the write cache, once a
    checkpoint moved it to the entry log and index, and after the bookie restarted."""
    from polling import eventually
    b, = bookies(1, metadata_uri=None, checkpoint_interval=3600, checkpoint_bytes="16KiB")

    def checkpoints() -> float:
        page = b.http_get("/metrics")[1].decode()
        return next(float(line.split()[1]) for line in page.splitlines() if line.startswith("pybk_bookie_checkpoints_total"))

    async def check(c: BookieClient, eid: int) -> None:
        await c.add(11, eid, body(11, eid, eid - 1), master_key=KEY)  # the same bytes: a retry
        with pytest.raises(BookieError) as refused:
            await c.add(11, eid, entry.encode(11, eid, eid - 1, b"forged"), master_key=KEY)
        assert refused.value.code is Status.ENTRY_EXISTS
        assert refused.value.message == (f"entry 11:{eid} is stored here with other bytes: entries are write-once, "
                                         f"the stored one stays")
        assert await c.read(11, eid) == body(11, eid, eid - 1)

    async with await BookieClient.connect(b.address, wait=30) as c:
        await asyncio.gather(*(c.add(11, i, body(11, i, i - 1), master_key=KEY) for i in range(3)))
        await check(c, 0)  # in the write cache
        assert checkpoints() == 0
        await asyncio.gather(*(c.add(12, i, body(12, i, i - 1, size=1000), master_key=KEY) for i in range(40)))
        await eventually(lambda: checkpoints() >= 1, timeout=20, what="a checkpoint (16 KiB cached)")
        await check(c, 1)  # in the index and entry log now
    await asyncio.to_thread(b.restart)
    async with await BookieClient.connect(b.address, wait=30) as c:
        await check(c, 2)
        assert [e async for e, _ in c.read_range(11, 0, 2)] == [0, 1, 2]
        metrics = (await asyncio.to_thread(b.http_get, "/metrics"))[1].decode()
        assert 'pybk_bookie_add_errors_total{status="ENTRY_EXISTS"} 1.0' in metrics
