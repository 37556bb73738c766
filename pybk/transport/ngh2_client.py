"""A client's gRPC stream on its own HTTP/2 connection, framed by libnghttp2 (through `ngh2`,
Role.CLIENT), without grpc.aio: the client's Add stream (ClientStream, bidi) and its range reads
and LAC follows (ServerStream: one request, a stream of answers), pybk.client.bookie_client.

Why not grpc.aio: with one add in flight, grpc.aio costs a client about 0.5 ms of CPU per message
on two cores, most of it handing every completion between gRPC's own threads and the event loop.
Here messages are written and answers read on the loop. The wire does not change: the server
sees an ordinary gRPC call. Why libnghttp2: framing, HPACK, flow control (the server's windows
and frame size, SETTINGS taking effect as RFC 9113 says, the ACK ahead of any frame that uses
them), PING and SETTINGS acknowledgements and the checks on what the server sends are a proven
engine's. What stays here is what an engine cannot know: when to write, and what the server's
trailers, RST_STREAM and GOAWAY mean for the call (grpc_message.py).

What it speaks (gRPC's PROTOCOL-HTTP2): a connection of its own carrying one stream. A message
is queued with `send_data` (the 5-byte prefix joined to a small message, a big one queued as it
is, not copied), and what the engine has framed is written at once; while a read is being
handled, writes wait for the one flush at its end, so an answer that makes the caller send the
next batch costs one system call with the acknowledgements of that read. Answers are taken from
`DataReceived` events, each handed to `on_message` in order as it completes, from the loop's
read callback (no task, no future per message); the engine gives the receive window back by
itself (`auto_window_update`), as nothing is held for later. A ServerStream's answers wait in a
queue for its caller, so they are paced: past `ahead` bytes not taken, what arrives is credited
back only as the caller takes it (the server is held to its window, and PINGs are still read and
answered, which pausing the socket would not do). A call per connection: on loopback the
handshake costs no more than a grpc.aio call, and the server needs no change; single-entry reads
stay on grpc.aio's shared channel, and so do range reads over TLS (its handshake per call costs
more than this transport saves), not follows (one call for many answers).

Failure modes, each ending the stream exactly once through `on_end(code, details)` with a gRPC
status code: the server's trailers (its status), RST_STREAM, a GOAWAY with an error or one that
did not take the stream, the connection failing to open or closing, an answer above
`max_receive_message_bytes` (RESOURCE_EXHAUSTED, before it is kept), a server that breaks
HTTP/2 (INTERNAL, naming the GOAWAY libnghttp2 sent it), an error the engine raises (INTERNAL),
and a keepalive PING left unanswered while answers are awaited (UNAVAILABLE). `cancel()` ends it
locally and calls nothing. A ServerStream raises them as CallError, and DEADLINE_EXCEEDED past
its timeout.
"""
from __future__ import annotations

import asyncio
import collections
import ssl as _ssl
from typing import Callable, Sequence

import grpc
import ngh2

from .grpc_message import (RST_CODES, SECRET_HEADERS, MessageBuffer, MessageError, call_status, message_parts,
                           request_headers)

RECEIVE_WINDOW = 4 * 1024 * 1024           # what this side lets the server send ahead
CLOSED_AT_ONCE = "connection closed before the server spoke HTTP/2"
PING_DATA = b"pybk-ka!"                    # the keepalive's PING
# what one data_to_send may return: each call builds its output in a fresh bytearray and copies it into
# bytes, and above malloc's mmap threshold (128 KiB) both are new mappings, page-faulted in every time
# (a 270 KB batch in one call cost about 10x what it costs in 64 KiB pulls)
_CHUNK = 64 * 1024
_SETTINGS = {ngh2.Setting.ENABLE_PUSH: 0, ngh2.Setting.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW}
_CONFIG = ngh2.Configuration()   # the engine credits received DATA itself: answers are consumed as they arrive
_PACED = ngh2.Configuration(auto_window_update=False)   # credit follows the caller taking answers
_ERROR_NAMES = {int(code): code.name for code in ngh2.ErrorCode}
OnEnd = Callable[[grpc.StatusCode, str], None]


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of host:port or [v6]:port; ValueError names an address without a port."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bookie address {address!r} has no port")
    return host.strip("[]"), int(port)


def _text(headers: tuple) -> list[tuple[str, str]]:
    """A header block as ngh2 gives it (bytes) as (name, value) strings."""
    return [(k.decode("ascii", "replace"), v.decode("utf-8", "replace")) for k, v in headers]


class ClientStream(asyncio.Protocol):
    """A client's gRPC bidi stream on its own HTTP/2 connection: create with `open`; `write`
    queues a message (before the connection is up too); answers reach `on_message(message)`
    (bytes, or a memoryview for one that spanned frames: see MessageBuffer), the server's
    initial metadata `on_headers(list of (name, value))`, the end `on_end(code, details)`.
    Callbacks run on the loop and must not raise."""

    def __init__(self, authority: str, path: str, metadata: Sequence[tuple[str, str]], scheme: str,
                 on_message: Callable[[bytes], None], on_headers: Callable[[list], None], on_end: OnEnd,
                 awaiting: Callable[[], bool], max_receive_message_bytes: int,
                 keepalive: float, keepalive_timeout: float, taking: Callable[[], bool] | None = None):
        self._loop = asyncio.get_running_loop()
        self._on_message, self._on_headers, self._on_end = on_message, on_headers, on_end
        self._awaiting = awaiting
        self._max_receive = max_receive_message_bytes
        self._transport: asyncio.Transport | None = None
        self._connecting: asyncio.Task | None = None
        self._ended = False
        self._spoke = False                # a SETTINGS frame came from the server
        self._got_headers = False          # the initial metadata arrived
        self._message = MessageBuffer()    # an answer spread over DATA frames
        self._keepalive, self._keepalive_timeout = keepalive, keepalive_timeout
        self._heard = True                 # anything received since the last keepalive check
        self._ping_sent: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_receive = False           # inside data_received: writes wait for its one flush
        self._taking = taking              # paced: credit for received DATA waits until it says True
        self._owed = 0                     # paced: DATA bytes received and not yet credited
        h2 = self._h2 = ngh2.Connection(ngh2.Role.CLIENT, _CONFIG if taking is None else _PACED)
        h2.initiate_connection(_SETTINGS)
        h2.set_local_window_size(RECEIVE_WINDOW)
        self._stream_id = h2.send_request(
            [ngh2.NeverIndexedHeader(k.encode(), v.encode()) if k in SECRET_HEADERS else (k.encode(), v.encode())
             for k, v in request_headers(authority, path, scheme, metadata)])

    @classmethod
    def open(cls, address: str, path: str, *, metadata: Sequence[tuple[str, str]] = (),
             ssl: _ssl.SSLContext | None = None, server_hostname: str | None = None,
             on_message: Callable[[bytes], None], on_headers: Callable[[list], None], on_end: OnEnd,
             awaiting: Callable[[], bool] = lambda: False, max_receive_message_bytes: int = 64 * 1024 * 1024,
             keepalive: float = 10.0, keepalive_timeout: float = 5.0,
             taking: Callable[[], bool] | None = None) -> "ClientStream":
        """Start the stream to `address` (host:port) calling `path` (/package.Service/Method); TLS
        with `ssl` (ALPN h2 is set here). Returns at once: writes wait for the connection. While
        `awaiting()` says answers are due and nothing arrives for `keepalive` seconds, a PING
        goes out; unanswered for `keepalive_timeout` more, the stream ends UNAVAILABLE. With
        `taking`, answers are paced: what arrives is credited back to the server (its window
        reopened) only while `taking()` says the caller takes more, else at `resume()`; so the
        server is held to the window while the caller is slow, and the connection is still read
        (PINGs answered)."""
        stream = cls(address, path, metadata, "https" if ssl else "http", on_message, on_headers, on_end,
                     awaiting, max_receive_message_bytes, keepalive, keepalive_timeout, taking)
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

    @property
    def spoke(self) -> bool:
        """The server spoke HTTP/2 (its SETTINGS came): false while connecting, or for a
        connection refused, reset or closed before that."""
        return self._spoke

    # ---- sending ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """The connection is up (the stream may have ended meanwhile: then it closes): start the
        keepalive and write the preface, SETTINGS, the window, the request and what was written
        before."""
        if self._ended:
            transport.close()
            return
        self._transport = transport
        if self._keepalive:
            self._timer = self._loop.call_later(self._keepalive, self._check_alive)
        self._flush()

    def write(self, message: bytes, last: bool = False) -> None:
        """Send one gRPC message (as it is: already serialized); `last`: the request ends with it
        (END_STREAM: a call with one request message)."""
        if self._ended:
            return
        h2 = self._h2
        try:
            *head, tail = message_parts(message)
            for part in head:
                h2.send_data(self._stream_id, part)
            h2.send_data(self._stream_id, tail, end_stream=last)
        except ngh2.NGH2Error as exc:  # the stream is over in the engine; its event is being handled
            self._end(grpc.StatusCode.INTERNAL, f"the HTTP/2 engine refused a message: {exc}")
            return
        if not self._in_receive and self._transport is not None:
            self._flush()

    def resume(self) -> None:
        """Paced: the caller takes answers again; what arrived is credited to the server."""
        if self._owed and not self._ended:
            self._credit()
            if not self._in_receive:
                self._flush()

    def _credit(self) -> None:
        try:
            self._h2.acknowledge_received_data(self._owed, self._stream_id)
        except ngh2.NGH2Error:
            pass  # the stream is over in the engine: its end is being handled
        self._owed = 0

    def _ping(self) -> None:
        self._h2.ping(PING_DATA)
        self._flush()

    def cancel(self) -> None:
        """End the stream and its connection here (RST_STREAM CANCEL), without calling on_end."""
        if self._ended:
            return
        self._ended = True
        if self._transport is not None:
            try:
                self._h2.reset_stream(self._stream_id, ngh2.ErrorCode.CANCEL)
                while out := self._h2.data_to_send(_CHUNK):
                    self._transport.write(out)
            except ngh2.NGH2Error:
                pass  # the engine gave up on the connection already: closing it is all that is left
        self._stop()

    def _flush(self) -> None:
        """Write what the engine has framed and handle the events that framing produced (a
        GOAWAY the engine sends ends the connection: its bytes go out first)."""
        h2, transport = self._h2, self._transport
        if transport is None or self._ended:
            return
        try:
            while True:
                out = h2.data_to_send(_CHUNK)
                if len(out) == _CHUNK:   # more may be ready: all of it goes out in one writelines
                    parts = [out]
                    while out := h2.data_to_send(_CHUNK):
                        parts.append(out)
                    transport.writelines(parts)
                elif out:
                    transport.write(out)
                events = h2.events()
                if not events:
                    return
                self._events(events)
                if self._ended:
                    return
        except ngh2.NGH2Error as exc:
            self._broken(f"the HTTP/2 engine failed: {exc}")

    # ---- receiving: the engine's events -------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._heard = True
        if self._ended:
            return
        h2 = self._h2
        self._in_receive = True
        try:
            h2.receive_data(data)
            self._events(h2.events())
        except ngh2.NGH2Error as exc:   # fatal: the engine destroyed the session
            self._broken(str(exc) or type(exc).__name__)
            return
        finally:
            self._in_receive = False
        if h2.want_write:   # acknowledgements, credit, or what the callbacks wrote (an empty pull costs more)
            self._flush()

    def _events(self, events: list) -> None:
        own = self._stream_id
        for event in events:
            kind = type(event)
            if kind is ngh2.DataReceived:
                if event.stream_id == own:
                    self._answer(event.data, event.end_stream)
            elif kind is ngh2.ResponseReceived:
                if event.stream_id == own:
                    self._headers(_text(event.headers), event.end_stream)
            elif kind is ngh2.TrailersReceived:
                if event.stream_id == own:
                    self._headers(_text(event.headers), True)
            elif kind is ngh2.SettingsReceived:
                self._spoke = True
            elif kind is ngh2.PingAcknowledged:
                self._ping_sent = None
            elif kind is ngh2.StreamReset:
                if event.stream_id == own:
                    self._reset(event.error_code)
            elif kind is ngh2.StreamClosed:
                if event.stream_id == own:  # closed by the engine, for an answer that broke HTTP/2
                    self._broken(f"the stream was closed (HTTP/2 error {_name(event.error_code)})")
            elif kind is ngh2.GoAwayReceived:
                self._goaway(event.last_stream_id, event.error_code, event.debug_data)
            elif kind is ngh2.ConnectionClosed:  # the engine ended the connection (its GOAWAY is written)
                text = event.debug_data.decode("utf-8", "replace")
                self._broken(f"HTTP/2 error {_name(event.error_code)}{': ' + text if text else ''}")
            if self._ended:
                return

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
        if self._taking is not None and not self._ended:
            self._owed += len(payload)
            if self._taking():
                self._credit()
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


def _name(code: int) -> str:
    """An HTTP/2 error code as its number and name."""
    name = _ERROR_NAMES.get(code)
    return f"{code} ({name})" if name else str(code)


class CallError(Exception):
    """A call that ended with a status other than OK: its gRPC `code` and `details`."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class ServerStream:
    """A call of one request message answered by a stream of messages (gRPC's unary-stream),
    on a ClientStream of its own: iterate its answers (bytes, or a memoryview: see
    MessageBuffer); an end other than OK raises CallError, after the answers before it.
    Answers are paced (ClientStream's `taking`): up to `ahead` bytes of them wait for the caller
    before the server is held to its window. `cancel()` ends the call and closes its connection
    (the caller that stops iterating calls it: nothing is left open); `timeout` seconds after
    the start it ends DEADLINE_EXCEEDED."""

    def __init__(self, address: str, path: str, request: bytes, *, metadata: Sequence[tuple[str, str]] = (),
                 ssl: _ssl.SSLContext | None = None, server_hostname: str | None = None,
                 max_receive_message_bytes: int = 64 * 1024 * 1024, keepalive: float = 10.0,
                 keepalive_timeout: float = 5.0, timeout: float | None = None, ahead: int = RECEIVE_WINDOW):
        self._loop = asyncio.get_running_loop()
        self._answers: collections.deque = collections.deque()
        self._held = 0                        # bytes of the answers not yet taken
        self._ahead = ahead
        self._status: tuple[grpc.StatusCode, str] | None = None
        self._waiter: asyncio.Future | None = None
        self._timer = None if timeout is None else self._loop.call_later(timeout, self._expired)
        self._stream = ClientStream.open(
            address, path, metadata=metadata, ssl=ssl, server_hostname=server_hostname, on_message=self._message,
            on_headers=_ignore, on_end=self._ended, awaiting=lambda: self._waiter is not None,
            max_receive_message_bytes=max_receive_message_bytes, keepalive=keepalive,
            keepalive_timeout=keepalive_timeout, taking=lambda: self._held < self._ahead)
        self._stream.write(request, last=True)

    def __aiter__(self) -> "ServerStream":
        return self

    @property
    def spoke(self) -> bool:
        """The server spoke HTTP/2 on this call's connection (ClientStream.spoke)."""
        return self._stream.spoke

    async def __anext__(self):
        answers = self._answers
        while not answers:
            if self._status is not None:
                code, details = self._status
                if code is grpc.StatusCode.OK:
                    raise StopAsyncIteration
                raise CallError(code, details)
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        answer = answers.popleft()
        held = self._held
        self._held = held - len(answer)
        if held >= self._ahead > self._held:
            self._stream.resume()
        return answer

    def cancel(self) -> None:
        """End the call here (RST_STREAM CANCEL) and close its connection; iterating it then
        raises CallError CANCELLED after the answers already received."""
        self._stream.cancel()
        self._ended(grpc.StatusCode.CANCELLED, "cancelled by the client")

    def _message(self, message) -> None:
        self._answers.append(message)
        self._held += len(message)
        self._wake()

    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        if self._status is None:
            self._status = (code, details)
            if self._timer is not None:
                self._timer.cancel()
            self._wake()

    def _expired(self) -> None:
        self._stream.cancel()
        self._ended(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _ignore(headers: list) -> None:
    """Initial metadata no caller of ServerStream needs."""
