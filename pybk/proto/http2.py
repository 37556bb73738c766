"""HTTP/2 for gRPC calls on asyncio connections, without grpc.aio: the frames, gRPC messages
and their buffer shared by pybk's own server (pybk.proto.h2server), and a client's bidi stream
(`ClientStream`, with pybk's own framing in `GrpcStream`; the libnghttp2 one is
pybk.transport.ngh2_client.GrpcStream).

Why: with one add in flight, grpc.aio costs a client about 0.5 ms of CPU per message on two
cores, most of it handing every completion between gRPC's own threads and the event loop. Framing
the messages here, on the loop, costs about a quarter of that (`pybk bench floor --client h2`).
The wire does not change: the server sees an ordinary gRPC call.

What a client stream speaks (RFC 9113, gRPC's PROTOCOL-HTTP2): a connection of its own carrying
one stream. Requests go out as gRPC length-prefixed messages in DATA frames, within the server's
flow-control windows and frame size; answers come back the same way and are handed to
`on_message` in order, from the loop's read callback (no task, no future per message). PINGs and
SETTINGS are acknowledged at once.

Failure modes, each ending the stream exactly once through `on_end(code, details)` with a gRPC
status code: the server's trailers (its status), RST_STREAM, a GOAWAY with an error or one that
did not take the stream, the connection failing to open or closing, a protocol error or an answer
above `max_receive_message_bytes` (INTERNAL, RESOURCE_EXHAUSTED), and a keepalive PING left
unanswered while answers are awaited (UNAVAILABLE). `cancel()` ends it locally and calls nothing.
"""
from __future__ import annotations

import asyncio
import ssl as _ssl
import struct
from collections import deque
from typing import Callable, Iterator, Sequence
from urllib.parse import unquote

import grpc
import hpack

from pybk.transport import http2_engine

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME = struct.Struct(">BHBBI")           # length (24 bits as 8 + 16), type, flags, stream id
_DATA_MESSAGE = struct.Struct(">BHBBIBI")  # a DATA frame's header followed by a gRPC message prefix
SETTING = struct.Struct(">HI")
U32 = struct.Struct(">I")

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
_HEADER_TABLE_SIZE, _ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 1, 2, 4, 5

STREAM = 1                                 # the one stream of a connection
DEFAULT_WINDOW = 65_535                    # RFC 9113's initial windows, until the server's SETTINGS
DEFAULT_FRAME = 16_384
RECEIVE_WINDOW = 4 * 1024 * 1024           # what this side lets the server send ahead
_CODES = {c.value[0]: c for c in grpc.StatusCode}
# what a client's call ends with, by the RST_STREAM error code (else INTERNAL)
RST_CODES = {0x7: grpc.StatusCode.UNAVAILABLE,   # REFUSED_STREAM: the server never took it
             0x8: grpc.StatusCode.CANCELLED,
             0xB: grpc.StatusCode.RESOURCE_EXHAUSTED}  # ENHANCE_YOUR_CALM

CLOSED_AT_ONCE = "connection closed before the server spoke HTTP/2"
PING_DATA = b"pybk-ka!"                    # a client's keepalive PING
OnEnd = Callable[[grpc.StatusCode, str], None]


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: its 9-byte header and payload."""
    n = len(payload)
    return FRAME.pack(n >> 16, n & 0xFFFF, ftype, flags, stream) + payload


def header_frames(block: bytes, stream: int, flags: int, limit: int) -> list[bytes]:
    """An HPACK-coded header block as a HEADERS frame (with `flags`, e.g. END_STREAM) followed by
    CONTINUATION frames, none above `limit` bytes."""
    if len(block) <= limit:
        return [frame(HEADERS, END_HEADERS | flags, stream, block)]
    chunks = [block[i:i + limit] for i in range(0, len(block), limit)]
    return ([frame(HEADERS, flags, stream, chunks[0])] + [frame(CONTINUATION, 0, stream, c) for c in chunks[1:-1]]
            + [frame(CONTINUATION, END_HEADERS, stream, chunks[-1])])


def message_frame(message: bytes, stream: int) -> list:
    """One gRPC message (uncompressed) as one DATA frame: the parts, for writelines."""
    n = len(message)
    size = n + 5
    return [_DATA_MESSAGE.pack(size >> 16, size & 0xFFFF, DATA, 0, stream, 0, n), message]


def queue_message(out: deque, message: bytes) -> int:
    """Queue one gRPC message's bytes (prefix, then the message) for `data_frame`; returns their size."""
    out.append(memoryview(b"\x00" + U32.pack(len(message))))
    out.append(memoryview(message))
    return len(message) + 5


def data_frame(out: deque, room: int, stream: int) -> list:
    """The parts of one DATA frame carrying the first `room` bytes queued in `out` (at least that
    many are queued; a piece cut in two leaves its rest at the front), for writelines."""
    parts: list = [FRAME.pack(room >> 16, room & 0xFFFF, DATA, 0, stream)]
    n = 0
    while n < room:
        piece = out[0]
        take = min(len(piece), room - n)
        if take == len(piece):
            parts.append(out.popleft())
        else:
            parts.append(piece[:take])
            out[0] = piece[take:]
        n += take
    return parts


def unpadded(payload, flags: int, ftype: int):
    """A DATA or HEADERS frame's payload without its padding (and a HEADERS frame's priority
    fields); ValueError for padding longer than the frame."""
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise ValueError(f"bad {'DATA' if ftype == DATA else 'HEADERS'} padding")
        payload = payload[1:len(payload) - payload[0]]
    if ftype == HEADERS and flags & PRIORITY:
        payload = payload[5:]
    return payload


class MessageError(Exception):
    """A message that cannot be taken: the gRPC code and details its call ends with."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class FrameSizeError(Exception):
    """A frame above the DEFAULT_FRAME bytes neither side ever raised its SETTINGS_MAX_FRAME_SIZE to."""

    def __init__(self, size: int):
        super().__init__(f"a frame of {size} bytes, above the {DEFAULT_FRAME} allowed")


def frames(rx: bytearray, data: bytes) -> Iterator[tuple[int, int, int, memoryview]]:
    """The whole frames of `rx` (what earlier reads left of an unfinished frame) followed by
    `data`, as (type, flags, stream id, payload), in order; the rest of an unfinished frame is
    left in `rx`. A payload is a view of `data`, not a copy, except that of the one frame begun
    in an earlier read, which is copied once. FrameSizeError for a frame above DEFAULT_FRAME
    bytes, before any of it is kept."""
    pos, end = 0, len(data)
    if rx:
        if len(rx) < 9:  # its header was cut too
            pos = 9 - len(rx)
            rx += data[:pos]
            if len(rx) < 9:
                return
        n = (rx[0] << 16) | (rx[1] << 8) | rx[2]
        if n > DEFAULT_FRAME:
            raise FrameSizeError(n)
        take = 9 + n - len(rx)
        rx += data[pos:pos + take]
        pos += take
        if len(rx) < 9 + n:
            return
        whole = bytes(rx)
        rx.clear()
        _, _, ftype, flags, stream = FRAME.unpack_from(whole)
        yield ftype, flags, stream & 0x7FFFFFFF, memoryview(whole)[9:]
    view = memoryview(data)
    while end - pos >= 9:
        hi, lo, ftype, flags, stream = FRAME.unpack_from(data, pos)
        n = (hi << 16) | lo
        if n > DEFAULT_FRAME:
            raise FrameSizeError(n)
        if end - pos - 9 < n:
            break
        start = pos + 9
        pos = start + n
        yield ftype, flags, stream & 0x7FFFFFFF, view[start:pos]
    if pos < end:
        rx += view[pos:]


class MessageBuffer:
    """One direction of a call's gRPC messages, put back together from its DATA frames' payloads.
    A message that spans frames is copied once, into a buffer of its own that is then handed out
    as it is (a memoryview: decoders take it, nothing writes to it again); one that fits its frame
    is copied out of the frame. What is buffered is at most one message within the limit plus
    one frame."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def __bool__(self) -> bool:
        """True while part of a message is buffered."""
        return bool(self._buf)

    def take(self, payload, limit: int) -> list:
        """The messages that a DATA frame's `payload` completes, in order. MessageError for a
        compressed message (none is ever offered) or one above `limit` bytes."""
        buf = self._buf
        if not buf and len(payload) >= 5 and U32.unpack_from(payload, 1)[0] == len(payload) - 5:
            _check_prefix(payload, limit)  # the usual case: one whole message in one frame
            return [bytes(payload[5:])]
        buf += payload
        out = []
        while len(buf) >= 5:
            n = _check_prefix(buf, limit)
            if len(buf) < n + 5:
                break
            if len(buf) == n + 5:  # the buffer is this message alone: hand it out, start a new one
                out.append(memoryview(buf)[5:])
                buf = self._buf = bytearray()
                break
            out.append(bytes(buf[5:n + 5]))
            del buf[:n + 5]
        return out


def _check_prefix(prefix, limit: int) -> int:
    """The size a gRPC message prefix announces; MessageError for a compressed or oversize one."""
    if prefix[0] != 0:
        raise MessageError(grpc.StatusCode.INTERNAL, "a compressed message (no compression was offered)")
    n = U32.unpack_from(prefix, 1)[0]
    if n > limit:
        raise MessageError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"received message larger than max ({n} vs. {limit} bytes)")
    return n


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of host:port or [v6]:port; ValueError names an address without a port."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bookie address {address!r} has no port")
    return host.strip("[]"), int(port)


def request_headers(authority: str, path: str, scheme: str,
                    metadata: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A gRPC call's request headers: the pseudo-headers, then `metadata` (an `authorization`
    value is one to be sent never-indexed, see `SECRET_HEADERS`)."""
    return [(":method", "POST"), (":scheme", scheme), (":path", path), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers"), *metadata]


SECRET_HEADERS = frozenset({"authorization"})  # HPACK-coded never-indexed: no proxy's table keeps them


def call_status(headers: Sequence[tuple[str, str]]) -> tuple[grpc.StatusCode, str]:
    """The status a call's trailers (or a trailers-only answer) carry: grpc-status and
    grpc-message (percent-decoded); UNKNOWN without a grpc-status, with the HTTP status named
    when it is not 200."""
    status, message = None, ""
    for k, v in headers:
        if k == "grpc-status":
            status = int(v) if v.isdigit() else None
        elif k == "grpc-message":
            message = unquote(v)
        elif k == ":status" and v != "200":
            message = message or f"HTTP status {v}"
    code = _CODES.get(status, grpc.StatusCode.UNKNOWN)
    return code, message if status is not None or message else "the answer ended without a gRPC status"


class ClientStream(asyncio.Protocol):
    """A client's gRPC bidi stream on its own HTTP/2 connection, whatever frames it: create with
    `open`; `write` queues a message (before the connection is up too); answers reach
    `on_message(message)` (bytes, or a memoryview for one that spanned frames: see
    MessageBuffer), the server's initial metadata `on_headers(list of (name, value))`, the end
    `on_end(code, details)`. Callbacks run on the loop and must not raise.

    What every engine shares is here: connecting (TLS with ALPN h2), the keepalive, what the
    server's trailers, RST_STREAM and GOAWAY mean, and ending exactly once. A subclass frames:
    `write`, `cancel`, `connection_made`, `data_received` and `_ping`."""

    def __init__(self, authority: str, path: str, metadata: Sequence[tuple[str, str]], scheme: str,
                 on_message: Callable[[bytes], None], on_headers: Callable[[list], None], on_end: OnEnd,
                 awaiting: Callable[[], bool], max_receive_message_bytes: int,
                 keepalive: float, keepalive_timeout: float):
        self._loop = asyncio.get_running_loop()
        self._on_message, self._on_headers, self._on_end = on_message, on_headers, on_end
        self._awaiting = awaiting
        self._max_receive = max_receive_message_bytes
        self._transport: asyncio.Transport | None = None
        self._connecting: asyncio.Task | None = None
        self._ended = False
        self._spoke = False                # a SETTINGS frame came from the server
        self._got_headers = False          # the initial metadata arrived
        self._stream_id = STREAM
        self._message = MessageBuffer()    # an answer spread over DATA frames
        self._keepalive, self._keepalive_timeout = keepalive, keepalive_timeout
        self._heard = True                 # anything received since the last keepalive check
        self._ping_sent: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._prepare(request_headers(authority, path, scheme, metadata))

    def _prepare(self, headers: list[tuple[str, str]]) -> None:
        """Set up the framing of a call with these request headers (the subclass's)."""
        raise NotImplementedError

    @classmethod
    def open(cls, address: str, path: str, *, metadata: Sequence[tuple[str, str]] = (),
             ssl: _ssl.SSLContext | None = None, server_hostname: str | None = None,
             on_message: Callable[[bytes], None], on_headers: Callable[[list], None], on_end: OnEnd,
             awaiting: Callable[[], bool] = lambda: False, max_receive_message_bytes: int = 64 * 1024 * 1024,
             keepalive: float = 10.0, keepalive_timeout: float = 5.0) -> "ClientStream":
        """Start the stream to `address` (host:port) calling `path` (/package.Service/Method); TLS
        with `ssl` (ALPN h2 is set here). Returns at once: writes wait for the connection. While
        `awaiting()` says answers are due and nothing arrives for `keepalive` seconds, a PING
        goes out; unanswered for `keepalive_timeout` more, the stream ends UNAVAILABLE."""
        stream = cls(address, path, metadata, "https" if ssl else "http", on_message, on_headers, on_end,
                     awaiting, max_receive_message_bytes, keepalive, keepalive_timeout)
        if ssl is not None:
            ssl.set_alpn_protocols(["h2"])
        stream._connecting = stream._loop.create_task(stream._connect(address, ssl, server_hostname))
        return stream

    async def _connect(self, address: str, ssl, server_hostname: str | None) -> None:
        try:
            host, port = split_address(address)
            await self._loop.create_connection(lambda: self, host, port, ssl=ssl,
                                               server_hostname=(server_hostname or host) if ssl else None)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; a bad address a ValueError
            self._end(grpc.StatusCode.UNAVAILABLE, f"cannot connect to {address}: {exc}")

    def _started(self, transport: asyncio.BaseTransport) -> bool:
        """The connection is up: keep its transport and start the keepalive; False (and the
        connection closed) when the stream ended meanwhile."""
        if self._ended:
            transport.close()
            return False
        self._transport = transport
        if self._keepalive:
            self._timer = self._loop.call_later(self._keepalive, self._check_alive)
        return True

    def write(self, message: bytes) -> None:
        """Send one gRPC message (as it is: already serialized)."""
        raise NotImplementedError

    def cancel(self) -> None:
        """End the stream and its connection here (RST_STREAM CANCEL), without calling on_end."""
        raise NotImplementedError

    def _ping(self) -> None:
        """Send the keepalive's PING (payload PING_DATA)."""
        raise NotImplementedError

    # ---- what the server says ---------------------------------------------------------------

    def _answer(self, payload, ends: bool) -> None:
        """A DATA frame's payload (without padding) on the stream: the answers it completes;
        `ends`: it had END_STREAM (no trailers, so no status follows)."""
        try:
            for message in self._message.take(payload, self._max_receive):
                self._on_message(message)
        except MessageError as exc:
            self._end(exc.code, f"an answer from the server: {exc.details}")
            return
        if ends:
            self._end(grpc.StatusCode.INTERNAL, "the server ended the stream without a status")

    def _headers(self, headers: list[tuple[str, str]], ends: bool) -> None:
        """A header block on the stream: the initial metadata, or (the last, or one that ends
        the stream) the trailers with the call's status."""
        if not ends and not self._got_headers:
            self._got_headers = True
            self._on_headers(headers)
            return
        self._end(*call_status(headers))

    def _reset(self, code: int) -> None:
        """The server reset the stream with HTTP/2 error `code`."""
        self._end(RST_CODES.get(code, grpc.StatusCode.INTERNAL), f"the server reset the stream (HTTP/2 error {code})")

    def _goaway(self, last_stream: int, code: int, debug: bytes) -> None:
        """A GOAWAY: the stream ends if it carries an error or did not take the stream."""
        if code or last_stream < self._stream_id:
            text = debug.decode("utf-8", "replace")
            self._end(grpc.StatusCode.UNAVAILABLE, f"the server closed the connection (GOAWAY, HTTP/2 error "
                      f"{code}{': ' + text if text else ''})")

    def _broken(self, why: str) -> None:
        """The server broke HTTP/2's rules (`why`): the stream ends INTERNAL."""
        self._end(grpc.StatusCode.INTERNAL, f"HTTP/2 protocol error from the server: {why}")

    # ---- ending -----------------------------------------------------------------------------

    def _check_alive(self) -> None:
        """The keepalive: a PING after `keepalive` seconds of silence while answers are due."""
        if self._ended:
            return
        now = self._loop.time()
        if self._ping_sent is not None and now - self._ping_sent >= self._keepalive_timeout:
            self._end(grpc.StatusCode.UNAVAILABLE,
                      f"no answer to a keepalive PING within {self._keepalive_timeout:g}s")
            return
        if self._heard or not self._awaiting():
            self._heard = False
        elif self._ping_sent is None:
            self._ping_sent = now
            self._ping()
        delay = self._keepalive if self._ping_sent is None else self._keepalive_timeout
        self._timer = self._loop.call_later(delay, self._check_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        why = "connection closed" if self._spoke else CLOSED_AT_ONCE
        self._end(grpc.StatusCode.UNAVAILABLE, f"{why}: {exc}" if exc else why)

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._stop()
        self._on_end(code, details)

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        if self._transport is not None:
            self._transport.close()


class GrpcStream(ClientStream):
    """pybk's own framing of a ClientStream (a connection carrying one stream, id 1): requests go
    out as DATA frames within the server's flow-control windows and frame size, with one
    writelines per batch of frames; frames are parsed in the read callback; header blocks are
    HPACK-coded with the `hpack` library (three per stream: the request's, the answer's initial
    metadata and its trailers); PINGs and SETTINGS are acknowledged at once."""

    def _prepare(self, headers: list[tuple[str, str]]) -> None:
        self._request_headers = hpack.Encoder().encode(
            [hpack.NeverIndexedHeaderTuple(k, v) if k in SECRET_HEADERS else (k, v) for k, v in headers])
        self._decoder = hpack.Decoder()
        self._block = bytearray()          # a header block spread over CONTINUATION frames
        self._block_ends = False
        self._rx = bytearray()             # received bytes of a frame not yet whole
        self._unacked = 0                  # DATA bytes received and not yet given back by WINDOW_UPDATE
        self._out: deque[memoryview] = deque()  # message bytes waiting for window
        self._out_bytes = 0
        self._early: list[bytes] = []      # frames written before the connection was up
        self._send_window = DEFAULT_WINDOW  # the connection's
        self._stream_window = DEFAULT_WINDOW
        self._peer_initial = DEFAULT_WINDOW
        self._max_frame = DEFAULT_FRAME

    # ---- sending ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._started(transport):
            return
        settings = SETTING.pack(_ENABLE_PUSH, 0) + SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)
        transport.writelines([PREFACE, frame(SETTINGS, 0, 0, settings),
                              frame(WINDOW_UPDATE, 0, 0, U32.pack(RECEIVE_WINDOW - DEFAULT_WINDOW)),
                              # sent before the server's SETTINGS can raise the frame size
                              *header_frames(self._request_headers, STREAM, 0, DEFAULT_FRAME), *self._early])
        self._early = []
        self._pump()

    def write(self, message: bytes) -> None:
        """Send one gRPC message (as it is: already serialized)."""
        if self._ended:
            return
        size = len(message) + 5
        if not self._out and self._transport is not None and size <= self._max_frame \
                and size <= self._send_window and size <= self._stream_window:
            self._send_window -= size
            self._stream_window -= size
            self._transport.writelines(message_frame(message, STREAM))
            return
        self._out_bytes += queue_message(self._out, message)
        self._pump()

    def _pump(self) -> None:
        """Send queued message bytes as DATA frames while both windows allow, with one
        writelines (a batch's frames cost one system call, not one each)."""
        transport, out = self._transport, self._out
        if transport is None:
            return
        parts: list = []
        while out:
            room = min(self._send_window, self._stream_window, self._max_frame, self._out_bytes)
            if room <= 0:
                break
            self._send_window -= room
            self._stream_window -= room
            self._out_bytes -= room
            parts += data_frame(out, room, STREAM)
        if parts:
            transport.writelines(parts)

    def _send(self, frame: bytes) -> None:
        if self._transport is not None:
            self._transport.write(frame)
        else:
            self._early.append(frame)

    def _ping(self) -> None:
        self._send(frame(PING, 0, 0, PING_DATA))

    def cancel(self) -> None:
        """End the stream and its connection here (RST_STREAM CANCEL), without calling on_end."""
        if self._ended:
            return
        self._ended = True
        if self._transport is not None:
            self._transport.write(frame(RST_STREAM, 0, STREAM, U32.pack(0x8)))
        self._stop()

    # ---- receiving --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._heard = True
        try:
            for ftype, flags, stream, payload in frames(self._rx, data):
                if ftype == DATA:
                    self._data(payload, flags, stream)
                else:
                    self._control(ftype, flags, stream, bytes(payload))
                if self._ended:
                    return
        except (_ProtocolError, FrameSizeError) as exc:
            self._broken(str(exc))

    def _data(self, payload, flags: int, stream: int) -> None:
        size = len(payload)
        try:
            payload = unpadded(payload, flags, DATA)
        except ValueError as exc:
            raise _ProtocolError(str(exc)) from None
        self._unacked += size
        if self._unacked >= RECEIVE_WINDOW // 4:
            credit = U32.pack(self._unacked)
            self._unacked = 0
            self._send(frame(WINDOW_UPDATE, 0, 0, credit) + frame(WINDOW_UPDATE, 0, STREAM, credit))
        if stream == STREAM:
            self._answer(payload, bool(flags & END_STREAM))

    def _control(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == SETTINGS:
            if not flags & ACK:  # acknowledged first: the server holds this side to new values only from the ACK on
                self._spoke = True
                self._send(frame(SETTINGS, ACK, 0))
                self._settings(payload)
        elif ftype == PING:
            if flags & ACK:
                self._ping_sent = None
            else:
                self._send(frame(PING, ACK, 0, payload))
        elif ftype == WINDOW_UPDATE:
            if len(payload) != 4:
                raise _ProtocolError("a WINDOW_UPDATE that is not 4 bytes")
            credit = U32.unpack(payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self._send_window += credit
            elif stream == STREAM:
                self._stream_window += credit
            self._pump()
        elif ftype == HEADERS or ftype == CONTINUATION:
            self._header_frame(ftype, flags, stream, payload)
        elif ftype == RST_STREAM and stream == STREAM:
            self._reset(U32.unpack(payload[:4])[0] if len(payload) >= 4 else 0)
        elif ftype == GOAWAY:
            last, code = struct.unpack_from(">II", payload) if len(payload) >= 8 else (0, 0)
            self._goaway(last & 0x7FFFFFFF, code, payload[8:])
        # PRIORITY, PUSH_PROMISE (push is off) and unknown frame types carry nothing for this stream

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise _ProtocolError("a SETTINGS frame whose length is not a multiple of 6")
        for k in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, k)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                self._stream_window += value - self._peer_initial
                self._peer_initial = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self._max_frame = value
        self._pump()

    def _header_frame(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == HEADERS:
            try:
                payload = unpadded(payload, flags, HEADERS)
            except ValueError as exc:
                raise _ProtocolError(str(exc)) from None
            self._block = bytearray(payload)
            self._block_ends = bool(flags & END_STREAM)
        else:
            self._block += payload
        if not flags & END_HEADERS:
            return
        try:
            headers = self._decoder.decode(bytes(self._block))
        except hpack.HPACKError as exc:
            raise _ProtocolError(f"undecodable headers: {exc}") from None
        if stream == STREAM:
            self._headers(headers, self._block_ends)

    def _stop(self) -> None:
        super()._stop()
        self._out.clear()
        self._out_bytes = 0


def stream_class(engine: str | None = None) -> type[ClientStream]:
    """The client stream class of an HTTP/2 engine: `engine`, else PYBK_HTTP2_CLIENT_ENGINE,
    else PYBK_HTTP2_ENGINE, else `own` (pybk.transport.http2_engine). ValueError names an
    unknown one."""
    if http2_engine(engine, client=True) == "ngh2":
        from pybk.transport.ngh2_client import GrpcStream as Ngh2Stream
        return Ngh2Stream
    return GrpcStream


class _ProtocolError(Exception):
    """The server broke HTTP/2's rules: the stream ends INTERNAL."""
