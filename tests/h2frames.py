"""HTTP/2 frames written and read by hand (RFC 9113 section 4.1: a 9-byte header and a payload),
for the tests' raw peers: a broken or hostile client or server writes frames no engine would
(not a test module; pybk itself frames with libnghttp2)."""
from __future__ import annotations

import struct
from typing import Iterator

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER = struct.Struct(">BHBBI")   # length (24 bits as 8 + 16), type, flags, stream id
SETTING = struct.Struct(">HI")
U32 = struct.Struct(">I")

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 4, 5
DEFAULT_FRAME = 16_384    # the frame size neither side may exceed until the other raised it
DEFAULT_WINDOW = 65_535   # the initial windows, until SETTINGS or WINDOW_UPDATE change them


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: its 9-byte header and payload."""
    n = len(payload)
    return HEADER.pack(n >> 16, n & 0xFFFF, ftype, flags, stream) + payload


def frames(rx: bytearray, data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """The whole frames of what `rx` held and `data`, as (type, flags, stream id, payload); the
    rest of an unfinished frame stays in `rx`."""
    rx += data
    while len(rx) >= 9:
        hi, lo, ftype, flags, stream = HEADER.unpack_from(rx)
        n = (hi << 16) | lo
        if len(rx) < 9 + n:
            return
        payload = bytes(rx[9:9 + n])
        del rx[:9 + n]
        yield ftype, flags, stream & 0x7FFFFFFF, payload


def goaway(payload: bytes) -> tuple[int, int, bytes]:
    """A GOAWAY frame's payload as (last stream id, error code, debug data)."""
    last, code = struct.unpack_from(">II", payload)
    return last & 0x7FFFFFFF, code, payload[8:]
