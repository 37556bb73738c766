"""A gRPC server on pybk's own HTTP/2 connections (h2server), in place of grpc.aio.Server.

Why: grpc.aio's server hands every message and every answer between gRPC's threads and the event
loop; a bookie spent about half of its busy time there at window 1. Here a call's messages reach
its handler from the transport's read callback. The handlers are written as for grpc.aio: `async
def method(request, context)` (unary, or server-streaming with `await context.write`) and `async
def method(request_iterator, context)` (bidi), with the part of grpc.aio's ServicerContext they
use (`Context`). Clients see ordinary gRPC: grpc.aio channels and pybk's own Add stream alike.

Life of a call: a bidi call's task starts with its HEADERS and reads its requests from an async
iterator fed by the connection; a unary or server-streaming call's task starts once its one
request arrived whole. The task's return (or `context.abort`) ends the call with trailers; a
client that resets the call or goes away cancels the task; a handler that raises ends the call
UNKNOWN, logged. `context.write` returns once the answer is handed to the connection within the
client's windows, so a slow reader slows its handler instead of piling answers up here.

Who may call: this layer authenticates nobody; the handlers decide with `invocation_metadata()`
(bearer tokens) and `auth_context()` (the verified client certificate's common name), as they
would under grpc.aio.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import socket
import ssl as _ssl
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import grpc

from pybk.security.auth import certificate_common_name
from pybk.transport import http2_engine

from .h2server import Call, GrpcServerConnection

log = logging.getLogger("pybk.proto.grpc_server")


def connection_class(engine: str | None = None) -> type:
    """The server connection class of an HTTP/2 engine: `engine`, else the PYBK_HTTP2_ENGINE
    environment variable, else `own` (pybk.transport.http2_engine). ValueError names an unknown one."""
    if http2_engine(engine) == "ngh2":
        from pybk.transport.ngh2_server import GrpcServerConnection as Ngh2Connection
        return Ngh2Connection
    return GrpcServerConnection


_NOT_METADATA = frozenset({"te", "content-type", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"})


class Kind(enum.Enum):
    """The shape of a method: which side streams."""
    UNARY = "unary"
    SERVER_STREAM = "server-stream"
    BIDI = "bidi"


@dataclass(frozen=True)
class Method:
    """One method: its path (/package.Service/Name), shape, codecs and handler."""
    path: str
    kind: Kind
    deserialize: Callable[[bytes], Any]
    serialize: Callable[[Any], bytes]
    behavior: Callable


class AbortError(Exception):
    """Raised by `Context.abort`: the call ends with the code and details given there."""


class Context:
    """What a handler sees of its call (the part of grpc.aio's ServicerContext pybk uses)."""

    def __init__(self, call: Call, serialize: Callable[[Any], bytes]):
        self._call, self._serialize = call, serialize
        self._code: grpc.StatusCode | None = None
        self._details = ""

    def peer(self) -> str:
        """The client's address, written as gRPC writes it (ipv4:host:port, ipv6:[host]:port)."""
        return self._call.peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The request's custom metadata (not the pseudo-headers nor gRPC's own)."""
        return tuple((k, v) for k, v in self._call.headers if not k.startswith(":") and k not in _NOT_METADATA)

    def auth_context(self) -> dict[str, list[bytes]]:
        """The verified client certificate's common name, keyed as gRPC keys it; empty without one."""
        ssl_object = self._call.ssl_object
        name = certificate_common_name(ssl_object.getpeercert() if ssl_object is not None else None)
        return {"x509_common_name": [name.encode()]} if name else {}

    async def send_initial_metadata(self, metadata) -> None:
        self._call.send_headers(list(metadata))

    async def write(self, message) -> None:
        """Send one answer; returns once the connection has taken it (see the module's notes)."""
        call = self._call
        await call.writable()  # a connection whose answers are backed up takes no new one either
        if call.finished:
            raise asyncio.CancelledError("the call is over")
        call.send(self._serialize(message))
        await call.writable()

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        """End the call with `code` and `details`; raises AbortError, which the server catches."""
        self._code, self._details = code, details
        raise AbortError(details)

    def code(self) -> grpc.StatusCode | None:
        """The code `abort` set, None before."""
        return self._code


class _Requests:
    """A bidi call's requests as an async iterator, fed from the connection's read callback; each
    request taken from it is reported to `consumed` (its size on the wire), so that the connection
    gives its flow-control credit back only then."""

    def __init__(self, deserialize: Callable[[bytes], Any], consumed: Callable[[int], None]):
        self._deserialize = deserialize
        self._consumed = consumed
        self._items: deque = deque()
        self._ended = False
        self._waiter: asyncio.Future | None = None

    def put(self, data: bytes) -> None:
        self._items.append((self._deserialize(data), len(data) + 5))
        self._wake()

    def clear(self) -> None:
        """Drop what was not taken (the call is over)."""
        self._items.clear()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> "_Requests":
        return self

    async def __anext__(self):
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        item, size = self._items.popleft()
        self._consumed(size)
        return item


class _Running:
    """The Handler of one call: feeds its task and ends the call as the task ends. It holds the
    requests it is given (`holds_messages`): a bidi call's are consumed as its task iterates
    them, a unary call's one request as its task starts."""

    holds_messages = True

    def __init__(self, server: "Server", method: Method, call: Call):
        self.server, self.method, self.call = server, method, call
        self.context = Context(call, method.serialize)
        self.task: asyncio.Task | None = None
        self.over = False  # the task is ending the call itself: closed() must not cancel it
        self.request: bytes | None = None  # a unary call's one request, until the client half-closes
        self.requests = _Requests(method.deserialize, call.consumed) if method.kind is Kind.BIDI else None
        if self.requests is not None:
            self._start(self.requests)

    def _start(self, argument) -> None:
        self.task = self.server.spawn(self._run(argument), self.method.path)

    def message(self, data: bytes) -> None:
        if self.requests is not None:
            self.requests.put(data)
        elif self.request is not None or self.task is not None:
            self.over = True
            self.call.abandon(grpc.StatusCode.INVALID_ARGUMENT, f"{self.method.path} takes one request message")
        else:
            self.request = data

    def end_of_input(self) -> None:
        if self.requests is not None:
            self.requests.end()
        elif self.task is None:
            if self.request is None:
                self.over = True
                self.call.finish(grpc.StatusCode.INVALID_ARGUMENT, f"{self.method.path} got no request message")
                return
            request, self.request = self.request, None
            self.call.consumed(len(request) + 5)
            self._start(self.method.deserialize(request))

    def closed(self) -> None:
        self.request = None
        if self.requests is not None:
            self.requests.clear()
        if self.task is not None and not self.over:
            self.task.cancel()

    async def _run(self, argument) -> None:
        call, context, method = self.call, self.context, self.method
        try:
            result = await method.behavior(argument, context)
            if method.kind is Kind.UNARY and result is not None and not call.finished:
                await call.writable()
                self.over = True
                call.send(method.serialize(result))
            self.over = True
            call.finish()
        except AbortError:
            self.over = True
            call.finish(context._code or grpc.StatusCode.UNKNOWN, context._details)
        except asyncio.CancelledError:
            self.over = True
            call.abandon(grpc.StatusCode.CANCELLED, "the call was cancelled")
            raise
        except Exception as exc:  # noqa: BLE001 - a handler's fault ends its call, never the server
            self.over = True
            log.exception("%s from %s failed", method.path, context.peer())
            call.abandon(grpc.StatusCode.UNKNOWN, f"unexpected {type(exc).__name__}: {exc}")


class Server:
    """Serves `methods` on a listening socket, with the lifecycle of grpc.aio.Server: `start`,
    then `stop(grace)`. TLS with `ssl` (an SSLContext offering ALPN h2). `engine` chooses the
    HTTP/2 engine (see connection_class)."""

    def __init__(self, methods: list[Method], sock: socket.socket, max_message_bytes: int,
                 ssl: _ssl.SSLContext | None = None, engine: str | None = None):
        self._connection_class = connection_class(engine)
        self._methods = {m.path: m for m in methods}
        self._max_message = max_message_bytes
        self._ssl = ssl
        self._sock = sock
        self._server: asyncio.Server | None = None
        self._connections: set[GrpcServerConnection] = set()
        self._tasks: set[asyncio.Task] = set()
        self._stopped = asyncio.Event()

    def spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _route(self, call: Call) -> _Running | None:
        method = self._methods.get(call.path)
        return _Running(self, method, call) if method is not None else None

    def _connection(self) -> GrpcServerConnection:
        conn = self._connection_class(self._route, self._max_message, on_close=self._connections.discard)
        self._connections.add(conn)
        return conn

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_server(self._connection, sock=self._sock,
                                                                      ssl=self._ssl, backlog=1024)

    async def stop(self, grace: float | None) -> None:
        """Stop taking connections, tell every client (GOAWAY), give the calls running `grace`
        seconds to end, then cancel them and close every connection."""
        if self._server is not None:
            self._server.close()
        else:
            self._sock.close()
        for conn in list(self._connections):
            conn.goaway()
        if self._tasks and grace:
            await asyncio.wait(list(self._tasks), timeout=grace)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for conn in list(self._connections):
            conn.close()
        self._stopped.set()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()
