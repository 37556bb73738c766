"""A client's gRPC bidi stream whose HTTP/2 engine is libnghttp2 (through `ngh2`, Role.CLIENT):
a drop-in for pybk.proto.http2.GrpcStream, with the same interface and failure modes.

Why: framing, HPACK, flow control (the server's windows and frame size, SETTINGS taking effect
as RFC 9113 says, the ACK ahead of any frame that uses them), PING and SETTINGS acknowledgements
and the checks on what the server sends come from libnghttp2 rather than from hand-written code.
What stays here is what an engine cannot know: what a gRPC message is, which gRPC status a
reset, a GOAWAY or trailers mean (pybk.proto.http2.ClientStream, shared with pybk's own
framing), and when to write.

How it drives the engine: a message is queued with `send_data` (the 5-byte prefix joined to a
small message, a big one queued as it is, not copied), and what the engine has framed is written
at once with one `transport.write`; while a read is being handled, writes wait for the one flush
at its end, so an answer that makes the caller send the next batch costs one system call with
the acknowledgements of that read. Answers are taken from `DataReceived` events; the engine
gives the receive window back by itself (`auto_window_update`): every answer is handed to
`on_message` as it completes, nothing is held for later, and a message above
`max_receive_message_bytes` ends the stream before it is kept.

Failure modes beyond the shared ones: a server that breaks HTTP/2 gets the GOAWAY libnghttp2
chooses, and the stream ends INTERNAL naming its error code (and text); an error the engine
raises (the session is then gone) ends it INTERNAL naming the error.
"""
from __future__ import annotations

import asyncio
import struct

import grpc
import ngh2

from pybk.proto.http2 import PING_DATA, RECEIVE_WINDOW, SECRET_HEADERS, ClientStream

_PREFIX = struct.Struct(">BI")   # a gRPC message's prefix: compressed flag, length
_SMALL = 4096   # messages up to this size are joined to their prefix; bigger ones are queued as they are
# what one data_to_send may return: each call builds its output in a fresh bytearray and copies it into
# bytes, and above malloc's mmap threshold (128 KiB) both are new mappings, page-faulted in every time
# (a 270 KB batch in one call cost about 10x what it costs in 64 KiB pulls)
_CHUNK = 64 * 1024
_SETTINGS = {ngh2.Setting.ENABLE_PUSH: 0, ngh2.Setting.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW}
_CONFIG = ngh2.Configuration()   # the engine credits received DATA itself: answers are consumed as they arrive
_ERROR_NAMES = {int(code): code.name for code in ngh2.ErrorCode}


def _text(headers: tuple) -> list[tuple[str, str]]:
    """A header block as ngh2 gives it (bytes) as (name, value) strings."""
    return [(k.decode("ascii", "replace"), v.decode("utf-8", "replace")) for k, v in headers]


class GrpcStream(ClientStream):
    """A ClientStream framed by libnghttp2: see the module's notes."""

    def _prepare(self, headers: list[tuple[str, str]]) -> None:
        h2 = self._h2 = ngh2.Connection(ngh2.Role.CLIENT, _CONFIG)
        h2.initiate_connection(_SETTINGS)
        h2.set_local_window_size(RECEIVE_WINDOW)
        self._stream_id = h2.send_request(
            [ngh2.NeverIndexedHeader(k.encode(), v.encode()) if k in SECRET_HEADERS else (k.encode(), v.encode())
             for k, v in headers])
        self._in_receive = False           # inside data_received: writes wait for its one flush

    # ---- sending ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._started(transport):
            self._flush()   # the preface, SETTINGS, the window, the request and what was written before

    def write(self, message: bytes) -> None:
        """Send one gRPC message (as it is: already serialized)."""
        if self._ended:
            return
        h2, n = self._h2, len(message)
        try:
            if n <= _SMALL:
                h2.send_data(self._stream_id, _PREFIX.pack(0, n) + message)
            else:
                h2.send_data(self._stream_id, _PREFIX.pack(0, n))
                h2.send_data(self._stream_id, message)
        except ngh2.NGH2Error as exc:  # the stream is over in the engine; its event is being handled
            self._end(grpc.StatusCode.INTERNAL, f"the HTTP/2 engine refused a message: {exc}")
            return
        if not self._in_receive and self._transport is not None:
            self._flush()

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

    # ---- receiving --------------------------------------------------------------------------

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


def _name(code: int) -> str:
    """An HTTP/2 error code as its number and name."""
    name = _ERROR_NAMES.get(code)
    return f"{code} ({name})" if name else str(code)
