"""The client's Add stream speaks HTTP/2 without grpc.aio (pybk.transport.ngh2_client.ClientStream):
shown against real `pybk bookie` processes, which must see an ordinary gRPC call."""
from __future__ import annotations

import asyncio
import random
import signal
import time

import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieUnavailableError, Status

from flow_checker import FlowChecker

KEY = entry.master_key(b"secret")
LEDGER = 7


def body(eid: int, lac: int, size: int) -> bytes:
    return entry.encode(LEDGER, eid, lac, random.Random(eid).randbytes(size))


async def stored(address: str, last: int) -> list[bytes]:
    async with await BookieClient.connect(address) as c:
        return [b async for _, b in c.read_range(LEDGER, 0, last)]


async def test_batches_keep_to_the_bookies_frame_size_and_flow_control_windows(bookies):
    """Batches above the bookie's frame size and windows, alone and in bursts, go out in frames
    no bigger than it allows, within its windows and only under settings this side acknowledged
    (a server may raise them mid-stream, as gRPC's own does); every entry is stored byte for
    byte."""
    b, = bookies(1, metadata_uri=None, max_entry_size=4 * 1024 * 1024)
    checker = FlowChecker(b.address)
    relay = await checker.start()
    bodies = [body(0, -1, 1000)] + [body(e, e - 1, 3_500_000) for e in range(1, 9)] \
        + [body(e, e - 1, 1_000_000) for e in range(9, 89)]
    try:
        async with await BookieClient.connect(relay, max_batch_bytes=16 * 1024 * 1024,
                                              max_message_bytes=9 * 1024 * 1024) as c:
            await c.add(LEDGER, 0, bodies[0], master_key=KEY)  # the connection is up: the big ones go at once
            await asyncio.gather(*(c.add(LEDGER, e, bodies[e], master_key=KEY) for e in range(1, 9)))
            await asyncio.gather(*(c.add(LEDGER, e, bodies[e], master_key=KEY) for e in range(9, len(bodies))))
    finally:
        checker.server.close()
    assert checker.violations == []
    assert await stored(b.address, len(bodies) - 1) == bodies


async def test_a_stream_the_bookie_ends_with_an_error_fails_its_adds_naming_the_code(bookies):
    """A message above the bookie's max_message_size ends the stream RESOURCE_EXHAUSTED (in the
    trailers): the adds fail with that code, and the next add opens a new stream that works."""
    b, = bookies(1, metadata_uri=None, max_entry_size=1024 * 1024, max_message_size=3 * 1024 * 1024)
    async with await BookieClient.connect(b.address, max_message_bytes=8 * 1024 * 1024) as c:
        with pytest.raises(BookieUnavailableError) as err:
            await c.add(LEDGER, 0, body(0, -1, 3_500_000), master_key=KEY)
        assert err.value.code is Status.IO_ERROR and "RESOURCE_EXHAUSTED" in str(err.value)
        small = body(0, -1, 1000)
        await c.add(LEDGER, 0, small, master_key=KEY)
    assert await stored(b.address, 0) == [small]


async def test_an_add_to_a_stalled_bookie_fails_once_its_keepalive_ping_goes_unanswered(bookies):
    """A bookie that is connected but silent (SIGSTOP) fails the adds in flight UNAVAILABLE after
    the keepalive (here 2 s of silence, then 1 s for the PING's answer), instead of holding them
    forever; what it acked before is still there once it runs again."""
    b, = bookies(1, metadata_uri=None)
    first = body(0, -1, 1000)
    async with await BookieClient.connect(b.address, keepalive=(2.0, 1.0)) as c:
        await c.add(LEDGER, 0, first, master_key=KEY)
        b.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(BookieUnavailableError) as err:
                await asyncio.wait_for(c.add(LEDGER, 1, body(1, 0, 1000), master_key=KEY), 60)
            waited = time.monotonic() - started
        finally:
            b.signal(signal.SIGCONT)
    assert "keepalive" in str(err.value) and waited >= 2
    assert (await stored(b.address, 0))[0] == first

