"""Frames and gRPC messages are taken apart the same however the bytes are split into reads."""
from __future__ import annotations

import random
import struct

import grpc
import pytest

from pybk.proto import http2


def _wire(messages: list[bytes], frame_size: int) -> bytes:
    """The messages as gRPC-prefixed bytes cut into DATA frames of at most frame_size, with a
    PING between every few frames."""
    body = b"".join(b"\x00" + struct.pack(">I", len(m)) + m for m in messages)
    out = []
    for k, i in enumerate(range(0, len(body), frame_size)):
        out.append(http2.frame(http2.DATA, 0, 1, body[i:i + frame_size]))
        if k % 3 == 0:
            out.append(http2.frame(http2.PING, 0, 0, b"12345678"))
    return b"".join(out)


def _read(wire: bytes, cuts: list[int], limit: int = 1 << 24) -> tuple[list[bytes], int]:
    """(the messages, the PINGs) read from wire split at cuts."""
    rx = bytearray()
    buffer = http2.MessageBuffer()
    got: list[bytes] = []
    pings = 0
    for a, b in zip([0, *cuts], [*cuts, len(wire)]):
        for ftype, _, _, payload in http2.frames(rx, wire[a:b]):
            if ftype == http2.DATA:
                got += [bytes(m) for m in buffer.take(payload, limit)]
            else:
                assert bytes(payload) == b"12345678"
                pings += 1
    assert not rx and not buffer
    return got, pings


@pytest.mark.parametrize("seed", range(20))
def test_messages_and_frames_survive_any_split_into_reads(seed):
    rng = random.Random(seed)
    messages = [bytes([i]) * rng.choice([0, 1, 5, 100, 16_379, 16_384, 40_000, 300_000]) for i in range(12)]
    wire = _wire(messages, rng.choice([777, 4096, http2.DEFAULT_FRAME]))
    cuts = sorted(rng.sample(range(1, len(wire)), min(len(wire) - 1, rng.choice([1, 5, 50, 500]))))
    whole, pings = _read(wire, [])
    assert whole == messages
    assert _read(wire, cuts) == (messages, pings)


def test_every_byte_in_its_own_read_and_frames_of_three_bytes():
    messages = [b"a" * 20, b"", b"bc" * 900]
    wire = _wire(messages, 3)
    assert _read(wire, list(range(1, len(wire)))) == _read(wire, [])
    assert _read(wire, [])[0] == messages


def test_a_frame_above_the_frame_size_is_refused_from_its_header_alone():
    header = struct.pack(">BHBBI", 0, http2.DEFAULT_FRAME + 1, http2.DATA, 0, 1)
    rx = bytearray(header[:4])
    with pytest.raises(http2.FrameSizeError, match="16385 bytes"):
        list(http2.frames(rx, header[4:]))


def test_a_message_above_the_limit_is_refused_before_it_is_kept():
    buffer = http2.MessageBuffer()
    prefix = b"\x00" + struct.pack(">I", 1000)
    with pytest.raises(http2.MessageError) as err:
        buffer.take(memoryview(prefix + b"x" * 10), 999)
    assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
