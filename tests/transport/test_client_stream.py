"""The client's Add and Read streams without grpc.aio (pybk.transport.ngh2_client.ClientStream and
ServerStream), against each server it meets: pybk's server connections and gRPC's own C-core
server (grpc.aio), all in this process on loopback; and against raw sockets that answer what a
broken, silent or departing server would."""
from __future__ import annotations

import asyncio
import socket
import ssl
import struct

import grpc
import pytest

import h2frames
from flow_checker import FlowChecker
from polling import eventually
from raw_h2_server import (ANSWER_HEADERS, RawServer, data_frames, goaway_frame as _goaway, grpc_message,
                           headers_frame as _headers, scripted as _scripted, settings_frame as _settings,
                           speaking as _speaking)

from pybk.security.ca import CertificateAuthority
from pybk.security.tls import ReloadingSSLContext, ServerTls
from pybk.transport.ngh2_client import CLOSED_AT_ONCE, PING_DATA, CallError, ClientStream, ServerStream
from pybk.transport.ngh2_server import Call, GrpcServerConnection

ECHO, REFUSE = "/t.T/Echo", "/t.T/Refuse"
MAX_MESSAGE = 8 * 1024 * 1024
REFUSAL = "not for you: 100% sure"
TOKEN = (("authorization", "Bearer t0k"), ("x-client", "test"))


class Seen:
    """What a server saw: each call's request headers, the ALPN protocol of its connection, and
    how many of its calls the client ended."""

    def __init__(self) -> None:
        self.headers: list[dict] = []
        self.alpn: list[str | None] = []
        self.closed = 0


class _Echo:
    """Answers every message with itself (pybk's server connections)."""

    def __init__(self, call: Call, seen: Seen):
        self.call, self.seen = call, seen

    def message(self, data: bytes) -> None:
        self.call.send(bytes(data))

    def end_of_input(self) -> None:
        self.call.finish()

    def closed(self) -> None:
        self.seen.closed += 1


class _Refuse(_Echo):
    """Ends the call PERMISSION_DENIED at its first message."""

    def message(self, data: bytes) -> None:
        self.call.finish(grpc.StatusCode.PERMISSION_DENIED, REFUSAL)


async def _pybk_server(seen: Seen, ssl_context: ssl.SSLContext | None = None):
    def route(call: Call):
        seen.headers.append(dict(call.headers))
        seen.alpn.append(call.ssl_object.selected_alpn_protocol() if call.ssl_object else None)
        if call.path == ECHO:
            call.trust_connection()  # as a bookie does for a call whose credential it knows
            call.send_headers([("x-served-by", "pybk")])
            return _Echo(call, seen)
        return _Refuse(call, seen) if call.path == REFUSE else None

    return await asyncio.get_running_loop().create_server(lambda: GrpcServerConnection(route, MAX_MESSAGE),
                                                          "127.0.0.1", 0, ssl=ssl_context)


async def _aio_server(seen: Seen):
    async def echo(requests, context):
        seen.headers.append(dict(context.invocation_metadata()))
        await context.send_initial_metadata((("x-served-by", "aio"),))
        async for message in requests:
            yield message

    async def refuse(requests, context):
        async for _ in requests:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, REFUSAL)

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                      ("grpc.max_send_message_length", MAX_MESSAGE)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {
        "Echo": grpc.stream_stream_rpc_method_handler(echo),
        "Refuse": grpc.stream_stream_rpc_method_handler(refuse)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.fixture(params=["pybk", "aio"])
async def server(request):
    """A gRPC server on a loopback port serving ECHO and REFUSE: pybk's, or grpc.aio's (gRPC's
    C-core). (address, what it saw, its name)."""
    seen = Seen()
    if request.param == "aio":
        srv, port = await _aio_server(seen)
        yield f"127.0.0.1:{port}", seen, "aio"
        await srv.stop(None)
        return
    srv = await _pybk_server(seen)
    yield f"127.0.0.1:{srv.sockets[0].getsockname()[1]}", seen, "pybk"
    srv.close()


class Client:
    """One stream's callbacks: the answers, the initial metadata, and every on_end call."""

    def __init__(self) -> None:
        self.answers: list[bytes] = []
        self.metadata: list[list] = []
        self.ends: list[tuple[grpc.StatusCode, str]] = []

    def open(self, address: str, path: str = ECHO, **options) -> ClientStream:
        return ClientStream.open(address, path, on_message=lambda m: self.answers.append(bytes(m)),
                                 on_headers=self.metadata.append, on_end=self._ended, **options)

    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        self.ends.append((code, details))

    async def end(self, timeout: float = 10) -> tuple[grpc.StatusCode, str]:
        """The stream's one end, once it came."""
        await eventually(lambda: self.ends, timeout=timeout, interval=0.01, what="the stream's end")
        assert len(self.ends) == 1, self.ends
        return self.ends[0]


def _messages() -> list[bytes]:
    """Messages across the frame size and both windows, a burst of big ones among them."""
    sizes = [0, 1, 100, 16_379, 16_380, 70_000, 1_000_000, 5, 300_000, 3_000_000, 3_000_000, 3_000_000, 7]
    return [bytes([i]) * n for i, n in enumerate(sizes)]


async def test_every_answer_arrives_in_order_after_the_initial_metadata(server):
    """Written before the connection is up and in a burst beyond the server's windows, every
    message is answered in order; the server sees the metadata (the token too) and its initial
    metadata reaches the client; cancelling calls nothing back."""
    address, seen, name = server
    client = Client()
    stream = client.open(address, metadata=TOKEN)
    messages = _messages()
    for m in messages:
        stream.write(m)
    await eventually(lambda: len(client.answers) >= len(messages) or client.ends, timeout=30, interval=0.01,
                     what="every answer")
    assert client.ends == [] and client.answers == messages
    assert ("x-served-by", name) in client.metadata[0]
    assert seen.headers[0]["authorization"] == "Bearer t0k" and seen.headers[0]["x-client"] == "test"
    stream.cancel()
    if name != "aio":
        await eventually(lambda: seen.closed == 1, timeout=10, interval=0.01, what="the server's call closed")
    assert client.ends == []


async def test_data_keeps_to_the_server_s_frame_size_and_windows(server):
    """Through a relay that checks every DATA frame: none above the server's frame size or
    beyond its windows, settings counting only from this side's ACK (grpc.aio's server raises
    them mid-stream with its BDP probe)."""
    address, _, _ = server
    checker = FlowChecker(address)
    relay = await checker.start()
    client = Client()
    stream = client.open(relay)
    messages = _messages()
    try:
        for m in messages:
            stream.write(m)
        await eventually(lambda: len(client.answers) >= len(messages) or client.ends, timeout=30, interval=0.01,
                         what="every answer")
        stream.cancel()
    finally:
        checker.server.close()
    assert client.ends == [] and client.answers == messages
    assert checker.violations == []


async def test_the_server_s_status_ends_the_stream_with_its_code_and_message(server):
    address, _, _ = server
    client = Client()
    client.open(address, REFUSE).write(b"please")
    assert await client.end() == (grpc.StatusCode.PERMISSION_DENIED, REFUSAL)


async def test_an_answer_above_the_limit_ends_the_stream_resource_exhausted(server):
    address, _, _ = server
    client = Client()
    client.open(address, max_receive_message_bytes=1000).write(b"x" * 2000)
    assert await client.end() == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  "an answer from the server: received message larger than max (2000 vs. 1000 bytes)")
    assert client.answers == []


async def test_tls_with_alpn_h2_reaches_the_server(tmp_path):
    """TLS: the server certificate checked against the CA for the name given, ALPN h2 offered
    and taken."""
    files = CertificateAuthority.create().write_identity(tmp_path, "bookie-0", hosts=("bookie-0.example",))
    server_context = ReloadingSSLContext(ServerTls(str(files.cert), str(files.key)), alpn=["h2"]).context
    seen = Seen()
    srv = await _pybk_server(seen, server_context)
    client = Client()
    stream = client.open(f"127.0.0.1:{srv.sockets[0].getsockname()[1]}",
                         ssl=ssl.create_default_context(cafile=str(files.ca)), server_hostname="bookie-0.example")
    stream.write(b"over TLS")
    try:
        await eventually(lambda: client.answers or client.ends, timeout=10, interval=0.01, what="the answer")
        assert client.answers == [b"over TLS"] and seen.alpn == ["h2"]
        assert seen.headers[0][":scheme"] == "https"
    finally:
        stream.cancel()
        srv.close()


# ---- servers that break, go silent or go away: raw sockets -----------------------------------

@pytest.mark.parametrize("answer, code, details", [
    (_settings() + _goaway(0, 0, b"going"), grpc.StatusCode.UNAVAILABLE,
     "the server closed the connection (GOAWAY, HTTP/2 error 0: going)"),
    (_settings() + _goaway(1, 2, b"oops"), grpc.StatusCode.UNAVAILABLE,
     "the server closed the connection (GOAWAY, HTTP/2 error 2: oops)"),
    (_settings() + h2frames.frame(h2frames.RST_STREAM, 0, 1, struct.pack(">I", 7)), grpc.StatusCode.UNAVAILABLE,
     "the server reset the stream (HTTP/2 error 7)"),
    (_settings() + h2frames.frame(h2frames.RST_STREAM, 0, 1, struct.pack(">I", 0xB)),
     grpc.StatusCode.RESOURCE_EXHAUSTED,
     "the server reset the stream (HTTP/2 error 11)"),
    (_settings() + _headers([(":status", "200"), ("content-type", "application/grpc")])
     + h2frames.frame(h2frames.DATA, h2frames.END_STREAM, 1, b"\x00\x00\x00\x00\x02ok"), grpc.StatusCode.INTERNAL,
     "the server ended the stream without a status"),
    (_settings() + _headers([(":status", "503")], h2frames.END_STREAM), grpc.StatusCode.UNKNOWN, "HTTP status 503"),
], ids=["goaway-not-taken", "goaway-error", "refused", "enhance-your-calm", "no-trailers", "http-503"])
async def test_what_the_server_does_to_the_stream_ends_it_naming_it(answer, code, details):
    raw = RawServer(_scripted(answer))
    client = Client()
    client.open(await raw.start()).write(b"hello")
    try:
        assert await client.end() == (code, details)
    finally:
        raw.server.close()


async def test_a_graceful_goaway_lets_the_stream_finish():
    """A GOAWAY without an error that took the stream (a server shutting down) ends nothing: the
    answers and the status still come."""
    answer = (_settings() + _goaway(1, 0, b"stopping")
              + _headers([(":status", "200"), ("content-type", "application/grpc")])
              + h2frames.frame(h2frames.DATA, 0, 1, b"\x00\x00\x00\x00\x02ok")
              + _headers([("grpc-status", "0")], h2frames.END_STREAM))
    raw = RawServer(_scripted(answer))
    client = Client()
    client.open(await raw.start()).write(b"hello")
    try:
        assert await client.end() == (grpc.StatusCode.OK, "")
        assert client.answers == [b"ok"]
    finally:
        raw.server.close()


async def _hello_to(script) -> tuple[grpc.StatusCode, str]:
    """How a stream that wrote one message ends against a raw server running `script`."""
    raw = RawServer(script)
    client = Client()
    client.open(await raw.start()).write(b"hello")
    try:
        return await client.end()
    finally:
        raw.server.close()


async def test_a_server_that_does_not_speak_http2_ends_the_stream_internal():
    code, details = await _hello_to(_scripted(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
    assert code is grpc.StatusCode.INTERNAL and details.startswith("HTTP/2 protocol error from the server: "), details


async def test_a_connection_closed_at_once_says_the_server_never_spoke_http2():
    """As a TLS port does to a plaintext client: the end names it, for BookieClient's hint."""
    async def close_at_once(reader, writer, raw) -> None:
        pass
    code, details = await _hello_to(close_at_once)
    assert code is grpc.StatusCode.UNAVAILABLE and details.startswith(CLOSED_AT_ONCE), details


async def test_a_refused_connection_ends_unavailable_naming_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there
    client = Client()
    client.open(address).write(b"hello")
    code, details = await client.end()
    assert code is grpc.StatusCode.UNAVAILABLE and details.startswith(f"cannot connect to {address}: "), details


def _pings(raw: RawServer) -> list[bytes]:
    return [p for t, f, _, p in raw.frames if t == h2frames.PING and not f & h2frames.ACK]


async def test_a_silent_server_ends_the_stream_once_the_keepalive_ping_goes_unanswered():
    raw = RawServer(_speaking)
    client = Client()
    client.open(await raw.start(), awaiting=lambda: True, keepalive=0.2,
                keepalive_timeout=0.3).write(b"hello")
    try:
        assert await client.end() == (grpc.StatusCode.UNAVAILABLE, "no answer to a keepalive PING within 0.3s")
    finally:
        raw.server.close()
    assert _pings(raw) == [PING_DATA]


async def test_a_server_that_answers_the_keepalive_ping_keeps_the_stream():
    raw = RawServer(_speaking, answer_pings=True)
    client = Client()
    stream = client.open(await raw.start(), awaiting=lambda: True, keepalive=0.1,
                         keepalive_timeout=0.2)
    stream.write(b"hello")
    try:
        await eventually(lambda: len(_pings(raw)) >= 3 or client.ends, timeout=10, interval=0.01,
                         what="three keepalive PINGs")
        assert client.ends == []
    finally:
        stream.cancel()
        raw.server.close()


async def test_cancel_resets_the_stream_and_calls_nothing():
    raw = RawServer(_speaking)
    client = Client()
    stream = client.open(await raw.start())
    stream.write(b"hello")
    try:
        await eventually(lambda: any(t == h2frames.DATA for t, *_ in raw.frames), timeout=10, interval=0.01,
                         what="the message")
        stream.cancel()
        await eventually(lambda: any(t == h2frames.RST_STREAM for t, *_ in raw.frames), timeout=10, interval=0.01,
                         what="the RST_STREAM")
    finally:
        raw.server.close()
    rst = next(p for t, _, s, p in raw.frames if t == h2frames.RST_STREAM)
    assert struct.unpack(">I", rst)[0] == 0x8 and client.ends == []



# ---- a call of one request and a stream of answers (ServerStream) ------------------------------

async def test_a_server_stream_half_closes_its_request_and_takes_every_answer(server):
    """The request ends with its one message (each echo server answers, then ends at the end of
    the input): the answer, then the end OK; the connection is closed after."""
    address, seen, _ = server
    call = ServerStream(address, ECHO, b"x" * 100_000, metadata=TOKEN)
    assert [bytes(m) async for m in call] == [b"x" * 100_000]
    assert seen.headers[0]["authorization"] == "Bearer t0k"


async def test_a_server_stream_raises_the_status_after_the_answers_before_it():
    answer = (_settings() + _headers(ANSWER_HEADERS) + data_frames(grpc_message(b"one") + grpc_message(b"two"))
              + _headers([("grpc-status", "5"), ("grpc-message", "no such entry")], h2frames.END_STREAM))
    raw = RawServer(_scripted(answer))
    call = ServerStream(await raw.start(), ECHO, b"hello")
    try:
        assert [bytes(await anext(call)), bytes(await anext(call))] == [b"one", b"two"]
        with pytest.raises(CallError) as err:
            await anext(call)
        assert (err.value.code, err.value.details) == (grpc.StatusCode.NOT_FOUND, "no such entry")
    finally:
        raw.server.close()


async def test_a_server_stream_credits_the_server_only_as_the_caller_takes_answers():
    """Answers beyond `ahead` that the caller has not taken are not credited back: the server is
    held to its window (nothing is buffered here beyond it); taking them reopens it. The
    connection is still read meanwhile (a PING is answered)."""
    n, size = 60, 65_536
    async def script(reader, writer, raw: RawServer) -> None:
        writer.write(_settings())
        await raw.read_frames(reader, writer, until=lambda frames: any(
            t == h2frames.DATA and f & h2frames.END_STREAM for t, f, *_ in frames))
        writer.write(h2frames.frame(h2frames.SETTINGS, h2frames.ACK, 0)   # the client's window takes effect
                     + _headers(ANSWER_HEADERS)
                     + data_frames(b"".join(grpc_message(bytes([i]) * size) for i in range(n)))
                     + h2frames.frame(h2frames.PING, 0, 0, b"sync-now"))
        await raw.read_frames(reader, writer)
    raw = RawServer(script)
    call = ServerStream(await raw.start(), ECHO, b"hello", ahead=100_000)

    def credit() -> list[bytes]:
        return [p for t, _, s, p in raw.frames if t == h2frames.WINDOW_UPDATE and s == 1]
    try:
        await eventually(lambda: any(t == h2frames.PING and f & h2frames.ACK for t, f, *_ in raw.frames),
                         timeout=10, interval=0.01, what="the PING's ACK, after every answer was read")
        assert credit() == []
        assert [bytes(await anext(call)) for _ in range(n)] == [bytes([i]) * size for i in range(n)]
        await eventually(credit, timeout=10, interval=0.01, what="the window reopened")
    finally:
        call.cancel()
        raw.server.close()


async def test_a_server_stream_past_its_deadline_ends_deadline_exceeded_and_is_reset():
    raw = RawServer(_speaking)
    call = ServerStream(await raw.start(), ECHO, b"hello", timeout=0.2)
    try:
        with pytest.raises(CallError) as err:
            await anext(call)
        assert err.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(raw.over.wait(), 10)   # the connection is closed
    finally:
        raw.server.close()
    assert [struct.unpack(">I", p)[0] for t, _, _, p in raw.frames if t == h2frames.RST_STREAM] == [0x8]


async def test_cancelling_a_server_stream_resets_it_and_closes_its_connection():
    raw = RawServer(_speaking)
    call = ServerStream(await raw.start(), ECHO, b"hello")
    waiting = asyncio.ensure_future(anext(call))
    try:
        await eventually(lambda: any(t == h2frames.DATA for t, *_ in raw.frames), timeout=10, interval=0.01,
                         what="the request")
        call.cancel()
        await asyncio.wait_for(raw.over.wait(), 10)
        with pytest.raises(CallError) as err:
            await waiting
        assert err.value.code is grpc.StatusCode.CANCELLED
    finally:
        raw.server.close()
    assert [struct.unpack(">I", p)[0] for t, _, _, p in raw.frames if t == h2frames.RST_STREAM] == [0x8]
