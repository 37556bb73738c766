"""Messages that carry many entry bodies, encoded (and an AddBatch's runs decoded) by hand so that the
bodies are copied once.

A PACKED ReadResults carries up to a few MiB of entry bodies in one `bytes` field, and an
AddBatch's packed runs (AddRun) carry theirs the same way. Through protobuf the bodies would be
joined, copied into the message and copied again by SerializeToString. Here protobuf serializes
only the small fields and the bodies are appended as they are (from the bookie's read buffers, or
the client's encoded entries, the same bytes for every bookie). Protobuf accepts fields in any
order, so the results are ordinary messages on the wire: FromString decodes them.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from google.protobuf.message import DecodeError, Message

from . import bookie_pb2 as pb

MESSAGE_HEADROOM = 4 * 1024 * 1024  # a message may be this much bigger than the largest entry
DEFAULT_MAX_MESSAGE_BYTES = 5 * 1024 * 1024 + MESSAGE_HEADROOM  # the bookie's default max_entry_size + headroom
ADD_RUNS_HEADER = "pybk-add-runs"  # initial metadata of a bookie's Add stream: it takes packed runs

_BODIES_TAG = bytes([(pb.ReadResults.DESCRIPTOR.fields_by_name["bodies"].number << 3) | 2])  # wire type 2: length-delimited


def varint(n: int) -> bytes:
    """n (>= 0) as a protobuf varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_packed(head: pb.ReadResults, bodies: Sequence[bytes | memoryview]) -> bytes:
    """head (a ReadResults without bodies) with `bodies` back to back as its bodies field, and
    their sizes as body_sizes, encoded with one copy of the bodies."""
    head.body_sizes.extend(map(len, bodies))
    return b"".join([head.SerializeToString(), _BODIES_TAG, varint(sum(head.body_sizes)), *bodies])


def serializer(message_type: type[Message]):
    """The response serializer of a method: protobuf's, passing answers already encoded here through."""
    serialize = message_type.SerializeToString

    def to_bytes(message: Message | bytes) -> bytes:
        return message if type(message) is bytes else serialize(message)
    return to_bytes


_RUNS_TAG = bytes([(pb.AddBatch.DESCRIPTOR.fields_by_name["runs"].number << 3) | 2])
_RUN_BODIES_TAG = bytes([(pb.AddRun.DESCRIPTOR.fields_by_name["bodies"].number << 3) | 2])
_AddRun = pb.AddRun


def add_run_parts(parts: list, request_id: int, ledger_id: int, master_key: bytes, flags: int,
                  entry_ids: list[int], bodies: list[bytes], size: int) -> None:
    """Append to `parts` one packed run (an AddBatch's `runs` field) whose bodies (`size` bytes
    together) are appended as they are: b"".join(parts) is then an AddBatch with one copy of the
    bodies. Raises TypeError or ValueError for values the wire cannot carry."""
    head = _AddRun(request_id=request_id, ledger_id=ledger_id, master_key=master_key, flags=flags,
                   entry_ids=entry_ids, body_sizes=list(map(len, bodies))).SerializeToString()
    blen = varint(size)
    parts += (_RUNS_TAG, varint(len(head) + 1 + len(blen) + size), head, _RUN_BODIES_TAG, blen)
    parts += bodies


class AddBatchView(NamedTuple):
    """An AddBatch as read_add_batch reads it: the message parsed without its packed runs' bodies,
    and each run's bodies as a read-only view of the bytes received (in the order of its runs)."""

    message: pb.AddBatch
    bodies: list[memoryview]

    @property
    def entries(self):
        return self.message.entries

    @property
    def runs(self):
        return self.message.runs


_RUNS_FIELD, _RUN_BODIES_FIELD = 2, 7


def read_add_batch(data: bytes | bytearray | memoryview) -> AddBatchView:
    """Decode an AddBatch leaving its runs' bodies where they are: protobuf copies every bytes field
    it parses, and the bodies are nearly all of a batch (copied, then copied again when read from
    the message, they cost a bookie more than anything else it does with them). Only the fields
    around them are parsed by protobuf; a run's bodies field given more than once counts by its
    last, as protobuf has it. DecodeError for what is not a well-formed message."""
    view = memoryview(data).toreadonly()
    rest = bytearray()
    bodies: list[memoryview] = []
    pos, end = 0, len(view)
    while pos < end:
        start = pos
        key, pos = _varint(view, pos, end)
        if key == (_RUNS_FIELD << 3) | 2:
            n, pos = _varint(view, pos, end)
            if n > end - pos:
                raise DecodeError("a run runs past the end of the batch")
            head, body = _without_bodies(view, pos, pos + n, _RUN_BODIES_FIELD)
            rest += _RUNS_TAG
            rest += varint(len(head))
            rest += head
            bodies.append(body)
            pos += n
        else:
            pos = _skip(view, pos, end, key & 7)
            rest += view[start:pos]
    return AddBatchView(pb.AddBatch.FromString(bytes(rest)), bodies)


class ReadResultsView(NamedTuple):
    """A ReadResults as read_results reads it: the message parsed without its packed bodies, and
    the bodies as a read-only view of the bytes received."""

    message: pb.ReadResults
    bodies: memoryview


_READ_BODIES_FIELD = pb.ReadResults.DESCRIPTOR.fields_by_name["bodies"].number


def read_results(data: bytes | bytearray | memoryview) -> ReadResultsView:
    """Decode a ReadResults leaving its bodies where they are (as read_add_batch does an AddBatch's):
    protobuf would copy the bodies into the message, and again each time they are read from it;
    a PACKED answer is nearly all bodies. DecodeError for what is not a well-formed message."""
    view = memoryview(data).toreadonly()
    head, bodies = _without_bodies(view, 0, len(view), _READ_BODIES_FIELD)
    return ReadResultsView(pb.ReadResults.FromString(bytes(head)), bodies)


def _without_bodies(view: memoryview, pos: int, end: int, field: int) -> tuple[bytearray, memoryview]:
    """(a message's fields but its bodies, its bodies as a view) of the message in view[pos:end]
    whose bodies are bytes field number `field` (given more than once: the last counts)."""
    head = bytearray()
    body = view[pos:pos]
    while pos < end:
        start = pos
        key, pos = _varint(view, pos, end)
        if key == (field << 3) | 2:
            n, pos = _varint(view, pos, end)
            if n > end - pos:
                raise DecodeError("a message's bodies run past its end")
            body = view[pos:pos + n]
            pos += n
        else:
            pos = _skip(view, pos, end, key & 7)
            head += view[start:pos]
    return head, body


def _varint(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    """(the varint at pos, the position after it)."""
    n = shift = 0
    while pos < end and shift < 64:
        b = view[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
    raise DecodeError("a varint is cut short or too long")


def _skip(view: memoryview, pos: int, end: int, wire_type: int) -> int:
    """The position after a field's value of `wire_type` at pos."""
    if wire_type == 0:
        return _varint(view, pos, end)[1]
    if wire_type == 2:
        n, pos = _varint(view, pos, end)
    elif wire_type == 1 or wire_type == 5:
        n = 8 if wire_type == 1 else 4
    else:
        raise DecodeError(f"wire type {wire_type} is not used by pybk's messages")
    if n > end - pos:
        raise DecodeError("a field runs past the end of its message")
    return pos + n
