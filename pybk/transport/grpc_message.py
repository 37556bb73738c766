"""What gRPC puts on top of HTTP/2 (gRPC's PROTOCOL-HTTP2), for pybk's server and its client's
Add stream alike: the 5-byte length prefix of every message and the buffer that puts messages
back together from DATA payloads (with the message size limit), a call's request headers, and
the mapping between a call's status and its trailers, RST_STREAM and GOAWAY codes.

Nothing here frames HTTP/2: libnghttp2 does (ngh2_server, ngh2_client). Each rule of the gRPC
layer is here once, so the server and the client cannot drift apart.
"""
from __future__ import annotations

import struct
from typing import Sequence
from urllib.parse import quote, unquote

import grpc

PREFIX = struct.Struct(">BI")   # a gRPC message's prefix: compressed flag, length
_U32 = struct.Struct(">I")
# messages up to this size are joined to their prefix (one small copy); bigger ones are handed to
# the engine as they are, not copied
_SMALL = 4096
_CODES = {c.value[0]: c for c in grpc.StatusCode}
# what a call ends with, by the HTTP/2 error code of the RST_STREAM that ended it (else INTERNAL)
RST_CODES = {0x7: grpc.StatusCode.UNAVAILABLE,   # REFUSED_STREAM: the server never took it
             0x8: grpc.StatusCode.CANCELLED,
             0xB: grpc.StatusCode.RESOURCE_EXHAUSTED}  # ENHANCE_YOUR_CALM
SECRET_HEADERS = frozenset({"authorization"})  # HPACK-coded never-indexed: no proxy's table keeps them
# grpc-message is percent-encoded: printable ASCII but '%' stays as it is
_MESSAGE_SAFE = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


def message_parts(message: bytes) -> tuple[bytes, ...]:
    """One uncompressed gRPC message as the parts to queue on its stream: the prefix joined to a
    small message, else the prefix and the message as it is."""
    n = len(message)
    if n <= _SMALL:
        return (PREFIX.pack(0, n) + message,)
    return PREFIX.pack(0, n), message


class MessageError(Exception):
    """A message that cannot be taken: the gRPC code and details its call ends with."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class MessageBuffer:
    """One direction of a call's gRPC messages, put back together from its DATA frames' payloads.
    A message that spans frames is kept as its frames until its last one came, then copied once
    into bytes of its own, handed out as a memoryview of them (growing one buffer frame by frame
    instead copied it again at each reallocation: a fifth of a bookie's CPU when taking 1 MiB
    batches); one that fits its frame is copied out of the frame. What is held is at most one
    message within the limit plus one frame, all of it received."""

    __slots__ = ("_parts", "_have", "_need")

    def __init__(self) -> None:
        self._parts: list = []   # the frames (views) of the message begun
        self._have = 0           # their bytes
        self._need = -1          # the message's bytes with its prefix, once its prefix came

    def __bool__(self) -> bool:
        """True while part of a message is buffered."""
        return bool(self._have)

    def take(self, payload, limit: int) -> list:
        """The messages that a DATA frame's `payload` completes, in order. MessageError for a
        compressed message (none is ever offered) or one above `limit` bytes."""
        if not self._have and len(payload) >= 5 and _U32.unpack_from(payload, 1)[0] == len(payload) - 5:
            _check_prefix(payload, limit)  # the usual case: one whole message in one frame
            return [bytes(payload[5:])]
        out = []
        data = memoryview(payload)
        while data:
            if not self._have and len(data) >= 5:   # a message starts here
                n = _check_prefix(data[:5], limit)
                if len(data) >= n + 5:              # and ends in this frame: copied out of it
                    out.append(bytes(data[5:n + 5]))
                    data = data[n + 5:]
                    continue
            parts = self._parts
            parts.append(data)
            self._have += len(data)
            if self._need < 0 and self._have >= 5:   # its prefix, perhaps over several frames
                self._need = _check_prefix(b"".join(bytes(p[:5]) for p in parts)[:5], limit) + 5
            if self._need < 0 or self._have < self._need:
                break
            extra = self._have - self._need          # the start of the next message, in this frame
            parts[-1] = data[:len(data) - extra]
            data = data[len(data) - extra:]
            out.append(memoryview(b"".join(parts))[5:])
            self._parts, self._have, self._need = [], 0, -1
        return out


def _check_prefix(prefix, limit: int) -> int:
    """The size a gRPC message prefix announces; MessageError for a compressed or oversize one."""
    if prefix[0] != 0:
        raise MessageError(grpc.StatusCode.INTERNAL, "a compressed message (no compression was offered)")
    n = _U32.unpack_from(prefix, 1)[0]
    if n > limit:
        raise MessageError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"received message larger than max ({n} vs. {limit} bytes)")
    return n


def request_headers(authority: str, path: str, scheme: str,
                    metadata: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A gRPC call's request headers: the pseudo-headers, then `metadata` (an `authorization`
    value is one to be sent never-indexed, see `SECRET_HEADERS`)."""
    return [(":method", "POST"), (":scheme", scheme), (":path", path), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers"), *metadata]


def status_trailers(code: grpc.StatusCode, details: str) -> list[tuple[bytes, bytes]]:
    """The trailers that end a call with `code` and `details` (grpc-message percent-encoded)."""
    block = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        block.append((b"grpc-message", quote(details, safe=_MESSAGE_SAFE).encode()))
    return block


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
