"""pybk's gRPC server (pybk.transport.grpc_server) runs handlers written as for grpc.aio, and
gRPC's own C-core clients (grpc.aio) see the codes, details, metadata and back-pressure they
would from grpc.aio's server."""
from __future__ import annotations

import asyncio
import logging
import socket
import struct

import grpc
import hpack
import pytest

import h2frames
from polling import eventually

from pybk.transport.grpc_server import ConnectionLimits, Kind, Method, Server
from pybk.transport.ngh2_client import split_address

ANSWER = 1024 * 1024


def _same(b: bytes) -> bytes:
    return b


@pytest.fixture
async def served():
    """A server with a few methods on a loopback port: (address, the handlers' record)."""
    seen: dict = {"written": 0, "cancelled": 0, "metadata": None, "peer": None, "release": asyncio.Event(),
                  "late": []}

    async def echo(request: bytes, context):
        seen["metadata"], seen["peer"] = dict(context.invocation_metadata()), context.peer()
        return request

    async def refuse(request: bytes, context):
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not for you: " + request.decode())

    async def broken(request: bytes, context):
        raise ValueError("a bug")

    async def flood(request: bytes, context):
        try:
            while True:
                await context.write(b"f" * ANSWER)
                seen["written"] += 1
        except asyncio.CancelledError:
            seen["cancelled"] += 1
            raise

    async def late(request: bytes, context):
        try:
            await seen["release"].wait()
            seen["late"].append("answering")
            return b"too late"
        except asyncio.CancelledError:
            seen["late"].append("cancelled")
            raise

    async def count(requests, context):
        n = 0
        async for r in requests:
            n += len(r)
            await context.write(str(n).encode())

    methods = [Method("/t.T/Echo", Kind.UNARY, _same, _same, echo),
               Method("/t.T/Refuse", Kind.UNARY, _same, _same, refuse),
               Method("/t.T/Broken", Kind.UNARY, _same, _same, broken),
               Method("/t.T/Flood", Kind.SERVER_STREAM, _same, _same, flood),
               Method("/t.T/Count", Kind.BIDI, _same, _same, count),
               Method("/t.T/Late", Kind.UNARY, _same, _same, late)]
    sock = socket.create_server(("127.0.0.1", 0))
    server = Server(methods, sock, 4 * 1024 * 1024)
    await server.start()
    yield f"127.0.0.1:{sock.getsockname()[1]}", seen, server
    await server.stop(None)


async def test_a_unary_call_gets_its_answer_and_the_handler_its_metadata_and_peer(served):
    address, seen, _ = served
    async with grpc.aio.insecure_channel(address) as ch:
        answer = await ch.unary_unary("/t.T/Echo")(b"hello", metadata=(("authorization", "Bearer t0k"),))
    assert answer == b"hello"
    assert seen["metadata"]["authorization"] == "Bearer t0k"
    assert seen["peer"].startswith("ipv4:127.0.0.1:")


async def test_an_accepted_connection_sends_without_nagle_whatever_the_event_loop(served):
    """A small answer must not wait for the client's delayed ACK: asyncio's own loop leaves
    TCP_NODELAY off on an accepted socket (uvloop sets it), so the server sets it itself."""
    address, _, server = served
    async with grpc.aio.insecure_channel(address) as ch:
        assert await ch.unary_unary("/t.T/Echo")(b"hi") == b"hi"
        socks = [link.transport.get_extra_info("socket") for link in server._links if link.transport]
        assert socks and all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in socks)


async def test_an_abort_reaches_the_client_with_its_code_and_details(served):
    address, _, _ = served
    async with grpc.aio.insecure_channel(address) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary("/t.T/Refuse")(b"alice")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.details() == "not for you: alice"


async def test_a_handler_that_raises_ends_its_call_unknown_naming_the_error_and_the_server_serves_on(served):
    address, _, _ = served
    async with grpc.aio.insecure_channel(address) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary("/t.T/Broken")(b"x")
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert "ValueError: a bug" in err.value.details()
        assert await ch.unary_unary("/t.T/Echo")(b"still here") == b"still here"


async def test_a_bidi_call_answers_each_request_in_order(served):
    address, _, _ = served
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.stream_stream("/t.T/Count")()
        for n in (3, 5, 0, 100_000):
            await call.write(b"x" * n)
        await call.done_writing()
        assert [a async for a in call] == [b"3", b"8", b"8", b"100008"]
        assert await call.code() == grpc.StatusCode.OK


async def test_a_client_that_reads_nothing_holds_its_handler_s_writes_and_cancelling_ends_the_handler(served):
    address, seen, _ = served
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_stream("/t.T/Flood")(b"go")
        await call.wait_for_connection()
        await eventually(lambda: seen["written"] > 0, timeout=10, interval=0.01, what="the first write")
        await asyncio.sleep(1)  # let the handler run as far as it can
        held = seen["written"]
        # the client's windows, the kernel's socket buffers and the connection's write limit: a few MiB
        assert held * ANSWER <= 64 * 1024 * 1024
        await asyncio.sleep(0.5)
        assert seen["written"] == held  # no progress while the client reads nothing
        call.cancel()
        await eventually(lambda: seen["cancelled"] == 1, timeout=10, interval=0.01, what="the handler cancelled")


async def test_stop_ends_running_calls_after_the_grace_and_refuses_new_connections(served):
    address, seen, server = served
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_stream("/t.T/Flood")(b"go")
        await call.wait_for_connection()
        await eventually(lambda: seen["written"] > 0, timeout=10, interval=0.01, what="the first write")
        await asyncio.wait_for(server.stop(0.2), 10)
        assert seen["cancelled"] == 1
    with pytest.raises(OSError):
        host, port = address.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()


async def test_a_call_in_flight_when_its_connection_ends_is_cancelled_and_writes_nothing(served, caplog):
    """A client that sends GOAWAY ends its connection here; a handler still running must not
    write after the connection's EOF (that raised "Cannot call writelines() after write_eof()"
    from the handler's task, an exception nobody retrieved)."""
    address, seen, _ = served
    loop = asyncio.get_running_loop()
    unhandled: list = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    reader, writer = await asyncio.open_connection(*split_address(address))
    headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/t.T/Late"),
                                      (":authority", "x"), ("content-type", "application/grpc")])
    writer.write(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0)
                 + h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1, headers)
                 + h2frames.frame(h2frames.DATA, h2frames.END_STREAM, 1, b"\x00" + struct.pack(">I", 2) + b"go"))
    await writer.drain()
    await asyncio.sleep(0.2)  # the call is running, waiting to answer
    writer.write(h2frames.frame(h2frames.GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
    await writer.drain()
    with caplog.at_level(logging.ERROR, logger="pybk.transport.grpc_server"):
        await asyncio.sleep(0.2)  # the connection is ending (the server reads on for a second)
        seen["release"].set()
        await eventually(lambda: seen["late"], timeout=10, interval=0.01, what="the handler's end")
        await asyncio.sleep(0.1)
    assert seen["late"] == ["cancelled"]
    assert [r.getMessage() for r in caplog.records] == [] and unhandled == []
    assert await reader.read() != b""  # the server's SETTINGS and GOAWAY, then the end
    writer.close()


async def _ended(source: str, port: int) -> bool:
    """Connect from `source`: whether the server ends the connection at once (EOF or a reset)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except ConnectionResetError:
        return True
    try:
        return await asyncio.wait_for(reader.read(), 0.5) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        writer.close()


async def test_connections_beyond_the_limits_are_refused_as_accepted_and_counted():
    refused: list[str] = []
    sock = socket.create_server(("127.0.0.1", 0))
    server = Server([], sock, 1024, limits=ConnectionLimits(max_connections=3, max_connections_per_peer=2),
                    on_refused=refused.append)
    await server.start()
    port = sock.getsockname()[1]
    held = []
    try:
        for source in ("127.0.0.2", "127.0.0.2", "127.0.0.3"):
            held.append(await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)))
        await eventually(lambda: server.connections == 3, timeout=10, interval=0.01, what="three held")
        assert await _ended("127.0.0.4", port)  # a fourth in all
        for _, w in held[1:]:
            w.close()
        await eventually(lambda: server.connections == 1, timeout=10, interval=0.01, what="two gone")
        assert await _ended("127.0.0.2", port) is False  # its second
        assert await _ended("127.0.0.3", port) is False
        await eventually(lambda: server.connections == 1, timeout=10, interval=0.01, what="those gone")
        held.append(await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0)))
        assert await _ended("127.0.0.2", port)  # a third from 127.0.0.2
        assert refused == ["max_connections", "max_connections_per_peer"]
    finally:
        for _, w in held:
            w.close()
        await server.stop(None)


async def test_an_idle_connection_gets_goaway_no_error_and_a_channel_calls_on():
    closed: list[str] = []
    sock = socket.create_server(("127.0.0.1", 0))
    echo = Method("/t.T/Echo", Kind.UNARY, _same, _same, lambda request, context: _async(request))
    server = Server([echo], sock, 1024, limits=ConnectionLimits(idle_timeout=0.5), on_closed=closed.append)
    await server.start()
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with grpc.aio.insecure_channel(address) as ch:
            for i in range(4):
                assert await ch.unary_unary("/t.T/Echo")(b"%d" % i) == b"%d" % i
                await eventually(lambda: len(closed) > i, timeout=10, interval=0.01, what="an idle close")
        assert set(closed) == {"idle"}
        await eventually(lambda: server.connections == 0, timeout=10, interval=0.01, what="the connections gone")
    finally:
        await server.stop(None)


async def _async(value):
    return value
