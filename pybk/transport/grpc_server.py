"""A gRPC server whose HTTP/2 engine is libnghttp2 (ngh2_server's connections), in place of
grpc.aio.Server.

Why: grpc.aio's server hands every message and every answer between gRPC's threads and the event
loop; a bookie spent about half of its busy time there at window 1. Here a call's messages reach
its handler from the transport's read callback. The handlers are written as for grpc.aio: `async
def method(request, context)` (unary, or server-streaming with `await context.write`) and `async
def method(request_iterator, context)` (bidi), with the part of grpc.aio's ServicerContext they
use (`Context`). Clients see ordinary gRPC: grpc.aio channels and pybk's own Add and Read streams alike.

Life of a call: a bidi call's task starts with its HEADERS and reads its requests from an async
iterator fed by the connection; a unary or server-streaming call's task starts once its one
request arrived whole. The task's return (or `context.abort`) ends the call with trailers; a
client that resets the call or goes away cancels the task; a handler that raises ends the call
UNKNOWN, logged. `context.write` returns once the answer is handed to the connection within the
client's windows, so a slow reader slows its handler instead of piling answers up here.

Who may call: the handlers decide with `invocation_metadata()` (bearer tokens) and
`auth_context()` (the verified client certificate's common name), as they would under grpc.aio.
This layer only asks `identify` at each call's HEADERS whether its credential is one the server
knows, to give its connection the full window and budget (see pybk.transport.ngh2_server).

Connections (`ConnectionLimits`): the server accepts connections itself, so that what it allows
each client holds is decided in one place, before a connection object exists. Beyond
`max_connections` in all, or `max_connections_per_peer` from one address, a connection is closed
as soon as it is accepted (before any TLS handshake), counted (`on_refused`) and logged at most
once a minute. A connection whose TLS handshake and HTTP/2 preface are not done within
`handshake_timeout` is dropped; one with no call open for `idle_timeout` is closed with a GOAWAY
(NO_ERROR: gRPC clients reconnect for their next call, and retry one that crossed the GOAWAY); one
that sent nothing for `keepalive_interval` gets a PING and is dropped if nothing comes back within
`keepalive_timeout` (a peer gone without a FIN keeps no slot). Each is counted (`on_closed`).
These limits apply before authentication, to anyone who can reach the port.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import enum
import errno
import logging
import socket
import ssl as _ssl
import struct
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable

import grpc

from pybk.security.auth import certificate_common_name

from .budget import ProcessBudget
from .ngh2_server import Call, GrpcServerConnection

log = logging.getLogger("pybk.transport.grpc_server")

# what the server holds for all its clients at most (requests ahead of consumption, unread answers)
DEFAULT_BUDGET_BYTES = 512 * 1024 * 1024

_NOT_METADATA = frozenset({"te", "content-type", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"})
LOG_INTERVAL = 60.0    # seconds between log lines of one kind about refused or failed connections
CLOSE_GRACE = 5.0      # seconds a connection closed with a GOAWAY may take to go before it is dropped
ACCEPT_BATCH = 128     # connections accepted per wake-up of the listening socket (as asyncio's backlog loop)
ACCEPT_PAUSE = 1.0     # seconds accepting pauses when the process is out of descriptors or memory
# calls started, and calls cancelled, per turn of the event loop (_Paced): a call's first step may
# build an answer of 1 MiB (a Read of cached entries, about 2 ms), so 16 are a turn of 30-40 ms at most
PER_TURN = 16
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection
# connections gone before the heap is trimmed: each held about 15 KB of C memory (libnghttp2's
# session and buffers), freed among longer-lived blocks, where malloc keeps it from the system
TRIM_AFTER = 1024
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


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
    them, a unary call's one request as its task starts. It counts as an open call of its
    connection (`link`) until it ended, once."""

    holds_messages = True

    def __init__(self, server: "Server", method: Method, call: Call, link: "_Link"):
        self.server, self.method, self.call, self.link = server, method, call, link
        self.ended = False
        link.calls += 1
        self.context = Context(call, method.serialize)
        self.task: asyncio.Task | None = None
        self.started = False  # the task is made, or due on a later turn (Server.paced)
        self.over = False  # the task is ending the call itself: closed() must not cancel it
        self.request: bytes | None = None  # a unary call's one request, until the client half-closes
        self.requests = _Requests(method.deserialize, call.consumed) if method.kind is Kind.BIDI else None
        if self.requests is not None:
            self._start(self.requests)

    def _start(self, argument) -> None:
        self.started = True
        self.server.paced(self._begin, argument)

    def _begin(self, argument) -> None:
        if self.ended:  # closed before its turn came
            return
        self.task = self.server.spawn(self._run(argument), self.method.path)
        self.task.add_done_callback(lambda _: self._ended())  # also a task cancelled before it began

    def message(self, data: bytes) -> None:
        if self.requests is not None:
            self.requests.put(data)
        elif self.request is not None or self.started:
            self.over = True
            self.call.abandon(grpc.StatusCode.INVALID_ARGUMENT, f"{self.method.path} takes one request message")
        else:
            self.request = data

    def end_of_input(self) -> None:
        if self.requests is not None:
            self.requests.end()
        elif not self.started:
            if self.request is None:
                self.over = True
                self.call.finish(grpc.StatusCode.INVALID_ARGUMENT, f"{self.method.path} got no request message")
                self._ended()
                return
            request, self.request = self.request, None
            self.call.consumed(len(request) + 5)
            self._start(self.method.deserialize(request))

    def closed(self) -> None:
        self.request = None
        if self.requests is not None:
            self.requests.clear()
        if self.task is None:
            self._ended()
        elif not self.over:
            self.server.paced(self.task.cancel)

    def _ended(self) -> None:
        if not self.ended:
            self.ended = True
            self.server.call_ended(self.link)

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
            # not re-raised: the task ends with no exception kept, so its frames (and the requests
            # they hold) are freed at once instead of at the next garbage collection
            self.over = True
            call.abandon(grpc.StatusCode.CANCELLED, "the call was cancelled")
        except Exception as exc:  # noqa: BLE001 - a handler's fault ends its call, never the server
            self.over = True
            log.exception("%s from %s failed", method.path, context.peer())
            call.abandon(grpc.StatusCode.UNKNOWN, f"unexpected {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class ConnectionLimits:
    """What the server allows connections (the bookie's options of the same names); 0 turns a
    limit off. Seconds for the timeouts."""

    max_connections: int = 0
    max_connections_per_peer: int = 0
    handshake_timeout: float = 0.0
    idle_timeout: float = 0.0
    keepalive_interval: float = 0.0
    keepalive_timeout: float = 0.0

    @property
    def tick(self) -> float:
        """How often connections are looked at: a quarter of the shortest timeout, at most a second."""
        timeouts = [t for t in (self.handshake_timeout, self.idle_timeout, self.keepalive_interval,
                                self.keepalive_timeout) if t > 0]
        return max(0.05, min([1.0, *(t / 4 for t in timeouts)]))


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0), which gives the free pages inside the heap back to the system (a
    no-op where there is none)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


_trim_heap = _malloc_trim()


class _Link:
    """The server's record of one accepted connection: its peer, its connection object once made
    (and its transport), the calls open on it and what the sweep last saw of it."""

    __slots__ = ("peer", "accepted", "conn", "transport", "task", "calls", "idle_since", "spoke", "heard",
                 "heard_at", "ping_at", "closing_at", "released")

    def __init__(self, peer: str, now: float):
        self.peer, self.accepted = peer, now
        self.conn: GrpcServerConnection | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.task: asyncio.Task | None = None
        self.calls = 0
        self.idle_since = now
        self.spoke = False
        self.heard, self.heard_at = -1, now
        self.ping_at: float | None = None
        self.closing_at: float | None = None
        self.released = False


class Throttled:
    """Log lines of one kind at most once per `interval` seconds, each saying how many were left
    out: what clients can cause as often as they like (refused connections, refused calls,
    cancelled streams) must not cost the event loop a line each, nor fill the disk."""

    def __init__(self, interval: float = LOG_INTERVAL, logger: logging.Logger = log):
        self.interval = interval
        self.log = logger
        self._last: dict[str, float] = {}
        self._held: Counter = Counter()

    def warn(self, kind: str, message: str) -> None:
        self.emit(logging.WARNING, kind, message)

    def emit(self, level: int, kind: str, message: str) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._held[kind] += 1
            return
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        self.log.log(level, "%s%s", message, f" ({held} more like it in the last {now - last:.0f}s)" if held else "")


class _Paced:
    """Calls run at most `per_turn` an event-loop turn, in the order they came, the rest on the
    next turns: a client that opens or ends a thousand calls in one read must not have all their
    tasks start (or be cancelled) in one turn of the loop, which stalls every other call for as
    long (1,000 Add calls at once were a 200 ms stall, 64 Reads of 1 MiB each 150 ms)."""

    def __init__(self, per_turn: int):
        self.per_turn = per_turn
        self._queue: deque = deque()
        self._scheduled = False

    def __call__(self, fn: Callable, *args) -> None:
        self._queue.append((fn, args))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        queue = self._queue
        try:
            for _ in range(min(self.per_turn, len(queue))):
                fn, args = queue.popleft()
                fn(*args)
        finally:  # one that raised must not hold up the rest
            if queue:
                asyncio.get_running_loop().call_soon(self._run)
            else:
                self._scheduled = False


class Server:
    """Serves `methods` on a listening socket, with the lifecycle of grpc.aio.Server: `start`,
    then `stop(grace)`. TLS with `ssl` (an SSLContext offering ALPN h2). Connections are held to
    `limits` (see the module's notes); `on_refused(reason)` and `on_closed(reason)` hear of every
    connection refused (max_connections, max_connections_per_peer) or closed by a limit
    (handshake_timeout, idle, keepalive). What all connections hold for clients is bounded by
    `budget_bytes`, and `identify` says whether a call's credential is one the server knows (None: every call's)."""

    def __init__(self, methods: list[Method], sock: socket.socket, max_message_bytes: int,
                 ssl: _ssl.SSLContext | None = None, limits: ConnectionLimits = ConnectionLimits(),
                 on_refused: Callable[[str], None] = lambda reason: None,
                 on_closed: Callable[[str], None] = lambda reason: None,
                 budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 identify: Callable[[Context], bool] | None = None):
        self._budget = ProcessBudget(budget_bytes)
        self._identify = identify
        self._methods = {m.path: m for m in methods}
        self._max_message = max_message_bytes
        self._ssl = ssl
        self._sock = sock
        self._limits = limits
        self._on_refused, self._on_closed = on_refused, on_closed
        self._links: set[_Link] = set()
        self._gone = 0  # connections released since the heap was last trimmed
        self._per_peer: Counter = Counter()
        self._tasks: set[asyncio.Task] = set()
        self._accepting = False
        self._serving = False
        self._sweeper: asyncio.Task | None = None
        self._log = Throttled()
        self.paced = _Paced(PER_TURN)  # starts and cancellations of calls' tasks
        self._stopped = asyncio.Event()

    @property
    def connections(self) -> int:
        """Connections held now (accepted and not yet lost)."""
        return len(self._links)

    def spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _route(self, link: _Link, call: Call) -> _Running | None:
        if self._identify is None or self._identify(Context(call, None)):
            call.trust_connection()
        method = self._methods.get(call.path)
        return _Running(self, method, call, link) if method is not None else None

    def call_ended(self, link: _Link) -> None:
        """A call of `link` is over; the connection is idle from its last one on."""
        link.calls -= 1
        if not link.calls:
            link.idle_since = asyncio.get_running_loop().time()

    # ---- accepting ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._sock.setblocking(False)
        self._serving = True
        self._resume_accepting()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="connection-sweeper")

    def _resume_accepting(self) -> None:
        if self._serving and not self._accepting:
            self._accepting = True
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._accept)

    def _pause_accepting(self) -> None:
        if self._accepting:
            self._accepting = False
            asyncio.get_running_loop().remove_reader(self._sock.fileno())

    def _accept(self) -> None:
        """Take the connections waiting on the listening socket (a batch per wake-up)."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                # the connection waits in the kernel's queue; accepting again at once would spin
                what = " (descriptors or memory exhausted)" if exc.errno in _OUT_OF_RESOURCES else ""
                self._log.warn("accept", f"cannot accept connections on {self._address()}: {exc}{what}; "
                                         f"pausing for {ACCEPT_PAUSE:g}s")
                self._pause_accepting()
                asyncio.get_running_loop().call_later(ACCEPT_PAUSE, self._resume_accepting)
                return
            self._admit(sock, address[0] if isinstance(address, tuple) else str(address))

    def _admit(self, sock: socket.socket, peer: str) -> None:
        limits = self._limits
        reason = ""
        if limits.max_connections and len(self._links) >= limits.max_connections:
            reason, why = "max_connections", f"{len(self._links)} connections open (max_connections)"
        elif limits.max_connections_per_peer and self._per_peer[peer] >= limits.max_connections_per_peer:
            reason, why = "max_connections_per_peer", (f"{self._per_peer[peer]} connections open from {peer} "
                                                       f"(max_connections_per_peer)")
        if reason:
            # closed before any TLS handshake; a reset, so no TIME_WAIT is kept for it either
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            sock.close()
            self._on_refused(reason)
            self._log.warn(reason, f"refused a connection from {peer} to {self._address()}: {why}")
            return
        loop = asyncio.get_running_loop()
        link = _Link(peer, loop.time())
        self._links.add(link)
        self._per_peer[peer] += 1
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # answers go out as written: asyncio's loop (unlike uvloop) leaves Nagle on for an accepted
            # socket, and a small answer then waits for the client's delayed ACK (up to 40 ms)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.task = loop.create_task(self._serve(link, sock), name=f"connection from {peer}")
        link.task.add_done_callback(lambda _: self._served(link, sock))

    async def _serve(self, link: _Link, sock: socket.socket) -> None:
        """Set the connection up (TLS handshake included); its connection object serves it from there."""
        timeout = self._limits.handshake_timeout
        try:
            link.transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
                lambda: self._connection(link), sock, ssl=self._ssl,
                ssl_handshake_timeout=timeout + CLOSE_GRACE if self._ssl is not None and timeout else None)
        except OSError as exc:  # a failed TLS handshake (ssl.SSLError is an OSError), a reset
            log.debug("connection from %s failed before serving: %s", link.peer, exc)

    def _served(self, link: _Link, sock: socket.socket) -> None:
        """The set-up is over: a connection that did not come up (failed, or cancelled by a
        timeout or stop, even before it began) gives its socket and slot back."""
        if link.transport is None:
            sock.close()
            self._release(link)

    def _connection(self, link: _Link) -> GrpcServerConnection:
        link.conn = GrpcServerConnection(lambda call: self._route(link, call), self._max_message,
                                         on_close=lambda conn: self._release(link), budget=self._budget)
        return link.conn

    def _release(self, link: _Link) -> None:
        """The connection is gone: its slot, and its peer's, are free again."""
        if link.released:
            return
        link.released = True
        self._gone += 1
        self._links.discard(link)
        n = self._per_peer[link.peer] - 1
        if n > 0:
            self._per_peer[link.peer] = n
        else:
            del self._per_peer[link.peer]

    def _address(self) -> str:
        try:
            host, port = self._sock.getsockname()[:2]
            return f"{host}:{port}"
        except OSError:
            return "a closed socket"

    # ---- limits -------------------------------------------------------------------------------

    async def _sweep(self) -> None:
        """Look at every connection every `tick` seconds: the timeouts and the keepalive; and once
        TRIM_AFTER connections went, give the memory they held back to the system (a flood of
        connections gone left some 60 MB of a bookie's heap free but resident)."""
        loop = asyncio.get_running_loop()
        tick = self._limits.tick
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            for link in list(self._links):
                self._check(link, now)
            if self._gone >= TRIM_AFTER:
                self._gone = 0
                _trim_heap()

    def _check(self, link: _Link, now: float) -> None:
        limits, conn = self._limits, link.conn
        if link.closing_at is not None:
            if now - link.closing_at >= CLOSE_GRACE:
                self._drop(link)
            return
        if not link.spoke:
            if link.transport is not None and conn.spoke:
                link.spoke = True
                link.idle_since = max(link.idle_since, now)
            elif limits.handshake_timeout and now - link.accepted >= limits.handshake_timeout:
                log.debug("dropping the connection from %s: no TLS handshake and HTTP/2 preface within %gs",
                          link.peer, limits.handshake_timeout)
                self._on_closed("handshake_timeout")
                self._drop(link)
                return
            if link.transport is None:  # in its TLS handshake
                return
        if conn.received != link.heard:
            link.heard, link.heard_at, link.ping_at = conn.received, now, None
        elif link.ping_at is not None:
            if now - link.ping_at >= limits.keepalive_timeout:
                log.debug("dropping the connection from %s: no answer to a PING within %gs", link.peer,
                          limits.keepalive_timeout)
                self._on_closed("keepalive")
                self._drop(link)
                return
        elif limits.keepalive_interval and now - link.heard_at >= limits.keepalive_interval:
            link.ping_at = now
            conn.ping()
        if limits.idle_timeout and not link.calls and now - link.idle_since >= limits.idle_timeout:
            self._on_closed("idle")
            link.closing_at = now
            conn.close(f"idle: no call for {limits.idle_timeout:g}s")

    def _drop(self, link: _Link) -> None:
        """End a connection at once, without a GOAWAY (its client did not speak, or is gone)."""
        if link.transport is not None:
            link.transport.abort()
        elif link.task is not None:
            link.task.cancel()  # in its TLS handshake: _serve closes the socket

    # ---- stopping -----------------------------------------------------------------------------

    async def stop(self, grace: float | None) -> None:
        """Stop taking connections, tell every client (GOAWAY), give the calls running `grace`
        seconds to end, then cancel them and close every connection."""
        self._serving = False
        self._pause_accepting()
        self._sock.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for link in list(self._links):
            if link.transport is not None:
                link.conn.goaway()
            elif link.task is not None:
                link.task.cancel()
        if self._tasks and grace:
            await asyncio.wait(list(self._tasks), timeout=grace)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for link in list(self._links):
            if link.transport is not None:
                link.conn.close()
        self._stopped.set()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()
