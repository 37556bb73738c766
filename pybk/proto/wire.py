"""Messages that carry many entry bodies, encoded by hand so that the bodies are copied once.

A PACKED ReadResults carries up to a few MiB of entry bodies in one `bytes` field, and an
AddBatch's packed runs (AddRun) carry theirs the same way. Through protobuf the bodies would be
joined, copied into the message and copied again by SerializeToString. Here protobuf serializes
only the small fields and the bodies are appended as they are (from the bookie's read buffers, or
the client's encoded entries, the same bytes for every bookie). Protobuf accepts fields in any
order, so the results are ordinary messages on the wire: FromString decodes them.
"""
from __future__ import annotations

from typing import Sequence

from google.protobuf.message import Message

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
