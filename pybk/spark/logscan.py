"""Reading one partition of a log (a range of entries of one segment) as Arrow record batches.

A log's entries pack many records each (`pybk.log.codec`): headers first, then keys and payloads.
The scan reads the segment's ledger in chunks (the bookies' answers, every entry's digest checked
by the client as it arrives), decodes each entry's record headers with numpy, and builds the Arrow
columns from the entry buffers and offsets: no Python object per record. Only records with offsets
in [lo, hi) are kept, so partitions that share an entry at their edge never repeat a record.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import AsyncIterator, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from pybk.log import codec
from pybk.security.settings import ClientSecurity

from .options import OptionError
from .runtime import client, drive
from .schema import TIMESTAMP

ARROW_BATCH_BYTES = 4 << 20   # entry bytes per sub-range read (one Arrow batch)
PREFETCH = 4                  # sub-ranges of one partition read concurrently

# every column a log scan can hand Spark: name -> (DDL type, Spark type name, Arrow type, may be null)
LOG_COLUMNS: dict[str, tuple[str, str, pa.DataType, bool]] = {
    "log": ("string", "StringType", pa.string(), False),
    "offset": ("long", "LongType", pa.int64(), False),
    "timestamp": ("timestamp", "TimestampType", TIMESTAMP, False),
    "key": ("binary", "BinaryType", pa.binary(), True),
    "payload": ("binary", "BinaryType", pa.binary(), False),
    "producer_id": ("long", "LongType", pa.int64(), True),
    "sequence": ("long", "LongType", pa.int64(), True),
}
BASE_COLUMNS = ("log", "offset", "timestamp", "key", "payload")
PRODUCER_COLUMNS = BASE_COLUMNS + ("producer_id", "sequence")


def _ddl(name: str) -> str:
    """A column's DDL, NOT NULL when it never is null: Spark's row copy of each record (the
    UnsafeProjection over the Arrow batch) and the query's code then test no null bit per value
    (a tenth of the JVM's CPU per record of a five-column scan)."""
    ddl, _, _, nullable = LOG_COLUMNS[name]
    return f"{name} {ddl}" if nullable else f"{name} {ddl} not null"


LOG_SCHEMA = ", ".join(_ddl(n) for n in BASE_COLUMNS)
PRODUCER_SCHEMA = ", ".join(_ddl(n) for n in PRODUCER_COLUMNS)


def log_schema(include_producer: bool) -> str:
    """The DDL schema of a log scan."""
    return PRODUCER_SCHEMA if include_producer else LOG_SCHEMA


def log_arrow_schema(include_producer: bool) -> pa.Schema:
    """The Arrow schema of a log scan's batches (matches log_schema)."""
    return pa.schema([pa.field(n, LOG_COLUMNS[n][2], LOG_COLUMNS[n][3])
                      for n in (PRODUCER_COLUMNS if include_producer else BASE_COLUMNS)])


def projection(schema: StructType) -> pa.Schema:
    """The Arrow schema of the batches for the schema Spark asks for: the source's own, or one the
    user gave with `spark.read.schema(...)` naming some of the log columns, in any order (Spark's
    Python data sources get every column of the schema, so a narrower schema is how a query that
    needs a few columns keeps the others from ever reaching the JVM). An unknown column, a wrong
    type or a column that may be null declared NOT NULL is an OptionError."""
    fields = []
    for f in schema.fields:
        spec = LOG_COLUMNS.get(f.name)
        if spec is None:
            raise OptionError(f"schema: {f.name!r} is not a column of a log scan (columns: "
                              f"{', '.join(PRODUCER_COLUMNS)})")
        ddl, spark_type, arrow_type, nullable = spec
        if type(f.dataType).__name__ != spark_type:
            raise OptionError(f"schema: column {f.name} is {ddl}, not {f.dataType.simpleString()}")
        if nullable and not f.nullable:
            raise OptionError(f"schema: column {f.name} may be null; declare it nullable")
        fields.append(pa.field(f.name, arrow_type, f.nullable))
    if len({f.name for f in fields}) < len(fields) or not fields:
        raise OptionError("schema: name each log column at most once, and at least one")
    return pa.schema(fields)


class LogPartition(InputPartition):
    """Entries [first_entry, last_entry] of one segment's ledger, keeping records lo <= offset < hi.
    seg_first: the segment's first offset (an entry's records are numbered from it);
    entry_bytes: the segment's mean entry size, to size sub-range reads."""

    def __init__(self, log: str, ledger_id: int, first_entry: int, last_entry: int, seg_first: int, lo: int,
                 hi: int, password: bytes, entry_bytes: float):
        self.log = log
        self.ledger_id = ledger_id
        self.first_entry = first_entry
        self.last_entry = last_entry
        self.seg_first = seg_first
        self.lo = lo
        self.hi = hi
        self.password = password
        self.entry_bytes = entry_bytes

    def __repr__(self) -> str:
        return (f"LogPartition({self.log!r}, ledger {self.ledger_id}, entries {self.first_entry}-{self.last_entry}, "
                f"offsets {self.lo}-{self.hi})")


def _binary(lengths: np.ndarray, data: bytes | memoryview, valid: np.ndarray | None = None) -> pa.Array:
    """An Arrow binary array over `data` (values back to back) with these lengths."""
    n = len(lengths)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    validity = None
    nulls = 0
    if valid is not None:
        nulls = int(n - np.count_nonzero(valid))
        validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def _split_keys(data: np.ndarray, klen: np.ndarray, plen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key bytes, payload bytes) of records laid out key, payload, key, payload...: one mask over
    the bytes, built with numpy."""
    m = len(klen)
    reps = np.empty(2 * m, np.int64)
    reps[0::2] = klen
    reps[1::2] = plen
    mask = np.repeat(np.tile(np.array([False, True]), m), reps)
    return data[~mask], data[mask]


def decode_chunk(buf: bytes, starts: Sequence[int], ends: Sequence[int]) -> tuple[np.ndarray, ...]:
    """The records of the entries buf[starts[i]:ends[i]], decoded together: per entry only its
    header is unpacked and its record headers viewed (codec.read_header, codec.record_heads);
    then one array per column for all of them. Returns per record (its entry, its index in the
    segment, timestamp, key length, payload length, where its bytes start in buf) and per entry
    (first index, where its bytes end, producer, first sequence). CorruptEntryError for anything
    that is not a well-formed record entry, bounded by the entries' sizes whatever their headers
    claim."""
    n = len(starts)
    heads, counts, firsts, data_starts, data_ends = [], np.empty(n, np.int64), np.empty(n, np.int64), \
        np.empty(n, np.int64), np.empty(n, np.int64)
    producers, sequences = np.empty(n, np.int64), np.empty(n, np.int64)
    mv = memoryview(buf)
    for e, (start, end) in enumerate(zip(np.asarray(starts, np.int64).tolist(), np.asarray(ends, np.int64).tolist())):
        entry = codec.read_header(mv[start:end])
        heads.append(codec.record_heads(buf, start, end - start, entry))
        counts[e], firsts[e], data_starts[e], data_ends[e] = (
            entry.count, entry.first_index, start + codec.ENTRY_HEADER_SIZE + entry.count * entry.record_header_size, end)
        producers[e], sequences[e] = entry.producer_id, entry.first_sequence
    h = np.concatenate(heads) if heads else np.empty(0, codec.RECORD_DTYPE)
    klen = h["klen"].astype(np.int64)
    plen = h["plen"].astype(np.int64)
    if (klen < -1).any():
        raise codec.CorruptEntryError("record entry has a negative key length other than -1 (no key)")
    sizes = np.maximum(klen, 0) + plen
    entry_of = np.repeat(np.arange(n), counts)
    first_row = np.zeros(n, np.int64)
    np.cumsum(counts[:-1], out=first_row[1:])
    excl = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=excl[1:])
    per_entry = np.add.reduceat(sizes, first_row)
    if (per_entry != data_ends - data_starts).any():
        bad = int(np.argmax(per_entry != data_ends - data_starts))
        raise codec.CorruptEntryError(f"record entry's records claim {int(per_entry[bad])} bytes of keys and payloads "
                                      f"but {int(data_ends[bad] - data_starts[bad])} follow their headers")
    starts = excl + np.repeat(data_starts - excl[first_row], counts)
    index = np.arange(len(sizes), dtype=np.int64) + np.repeat(firsts - first_row, counts)
    return entry_of, index, h["ts"].astype(np.int64), klen, plen, starts, firsts, data_ends, producers, sequences


class Columns:
    """Builds the Arrow columns of `schema` (a projection of the log columns) for the records of
    many entries: a few numpy operations per chunk of entries, one concatenation per column per
    batch; a column the schema leaves out is never built."""

    def __init__(self, log: str, schema: pa.Schema):
        self.log = log.encode()
        self.schema = schema
        names = set(schema.names)
        self.want_keys = "key" in names
        self.want_ts = "timestamp" in names
        self.want_producer = bool(names & {"producer_id", "sequence"})
        self.reset()

    def reset(self) -> None:
        self.offsets: list[np.ndarray] = []
        self.ts: list[np.ndarray] = []
        self.klen: list[np.ndarray] = []
        self.plen: list[np.ndarray] = []
        self.payloads: list = []
        self.keys: list = []
        self.producer: list[np.ndarray] = []
        self.sequence: list[np.ndarray] = []
        self.rows = 0

    def add_chunk(self, buf: bytes, entry_starts: Sequence[int], entry_ends: Sequence[int], seg_first: int,
                  lo: int, hi: int) -> None:
        """The records of the entries buf[entry_starts[i]:entry_ends[i]] whose offsets are in [lo, hi)."""
        entry_of, index, ts, klen, plen, starts, firsts, data_ends, producers, sequences = decode_chunk(
            buf, entry_starts, entry_ends)
        offsets = index + seg_first
        a = int(np.searchsorted(offsets, lo, side="left"))
        z = int(np.searchsorted(offsets, hi, side="left"))
        if z <= a:
            return
        kpos = np.maximum(klen, 0)
        # each entry's records are back to back: one region of buf per entry holds its rows' keys
        # and payloads (the first and last entry kept may be cut by lo and hi)
        e0, e1 = int(entry_of[a]), int(entry_of[z - 1])
        region_starts = starts[np.r_[a, np.searchsorted(entry_of, np.arange(e0 + 1, e1 + 1))]].tolist()
        region_ends = data_ends[e0:e1 + 1].tolist()
        region_ends[-1] = int(starts[z - 1] + kpos[z - 1] + plen[z - 1])
        if a or z < len(offsets):
            entry_of, index, offsets, ts, klen, kpos, plen = (
                x[a:z] for x in (entry_of, index, offsets, ts, klen, kpos, plen))
        mv = memoryview(buf)
        regions = [mv[s:e] for s, e in zip(region_starts, region_ends)]
        if int(klen.max()) < 0:
            self.payloads += regions
        else:
            k, p = _split_keys(np.frombuffer(b"".join(regions), np.uint8), kpos, plen)
            if self.want_keys:
                self.keys.append(k)
            self.payloads.append(p)
        self.offsets.append(offsets)
        if self.want_ts:
            self.ts.append(ts)
        self.klen.append(klen)
        self.plen.append(plen)
        if self.want_producer:
            self.producer.append(producers[entry_of])
            first_seq = sequences[entry_of]
            self.sequence.append(np.where(first_seq == codec.NO_SEQUENCE, first_seq,
                                          first_seq + index - firsts[entry_of]))
        self.rows += z - a

    def _column(self, name: str, n: int) -> pa.Array:
        """One column of the batch of the n records added."""
        if name == "payload":
            return _binary(np.concatenate(self.plen), b"".join(self.payloads))
        if name == "offset":
            return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(np.concatenate(self.offsets))])
        if name == "timestamp":
            return pa.Array.from_buffers(TIMESTAMP, n, [None, pa.py_buffer(np.concatenate(self.ts) * 1000)])
        if name == "log":
            offsets = np.arange(0, (n + 1) * len(self.log), len(self.log), dtype=np.int32)
            return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(self.log * n)])
        if name == "key":
            if not self.keys:
                return pa.nulls(n, pa.binary())
            klen = np.concatenate(self.klen)
            return _binary(np.maximum(klen, 0), b"".join(memoryview(k) for k in self.keys), klen >= 0)
        if name == "producer_id":
            producer = np.concatenate(self.producer)
            return pa.array(producer, mask=producer == 0)
        sequence = np.concatenate(self.sequence)
        return pa.array(sequence, mask=sequence == codec.NO_SEQUENCE)

    def batch(self) -> pa.RecordBatch | None:
        """The records added since the last batch, as one Arrow record batch (None: no record)."""
        n = self.rows
        if not n:
            return None
        cols = [self._column(name, n) for name in self.schema.names]
        self.reset()
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


def sub_range(entry_bytes: float, i: int = PREFETCH) -> int:
    """Entries of a partition's i-th sub-range read (from 0): about ARROW_BATCH_BYTES of entries,
    the first PREFETCH ramping up from 1/PREFETCH of that. The PREFETCH reads in flight share the
    bookies' bandwidth, so equal ones would all end together, late; a task's first batch, which
    Spark waits for with nothing else to do, comes that much sooner."""
    full = max(1, min(4096, int(ARROW_BATCH_BYTES // max(entry_bytes, 1.0))))
    return max(1, full * min(i + 1, PREFETCH) // PREFETCH)


async def _read_log_batches(uri: str, security: ClientSecurity | None, part: LogPartition,
                            schema: pa.Schema) -> AsyncIterator[pa.RecordBatch]:
    """One partition's records as Arrow batches, in offset order; PREFETCH sub-ranges in flight."""
    from pybk.client import reader as ledger_reader
    bk = await client(uri, security)
    md = await bk.ledger_metadata(part.ledger_id)

    async def fetch(first: int, last: int) -> pa.RecordBatch | None:
        cols = Columns(part.log, schema)
        async for chunk in ledger_reader.read_chunks(bk, md, part.password, first, last):
            cols.add_chunk(chunk.buffer, chunk.starts, chunk.ends, part.seg_first, part.lo, part.hi)
        return cols.batch()

    next_first = part.first_entry
    launched = 0
    pending: deque[asyncio.Task] = deque()

    def launch() -> None:
        nonlocal next_first, launched
        while len(pending) < PREFETCH and next_first <= part.last_entry:
            last = min(part.last_entry, next_first + sub_range(part.entry_bytes, launched) - 1)
            pending.append(asyncio.ensure_future(fetch(next_first, last)))
            next_first = last + 1
            launched += 1

    try:
        launch()
        while pending:
            batch = await pending.popleft()
            launch()
            if batch is not None:
                yield batch
    finally:
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def read_log_partition(uri: str, security: ClientSecurity | None, part: InputPartition,
                       schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Synchronous iterator of one partition's record batches of these columns (an empty plan's
    partition: none)."""
    if not isinstance(part, LogPartition):
        return iter(())
    return drive(lambda: _read_log_batches(uri, security, part, schema))


def split_entries(first: int, last: int, entry_bytes: float, bytes_per_partition: int,
                  pieces: int = 1) -> list[tuple[int, int]]:
    """Entries [first, last] cut into ranges of about bytes_per_partition bytes, at least `pieces`
    of them when there are that many entries."""
    count = last - first + 1
    per = max(1, int(bytes_per_partition // max(entry_bytes, 1.0)))
    n = max(pieces, -(-count // per))
    n = min(n, count)
    bounds = [first + count * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(n)]


def pieces_of(sizes: Sequence[int], want: int) -> list[int]:
    """How many pieces each of these ranges (sizes in entries) is cut into so that there are at
    least `want` in all: the largest ranges are cut first, none beyond its entries."""
    out = [1] * len(sizes)
    while sum(out) < want:
        best = max(range(len(sizes)), key=lambda i: sizes[i] / out[i], default=None)
        if best is None or out[best] >= sizes[best]:
            break
        out[best] += 1
    return out
