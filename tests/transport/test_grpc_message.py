"""gRPC's layer over HTTP/2 (pybk.transport.grpc_message): messages are put back together the
same however DATA payloads split them, the size limit and compression are refused before a
message is kept, and a call's status survives its trailers both ways."""
from __future__ import annotations

import random

import grpc
import pytest

from pybk.transport.grpc_message import (MessageBuffer, MessageError, call_status, message_parts,
                                         status_trailers)


def _wire(messages: list[bytes]) -> bytes:
    return b"".join(b"".join(message_parts(m)) for m in messages)


def _read(wire: bytes, cuts: list[int], limit: int = 1 << 24) -> list[bytes]:
    """The messages read from `wire` given as DATA payloads cut at `cuts`."""
    buffer = MessageBuffer()
    got: list[bytes] = []
    for a, b in zip([0, *cuts], [*cuts, len(wire)]):
        got += [bytes(m) for m in buffer.take(memoryview(wire)[a:b], limit)]
    assert not buffer
    return got


@pytest.mark.parametrize("seed", range(20))
def test_messages_survive_any_split_into_payloads(seed):
    rng = random.Random(seed)
    messages = [bytes([i]) * rng.choice([0, 1, 5, 100, 4096, 4097, 16_384, 40_000, 300_000]) for i in range(12)]
    wire = _wire(messages)
    cuts = sorted(rng.sample(range(1, len(wire)), min(len(wire) - 1, rng.choice([1, 5, 50, 500]))))
    assert _read(wire, []) == messages
    assert _read(wire, cuts) == messages


def test_every_byte_in_a_payload_of_its_own():
    messages = [b"a" * 20, b"", b"bc" * 900]
    wire = _wire(messages)
    assert _read(wire, list(range(1, len(wire)))) == messages


def test_a_message_above_the_limit_is_refused_before_it_is_kept():
    buffer = MessageBuffer()
    with pytest.raises(MessageError) as err:
        buffer.take(memoryview(message_parts(b"x" * 1000)[0][:15]), 999)
    assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details == "received message larger than max (1000 vs. 999 bytes)"


def test_a_compressed_message_is_refused_internal():
    with pytest.raises(MessageError) as err:
        MessageBuffer().take(b"\x01\x00\x00\x00\x01x", 100)
    assert err.value.code is grpc.StatusCode.INTERNAL


@pytest.mark.parametrize("details", ["", "plain", "100% sure: naïve\nline two"])
def test_a_status_survives_its_trailers(details):
    trailers = [(k.decode(), v.decode()) for k, v in status_trailers(grpc.StatusCode.PERMISSION_DENIED, details)]
    assert all(v.isascii() and "\n" not in v for _, v in trailers)
    assert call_status(trailers) == (grpc.StatusCode.PERMISSION_DENIED, details)


def test_an_answer_without_a_status_is_unknown_naming_the_http_status():
    assert call_status([(":status", "503")]) == (grpc.StatusCode.UNKNOWN, "HTTP status 503")
    assert call_status([(":status", "200")]) == (grpc.StatusCode.UNKNOWN, "the answer ended without a gRPC status")
