"""One unauthenticated client cannot knock over pybk's gRPC server (pybk.transport.grpc_server on
ngh2_server's libnghttp2 connections): half-sent large messages stall on flow control within a byte
budget, unread answers stop the calls that make them, SETTINGS floods do not block the event loop,
and rapid resets and empty CONTINUATION floods end the connection with GOAWAY ENHANCE_YOUR_CALM.
The attackers are real clients on loopback sockets: the `h2` library (which keeps to flow control,
as a careful attacker does) and raw frames (tests/h2frames.py). Every loop is bounded in count
and time."""
from __future__ import annotations

import asyncio
import resource
import socket
import struct

import grpc
import h2.config
import h2.connection
import h2.events
import hpack
import pytest

import h2frames
from polling import eventually
from procfs import favoured

from pybk.transport import ngh2_server
from pybk.transport.grpc_server import Kind, Method, Server
from pybk.transport.ngh2_client import split_address

MAX_MESSAGE = 9 * 1024 * 1024
ANSWER = 1024 * 1024
ENHANCE_YOUR_CALM = 0xB


def _same(b):
    return b


async def _echo(requests, context):
    async for r in requests:
        await context.write(r)


@pytest.fixture
async def served():
    """A server on a loopback port: (address, the Server, the handlers' record)."""
    seen = {"started": 0, "written": 0}

    async def echo(requests, context):
        seen["started"] += 1
        async for r in requests:
            await context.write(r)

    async def flood(request, context):
        seen["started"] += 1
        while True:
            await context.write(b"f" * ANSWER)
            seen["written"] += 1

    methods = [Method("/t.T/Echo", Kind.BIDI, _same, _same, echo),
               Method("/t.T/Flood", Kind.SERVER_STREAM, _same, _same, flood)]
    sock = socket.create_server(("127.0.0.1", 0))
    server = Server(methods, sock, MAX_MESSAGE)
    await server.start()
    yield f"127.0.0.1:{sock.getsockname()[1]}", server, seen
    await server.stop(None)


def _connection(server: Server):
    """The one client connection the server holds."""
    conns = [link.conn for link in server._links if link.conn is not None]
    assert len(conns) == 1
    return conns[0]


def _headers(path: str) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
            ("content-type", "application/grpc"), ("te", "trailers")]


class Raw:
    """Frames written by hand; `frames()` reads what the server sends until it closes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()

    @classmethod
    async def connect(cls, address: str) -> "Raw":
        raw = cls(*await asyncio.open_connection(*split_address(address)))
        raw.writer.write(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0))
        return raw

    def request(self, stream: int, path: str = "/t.T/Echo") -> bytes:
        return h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, stream, self.encoder.encode(_headers(path)))

    async def goaway(self, timeout: float = 20) -> tuple[int, str]:
        """The code and text of the server's GOAWAY, acknowledging its SETTINGS on the way."""
        async def read() -> tuple[int, str]:
            while True:
                head = await self.reader.readexactly(9)
                hi, lo, ftype, flags, _ = struct.unpack(">BHBBI", head)
                payload = await self.reader.readexactly((hi << 16) | lo)
                if ftype == h2frames.SETTINGS and not flags & h2frames.ACK:
                    self.writer.write(h2frames.frame(h2frames.SETTINGS, h2frames.ACK, 0))
                elif ftype == h2frames.GOAWAY:
                    _, code = struct.unpack_from(">II", payload)
                    return code, payload[8:].decode(errors="replace")
        return await asyncio.wait_for(read(), timeout)

    def close(self) -> None:
        self.writer.close()


class LoopWatch:
    """The longest gap between ticks of a 5 ms timer on the loop: how long the loop was blocked."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.005)
            now = loop.time()
            self.longest = max(self.longest, now - last - 0.005)
            last = now

    def stop(self) -> float:
        self._task.cancel()
        return self.longest


def _rss() -> int:
    """This process's resident set size in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class Stalled:
    """A client (the `h2` library, keeping to flow control as a careful attacker does) that opens
    `streams` calls, announces on each a message just under the limit and sends all of it but its
    last KiB, for as long as the server gives it credit. `sent`: what the server let in."""

    def __init__(self, client, reader, writer, streams: list[int], left: dict[int, int], sent: int, goaway):
        self.client, self.reader, self.writer = client, reader, writer
        self.streams, self.left, self.sent, self.goaway = streams, left, sent, goaway

    @classmethod
    async def run(cls, address: str, streams: int = 300, timeout: float = 60) -> "Stalled":
        reader, writer = await asyncio.open_connection(*split_address(address))
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        ids = [client.get_next_available_stream_id()]
        for _ in range(streams - 1):
            ids.append(ids[-1] + 2)
        for s in ids:
            client.send_headers(s, _headers("/t.T/Echo"))
        writer.write(client.data_to_send())
        body = MAX_MESSAGE - 1024
        left = {s: body for s in ids}
        for s in ids:
            client.send_data(s, b"\x00" + struct.pack(">I", MAX_MESSAGE - 8))
        loop = asyncio.get_running_loop()
        deadline, idle_since, sent, goaway = loop.time() + timeout, None, 0, None
        chunk = b"m" * 16_384
        while loop.time() < deadline and goaway is None:
            progressed = False
            for s in ids:
                room = min(client.local_flow_control_window(s), left[s], len(chunk))
                if room > 0:
                    client.send_data(s, chunk[:room])
                    left[s] -= room
                    sent += room
                    progressed = True
            writer.write(client.data_to_send())
            try:
                await writer.drain()
                data = await asyncio.wait_for(reader.read(1 << 20), 0.2)
            except asyncio.TimeoutError:
                data = b""
            except ConnectionError:
                break
            if data:
                for event in client.receive_data(data):
                    if isinstance(event, h2.events.ConnectionTerminated):
                        goaway = event.error_code
                writer.write(client.data_to_send())
            if progressed or data:
                idle_since = None
            else:
                idle_since = idle_since or loop.time()
                if loop.time() - idle_since > 1.5:
                    break
        else:
            if goaway is None:
                pytest.fail(f"the client could still send after {sent} bytes")
        return cls(client, reader, writer, ids, left, sent, goaway)

    @property
    def held_back(self) -> bool:
        """Every stream that has more to send is out of window, or the connection is."""
        return self.client.outbound_flow_control_window == 0 or all(
            self.left[s] == 0 or self.client.local_flow_control_window(s) == 0 for s in self.streams)


async def test_300_streams_each_holding_most_of_a_large_message_stall_within_the_byte_budget(served):
    """Before: each stream's credit came back as its frames were parsed, so 300 streams holding
    9 MiB each grew the server by 2.7 GB. Now the connection stops crediting once it holds its
    budget: the client, keeping to flow control, cannot send more."""
    address, server, _ = served
    rss_before = _rss()
    stalled = await Stalled.run(address)
    conn = _connection(server)
    bound = ngh2_server.INBOUND_BUDGET + ngh2_server.CONNECTION_WINDOW
    assert stalled.held_back
    assert stalled.sent <= bound + 300 * 16_384
    assert conn.held <= bound
    assert _rss() - rss_before < 200 * 1024 * 1024   # was 2.7 GB
    stalled.writer.close()


async def test_a_connection_whose_calls_carry_no_known_credential_gets_a_small_budget():
    """A server that knows none of the calls' credentials (a secured bookie, a client with none):
    the connection keeps HTTP/2's default window and the untrusted budget, so 300 half-sent 9 MiB
    messages make it hold at most about 128 KiB; a call with a known credential opens it."""
    sock = socket.create_server(("127.0.0.1", 0))
    known: list[bool] = [False]
    server = Server([Method("/t.T/Echo", Kind.BIDI, _same, _same, _echo)], sock, MAX_MESSAGE,
                    identify=lambda context: known[0])
    await server.start()
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    try:
        stalled = await Stalled.run(address, timeout=30)
        conn = _connection(server)
        bound = ngh2_server.UNTRUSTED_BUDGET + 65_535
        assert stalled.held_back and stalled.sent <= bound + 16_384
        assert conn.held <= bound and not conn.trusted
        stalled.writer.close()
        known[0] = True
        async with grpc.aio.insecure_channel(address) as channel:
            big = b"k" * (2 * 1024 * 1024)
            call = channel.stream_stream("/t.T/Echo")()
            await call.write(big)
            await call.done_writing()
            assert [a async for a in call] == [big]
    finally:
        await server.stop(None)


async def test_connections_past_the_process_budget_end_those_holding_most_and_spare_the_others():
    """Each connection within its own budget, three attackers together past the process's: credit
    ahead of consumption stops at half the budget, and past all of it the connection holding the
    most is ended ENHANCE_YOUR_CALM, until what is left fits. A client making small calls
    meanwhile holds little, so it is never the one ended: every one of its calls is answered."""
    limit = 20 * 1024 * 1024
    sock = socket.create_server(("127.0.0.1", 0))
    server = Server([Method("/t.T/Echo", Kind.BIDI, _same, _same, _echo)], sock, MAX_MESSAGE,
                    budget_bytes=limit)
    await server.start()
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    answered: list[bytes] = []

    async def legitimate(stop: asyncio.Event) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            i = 0
            while not stop.is_set() and i < 2000:
                call = channel.stream_stream("/t.T/Echo")()
                await call.write(b"%d" % i)
                await call.done_writing()
                answered.extend([a async for a in call])
                assert await call.code() == grpc.StatusCode.OK
                i += 1
                await asyncio.sleep(0.01)

    try:
        stop = asyncio.Event()
        writer = asyncio.ensure_future(legitimate(stop))
        runs = await asyncio.gather(*(Stalled.run(address, streams=50, timeout=30) for _ in range(3)))
        stop.set()
        await asyncio.wait_for(writer, 30)
        ended = [r for r in runs if r.goaway is not None]
        assert ended and {r.goaway for r in ended} == {ENHANCE_YOUR_CALM}
        assert all(r.held_back for r in runs if r.goaway is None)
        assert answered == [b"%d" % i for i in range(len(answered))] and len(answered) > 10
        assert server._budget.used <= limit
        for r in runs:
            r.writer.close()
    finally:
        await server.stop(None)


async def test_streams_whose_answers_are_never_read_stop_at_the_answer_budget(served):
    """A client that gives the server no window (INITIAL_WINDOW_SIZE 0) and calls a method that
    answers 1 MiB at a time: the answers wait in the server up to the answer budget; calls past it
    wait to write their first answer."""
    address, server, seen = served
    raw = await Raw.connect(address)
    raw.writer.write(h2frames.frame(h2frames.SETTINGS, 0, 0,
                                    h2frames.SETTING.pack(h2frames.SETTINGS_INITIAL_WINDOW_SIZE, 0)))
    request = b"\x00" + struct.pack(">I", 2) + b"go"
    for i in range(200):
        stream = 1 + 2 * i
        raw.writer.write(raw.request(stream, "/t.T/Flood")
                         + h2frames.frame(h2frames.DATA, h2frames.END_STREAM, stream, request))
    await eventually(lambda: server.connections and _connection(server).buffered > ngh2_server.ANSWER_BUDGET,
                     timeout=20, interval=0.05, what="the answers to back up")
    await asyncio.sleep(0.5)  # what more the server would take, it takes now
    conn = _connection(server)
    assert conn.buffered <= ngh2_server.ANSWER_BUDGET + 2 * ANSWER
    assert seen["written"] <= (ngh2_server.ANSWER_BUDGET + 2 * ANSWER) // ANSWER
    raw.close()


async def test_settings_flooding_while_many_streams_are_open_does_not_block_the_loop(served):
    """Before: a SETTINGS frame with thousands of INITIAL_WINDOW_SIZE entries cost a Python loop
    over every open stream per entry, 28 s with 1,000 streams. Now libnghttp2 refuses more than 32
    entries, applies a frame's repeated entries once, and the PING/SETTINGS rate ends the flood."""
    address, server, seen = served
    async with favoured():  # the loop's stalls in wall time: this test's own work, not its neighbours'
        raw = await Raw.connect(address)
        raw.writer.write(b"".join(raw.request(1 + 2 * i) for i in range(1000)))
        await eventually(lambda: seen["started"] == 1000, timeout=20, interval=0.05, what="1000 calls open")
        watch = LoopWatch()
        many_small = b"".join(h2frames.frame(h2frames.SETTINGS, 0, 0, h2frames.SETTING.pack(4, 65_535 + (i & 1)))
                              for i in range(20_000))
        raw.writer.write(many_small)
        code, why = await raw.goaway()
        longest = watch.stop()
        assert code == ENHANCE_YOUR_CALM, why
        assert longest < 0.25, f"many SETTINGS frames blocked the loop {longest * 1e3:.0f} ms"  # before: 28 s
        raw.close()
        # and one frame with thousands of entries, on a connection of its own
        raw = await Raw.connect(address)
        raw.writer.write(b"".join(raw.request(1 + 2 * i) for i in range(1000)))
        await eventually(lambda: seen["started"] == 2000, timeout=20, interval=0.05, what="1000 more calls open")
        watch = LoopWatch()
        raw.writer.write(h2frames.frame(h2frames.SETTINGS, 0, 0, h2frames.SETTING.pack(4, 70_000) * 2_000))
        code, why = await raw.goaway()
        longest = watch.stop()
        assert code == ENHANCE_YOUR_CALM and "too many setting entries" in why
        assert longest < 0.1, f"a SETTINGS frame of 2,000 entries blocked the loop {longest * 1e3:.0f} ms"
        raw.close()


async def test_rapid_reset_ends_the_connection_with_enhance_your_calm(served):
    address, server, _ = served
    raw = await Raw.connect(address)
    pairs = 0
    goaway = asyncio.get_running_loop().create_task(raw.goaway())
    for batch in range(50):   # at most 5,000 streams opened and reset
        if goaway.done():
            break
        frames = []
        for i in range(100):
            stream = 1 + 2 * (batch * 100 + i)
            frames += [raw.request(stream), h2frames.frame(h2frames.RST_STREAM, 0, stream, struct.pack(">I", 0x8))]
        raw.writer.write(b"".join(frames))
        pairs += 100
        await raw.writer.drain()
        await asyncio.sleep(0.01)
    code, why = await asyncio.wait_for(goaway, 20)
    assert code == ENHANCE_YOUR_CALM and "reset" in why
    assert pairs <= ngh2_server.RESET_BURST + 1_000   # before: 144,000 with no GOAWAY
    raw.close()


async def test_an_empty_continuation_flood_ends_the_connection_with_enhance_your_calm(served):
    address, _, _ = served
    raw = await Raw.connect(address)
    raw.writer.write(h2frames.frame(h2frames.HEADERS, 0, 1, raw.encoder.encode(_headers("/t.T/Echo")))
                     + h2frames.frame(h2frames.CONTINUATION, 0, 1, b"") * 1_000)
    code, why = await raw.goaway()
    assert code == ENHANCE_YOUR_CALM and "CONTINUATION" in why
    raw.close()
    async with grpc.aio.insecure_channel(address) as channel:  # the others are served on
        call = channel.stream_stream("/t.T/Echo")()
        await call.write(b"fine")
        await call.done_writing()
        assert [a async for a in call] == [b"fine"]


async def test_a_ping_flood_from_a_client_that_reads_its_acks_ends_with_enhance_your_calm(served):
    """libnghttp2 bounds only the acknowledgements left unread; a client that reads them is held
    to the PING and SETTINGS rate."""
    address, _, _ = served
    raw = await Raw.connect(address)
    goaway = asyncio.get_running_loop().create_task(raw.goaway())
    sent = 0
    for batch in range(100):   # at most 10,000 PINGs
        if goaway.done():
            break
        raw.writer.write(h2frames.frame(h2frames.PING, 0, 0, batch.to_bytes(8, "big")) * 100)
        sent += 100
        await raw.writer.drain()
        await asyncio.sleep(0.005)
    code, why = await asyncio.wait_for(goaway, 20)
    assert code == ENHANCE_YOUR_CALM and "PING" in why
    assert sent <= ngh2_server.CONTROL_BURST + 1_000
    raw.close()


async def test_a_client_that_never_sends_its_preface_is_dropped(served, monkeypatch):
    monkeypatch.setattr(ngh2_server, "HANDSHAKE_TIMEOUT", 0.3)
    address, _, _ = served
    reader, writer = await asyncio.open_connection(*split_address(address))
    raw = Raw(reader, writer)
    code, why = await raw.goaway(timeout=10)
    assert code == 0x1 and "preface" in why
    assert await asyncio.wait_for(reader.read(), 10) == b""  # then the connection closes
    writer.close()
