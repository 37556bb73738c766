"""Range reads and LAC follows speak HTTP/2 without grpc.aio (BookieClient over
pybk.transport.ngh2_client.ServerStream): against real `pybk bookie` processes (a call on a
connection of its own, closed once the read is done or abandoned; a bookie dying mid-range), and
against raw servers for what a bookie could answer wrongly."""
from __future__ import annotations

import asyncio
import random
import re
import socket
import struct

import pytest

import h2frames
from polling import eventually
from raw_h2_server import ANSWER_HEADERS, RawServer, data_frames, goaway_frame, headers_frame, scripted, settings_frame

from pybk import entry
from pybk.client.bookie_client import (MAX_RECEIVE_BYTES, BookieAccessDeniedError, BookieClient, BookieError,
                                       BookieUnavailableError, Status)

KEY = entry.master_key(b"secret")
LEDGER = 7


def body(eid: int, size: int) -> bytes:
    return entry.encode(LEDGER, eid, eid - 1, random.Random(eid).randbytes(size))


async def connections(b) -> int:
    """The bookie's gRPC connections open now (its metric)."""
    metrics = (await asyncio.to_thread(b.http_get, "/metrics"))[1].decode()
    return int(float(re.search(r"^pybk_bookie_connections (\S+)$", metrics, re.M).group(1)))


async def _connections_are(b, n: int) -> None:
    async def check() -> bool:
        return await connections(b) == n
    await eventually(check, timeout=20, interval=0.05, what=f"{n} connections open on the bookie")


async def _stored(c: BookieClient, n: int, size: int) -> list[bytes]:
    bodies = [body(e, size) for e in range(n)]
    await asyncio.gather(*(c.add(LEDGER, e, bodies[e], master_key=KEY) for e in range(n)))
    return bodies


async def test_a_range_read_comes_whole_on_a_connection_of_its_own_closed_after_it(bookies):
    b, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(b.address) as c:
        bodies = await _stored(c, 12, 1_000_000)
        before = await connections(b)                    # the Add stream's
        stream = c.read_packed(LEDGER, 0, 11)
        first, got, sizes = await anext(stream)
        await _connections_are(b, before + 1)
        pos, eid, out = 0, first, []
        while True:
            for size in sizes.tolist():
                out.append((eid, bytes(got[pos:pos + size])))
                pos, eid = pos + size, eid + 1
            try:
                first, got, sizes = await anext(stream)
            except StopAsyncIteration:
                break
            pos = 0
        assert out == list(enumerate(bodies))
        await _connections_are(b, before)
        assert await c.read(LEDGER, 5) == bodies[5]        # a single entry: on the channel
        with pytest.raises(BookieError) as err:
            [x async for x in c.read_range(LEDGER, 10, 12)]
        assert err.value.code is Status.NO_ENTRY


async def test_a_bookie_killed_mid_range_fails_the_read_after_the_entries_it_sent(bookies):
    """The reader holds the bookie to the window while it does not take answers, so most of the
    range is still unsent when the bookie dies: what came is whole, then BookieUnavailableError."""
    b, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(b.address) as c:
        bodies = await _stored(c, 40, 1_000_000)
        stream = c.read_packed(LEDGER, 0, 39)
        answers = [await anext(stream)]
        b.kill()
        with pytest.raises(BookieUnavailableError):
            async for answer in stream:
                answers.append(answer)
    eid = 0
    for first, got, sizes in answers:
        assert first == eid
        pos = 0
        for size in sizes.tolist():
            assert bytes(got[pos:pos + size]) == bodies[eid]
            pos, eid = pos + size, eid + 1
    assert 0 < eid < 40


async def test_a_follow_the_caller_abandons_closes_its_connection(bookies):
    """Closing the follow (aclose) or cancelling the task waiting on it ends its call and its
    connection: nothing is left open on the bookie."""
    b, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(b.address) as c:
        bodies = await _stored(c, 5, 100)
        before = await connections(b)
        stream = c.follow_lac(LEDGER, -1, timeout=60)
        lac, first, got, sizes = await anext(stream)
        assert (lac, first, got) == (3, 0, b"".join(bodies[:4]))
        await _connections_are(b, before + 1)
        await stream.aclose()
        await _connections_are(b, before)

        async def follow() -> None:
            async for _ in c.follow_lac(LEDGER, lac, timeout=60):
                pass
        task = asyncio.ensure_future(follow())
        await _connections_are(b, before + 1)
        task.cancel()
        await _connections_are(b, before)
        assert task.cancelled()


def _prefix(n: int) -> bytes:
    return struct.pack(">BI", 0, n)


@pytest.mark.parametrize("answer, error, words", [
    (settings_frame() + h2frames.frame(h2frames.RST_STREAM, 0, 1, struct.pack(">I", 2)),
     BookieUnavailableError, ["INTERNAL", "reset the stream (HTTP/2 error 2)"]),
    (settings_frame() + headers_frame(ANSWER_HEADERS) + data_frames(_prefix(MAX_RECEIVE_BYTES + 1)),
     BookieUnavailableError, ["RESOURCE_EXHAUSTED", f"larger than max ({MAX_RECEIVE_BYTES + 1} vs."]),
    (settings_frame() + goaway_frame(0, 0xB, b"calm down"), BookieUnavailableError, ["UNAVAILABLE", "calm down"]),
    (settings_frame() + headers_frame(ANSWER_HEADERS + [("grpc-status", "16"), ("grpc-message", "who are you")],
                                      h2frames.END_STREAM),
     BookieAccessDeniedError, ["UNAUTHENTICATED", "who are you"]),
    (settings_frame() + headers_frame(ANSWER_HEADERS) + data_frames(b"\x00\x00\x00\x00\x03\xff\xff\xff"),
     BookieUnavailableError, ["not a ReadResults"]),
], ids=["reset", "oversize", "goaway", "unauthenticated", "garbage"])
async def test_what_a_bookie_does_to_a_range_read_fails_it_naming_it(answer, error, words):
    raw = RawServer(scripted(answer))
    address = await raw.start()
    try:
        async with BookieClient(address) as c:
            with pytest.raises(error) as err:
                [x async for x in c.read_packed(LEDGER, 0, 9)]
            assert all(w in str(err.value) for w in words), str(err.value)
            with pytest.raises(error):
                [x async for x in c.follow_lac(LEDGER, -1, timeout=5)]
        await asyncio.wait_for(raw.over.wait(), 10)   # no connection left open
    finally:
        raw.server.close()


async def test_a_range_read_from_an_unreachable_bookie_fails_unavailable():
    """(after asking on the channel too: a new connection that fails before the server speaks
    HTTP/2 may be a bookie at its connection limit)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"   # closed again: nothing listens there
    async with BookieClient(address) as c:
        with pytest.raises(BookieUnavailableError) as err:
            [x async for x in c.read_packed(LEDGER, 0, 9)]
    assert err.value.code is Status.IO_ERROR and "UNAVAILABLE" in str(err.value)
