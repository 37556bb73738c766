"""One client cannot exhaust a bookie: messages have a maximum size, adds in flight are capped,
slow readers are paused and then cut off, calls on ledgers the bookie never stored create
nothing, the admin ledger list is paged and off the event loop, and the registration lease
outlives a busy event loop. Real bookie processes; memory is their RSS from /proc."""
from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieError, Status
from pybk.proto import pb, rpc
from polling import eventually
from procfs import rss

KEY = entry.master_key(b"bounds")
MiB = 1024 * 1024
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def body(ledger: int, eid: int, size: int = 64, lac: int | None = None) -> bytes:
    pattern = f"{ledger}:{eid}:".encode()
    payload = (pattern * (size // len(pattern) + 1))[:size]
    return entry.encode(ledger, eid, eid - 1 if lac is None else lac, payload)

# ---- message size -----------------------------------------------------------------------------

async def test_an_oversized_add_message_is_refused_without_growing_memory(bookies):
    """Rounds of three concurrent 40 MiB Add messages to a bookie whose limit is a few MiB end
    with RESOURCE_EXHAUSTED naming the size, and the bookie's memory does not grow by them. The
    first round may cost gRPC's buffers once (up to about one message's worth was seen); the
    rounds after it, 360 MiB more, must not add to that."""
    bk, = bookies(1, metadata_uri=None, max_entry_size="1MiB")
    async with await BookieClient.connect(bk.address, wait=30) as client:
        await client.add(1, 0, body(1, 0), master_key=KEY)

    async def attack() -> None:
        async with grpc.aio.insecure_channel(bk.address, options=UNLIMITED) as channel:
            stub = rpc.BookieStub(channel)

            async def huge(ledger: int) -> tuple[grpc.StatusCode, str]:
                batch = pb.AddBatch(entries=[pb.AddEntry(request_id=i, ledger_id=ledger, entry_id=i,
                                                         master_key=KEY, body=body(ledger, i, MiB - 100))
                                             for i in range(40)])
                call = stub.Add(iter([batch]))
                try:
                    async for _ in call:
                        pass
                except grpc.aio.AioRpcError as exc:
                    return exc.code(), exc.details()
                return grpc.StatusCode.OK, ""

            outcomes = await asyncio.gather(*(huge(10 + i) for i in range(3)))
        for code, details in outcomes:
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
            assert "larger than max" in details, details

    start = rss(bk.pid)
    await attack()
    first = rss(bk.pid) - start
    assert first < 80 * MiB, f"the first 120 MiB of oversized messages grew RSS by {first / MiB:.0f} MiB"
    before = rss(bk.pid)
    for _ in range(3):
        await attack()
    grown = rss(bk.pid) - before
    assert grown < 40 * MiB, f"RSS grew by {grown / MiB:.0f} MiB over three more rounds"
    async with await BookieClient.connect(bk.address, wait=30) as client:
        assert await client.read(1, 0) == body(1, 0)
        with pytest.raises(BookieError) as err:
            await client.read(10, 0)
        assert err.value.code is Status.NO_LEDGER


async def test_the_client_refuses_an_entry_larger_than_a_message_and_goes_on(bookies):
    """An entry that cannot fit in one message fails alone with BAD_REQUEST naming the limit;
    the adds around it on the same stream succeed."""
    bk, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(bk.address, wait=30) as client:
        big = body(2, 1, client.max_message_bytes + 1)
        results = await asyncio.gather(client.add(2, 0, body(2, 0), master_key=KEY),
                                       client.add(2, 1, big, master_key=KEY),
                                       client.add(2, 2, body(2, 2), master_key=KEY), return_exceptions=True)
        assert results[0] is None and results[2] is None, results
        assert isinstance(results[1], BookieError) and results[1].code is Status.BAD_REQUEST
        assert "message size" in results[1].message
        assert await client.read(2, 2) == body(2, 2)


# ---- adds in flight ---------------------------------------------------------------------------

async def _push_adds(address: str, ledger: int) -> list:
    """30 batches of 8 x 64 KiB entries sent on one Add stream without waiting; their results."""
    async with grpc.aio.insecure_channel(address, options=UNLIMITED) as channel:
        stub = rpc.BookieStub(channel)
        batches = [pb.AddBatch(entries=[pb.AddEntry(request_id=b * 8 + i, ledger_id=ledger, entry_id=b * 8 + i,
                                                    master_key=KEY, body=body(ledger, b * 8 + i, 64 * 1024))
                                        for i in range(8)]) for b in range(30)]
        return [r async for res in stub.Add(iter(batches)) for r in res.results]


async def _check_refusals(address: str, ledger: int, results: list, cap: str) -> None:
    """Some adds were refused with TOO_MANY_REQUESTS naming the cap; every accepted one reads back."""
    assert len(results) == 240
    refused = [r for r in results if r.status != pb.OK]
    assert refused, "no add was refused"
    assert {r.status for r in refused} == {pb.TOO_MANY_REQUESTS}
    assert "in flight" in refused[0].message and cap in refused[0].message, refused[0].message
    async with await BookieClient.connect(address, wait=30) as client:
        for eid in (r.request_id for r in results if r.status == pb.OK):
            assert await client.read(ledger, eid) == body(ledger, eid, 64 * 1024)


async def test_adds_beyond_the_bytes_in_flight_cap_of_a_connection_get_too_many_requests(bookies):
    """Batches pushed on one stream faster than the journal takes them: those beyond the
    per-connection cap are refused with TOO_MANY_REQUESTS naming the cap, every accepted one is
    durable and reads back."""
    bk, = bookies(1, metadata_uri=None, journal_group_wait=0.3, max_add_bytes_in_flight="64MiB",
                  max_add_bytes_in_flight_per_connection="2MiB")
    await _check_refusals(bk.address, 3, await _push_adds(bk.address, 3), "max_add_bytes_in_flight_per_connection")


async def test_adds_beyond_the_bytes_in_flight_cap_of_the_bookie_get_too_many_requests(bookies):
    """Three streams each within their own cap push together past the bookie's cap: the adds
    beyond it are refused with TOO_MANY_REQUESTS naming that cap, every accepted one reads back."""
    bk, = bookies(1, metadata_uri=None, journal_group_wait=0.3, max_add_bytes_in_flight="2MiB",
                  max_add_bytes_in_flight_per_connection="64MiB")
    outcomes = await asyncio.gather(*(_push_adds(bk.address, lg) for lg in (8, 9, 10)))
    refused = [r for results in outcomes for r in results if r.status != pb.OK]
    assert refused and all("on this bookie" in r.message for r in refused)
    for lg, results in zip((8, 9, 10), outcomes):
        if any(r.status != pb.OK for r in results):
            await _check_refusals(bk.address, lg, results, "max_add_bytes_in_flight)")


# ---- slow readers -----------------------------------------------------------------------------

async def test_read_streams_that_stop_reading_are_paused_then_cancelled(bookies):
    """200 read streams over a 24 MiB ledger each take one answer and stop reading: the bookie's
    memory stays bounded, stuck streams are cancelled, and a fresh reader is served at once. Each
    stream has a connection of its own: on a shared one, the answers its siblings leave unread
    hold back even a stream's first answer (the connection's answer budget)."""
    bk, = bookies(1, metadata_uri=None, read_stream_timeout=3, max_read_buffer_bytes="16MiB")
    size = 256 * 1024
    async with await BookieClient.connect(bk.address, wait=30) as client:
        await asyncio.gather(*(client.add(4, e, body(4, e, size), master_key=KEY) for e in range(96)))
    before = rss(bk.pid)
    # without BDP probing the client's window stays small: it really stops taking data
    channels = [grpc.aio.insecure_channel(bk.address, options=UNLIMITED + [("grpc.http2.bdp_probe", 0),
                                                                        ("grpc.use_local_subchannel_pool", 1)])
                for _ in range(200)]
    try:
        calls = [rpc.BookieStub(channel).Read(pb.ReadRequest(ledger_id=4, first_entry=0, last_entry=95))
                 for channel in channels]
        firsts = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), 60)
        assert {f.status for f in firsts} <= {pb.OK, pb.TOO_MANY_REQUESTS}
        assert sum(f.status == pb.OK for f in firsts) >= 16
        await eventually(lambda: "cancelling its stream" in bk.log_tail(50), 30, what="stuck streams cancelled")
        grown = rss(bk.pid) - before
        assert grown < 150 * MiB, f"RSS grew by {grown / MiB:.0f} MiB for 200 stalled readers"
        async with await BookieClient.connect(bk.address, wait=30) as client:
            assert [e async for e, _ in client.read_range(4, 0, 95)] == list(range(96))
    finally:
        for ch in channels:
            await ch.close()


async def test_a_read_stream_whose_client_takes_nothing_is_cancelled_after_the_timeout(bookies):
    """One reader stops after its first answer while the read buffer has room: the bookie
    cancels its stream after read_stream_timeout, saying why."""
    bk, = bookies(1, metadata_uri=None, read_stream_timeout=1)
    async with await BookieClient.connect(bk.address, wait=30) as client:
        await asyncio.gather(*(client.add(7, e, body(7, e, 256 * 1024), master_key=KEY) for e in range(40)))
    async with grpc.aio.insecure_channel(bk.address, options=UNLIMITED + [("grpc.http2.bdp_probe", 0)]) as ch:
        call = rpc.BookieStub(ch).Read(pb.ReadRequest(ledger_id=7, first_entry=0, last_entry=39))
        assert (await call.read()).status == pb.OK
        await eventually(lambda: "took no answer for 1s (read_stream_timeout): cancelling its stream" in bk.log_tail(20),
                         30, what="the stalled stream cancelled")


# ---- no records for ledgers never stored ------------------------------------------------------

async def test_calls_on_unknown_ledgers_create_no_ledger_record(bookies):
    """WriteLac, reads, ReadLac, long-poll and ListEntries on ledgers the bookie never stored
    answer NO_LEDGER and leave no record behind, also after a restart; a fence still records
    the ledger (recovery needs it)."""
    bk, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(bk.address, wait=30) as client:
        for lid in range(100, 400):
            with pytest.raises(BookieError) as err:
                await client.write_lac(lid, 5, KEY)
            assert err.value.code is Status.NO_LEDGER, err.value
            assert f"ledger {lid}" in err.value.message
        with pytest.raises(BookieError):
            await client.read(500, 0)
        with pytest.raises(BookieError):
            await client.read_lac(501)
        with pytest.raises(BookieError):
            await client.wait_lac(502, -1, 0.1)
        assert await client.list_entries(503) == []
        assert await client.list_ledgers() == []
        assert await client.fence(600, KEY) == -1
        assert await client.list_ledgers() == [600]
    await asyncio.to_thread(bk.restart)
    async with await BookieClient.connect(bk.address, wait=30) as client:
        assert await client.list_ledgers() == [600]


# ---- LAC validation ---------------------------------------------------------------------------

async def test_an_add_whose_lac_is_not_below_its_entry_id_is_refused(bookies):
    """A body header LAC >= the entry id (2^63-1, or the entry itself) is BAD_REQUEST naming the
    LAC; the bookie's LAC is not moved by it."""
    bk, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(bk.address, wait=30) as client:
        await client.add(5, 0, body(5, 0), master_key=KEY)
        for lac in (2 ** 63 - 1, 1):
            with pytest.raises(BookieError) as err:
                await client.add(5, 1, body(5, 1, lac=lac), master_key=KEY)
            assert err.value.code is Status.BAD_REQUEST
            assert f"LAC {lac}" in err.value.message, err.value.message
        assert await client.read_lac(5) == -1
        await client.add(5, 1, body(5, 1), master_key=KEY)
        assert await client.read_lac(5) == 0


async def test_an_explicit_lac_beyond_the_entries_held_is_refused(bookies):
    """WriteLac may not claim more than the bookie holds: a LAC past its last entry is
    BAD_REQUEST naming both, and the LAC stays."""
    bk, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(bk.address, wait=30) as client:
        for e in range(3):
            await client.add(6, e, body(6, e), master_key=KEY)
        await client.write_lac(6, 2, KEY)
        with pytest.raises(BookieError) as err:
            await client.write_lac(6, 2 ** 63 - 1, KEY)
        assert err.value.code is Status.BAD_REQUEST
        assert "last entry 2" in err.value.message, err.value.message
        assert await client.read_lac(6) == 2


# ---- admin ledger list and the lease ----------------------------------------------------------

async def _many_ledgers(client: BookieClient, count: int) -> None:
    """One entry in each of `count` ledgers, by keyless recovery adds (open mode: every caller is
    an admin), so that no ledger needs metadata."""
    futures = [client.add_nowait(lid, 0, body(lid, 0, 8), b"", recovery=True) for lid in range(1, count + 1)]
    await asyncio.gather(*futures)


async def test_the_ledger_list_is_paged(bookies):
    """GET /api/v1/ledger/list answers a default-sized page and a token for the next one; the
    pages together list every ledger once, with entries on request; a bad limit is 400."""
    bk, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(bk.address, wait=30) as client:
        await _many_ledgers(client, 2500)
    page = await asyncio.to_thread(bk.http_json, "/api/v1/ledger/list")
    assert len(page["ledgers"]) == 1000 and page["next"] == page["ledgers"][-1]["ledger_id"] + 1
    seen, start = [], 0
    while start is not None:
        page = await asyncio.to_thread(bk.http_json, f"/api/v1/ledger/list?entries=true&limit=700&start={start}")
        seen += page["ledgers"]
        start = page["next"]
    assert [item["ledger_id"] for item in seen] == list(range(1, 2501))
    assert all(item["entries"] == [[0, 0]] for item in seen)
    status, text = await asyncio.to_thread(bk.http_get, "/api/v1/ledger/list?limit=-3")
    assert status == 400 and b"limit" in text


async def test_the_registration_outlives_a_busy_event_loop(bookies, metadata_uri):
    """With a 2 s lease, full ledger listings over 300,000 ledgers (seconds of work) do not cost
    the bookie its registration: its registry key never goes away, and the event loop lag is a
    metric.

    Slow: it writes 300,000 ledger records and lists them twice, so the bookie's loop is busy for seconds.
    """
    from pybk.meta import MetadataStore
    bk, = bookies(1, registration_ttl=2)
    async with await BookieClient.connect(bk.address, wait=30) as client:
        await _many_ledgers(client, 300_000)
    store = await MetadataStore.connect(metadata_uri)
    try:
        async def registered() -> bool:
            return bk.bookie_id in await store.registry.all()

        assert await registered()
        gone = []

        async def watch(stop: asyncio.Event) -> None:
            while not stop.is_set():
                if not await registered():
                    gone.append(time.monotonic())
                await asyncio.sleep(0.1)

        stop = asyncio.Event()
        watcher = asyncio.ensure_future(watch(stop))
        listed = 0
        for _ in range(2):
            start = 0
            while start is not None:
                page = await asyncio.to_thread(bk.http_json, f"/api/v1/ledger/list?entries=true&limit=100000"
                                               f"&start={start}", timeout=120)
                listed += len(page.get("ledgers", ()))
                start = page.get("next")
        stop.set()
        await watcher
        assert listed == 600_000
        assert not gone, "the registration went away while the bookie was busy"
        metrics = (await asyncio.to_thread(bk.http_get, "/metrics"))[1].decode()
        assert "pybk_event_loop_lag_seconds_count" in metrics
    finally:
        await store.close()
