"""The bookie's gRPC server connections on libnghttp2 (pybk.transport.ngh2_server) serve gRPC's
own clients and pybk's, keep to their flow-control windows, and answer every kind of bad client
with a status or a GOAWAY while they serve the others on. The clients are real: grpc.aio
channels, pybk's Add stream (ClientStream), and raw sockets writing the frames a broken or
hostile client would."""
from __future__ import annotations

import asyncio
import struct

import grpc
import hpack
import pytest

import h2frames
from polling import eventually

from pybk.transport.ngh2_client import ClientStream, split_address
from pybk.transport.ngh2_server import RECEIVE_WINDOW, Call, GrpcServerConnection

ECHO = "/test.Echo/Stream"
MAX_MESSAGE = 2 * 1024 * 1024


class Echo:
    """Answers every message with itself; ends OK when the client half-closes."""

    def __init__(self, call: Call, log: list):
        self.call, self.log = call, log

    def message(self, data: bytes) -> None:
        self.log.append(("message", len(data)))
        self.call.send(data)

    def end_of_input(self) -> None:
        self.log.append(("end", 0))
        self.call.finish()

    def closed(self) -> None:
        self.log.append(("closed", 0))


@pytest.fixture
async def server():
    """An echo server on a loopback port: (address, its connections, the handlers' event log)."""
    conns: list = []
    log: list = []

    def route(call: Call):
        if call.path != ECHO:
            return None
        call.trust_connection()  # as a server does for a call whose credential it knows
        call.send_headers([("x-served-by", "ngh2")])
        return Echo(call, log)

    def connection():
        conn = GrpcServerConnection(route, MAX_MESSAGE)
        conns.append(conn)
        return conn

    srv = await asyncio.get_running_loop().create_server(connection, "127.0.0.1", 0)
    yield f"127.0.0.1:{srv.sockets[0].getsockname()[1]}", conns, log
    srv.close()
    for conn in conns:
        conn.close()


def _stream(channel: grpc.aio.Channel):
    return channel.stream_stream(ECHO)


async def test_a_grpc_client_gets_every_answer_in_order_then_its_status(server):
    address, _, _ = server
    sizes = [0, 1, 100, 16_379, 16_380, 70_000, 1_000_000, 5, 300_000]  # across frame size and windows
    messages = [bytes([i]) * n for i, n in enumerate(sizes)]
    async with grpc.aio.insecure_channel(address) as channel:
        call = _stream(channel)()
        for m in messages:
            await call.write(m)
        await call.done_writing()
        answers = [a async for a in call]
        assert answers == messages
        assert await call.code() == grpc.StatusCode.OK
        assert ("x-served-by", "ngh2") in tuple(await call.initial_metadata())


async def test_pybk_s_add_stream_gets_every_answer_in_order(server):
    address, _, _ = server
    got: list[bytes] = []
    ended: asyncio.Future = asyncio.get_running_loop().create_future()
    stream = ClientStream.open(address, ECHO, on_message=got.append, on_headers=lambda _: None,
                               on_end=lambda code, details: ended.set_result((code, details)))
    messages = [bytes([i % 256]) * (i * 997) for i in range(60)]
    for m in messages:
        stream.write(m)
    await eventually(lambda: len(got) == len(messages), timeout=10, interval=0.01, what="all answers")
    assert got == messages
    stream.cancel()


async def test_a_message_above_the_limit_ends_its_call_resource_exhausted_and_others_go_on(server):
    address, _, _ = server
    async with grpc.aio.insecure_channel(address) as channel:
        call = _stream(channel)()
        await call.write(b"x" * 10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.write(b"y" * (MAX_MESSAGE + 1))
            await call.done_writing()
            async for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"larger than max ({MAX_MESSAGE + 1} vs. {MAX_MESSAGE} bytes)" in err.value.details()
        again = _stream(channel)()
        await again.write(b"still served")
        await again.done_writing()
        assert [a async for a in again] == [b"still served"]


async def test_an_unknown_method_is_answered_unimplemented(server):
    address, _, _ = server
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await channel.unary_unary("/test.Echo/Nope")(b"hi")
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "/test.Echo/Nope" in err.value.details()


async def test_a_call_the_client_cancels_reaches_its_handler_as_closed_once(server):
    address, _, log = server
    async with grpc.aio.insecure_channel(address) as channel:
        call = _stream(channel)()
        await call.write(b"one")
        assert await call.read() == b"one"
        call.cancel()
        await eventually(lambda: ("closed", 0) in log, timeout=10, interval=0.01, what="the handler closed")
    await asyncio.sleep(0)
    assert log.count(("closed", 0)) == 1 and ("end", 0) not in log


class RawClient:
    """A client writing HTTP/2 frames by hand, as a broken or hostile one would."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, address: str) -> "RawClient":
        return cls(*await asyncio.open_connection(*split_address(address)))

    def start(self, path: str = ECHO) -> None:
        headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                          (":authority", "x"), ("content-type", "application/grpc")])
        self.writer.write(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0)
                          + h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1, headers))

    def message(self, data: bytes) -> None:
        """One gRPC message in DATA frames of at most 16 KiB."""
        body = b"\x00" + struct.pack(">I", len(data)) + data
        for i in range(0, len(body), h2frames.DEFAULT_FRAME):
            self.writer.write(h2frames.frame(h2frames.DATA, 0, 1, body[i:i + h2frames.DEFAULT_FRAME]))

    async def frame(self) -> tuple[int, int, int, bytes]:
        """(type, flags, stream, payload) of the next frame; EOFError at the end of the connection."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(9), 10)
            hi, lo, ftype, flags, stream = struct.unpack(">BHBBI", head)
            return ftype, flags, stream, await self.reader.readexactly((hi << 16) | lo)
        except asyncio.IncompleteReadError:
            raise EOFError from None

    async def goaway(self) -> tuple[int, str]:
        """The HTTP/2 error code and text of the GOAWAY that ends the connection."""
        while True:
            ftype, _, _, payload = await self.frame()
            if ftype == h2frames.GOAWAY:
                _, code = struct.unpack_from(">II", payload)
                return code, payload[8:].decode()

    def close(self) -> None:
        self.writer.close()


async def test_a_client_not_speaking_http2_is_told_so_and_others_are_served(server):
    address, _, _ = server
    raw = await RawClient.connect(address)
    raw.writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    code, why = await raw.goaway()
    assert code == 0x1 and "preface" in why
    with pytest.raises(EOFError):
        await raw.frame()
    async with grpc.aio.insecure_channel(address) as channel:
        call = _stream(channel)()
        await call.write(b"fine")
        await call.done_writing()
        assert [a async for a in call] == [b"fine"]


async def test_every_ping_is_answered_however_often_and_the_connection_serves_on(server):
    """Clients ping every 10 s, also while idle; a server that counted pings against them (gRPC's
    default answers GOAWAY too_many_pings) would cut idle clients off."""
    address, _, log = server
    raw = await RawClient.connect(address)
    raw.start()
    for i in range(200):
        raw.writer.write(h2frames.frame(h2frames.PING, 0, 0, i.to_bytes(8, "big")))
    acks = []
    while len(acks) < 200:
        ftype, flags, _, payload = await raw.frame()
        if ftype == h2frames.PING and flags & h2frames.ACK:
            acks.append(int.from_bytes(payload, "big"))
    assert acks == list(range(200))
    raw.message(b"after the pings")
    while True:
        ftype, _, stream, payload = await raw.frame()
        if ftype == h2frames.DATA and stream == 1:
            assert payload[5:] == b"after the pings"
            break
    raw.close()


@pytest.mark.parametrize("block", [b"\xff\xff\xff\xff\x7f", b"\x00\x01a\x01\xff"],
                         ids=["bad HPACK", "a value that is not UTF-8"])
async def test_an_undecodable_header_block_ends_the_connection_or_its_stream(server, block):
    address, _, log = server
    raw = await RawClient.connect(address)
    raw.writer.write(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0)
                     + h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1, block))
    if block[0] == 0:
        # libnghttp2 decodes it (HPACK is bytes) and refuses the request, which lacks its
        # pseudo-headers, with RST_STREAM PROTOCOL_ERROR: a stream error, not a connection error
        while (frame := await raw.frame())[0] != h2frames.RST_STREAM:
            pass
        assert frame[2] == 1 and struct.unpack(">I", frame[3])[0] == 0x1
    else:
        code, _ = await raw.goaway()
        assert code == 0x9
    assert log == []


async def test_a_request_header_that_is_not_utf8_ends_its_call_and_others_go_on(server):
    address, _, log = server
    raw = await RawClient.connect(address)
    headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                                      (":authority", "x"), ("content-type", "application/grpc"),
                                      ("x-bad", b"\xff")])
    raw.writer.write(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0)
                     + h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1, headers))
    while (frame := await raw.frame())[0] != h2frames.HEADERS:
        pass
    assert b"grpc-status" in frame[3] or frame[1] & h2frames.END_STREAM
    raw.close()
    assert log == []
    async with grpc.aio.insecure_channel(address) as channel:
        assert await channel.unary_unary(ECHO)(b"fine") == b"fine"


async def test_a_frame_above_the_frame_size_ends_the_connection_with_frame_size_error(server):
    address, _, log = server
    raw = await RawClient.connect(address)
    raw.start()
    raw.writer.write(h2frames.frame(h2frames.DATA, 0, 1, b"\x00" * (h2frames.DEFAULT_FRAME + 1)))
    code, why = await raw.goaway()
    assert code == 0x6 and "too large frame size" in why
    await eventually(lambda: ("closed", 0) in log, timeout=10, interval=0.01, what="the call closed")
    assert not any(kind == "message" for kind, _ in log)


async def test_a_client_ignoring_flow_control_is_disconnected_with_flow_control_error(server):
    address, conns, log = server
    window = RECEIVE_WINDOW
    raw = await RawClient.connect(address)
    raw.start()
    for _ in range(4 * window // (1024 * 1024)):  # never reading a WINDOW_UPDATE
        raw.message(b"z" * (1024 * 1024))
    code, _ = await raw.goaway()
    assert code == 0x3
    taken = sum(n for kind, n in log if kind == "message")  # credit stops once the answers back up
    assert taken <= 3 * window


async def test_a_client_that_never_takes_its_answers_cannot_make_the_server_hold_more(server):
    """It reads the frames (so it sees every WINDOW_UPDATE) but never gives the answers any window:
    the server stops crediting its requests, so both sides' bytes stop, bounded."""
    address, conns, log = server
    raw = await RawClient.connect(address)
    raw.start()
    allowed = {0: 65_535, 1: 65_535}
    chunk = 64 * 1024
    sent = 0
    answered = 0  # answer bytes the server sent: never more than the 65,535 this client allows

    async def read_updates() -> None:
        nonlocal answered
        while True:
            ftype, _, stream, payload = await raw.frame()
            if ftype == h2frames.DATA:
                answered += len(payload)
            elif ftype == h2frames.SETTINGS and payload:
                raw.writer.write(h2frames.frame(h2frames.SETTINGS, h2frames.ACK, 0))  # as RFC 9113 6.5.3 asks
                for k in range(0, len(payload), 6):
                    key, value = struct.unpack_from(">HI", payload, k)
                    if key == 4:
                        allowed[1] += value - 65_535
            elif ftype == h2frames.WINDOW_UPDATE:
                allowed[stream] = allowed.get(stream, 0) + struct.unpack(">I", payload)[0]

    reader = asyncio.get_running_loop().create_task(read_updates())
    try:
        stalled_since = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while loop.time() < deadline:
            need = chunk + 5
            if allowed[0] >= need and allowed[1] >= need:
                raw.message(b"a" * chunk)
                allowed[0] -= need
                allowed[1] -= need
                sent += need
                await raw.writer.drain()
                stalled_since = None
            else:
                stalled_since = stalled_since or loop.time()
                if loop.time() - stalled_since > 2:
                    break
                await asyncio.sleep(0.05)
        else:
            pytest.fail(f"the client could still send after {sent} bytes")
        held = conns[0].buffered
        window = RECEIVE_WINDOW
        assert 0 < answered <= 65_535
        assert held <= 2 * window
        assert sent <= 3 * window
        assert sum(n for kind, n in log if kind == "message") * 1.0 >= held - 65_535
    finally:
        reader.cancel()
        raw.close()
