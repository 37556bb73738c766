"""gRPC calls served over HTTP/2 whose protocol engine is libnghttp2 (through `ngh2`): the
connection (`GrpcServerConnection`), its calls (`Call`) and what their messages reach (`Handler`),
under pybk's gRPC server (grpc_server.py).

Why: framing, HPACK, flow control and the protocol's own flood defences (CONTINUATION floods,
SETTINGS with too many entries, unread PING/SETTINGS acknowledgements, empty DATA and other
"glitches") come from the HTTP/2 library behind curl, nginx-alternatives and Node.js, not from
hand-written code. This module adds only what an engine cannot know: what a gRPC message is,
when the application has consumed one, and how many bytes one client may make this process hold.

Budgets, per connection:
- Request bytes are credited back (WINDOW_UPDATE) when the handler has consumed the message they
  belong to, not when a frame is parsed: a handler that stops taking messages stops its client.
  A message bigger than the stream window is let in ahead of consumption (its frames are
  credited as they come) only while the connection holds less than `INBOUND_BUDGET` bytes of
  partial and queued requests, so many half-sent large messages stall on flow control instead of
  growing memory.
- A call whose answers wait for the client's windows (more than `CALL_ANSWER_BUDGET`) gets no
  more request credit: a client that does not read its answers cannot send more. Answers not
  yet written (queued for the client's windows, or in the transport) above `ANSWER_BUDGET` stop
  the delivery of further requests and their credit until the client reads; handlers awaiting
  `Call.writable` wait meanwhile. Above `ANSWER_LIMIT` the connection
  ends ENHANCE_YOUR_CALM. While the transport holds more than `WRITE_LIMIT`, reading pauses.
- `MAX_STREAMS` calls at once (SETTINGS_MAX_CONCURRENT_STREAMS, enforced by libnghttp2).
- Streams the client resets and PING/SETTINGS frames are rate limited (token buckets); past
  them, GOAWAY ENHANCE_YOUR_CALM. A client that sends no preface within `HANDSHAKE_TIMEOUT`
  seconds is dropped.
- A cancelled or reset call's buffered request bytes are released (and their credit given back
  on the connection) at once.
- Until a call on it carries a credential the server knows (`trust`, decided by the server at the
  call's HEADERS, before any of its DATA is credited), a connection keeps HTTP/2's default
  connection window (64 KiB) and `UNTRUSTED_BUDGET`: a client with no credential cannot make the
  bookie hold more than that.
- What every connection holds is also charged to the process's `ProcessBudget` (budget.py).

Failure modes: a message above `max_message_bytes` ends its call RESOURCE_EXHAUSTED,
a compressed one INTERNAL, an unknown method UNIMPLEMENTED; a client breaking HTTP/2 gets the
GOAWAY libnghttp2 chooses (or, for a fatal one, a GOAWAY naming the error: libnghttp2 destroys
its session then and writes none, so this one frame is packed here), and its connection closes.
A reset stream or a lost connection reaches the handler's `closed()` once.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from typing import Callable, Protocol

import grpc
import ngh2

from .budget import ProcessBudget
from .grpc_message import MessageBuffer, MessageError, message_parts, status_trailers

log = logging.getLogger("pybk.transport.ngh2_server")

RECEIVE_WINDOW = 4 * 1024 * 1024       # what a client may send ahead on one stream
CONNECTION_WINDOW = 8 * 1024 * 1024    # ... and on the whole connection
INBOUND_BUDGET = 32 * 1024 * 1024      # partial + undelivered + unconsumed request bytes of a connection
UNTRUSTED_BUDGET = 64 * 1024           # ... before a call on it carried a credential the server knows
ANSWER_BUDGET = 8 * 1024 * 1024        # answers not yet written before requests stop being delivered
CALL_ANSWER_BUDGET = RECEIVE_WINDOW // 2  # one call's answers waiting for windows before its credit stops
ANSWER_LIMIT = 64 * 1024 * 1024        # answers not yet written before the connection is ended
WRITE_LIMIT = 1024 * 1024              # bytes the transport holds before handlers wait and reading pauses
MAX_STREAMS = 1024                     # calls open at once (gRPC clients share one connection among calls)
MAX_HEADER_LIST = 16 * 1024
# streams a client may reset before they ended: at once, then per second. A gRPC client cancels a call
# it has what it needs from (pybk's own reads of one entry do), hundreds a second in a busy reader;
# a rapid-reset attack runs at thousands a second
RESET_BURST, RESET_RATE = 1000, 500.0
CONTROL_BURST, CONTROL_RATE = 2000, 500.0  # PING and SETTINGS frames: at once, then per second
HANDSHAKE_TIMEOUT = 10.0               # seconds to the client's connection preface and SETTINGS
LINGER = 1.0                           # seconds a failed connection is drained before it closes

_NO_ERROR, _PROTOCOL_ERROR, _INTERNAL_ERROR, _CANCEL, _ENHANCE_YOUR_CALM = 0x0, 0x1, 0x2, 0x8, 0xB
_OK_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
# a GOAWAY frame's header and fixed fields (length, type 0x7, flags, stream 0, last stream, code),
# for the one case the engine cannot write it: after a fatal error destroyed its session
_GOAWAY = struct.Struct(">I5xII")
# what one data_to_send returns at most: each call builds its output in a fresh buffer, and one of a
# 1 MiB answer (above malloc's mmap threshold) cost 1.9 ms of page faults against 0.26 ms in pieces
_CHUNK = 64 * 1024
_CONFIG = ngh2.Configuration(
    auto_window_update=False,                 # credit follows consumption (acknowledge_received_data)
    max_inbound_header_list_size=MAX_HEADER_LIST,
    # libnghttp2's own rapid-reset limit answers GOAWAY INTERNAL_ERROR and lets the streams open go
    # on; this module's tighter bucket ends the connection ENHANCE_YOUR_CALM first
    stream_reset_rate_limit=(2 * RESET_BURST, int(2 * RESET_RATE)),
)


class _Bucket:
    """A token bucket: `take` says whether one more event fits `burst` at once and `rate` per second."""

    __slots__ = ("burst", "rate", "tokens", "stamp")

    def __init__(self, burst: int, rate: float):
        self.burst, self.rate, self.tokens, self.stamp = burst, rate, float(burst), time.monotonic()

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class Handler(Protocol):
    """What a call's messages reach. Calls run on the loop and must not raise. A handler with a
    true `holds_messages` says itself when it consumed a message (`Call.consumed`); for others a
    message is consumed once `message()` returns."""

    def message(self, data: bytes | memoryview) -> None:
        """One request message, whole: bytes, or a memoryview of a buffer of its own when it
        spanned frames (nothing writes to it again)."""

    def end_of_input(self) -> None:
        """The client half-closed: no more messages."""

    def closed(self) -> None:
        """The call is over without trailers from this side (reset by the client, connection lost)."""


class Call:
    """One gRPC call on a connection: `headers` (the request's, as (name, value) pairs), `peer`,
    the SSL object of a TLS connection (`ssl_object`), and the methods that answer it."""

    def __init__(self, conn: "GrpcServerConnection", stream: int, path: str, headers: list[tuple[str, str]]):
        self._conn, self.stream, self.path, self.headers = conn, stream, path, headers
        self.handler: Handler | None = None
        self.holds = False                 # the handler says when it consumed a message (consumed())
        self.message = MessageBuffer()     # a request spread over DATA frames
        self.pending: deque = deque()      # whole requests waiting for delivery (answers backed up)
        self.received = 0                  # request bytes received (DATA payloads without padding)
        self.credited = 0                  # ... given back to the client
        self.taken = 0                     # ... consumed by the handler (message + 5-byte prefix)
        self.input_ended = False           # end_of_input delivered
        self.eos = False                   # END_STREAM received, end_of_input not yet delivered
        self.sent_headers = False
        self.finished = False              # trailers queued: nothing more goes out
        self._writable: asyncio.Future | None = None

    @property
    def peer(self) -> str:
        return self._conn.peer

    @property
    def ssl_object(self):
        return self._conn.ssl_object

    def send_headers(self, metadata: list[tuple[str, str]] = ()) -> None:
        """Send the answer's initial metadata now (else it goes with the first message)."""
        if not self.sent_headers and not self.finished:
            self.sent_headers = True
            self._conn.send_headers(self, _OK_HEADERS + [(k.encode(), v.encode()) for k, v in metadata])

    def send(self, message: bytes) -> None:
        """Send one answer message (already serialized)."""
        if self.finished:
            return
        if not self.sent_headers:
            self.sent_headers = True
            self._conn.send_headers(self, _OK_HEADERS)
        self._conn.send_message(self, message)

    def trust_connection(self) -> None:
        """This call carried a credential the server knows: its connection gets its full window
        and budget (until then, UNTRUSTED_BUDGET and HTTP/2's default window of 64 KiB)."""
        self._conn.trust()

    def consumed(self, nbytes: int) -> None:
        """The handler is done with `nbytes` of requests (each message's size plus 5): their
        flow-control credit goes back to the client. Only for handlers with `holds_messages`."""
        self._conn.taken(self, nbytes)

    async def writable(self) -> None:
        """Return once this call's answers are all handed to the transport and the connection is
        under its write limits: what a handler awaits after `send` so that a client that reads
        slowly slows it down. Cancelled if the call closes first."""
        if self._conn.can_write(self):
            return
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()
        self._conn.waiting.add(self)
        await self._writable

    def abandon(self, code: grpc.StatusCode, details: str) -> None:
        """End the call at once from this side: trailers with `code` (or, when answers are still
        queued, an RST_STREAM that drops them), RST_STREAM so the client stops sending."""
        self._conn.reset(self, code, details)

    def finish(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        """End the call with a status: trailers after every queued answer."""
        if self.finished:
            return
        self.finished = True
        self._conn.send_trailers(self, status_trailers(code, details))


class GrpcServerConnection(asyncio.Protocol):
    """One client connection. `route(call)` is asked for each new call's Handler (None: the method
    does not exist, answered UNIMPLEMENTED); it may answer the call itself with `call.finish`."""

    def __init__(self, route: Callable[[Call], Handler | None], max_message_bytes: int,
                 on_close: Callable[["GrpcServerConnection"], None] | None = None,
                 budget: ProcessBudget | None = None):
        self._route = route
        self._budget = budget
        self.trusted = False                # a call carried a known credential (trust())
        self._inbound_budget = UNTRUSTED_BUDGET
        self._answers = 0                   # answer bytes not yet written, as last charged to the budget
        self._max_message = max_message_bytes
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        self._h2: ngh2.Connection | None = None
        self.peer = ""
        self.ssl_object = None
        self._calls: dict[int, Call] = {}
        self._last_stream = 0
        self._spoke = False                 # the client's preface and SETTINGS arrived
        self.received = 0                   # reads from the client: the server's keepalive watches it
        self._closing = False
        self._going_away = False
        self._timer: asyncio.TimerHandle | None = None
        self._ended = False                 # EOF written, the close scheduled
        self._in_receive = False            # inside data_received: writes wait for its one flush
        self.paused = False                 # the transport holds more than WRITE_LIMIT
        self.held = 0                       # request bytes received and not yet consumed, all calls
        self._backed_up = False             # answers above ANSWER_BUDGET: delivery and credit wait
        self._queued = 0                    # answer bytes in the engine's queue at the last flush
        self._stalled: set[Call] = set()    # calls with requests or credit waiting for answers to drain
        self.waiting: set[Call] = set()     # calls whose handler awaits writable()
        self._resets: dict[int, int] = {}   # calls ended with trailers: RST_STREAM code once they are out
        self._reset_bucket = _Bucket(RESET_BURST, RESET_RATE)
        self._control_bucket = _Bucket(CONTROL_BURST, CONTROL_RATE)

    # ---- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")  # written as gRPC writes it, for logs
        self.peer = (f"ipv6:[{peer[0]}]:{peer[1]}" if ":" in peer[0] else f"ipv4:{peer[0]}:{peer[1]}") \
            if isinstance(peer, tuple) else str(peer)
        self.ssl_object = transport.get_extra_info("ssl_object")
        transport.set_write_buffer_limits(high=WRITE_LIMIT)
        h2 = self._h2 = ngh2.Connection(ngh2.Role.SERVER, _CONFIG)
        if self._budget is not None:
            loop = asyncio.get_running_loop()
            self._budget.join(id(self), lambda why: loop.call_soon(self._fail, _ENHANCE_YOUR_CALM, why))
        h2.initiate_connection({ngh2.Setting.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                                ngh2.Setting.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
                                ngh2.Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST})
        self._flush()
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT, self._handshake_over)

    def trust(self) -> None:
        """A call carried a credential the server knows: the full connection window and budget."""
        if self.trusted or self._h2 is None or self._closing:
            return
        self.trusted = True
        self._inbound_budget = INBOUND_BUDGET
        self._h2.set_local_window_size(CONNECTION_WINDOW)
        self._written()

    def _hold(self, nbytes: int) -> None:
        """Request bytes held (negative: released), on this connection and in the process budget."""
        self.held += nbytes
        if self._budget is not None:
            self._budget.charge(id(self), nbytes)

    def _handshake_over(self) -> None:
        if not self._spoke:
            self._fail(_PROTOCOL_ERROR, f"no HTTP/2 connection preface within {HANDSHAKE_TIMEOUT:g}s")

    def pause_writing(self) -> None:
        self.paused = True
        if self._transport is not None and not self._closing:
            self._transport.pause_reading()   # what the client sends would only queue more answers

    def resume_writing(self) -> None:
        self.paused = False
        if self._transport is not None and not self._closing:
            self._transport.resume_reading()
        self._after_write()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
        self._release()
        self._h2 = None
        if self._on_close is not None:
            self._on_close(self)

    @property
    def spoke(self) -> bool:
        """Whether the client's connection preface and SETTINGS arrived (the server's handshake timeout)."""
        return self._spoke

    def ping(self) -> None:
        """Send a PING (the server's keepalive): its ACK, like anything else read, counts in `received`."""
        if self._h2 is not None and not self._closing:
            self._h2.ping(b"pybk-srv")
            self._written()

    def goaway(self) -> None:
        """Tell the client that no new call will be taken here (GOAWAY, no error); the calls
        running go on."""
        h2 = self._h2
        if h2 is None or self._closing or self._going_away:
            return
        self._going_away = True
        h2.send_goaway(_NO_ERROR, last_stream_id=self._last_stream, debug_data=b"server stopping")
        self._flush()

    def close(self, why: str = "server shutting down") -> None:
        """GOAWAY (no error) and close once what is queued is written."""
        self._fail(_NO_ERROR, why)

    def _fail(self, code: int, why: str) -> None:
        """GOAWAY with the HTTP/2 error `code` and why, then close. What the client still sends is
        read and dropped for `LINGER` seconds, so that it gets the GOAWAY that says why."""
        transport = self._transport
        if transport is None or self._closing:
            return
        self._closing = True
        h2, out = self._h2, b""
        if h2 is not None:
            try:
                h2.send_goaway(code, last_stream_id=self._last_stream, debug_data=why.encode())
                out = h2.data_to_send()
            except ngh2.NGH2Error:
                h2 = None
        if h2 is None:  # the engine gave up on the connection: the GOAWAY is written here
            debug = why.encode()
            out = _GOAWAY.pack((8 + len(debug)) << 8 | 0x7, self._last_stream, code) + debug
        transport.write(out)
        transport.resume_reading()
        self._end_transport()

    def _end_transport(self) -> None:
        transport = self._transport
        self._closing = True
        self._release()
        if transport is None or self._ended:
            return
        self._ended = True
        try:
            if transport.can_write_eof():
                transport.write_eof()
        except OSError:  # the client is gone already
            transport.close()
            return
        asyncio.get_running_loop().call_later(LINGER, transport.close)

    # ---- receiving ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.received += 1
        h2 = self._h2
        if self._closing or h2 is None:
            return
        self._in_receive = True
        try:
            h2.receive_data(data)
            self._events(h2.events())
        except ngh2.DenialOfServiceError as exc:
            self._dead(_ENHANCE_YOUR_CALM, str(exc))
            return
        except ngh2.ConnectionProtocolError as exc:
            why = str(exc) if self._spoke else ("not an HTTP/2 connection preface (is the client speaking HTTP/1 "
                                                "or TLS to a plaintext port?)")
            self._dead(_PROTOCOL_ERROR, why)
            return
        except ngh2.NGH2Error as exc:
            log.warning("HTTP/2 engine failed on the connection from %s: %s", self.peer, exc)
            self._dead(_INTERNAL_ERROR, str(exc))
            return
        finally:
            self._in_receive = False
        self._flush()

    def _release(self) -> None:
        """A closing connection ends its calls at once (their handlers learn it now: nothing is
        written after the EOF) and lets go of what it holds, in the process budget too."""
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.message = MessageBuffer()
            call.pending.clear()
            call.finished = True
            self._drop(call)
        self._stalled.clear()
        self.held = self._answers = 0
        if self._budget is not None:
            self._budget.leave(id(self))

    def _dead(self, code: int, why: str) -> None:
        """The engine invalidated the connection (raised): GOAWAY written by hand, then close."""
        self._h2 = None
        self._fail(code, why)

    def _events(self, events: list) -> None:
        for event in events:
            kind = type(event)
            if kind is ngh2.DataReceived:
                self._data(event.stream_id, event.data, event.end_stream)
            elif kind is ngh2.RequestReceived:
                self._open(event.stream_id, event.headers, event.end_stream)
            elif kind is ngh2.TrailersReceived:
                if (call := self._calls.get(event.stream_id)) is not None:
                    self._end_of_input(call)
            elif kind is ngh2.StreamReset:
                if not self._reset_bucket.take(time.monotonic()):
                    self._fail(_ENHANCE_YOUR_CALM, f"more than {RESET_BURST} streams reset at once "
                                                   f"or {RESET_RATE:g} a second")
                    return
                self._closed(event.stream_id)
            elif kind is ngh2.StreamClosed:
                self._resets.pop(event.stream_id, None)
                self._closed(event.stream_id)
            elif kind is ngh2.PingReceived or kind is ngh2.SettingsReceived:
                self._spoke = True
                if not self._control_bucket.take(time.monotonic()):
                    self._fail(_ENHANCE_YOUR_CALM, f"more than {CONTROL_BURST} PING and SETTINGS frames at once "
                                                   f"or {CONTROL_RATE:g} a second")
                    return
            elif kind is ngh2.GoAwayReceived:
                self.close("client went away")
                return
            elif kind is ngh2.ConnectionClosed:   # the engine ended the connection (its GOAWAY is queued)
                self._closing = True
            if self._closing:
                return

    def _data(self, stream: int, data: bytes, end_stream: bool) -> None:
        n = len(data)
        call = self._calls.get(stream)
        if call is None:  # a call this side already ended: its bytes are credited at once
            if n:
                self._h2.acknowledge_received_data(n, stream)
            return
        call.received += n
        self._hold(n)
        if n:
            try:
                taken = call.message.take(data, self._max_message)
            except MessageError as exc:
                self.reset(call, exc.code, exc.details)
                return
            for message in taken:
                if call.pending or self._backed_up:
                    call.pending.append(message)
                    self._stalled.add(call)
                    continue
                call.handler.message(message)
                if call.stream not in self._calls:  # the handler ended the call
                    return
                if not call.holds:
                    call.taken += len(message) + 5
                    self._hold(-(len(message) + 5))
        if end_stream:
            self._end_of_input(call)
            if call.stream not in self._calls:
                return
        self._credit(call)

    def _end_of_input(self, call: Call) -> None:
        if call.message:
            self.reset(call, grpc.StatusCode.INTERNAL, "the request ended inside a message")
            return
        call.eos = True
        if not call.pending and not call.input_ended:
            call.eos = False
            call.input_ended = True
            call.handler.end_of_input()

    def _credit(self, call: Call) -> None:
        """Give the client back the window of what the handler consumed, and of a message still
        arriving (spanning frames, possibly above the stream window) while the connection holds
        less than INBOUND_BUDGET. Nothing while answers are backed up, on the connection or on the
        call (the call is looked at again as they drain)."""
        if self._backed_up or (self._queued and self._h2.queued_body_size(call.stream) > CALL_ANSWER_BUDGET):
            self._stalled.add(call)
            return
        ahead = call.message and self.held <= self._inbound_budget and not (self._budget and self._budget.tight)
        target = call.received if ahead else call.taken
        if target > call.credited:
            self._h2.acknowledge_received_data(target - call.credited, call.stream)
            call.credited = target

    def taken(self, call: Call, nbytes: int) -> None:
        """A holding handler consumed `nbytes` of its requests."""
        if self._calls.get(call.stream) is not call or self._h2 is None:
            return
        nbytes = min(nbytes, call.received - call.taken)
        call.taken += nbytes
        self._hold(-nbytes)
        self._credit(call)
        if not self._in_receive:
            self._flush()

    def _deliver(self, call: Call) -> None:
        """Hand a call the requests that waited for answers to drain."""
        while call.pending and not self._backed_up:
            message = call.pending.popleft()
            call.handler.message(message)
            if call.stream not in self._calls:
                return
            if not call.holds:
                call.taken += len(message) + 5
                self._hold(-(len(message) + 5))
        if not call.pending and call.eos and not call.input_ended:
            call.eos = False
            call.input_ended = True
            call.handler.end_of_input()
            if call.stream not in self._calls:
                return
        self._credit(call)

    def _open(self, stream: int, raw: tuple, ends: bool) -> None:
        self._spoke = True
        self._last_stream = max(self._last_stream, stream)
        try:
            headers = [(k.decode("ascii"), v.decode()) for k, v in raw]
        except UnicodeDecodeError:
            headers = None
        path = next((v for k, v in headers or () if k == ":path"), "")
        call = Call(self, stream, path, headers or [])
        self._calls[stream] = call
        if headers is None:
            self.reset(call, grpc.StatusCode.INTERNAL, "a request header that is not UTF-8")
            return
        if next((v for k, v in headers if k == "grpc-encoding"), "identity") not in ("identity", ""):
            self.reset(call, grpc.StatusCode.UNIMPLEMENTED, "compressed requests are not accepted")
            return
        handler = self._route(call)
        if call.finished:
            self._forget(call)
            return
        if handler is None:
            self.reset(call, grpc.StatusCode.UNIMPLEMENTED, f"method {path} is not served here")
            return
        call.handler = handler
        call.holds = getattr(handler, "holds_messages", False)
        if ends:
            call.input_ended = True
            handler.end_of_input()

    def _closed(self, stream: int) -> None:
        """The client reset the stream, or it closed: the call is over, its buffers released."""
        call = self._calls.get(stream)
        if call is not None:
            self._forget(call)
            call.finished = True
            self._drop(call)

    # ---- sending ------------------------------------------------------------------------------

    def send_headers(self, call: Call, block: list) -> None:
        h2 = self._h2
        if h2 is not None and not self._closing:
            try:
                h2.send_response(call.stream, block)
            except ngh2.StreamProtocolError:  # closed by the client; its event is on its way
                return
            self._written()

    def send_message(self, call: Call, message: bytes) -> None:
        h2 = self._h2
        if h2 is None or self._closing:
            return
        try:
            for part in message_parts(message):
                h2.send_data(call.stream, part)
        except ngh2.StreamProtocolError:
            return
        self._written()

    def send_trailers(self, call: Call, block: list) -> None:
        h2 = self._h2
        if h2 is None or self._closing:
            self._forget(call)
            return
        try:
            if call.sent_headers:
                h2.send_trailers(call.stream, block)
            else:  # trailers-only answer
                call.sent_headers = True
                h2.send_response(call.stream, _OK_HEADERS + block, end_stream=True)
        except ngh2.StreamProtocolError:
            self._forget(call)
            return
        if not call.input_ended:  # the call is over: tell the client to stop sending (RFC 9113 8.1)
            self._resets[call.stream] = _NO_ERROR
        self._forget(call)
        self._written()

    def reset(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        """End a call from this side for a fault of its request: trailers naming the fault, then
        RST_STREAM so that the client stops sending (answers still queued are dropped with an
        RST_STREAM instead, the one way to drop them); its handler learns it through closed()."""
        h2 = self._h2
        if h2 is not None and not self._closing and not call.finished:
            if h2.queued_body_size(call.stream):  # answers queued in this read go out first if they can
                while out := h2.data_to_send(_CHUNK):  # (its events are taken by the next flush)
                    self._transport.write(out)
            if h2.queued_body_size(call.stream):
                call.finished = True
                rst = _CANCEL if code is grpc.StatusCode.CANCELLED else \
                    _ENHANCE_YOUR_CALM if code is grpc.StatusCode.RESOURCE_EXHAUSTED else _INTERNAL_ERROR
                h2.reset_stream(call.stream, rst)
                self._written()
            else:
                call.finish(code, details)
        self._forget(call)
        self._drop(call)

    def _written(self) -> None:
        if not self._in_receive:
            self._flush()

    def _flush(self) -> None:
        """Write what the engine has framed (within the client's windows), send the RST_STREAMs
        due after trailers, and apply the answer budget."""
        h2, transport = self._h2, self._transport
        if h2 is None or transport is None or transport.is_closing():
            return  # a transport that failed a send: connection_lost is on its way
        try:
            while True:
                while out := h2.data_to_send(_CHUNK):
                    transport.write(out)
                events = h2.events()
                if events:
                    self._events(events)
                    continue
                if self._resets and not self._closing and self._send_resets(h2):
                    continue
                break
        except ngh2.NGH2Error as exc:
            log.warning("HTTP/2 engine failed on the connection from %s: %s", self.peer, exc)
            self._dead(_INTERNAL_ERROR, str(exc))
            return
        if self._closing:
            self._end_transport()
            return
        self._after_write()

    def _send_resets(self, h2: ngh2.Connection) -> bool:
        """RST_STREAM for the calls whose trailers are out (their queued answers gone and the
        windows open, so the engine framed the trailers in the last flush)."""
        sent = False
        open_conn = h2.remote_window_size > 0
        for stream, code in list(self._resets.items()):
            try:
                due = not h2.queued_body_size(stream) and open_conn and h2.stream_remote_window_size(stream) > 0
            except ngh2.StreamUnavailableError:
                del self._resets[stream]
                continue
            if due:
                del self._resets[stream]
                h2.reset_stream(stream, code)
                sent = True
        return sent

    def _after_write(self) -> None:
        """Release writers and stalled requests once answers drained; end a connection whose
        answers pile up past ANSWER_LIMIT."""
        h2, transport = self._h2, self._transport
        if h2 is None or transport is None or self._closing:
            return
        self._queued = h2.queued_body_size()
        backlog = self._queued + transport.get_write_buffer_size()
        if backlog > ANSWER_LIMIT:
            self._fail(_ENHANCE_YOUR_CALM, f"more than {ANSWER_LIMIT} bytes of answers left unread")
            return
        if self._budget is not None and backlog != self._answers:
            self._budget.charge(id(self), backlog - self._answers)
            self._answers = backlog
        self._backed_up = backlog > ANSWER_BUDGET
        if self._stalled and not self._backed_up:
            ready = [c for c in self._stalled if h2.queued_body_size(c.stream) <= CALL_ANSWER_BUDGET]
            if ready:
                self._stalled.difference_update(ready)
                for call in ready:
                    if self._calls.get(call.stream) is call:
                        self._deliver(call)
                self._flush()  # the credit given and the answers of what was delivered
                return
        if self.waiting:
            for call in list(self.waiting):
                if self.can_write(call):
                    self.waiting.discard(call)
                    w = call._writable
                    if w is not None and not w.done():
                        w.set_result(None)

    def can_write(self, call: Call) -> bool:
        """Whether a handler may send more: its answers all framed, the transport under its limit,
        the connection's answers under their budget."""
        h2 = self._h2
        return (h2 is not None and not self.paused and not self._backed_up
                and not h2.queued_body_size(call.stream))

    @property
    def buffered(self) -> int:
        """Answer bytes waiting for the client's windows, on every call of this connection."""
        return self._h2.queued_body_size() if self._h2 is not None else 0

    # ---- ending -------------------------------------------------------------------------------

    def _forget(self, call: Call) -> None:
        """Take a call off the connection, crediting back (on the connection) what it held."""
        if self._calls.pop(call.stream, None) is None:
            return
        self._hold(-(call.received - call.taken))
        call.taken = call.received
        call.pending.clear()
        call.message = MessageBuffer()
        self._stalled.discard(call)
        owed = call.received - call.credited
        if owed and self._h2 is not None and not self._closing:
            call.credited = call.received
            try:
                self._h2.acknowledge_received_data(owed, call.stream)
            except ngh2.NGH2Error:
                pass  # the stream is gone from the engine: its DATA counted as consumed there

    def _drop(self, call: Call) -> None:
        self.waiting.discard(call)
        if call._writable is not None:
            call._writable.cancel()
        if call.handler is not None:
            handler, call.handler = call.handler, None
            handler.closed()
