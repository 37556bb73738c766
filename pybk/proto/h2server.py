"""gRPC calls served directly over HTTP/2 on an asyncio server, without grpc.aio: the server's
half of `http2.GrpcStream`.

Why: a grpc.aio server hands every message it reads and every answer it writes between gRPC's own
threads and the event loop, about 0.45 ms of CPU per message on two cores
(`pybk bench floor --server h2` measures the difference). Here frames are parsed in the
transport's read callback and answers written with one `writelines`, with no thread, task or
future per message.

What it speaks (RFC 9113, gRPC's PROTOCOL-HTTP2): the client's connection preface and SETTINGS;
calls are client-opened streams whose HEADERS carry `:path` (HPACK-decoded with the `hpack`
library, a header list of at most `MAX_HEADER_LIST` bytes); requests are gRPC length-prefixed
messages in DATA frames, handed whole to the call's handler in order; answers go back as messages
within the client's flow-control windows and frame size, then trailers with `grpc-status`. PINGs
and SETTINGS are acknowledged at once. The receive windows are given back as messages are taken
apart, so what one connection holds is at most its window plus one message being reassembled.

Failure modes: a message above `max_message_bytes` ends its call RESOURCE_EXHAUSTED (trailers, then
RST_STREAM); a compressed message ends it INTERNAL; an unknown method UNIMPLEMENTED; a broken frame,
header block or preface ends the whole connection with GOAWAY naming the error. A reset stream or
a lost connection reaches the handler's `closed()` once. Nothing a client sends raises out of the
protocol.
"""
from __future__ import annotations

import asyncio
import struct
from collections import deque
from typing import Callable, Protocol
from urllib.parse import quote

import grpc
import hpack

from .http2 import (ACK, CONTINUATION, DATA, DEFAULT_FRAME, DEFAULT_WINDOW, END_HEADERS, END_STREAM, GOAWAY, HEADERS,
                    PING, PREFACE, RST_STREAM, SETTING, SETTINGS, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE,
                    U32, WINDOW_UPDATE, FrameSizeError, MessageBuffer, MessageError, data_frame, frame, frames,
                    header_frames, message_frame, queue_message, unpadded)

_MAX_CONCURRENT_STREAMS, _MAX_HEADER_LIST_SIZE = 3, 6   # the SETTINGS only a server sends

RECEIVE_WINDOW = 4 * 1024 * 1024    # what a client may send ahead, per stream and per connection
LINGER = 1.0                         # seconds a failed connection is drained before it closes
WRITE_LIMIT = 1024 * 1024            # bytes the transport holds before handlers' writes wait
MAX_WRITE_BUFFER = 16 * 1024 * 1024  # frames the client has not read; above it the connection is dropped
MAX_STREAMS = 1024   # calls open at once on a connection: gRPC clients share one connection among their
                     # channels, and count a call whose answers the application stopped reading as open
MAX_HEADER_LIST = 16 * 1024
_PROTOCOL_ERROR, _FLOW_CONTROL_ERROR, _FRAME_SIZE_ERROR, _REFUSED, _COMPRESSION, _ENHANCE_YOUR_CALM = \
    0x1, 0x3, 0x6, 0x7, 0x9, 0xB


class Handler(Protocol):
    """What a call's messages reach. Calls run on the loop and must not raise."""

    def message(self, data: bytes | memoryview) -> None:
        """One request message, whole: bytes, or a memoryview of a buffer of its own when it
        spanned frames (nothing writes to it again)."""

    def end_of_input(self) -> None:
        """The client half-closed: no more messages."""

    def closed(self) -> None:
        """The call is over without trailers from this side (reset by the client, connection lost)."""


class Call:
    """One gRPC call on a connection: `headers` (the request's, as (name, value) pairs),
    `peer`, the SSL object of a TLS connection (`ssl_object`), and the methods that answer it."""

    def __init__(self, conn: "GrpcServerConnection", stream: int, path: str, headers: list[tuple[str, str]]):
        self._conn, self.stream, self.path, self.headers = conn, stream, path, headers
        self.handler: Handler | None = None
        self.window = conn.peer_initial   # what this side may still send on the stream
        self.out: deque[memoryview] = deque()
        self.out_bytes = 0
        self.message = MessageBuffer()    # a request spread over DATA frames
        self.unacked = 0                  # request bytes taken, not yet credited back to the client
        self.allowed = RECEIVE_WINDOW     # what the client may still send on the stream
        self.input_ended = False
        self.sent_headers = False
        self.finished = False             # trailers queued: nothing more goes out
        self.trailers: bytes | None = None
        self._writable: asyncio.Future | None = None

    @property
    def peer(self) -> str:
        return self._conn.peer

    @property
    def ssl_object(self):
        return self._conn.ssl_object

    def trust_connection(self) -> None:
        """A known credential: this engine gives every connection its full window from the start."""

    def send_headers(self, metadata: list[tuple[str, str]] = ()) -> None:
        """Send the answer's initial metadata now (else it goes with the first message)."""
        if not self.sent_headers and not self.finished:
            self.sent_headers = True
            self._conn.send_headers(self.stream, [(":status", "200"), ("content-type", "application/grpc"),
                                                  *metadata])

    def send(self, message: bytes) -> None:
        """Send one answer message (already serialized)."""
        if self.finished:
            return
        self.send_headers()
        self._conn.send_message(self, message)

    def consumed(self, nbytes: int) -> None:
        """Nothing: this server credits requests as it takes them apart (the ngh2 engine credits
        them when a holding handler says it consumed them)."""

    async def writable(self) -> None:
        """Return once every answer sent is handed to the connection and the connection is not
        holding more than its write limit: what a handler awaits after `send` so that a client that
        reads slowly slows it down. Cancelled if the call closes first."""
        if not self.out_bytes and not self._conn.paused:
            return
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()
        await self._writable

    def wake(self) -> None:
        """Release a `writable` waiter if the call can take more."""
        w = self._writable
        if w is not None and not w.done() and not self.out_bytes and not self._conn.paused:
            w.set_result(None)

    def abandon(self, code: grpc.StatusCode, details: str) -> None:
        """End the call at once from this side (a stream the server gives up on): queued answers
        dropped, trailers, RST_STREAM so the client stops sending."""
        self._conn.reset(self, code, details)

    def finish(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        """End the call with a status: trailers after every queued answer."""
        if self.finished:
            return
        self.finished = True
        block = [("grpc-status", str(code.value[0]))]
        if details:
            block.append(("grpc-message", quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")))
        if not self.sent_headers:  # trailers-only answer
            self.sent_headers = True
            block = [(":status", "200"), ("content-type", "application/grpc"), *block]
        self._conn.send_trailers(self, block)


class GrpcServerConnection(asyncio.Protocol):
    """One client connection. `route(call)` is asked for each new call's Handler (None: the method
    does not exist, answered UNIMPLEMENTED); it may answer the call itself with `call.finish`."""

    def __init__(self, route: Callable[[Call], Handler | None], max_message_bytes: int,
                 on_close: Callable[["GrpcServerConnection"], None] | None = None, budget=None):
        self._route = route
        self._max_message = max_message_bytes
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        self.peer = ""
        self.ssl_object = None
        self._preface = False
        self._rx = bytearray()
        self._calls: dict[int, Call] = {}
        self._last_stream = 0
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._encoder = hpack.Encoder()
        self._block = bytearray()           # a header block spread over CONTINUATION frames
        self._block_stream = 0
        self._block_ends = False
        self._send_window = DEFAULT_WINDOW  # the connection's, towards the client
        self.peer_initial = DEFAULT_WINDOW
        self._max_frame = DEFAULT_FRAME
        self._unacked = 0                   # connection-level DATA received, not yet credited back
        self._allowed = RECEIVE_WINDOW      # what the client may still send on the connection
        self._closing = False
        self._linger: asyncio.TimerHandle | None = None
        self.paused = False                 # the transport holds more than its write limit
        self._going_away = False            # GOAWAY sent: no new calls
        self.received = 0                   # reads from the client: the server's keepalive watches it

    # ---- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")  # written as gRPC writes it, for logs
        self.peer = (f"ipv6:[{peer[0]}]:{peer[1]}" if ":" in peer[0] else f"ipv4:{peer[0]}:{peer[1]}") \
            if isinstance(peer, tuple) else str(peer)
        self.ssl_object = transport.get_extra_info("ssl_object")
        transport.set_write_buffer_limits(high=WRITE_LIMIT)
        settings = (SETTING.pack(_MAX_CONCURRENT_STREAMS, MAX_STREAMS)
                    + SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)
                    + SETTING.pack(_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST))
        transport.writelines([frame(SETTINGS, 0, 0, settings),
                              frame(WINDOW_UPDATE, 0, 0, U32.pack(RECEIVE_WINDOW - DEFAULT_WINDOW))])

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for call in list(self._calls.values()):
            call.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._linger is not None:
            self._linger.cancel()
        calls, self._calls = self._calls, {}
        for call in calls.values():
            self._drop(call)
        if self._on_close is not None:
            self._on_close(self)

    @property
    def spoke(self) -> bool:
        """Whether the client's connection preface arrived (the server's handshake timeout)."""
        return self._preface

    def ping(self) -> None:
        """Send a PING (the server's keepalive): its ACK, like anything else read, counts in `received`."""
        if self._transport is not None and not self._closing:
            self._transport.write(frame(PING, 0, 0, b"pybk-srv"))

    def goaway(self) -> None:
        """Tell the client that no new call will be taken here (GOAWAY, no error); the calls
        running go on. A call opened after it is refused (RST_STREAM REFUSED_STREAM), which a
        gRPC client retries on another connection."""
        if self._transport is not None and not self._closing and not self._going_away:
            self._going_away = True
            self._transport.write(frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream, 0) + b"server stopping"))

    def close(self, why: str = "server shutting down") -> None:
        """GOAWAY (no error) and close once what is queued is written."""
        self._fail(0, why)

    def _fail(self, code: int, why: str) -> None:
        """GOAWAY with the HTTP/2 error `code` (0: none) and why, then close. What the client still
        sends is read and dropped for `LINGER` seconds: closing a socket with unread bytes resets
        it, and the client would lose the GOAWAY that says why."""
        transport = self._transport
        if transport is None or self._closing:
            return
        self._closing = True
        transport.write(frame(GOAWAY, 0, 0, struct.pack(">II", self._last_stream, code) + why.encode()))
        calls, self._calls = self._calls, {}  # the calls in flight end with the connection, and their
        for call in calls.values():           # handlers learn it now: nothing is written after the EOF
            self._drop(call)
        try:
            if transport.can_write_eof():
                transport.write_eof()
        except OSError:  # the client is gone already
            transport.close()
            return
        self._linger = asyncio.get_running_loop().call_later(LINGER, transport.close)

    # ---- receiving ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.received += 1
        if self._closing:
            return
        if not self._preface:
            data = bytes(self._rx) + data
            self._rx.clear()
            if not PREFACE.startswith(data[:len(PREFACE)]):
                self._fail(_PROTOCOL_ERROR, "not an HTTP/2 connection preface (is the client speaking HTTP/1 "
                                            "or TLS to a plaintext port?)")
                return
            if len(data) < len(PREFACE):
                self._rx += data
                return
            self._preface = True
            data = data[len(PREFACE):]
        try:
            for ftype, flags, stream, payload in frames(self._rx, data):
                if self._block_stream and ftype != CONTINUATION:
                    raise _ConnectionError(_PROTOCOL_ERROR, "a header block interrupted by another frame")
                if ftype == DATA:
                    self._data(payload, flags, stream)
                else:
                    self._control(ftype, flags, stream, bytes(payload))
                if self._closing:
                    return
        except FrameSizeError as exc:
            self._fail(_FRAME_SIZE_ERROR, str(exc))
            return
        except _ConnectionError as exc:
            self._fail(exc.code, exc.why)
            return
        if self._transport is not None and self._transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self._fail(_ENHANCE_YOUR_CALM, f"more than {MAX_WRITE_BUFFER} bytes of frames left unread")

    def _data(self, payload, flags: int, stream: int) -> None:
        size = len(payload)
        if size > self._allowed:
            raise _ConnectionError(_FLOW_CONTROL_ERROR, "DATA beyond the connection's flow-control window")
        self._allowed -= size
        self._unacked += size
        if self._unacked >= RECEIVE_WINDOW // 4:
            self._transport.write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self._unacked)))
            self._allowed += self._unacked
            self._unacked = 0
        if stream == 0:
            raise _ConnectionError(_PROTOCOL_ERROR, "DATA on stream 0")
        call = self._calls.get(stream)
        if call is None:
            return  # a call this side already ended: its bytes count for the connection only
        if size > call.allowed:
            raise _ConnectionError(_FLOW_CONTROL_ERROR, f"DATA beyond stream {stream}'s flow-control window")
        call.allowed -= size
        try:
            payload = unpadded(payload, flags, DATA)
        except ValueError as exc:
            raise _ConnectionError(_PROTOCOL_ERROR, str(exc)) from None
        call.unacked += size
        if call.unacked >= RECEIVE_WINDOW // 4 and call.out_bytes < RECEIVE_WINDOW:
            self._credit(call)
        try:
            taken = call.message.take(payload, self._max_message)
        except MessageError as exc:
            self.reset(call, exc.code, exc.details)
            return
        for message in taken:
            call.handler.message(message)
            if call.stream not in self._calls:  # the handler ended the call
                return
        if flags & END_STREAM:
            if call.message:
                self.reset(call, grpc.StatusCode.INTERNAL, "the request ended inside a message")
                return
            call.input_ended = True
            call.handler.end_of_input()

    def _credit(self, call: Call) -> None:
        """Give the client back the stream window its taken requests used. Held back while the
        call's answers wait for the client's own window: a client that does not read its answers
        stops being able to send, so neither side's bytes pile up here."""
        self._transport.write(frame(WINDOW_UPDATE, 0, call.stream, U32.pack(call.unacked)))
        call.allowed += call.unacked
        call.unacked = 0

    def reset(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        """End a call from this side for a fault of its request: its queued answers dropped,
        trailers naming the fault, RST_STREAM so that the client stops sending; its handler
        learns it through closed()."""
        call.out.clear()
        call.out_bytes = 0
        call.finish(code, details)  # trailers, then RST_STREAM NO_ERROR: the client stops sending
        self._forget(call)
        self._drop(call)

    def _control(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == HEADERS or ftype == CONTINUATION:
            self._header_frame(ftype, flags, stream, payload)
        elif ftype == SETTINGS:
            if stream:
                raise _ConnectionError(_PROTOCOL_ERROR, "SETTINGS on a stream")
            if not flags & ACK:
                self._transport.write(frame(SETTINGS, ACK, 0))
                self._settings(payload)
        elif ftype == PING:
            if not flags & ACK:
                if len(payload) != 8:
                    raise _ConnectionError(_FRAME_SIZE_ERROR, "a PING that is not 8 bytes")
                self._transport.write(frame(PING, ACK, 0, payload))
        elif ftype == WINDOW_UPDATE:
            if len(payload) != 4:
                raise _ConnectionError(_FRAME_SIZE_ERROR, "a WINDOW_UPDATE that is not 4 bytes")
            credit = U32.unpack(payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self._send_window += credit
                if self._send_window > 0x7FFFFFFF:
                    raise _ConnectionError(_FLOW_CONTROL_ERROR, "the connection's send window above 2^31-1")
                for call in list(self._calls.values()):
                    self._pump(call)
            elif (call := self._calls.get(stream)) is not None:
                call.window += credit
                self._pump(call)
        elif ftype == RST_STREAM:
            call = self._calls.get(stream)
            if call is not None:
                self._forget(call)
                call.finished = True
                self._drop(call)
        elif ftype == GOAWAY:
            self.close("client went away")
        # PRIORITY and unknown frame types carry nothing here; PUSH_PROMISE never comes to a server

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise _ConnectionError(_FRAME_SIZE_ERROR, "a SETTINGS frame whose length is not a multiple of 6")
        for k in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, k)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > 0x7FFFFFFF:
                    raise _ConnectionError(_FLOW_CONTROL_ERROR, "an initial window above 2^31-1")
                for call in self._calls.values():
                    call.window += value - self.peer_initial
                self.peer_initial = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 0xFFFFFF:
                    raise _ConnectionError(_PROTOCOL_ERROR, f"a max frame size of {value}")
                self._max_frame = value
        for call in list(self._calls.values()):
            self._pump(call)

    def _header_frame(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == HEADERS:
            if stream == 0 or stream % 2 == 0:
                raise _ConnectionError(_PROTOCOL_ERROR, f"HEADERS on stream {stream}")
            try:
                payload = unpadded(payload, flags, HEADERS)
            except ValueError as exc:
                raise _ConnectionError(_PROTOCOL_ERROR, str(exc)) from None
            self._block = bytearray(payload)
            self._block_stream, self._block_ends = stream, bool(flags & END_STREAM)
        else:
            if stream != self._block_stream or not stream:
                raise _ConnectionError(_PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            self._block += payload
        if len(self._block) > MAX_HEADER_LIST:
            raise _ConnectionError(_PROTOCOL_ERROR, f"a header block above {MAX_HEADER_LIST} bytes")
        if not flags & END_HEADERS:
            return
        self._block_stream = 0
        try:
            headers = self._decoder.decode(bytes(self._block))
        except hpack.HPACKError as exc:
            raise _ConnectionError(_COMPRESSION, f"undecodable headers: {exc}") from None
        call = self._calls.get(stream)
        if call is not None:  # trailers from the client: the end of its requests
            if self._block_ends and call.handler is not None and not call.input_ended:
                call.input_ended = True
                call.handler.end_of_input()
            return
        if stream <= self._last_stream:
            return  # a call already over; its late headers change nothing
        self._last_stream = stream
        self._open(stream, headers, self._block_ends)

    def _open(self, stream: int, headers: list, ends: bool) -> None:
        if len(self._calls) >= MAX_STREAMS or self._going_away:
            self._transport.write(frame(RST_STREAM, 0, stream, U32.pack(_REFUSED)))
            return
        pairs = [(k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
                 for k, v in headers]
        path = next((v for k, v in pairs if k == ":path"), "")
        call = Call(self, stream, path, pairs)
        self._calls[stream] = call
        if next((v for k, v in pairs if k == "grpc-encoding"), "identity") not in ("identity", ""):
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
        if ends:
            call.input_ended = True
            handler.end_of_input()

    # ---- sending ------------------------------------------------------------------------------

    def send_headers(self, stream: int, block: list[tuple[str, str]]) -> None:
        if self._transport is not None and not self._closing:
            self._transport.writelines(header_frames(self._encoder.encode(block), stream, 0, self._max_frame))

    def send_message(self, call: Call, message: bytes) -> None:
        transport = self._transport
        if transport is None or self._closing:  # closing: its EOF is written, a write would raise
            return
        size = len(message) + 5
        if not call.out and size <= self._max_frame and size <= self._send_window and size <= call.window:
            self._send_window -= size
            call.window -= size
            transport.writelines(message_frame(message, call.stream))
            return
        call.out_bytes += queue_message(call.out, message)
        self._pump(call)

    def send_trailers(self, call: Call, block: list[tuple[str, str]]) -> None:
        call.trailers = b"".join(header_frames(self._encoder.encode(block), call.stream, END_STREAM, self._max_frame))
        self._pump(call)

    def _pump(self, call: Call) -> None:
        """Send a call's queued answer bytes as DATA frames while both windows allow, then its
        trailers once nothing is queued."""
        transport, out = self._transport, call.out
        if transport is None or self._closing:
            return
        while out:
            room = min(self._send_window, call.window, self._max_frame, call.out_bytes)
            if room <= 0:
                return
            self._send_window -= room
            call.window -= room
            call.out_bytes -= room
            transport.writelines(data_frame(out, room, call.stream))
        if call.unacked >= RECEIVE_WINDOW // 4:
            self._credit(call)
        call.wake()
        if call.trailers is not None:
            transport.write(call.trailers)
            call.trailers = None
            if not call.input_ended:  # the call is over: tell the client to stop sending (RFC 9113 8.1)
                transport.write(frame(RST_STREAM, 0, call.stream, U32.pack(0)))
            self._forget(call)

    @property
    def buffered(self) -> int:
        """Answer bytes waiting for the client's windows, on every call of this connection."""
        return sum(c.out_bytes for c in self._calls.values())

    # ---- ending -------------------------------------------------------------------------------

    def _forget(self, call: Call) -> None:
        self._calls.pop(call.stream, None)

    @staticmethod
    def _drop(call: Call) -> None:
        """The call is over without trailers: its answers dropped, its writes refused from now on
        (`finished`), its handler told once."""
        call.finished = True
        call.out.clear()
        call.out_bytes = 0
        if call._writable is not None:
            call._writable.cancel()
        if call.handler is not None:
            handler, call.handler = call.handler, None
            handler.closed()


class _ConnectionError(Exception):
    """The client broke HTTP/2's rules: GOAWAY with `code`, and the connection closes."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code, self.why = code, why
