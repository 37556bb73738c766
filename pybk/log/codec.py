"""Records packed into ledger entries.

An entry is a 40-byte header, then one header per record, then the records' keys and payloads
back to back:

    entry header  >2sBBIQqQq  magic b"PL", version, flags 0, count, first index (the first
                              record's index within its segment), max timestamp (ms), producer id
                              (0: none), first sequence (-1: none; record i has first + i)
    record header >qiI        version 1: timestamp (ms), key length (-1: no key), payload length
                  >I          version 2 (uniform): payload length; every record is keyless and
                              stamped with the entry's max timestamp

A writer builds a uniform entry whenever its records allow (append_many's always do): 100-byte
records then take 104 bytes instead of 116, on the wire, in the journal and in the entry logs.

Headers first and bytes after lets a reader decode a whole entry with numpy (one array per column,
one cumulative sum for the positions), with no Python work per record until it asks for records.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np

from .errors import CorruptEntryError

MAGIC = b"PL"
VERSION = 1           # records with their own timestamps and keys
VERSION_UNIFORM = 2   # keyless records sharing the entry's timestamp: a payload length per record
VERSIONS = (VERSION, VERSION_UNIFORM)
ENTRY_HEADER = struct.Struct(">2sBBIQqQq")
ENTRY_HEADER_SIZE = ENTRY_HEADER.size          # 40
RECORD_HEADER = struct.Struct(">qiI")
RECORD_HEADER_SIZE = RECORD_HEADER.size        # 16
RECORD_DTYPE = np.dtype([("ts", ">i8"), ("klen", ">i4"), ("plen", ">u4")])
LENGTH_SIZE = 4                                # a uniform entry's record header: its payload length
LENGTH_DTYPE = np.dtype(">u4")
NO_SEQUENCE = -1


class EntryHeader(NamedTuple):
    """What an entry says of its records without decoding them."""

    count: int
    first_index: int
    max_timestamp: int
    producer_id: int
    first_sequence: int
    uniform: bool = False   # version 2: keyless records, all stamped max_timestamp

    @property
    def record_header_size(self) -> int:
        return LENGTH_SIZE if self.uniform else RECORD_HEADER_SIZE

    @property
    def end_index(self) -> int:
        """The index after the entry's last record (the segment's record count, for its last entry)."""
        return self.first_index + self.count


class LogRecord(NamedTuple):
    """One record as readers see it."""

    offset: int
    timestamp: int
    key: bytes | None
    payload: bytes


def read_header(body: bytes | memoryview) -> EntryHeader:
    """The entry header; CorruptEntryError if `body` is not a record entry."""
    if len(body) < ENTRY_HEADER_SIZE:
        raise CorruptEntryError(f"entry of {len(body)} bytes is shorter than a record entry header "
                                f"({ENTRY_HEADER_SIZE} bytes)")
    magic, version, _flags, count, first, max_ts, producer, first_seq = ENTRY_HEADER.unpack_from(body)
    if magic != MAGIC or version not in VERSIONS:
        raise CorruptEntryError(f"entry does not start with a record entry header (magic {magic!r} version "
                                f"{version}, expected {MAGIC!r} and a version of {VERSIONS})")
    if count == 0:
        raise CorruptEntryError("record entry holds no records")
    return EntryHeader(count, first, max_ts, producer, first_seq, version == VERSION_UNIFORM)


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """One decoded entry: its header and its records as columns over the entry's bytes."""

    header: EntryHeader
    timestamps: np.ndarray      # int64, one per record
    key_lengths: np.ndarray     # int32, -1 for no key
    starts: np.ndarray          # int64: where record i's key (then payload) begins in `data`
    payload_lengths: np.ndarray
    data: bytes

    def __len__(self) -> int:
        return self.header.count

    def payload(self, i: int) -> bytes:
        s = int(self.starts[i]) + max(int(self.key_lengths[i]), 0)
        return self.data[s:s + int(self.payload_lengths[i])]

    def key(self, i: int) -> bytes | None:
        k = int(self.key_lengths[i])
        return None if k < 0 else self.data[int(self.starts[i]):int(self.starts[i]) + k]

    def first_at_or_after(self, timestamp: int) -> int:
        """Index of the first record whose timestamp is at or after `timestamp` (len if none)."""
        return int(np.searchsorted(self.timestamps, timestamp, side="left"))

    def records(self, first_offset: int, start: int = 0) -> Iterator[LogRecord]:
        """Records from index `start` on, numbered from `first_offset` (the offset of index 0)."""
        data = self.data
        ts = self.timestamps.tolist()
        kl = self.key_lengths.tolist()
        st = self.starts.tolist()
        pl = self.payload_lengths.tolist()
        for i in range(start, self.header.count):
            s, k = st[i], kl[i]
            if k < 0:
                yield LogRecord(first_offset + i, ts[i], None, data[s:s + pl[i]])
            else:
                yield LogRecord(first_offset + i, ts[i], data[s:s + k], data[s + k:s + k + pl[i]])


def record_heads(buf: bytes | memoryview, offset: int, size: int, h: EntryHeader) -> np.ndarray:
    """The record headers of the entry buf[offset:offset + size] (whose header is h) in the full
    layout (RECORD_DTYPE): a view of them, or, for a uniform entry, made from its lengths and
    timestamp, so that readers handle one layout. CorruptEntryError when the entry's bytes cannot
    hold as many headers as it claims."""
    room = (size - ENTRY_HEADER_SIZE) // h.record_header_size
    if h.count > room:
        raise CorruptEntryError(f"record entry claims {h.count} records but its {size} bytes hold at most "
                                f"{room} record headers")
    at = offset + ENTRY_HEADER_SIZE
    if not h.uniform:
        return np.frombuffer(buf, RECORD_DTYPE, h.count, at)
    heads = np.empty(h.count, RECORD_DTYPE)
    heads["ts"] = h.max_timestamp
    heads["klen"] = -1
    heads["plen"] = np.frombuffer(buf, LENGTH_DTYPE, h.count, at)
    return heads


def decode(body: bytes) -> RecordBatch:
    """Decode one entry; CorruptEntryError naming what is wrong for anything that is not a
    well-formed record entry. Work and memory are bounded by len(body), whatever the header claims."""
    h = read_header(body)
    heads = record_heads(body, 0, len(body), h)
    heads_end = ENTRY_HEADER_SIZE + h.count * h.record_header_size
    klen = heads["klen"].astype(np.int64)
    plen = heads["plen"].astype(np.int64)
    if (klen < -1).any():
        raise CorruptEntryError("record entry has a negative key length other than -1 (no key)")
    sizes = np.maximum(klen, 0) + plen
    ts = heads["ts"].astype(np.int64)
    total = int(sizes.sum())
    if total != len(body) - heads_end:
        raise CorruptEntryError(f"record entry's records claim {total} bytes of keys and payloads but "
                                f"{len(body) - heads_end} follow their headers")
    starts = np.empty(h.count, np.int64)
    starts[0] = 0
    np.cumsum(sizes[:-1], out=starts[1:])
    return RecordBatch(h, ts, klen, starts, plen, body[heads_end:])


class BatchBuilder:
    """Records being packed into the next entry (appends are O(1): two bytearray extends). The
    entry is built uniform (version 2) while every record is keyless and stamped alike; `size` is
    always the size of the entry built now."""

    __slots__ = ("heads", "data", "count", "max_ts", "size", "uniform")

    def __init__(self) -> None:
        self.heads = bytearray()   # full record headers; a uniform entry keeps their lengths only
        self.data = bytearray()
        self.count = 0
        self.max_ts = 0
        self.size = ENTRY_HEADER_SIZE
        self.uniform = True

    def header_size(self, keyless: bool, timestamp: int) -> int:
        """Bytes the header of a record like this adds to the entry (what append_many fills by)."""
        return LENGTH_SIZE if self._stays_uniform(keyless, timestamp) else RECORD_HEADER_SIZE

    def _stays_uniform(self, keyless: bool, timestamp: int) -> bool:
        return self.uniform and keyless and (not self.count or timestamp == self.max_ts)

    def _take(self, keyless: bool, timestamp: int) -> int:
        """Note a record's kind; the bytes its header adds (a first mixed record turns the entry's
        headers full-size: the size grows by the difference for those before it)."""
        if self._stays_uniform(keyless, timestamp):
            return LENGTH_SIZE
        if self.uniform:
            self.uniform = False
            self.size += self.count * (RECORD_HEADER_SIZE - LENGTH_SIZE)
        return RECORD_HEADER_SIZE

    def add(self, payload: bytes, key: bytes | None, timestamp: int) -> None:
        head = self._take(key is None, timestamp)
        if key is None:
            self.heads += RECORD_HEADER.pack(timestamp, -1, len(payload))
        else:
            self.heads += RECORD_HEADER.pack(timestamp, len(key), len(payload))
            self.data += key
        self.data += payload
        self.count += 1
        self.max_ts = timestamp if timestamp > self.max_ts else self.max_ts
        self.size += head + len(payload) + (len(key) if key is not None else 0)

    def add_many(self, payloads: list[bytes], timestamp: int, lengths: np.ndarray | None = None) -> None:
        """Keyless records all stamped `timestamp` (append_many's fast path); `lengths`: their
        payloads' lengths, when the caller has them already."""
        n = len(payloads)
        head = self._take(True, timestamp)
        heads = np.empty(n, RECORD_DTYPE)
        heads["ts"] = timestamp
        heads["klen"] = -1
        if lengths is None:
            lengths = np.fromiter(map(len, payloads), np.int64, n)
        heads["plen"] = lengths
        self.heads += heads.tobytes()
        self.data += b"".join(payloads)
        self.count += n
        self.max_ts = max(self.max_ts, timestamp)
        self.size += n * head + int(lengths.sum())

    def build(self, first_index: int, producer_id: int = 0, first_sequence: int = NO_SEQUENCE) -> bytes:
        if self.uniform and self.count:
            version, heads = VERSION_UNIFORM, np.frombuffer(self.heads, RECORD_DTYPE)["plen"].tobytes()
        else:
            version, heads = VERSION, self.heads
        return b"".join((ENTRY_HEADER.pack(MAGIC, version, 0, self.count, first_index, self.max_ts,
                                           producer_id, first_sequence), heads, self.data))


def encode(records: list[tuple[bytes, bytes | None, int]], first_index: int, producer_id: int = 0,
           first_sequence: int = NO_SEQUENCE) -> bytes:
    """One entry holding `records` ((payload, key, timestamp) each): what BatchBuilder builds."""
    b = BatchBuilder()
    for payload, key, ts in records:
        b.add(payload, key, ts)
    return b.build(first_index, producer_id, first_sequence)
