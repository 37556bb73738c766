"""The client's Add stream speaks HTTP/2 itself (pybk.proto.http2): shown against real `pybk
bookie` processes, whose grpc.aio servers must see an ordinary gRPC call."""
from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import struct
import time

import pytest

from pybk import entry
from pybk.bookie.client import BookieClient, BookieUnavailableError, Status
from pybk.proto.http2 import split_address

KEY = entry.master_key(b"secret")
LEDGER = 7


def body(eid: int, lac: int, size: int) -> bytes:
    return entry.encode(LEDGER, eid, lac, random.Random(eid).randbytes(size))


async def stored(address: str, last: int) -> list[bytes]:
    async with await BookieClient.connect(address) as c:
        return [b async for _, b in c.read_range(LEDGER, 0, last)]


class FlowChecker:
    """A TCP relay between a client and a bookie that reads the HTTP/2 frames going by and notes
    every DATA frame the client sends beyond the bookie's frame size or flow-control windows
    (RFC 9113 section 6.9). A bookie refuses them too, but only the relay can say which frame."""

    def __init__(self, target: str):
        self.target = target
        self.violations: list[str] = []
        self._conn = self._stream = 65_535
        self._initial, self._max_frame = 65_535, 16_384
        self._unacked: list[bytes] = []  # the bookie's SETTINGS the client has not acknowledged yet

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _relay(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*split_address(self.target))
        await asyncio.gather(self._pipe(reader, up_writer, self._from_client, skip=24),
                             self._pipe(up_reader, writer, self._from_bookie, skip=0), return_exceptions=True)
        writer.close()
        up_writer.close()

    async def _pipe(self, reader, writer, seen, skip: int) -> None:
        with contextlib.suppress(ConnectionError):
            buf = bytearray()
            while data := await reader.read(1 << 16):
                buf += data
                while skip and buf:
                    cut = min(skip, len(buf))
                    del buf[:cut]
                    skip -= cut
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + n:
                        break
                    seen(buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, bytes(buf[9:9 + n]))
                    del buf[:9 + n]
                writer.write(data)
                await writer.drain()
        writer.close()

    def _from_client(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == 4 and flags & 1 and self._unacked:  # a SETTINGS ACK: the client may use them now
            self._apply(self._unacked.pop(0))
        if ftype != 0:
            return
        n = len(payload)
        if n > self._max_frame:
            self.violations.append(f"a DATA frame of {n} bytes, frame size {self._max_frame}")
        if n > self._conn or n > self._stream:
            self.violations.append(f"a DATA frame of {n} bytes, windows {self._conn} and {self._stream}")
        self._conn -= n
        self._stream -= n

    def _from_bookie(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == 4 and not flags & 1:  # SETTINGS: in force once the client acknowledges them
            self._unacked.append(payload)
        elif ftype == 8:  # WINDOW_UPDATE
            credit = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if stream == 0:
                self._conn += credit
            else:
                self._stream += credit

    def _apply(self, settings: bytes) -> None:
        for k in range(0, len(settings), 6):
            key, value = struct.unpack_from(">HI", settings, k)
            if key == 4:
                self._stream += value - self._initial
                self._initial = value
            elif key == 5:
                self._max_frame = value


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
    the keepalive (10 s of silence, then 5 s for the PING's answer), instead of holding them
    forever; what it acked before is still there once it runs again.

    Slow: waits out the client's keepalive, 10 s of silence and 5 s for the PING's answer, as a real stall would.
    """
    b, = bookies(1, metadata_uri=None)
    first = body(0, -1, 1000)
    async with await BookieClient.connect(b.address) as c:
        await c.add(LEDGER, 0, first, master_key=KEY)
        b.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(BookieUnavailableError) as err:
                await asyncio.wait_for(c.add(LEDGER, 1, body(1, 0, 1000), master_key=KEY), 60)
            waited = time.monotonic() - started
        finally:
            b.signal(signal.SIGCONT)
    assert "keepalive" in str(err.value) and waited >= 10
    assert (await stored(b.address, 0))[0] == first

