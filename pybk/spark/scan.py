"""Reading one partition (an entry range of one ledger) as Arrow record batches (executor side)."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import AsyncIterator, Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from pybk.client.types import EntryChunk
from pybk.security.settings import ClientSecurity

from .options import ReadOptions
from .plan import EntryRange
from .runtime import client, drive
from .schema import LedgerColumns

ARROW_BATCH_BYTES = 4 << 20   # payload bytes per Arrow batch (one sub-range read)
MIN_SUB_RANGE = 64            # entries per sub-range while entry sizes are unknown
MAX_SUB_RANGE = 4096
PREFETCH = 8                  # sub-ranges of one partition read concurrently (measured: 1 -> 8 about 2-3x)


class LedgerPartition(InputPartition):
    """Entries [first, last] of one ledger."""

    def __init__(self, ledger_id: int, first: int, last: int):
        self.ledger_id = ledger_id
        self.first = first
        self.last = last

    @classmethod
    def of(cls, r: EntryRange) -> "LedgerPartition":
        return cls(r.ledger_id, r.first, r.last)


def chunk_columns(chunk: EntryChunk) -> tuple[pa.Array, pa.Array]:
    """The chunk's entry ids and payloads as Arrow arrays, built from its payloads gathered back to
    back once and their offsets, not from an object per entry."""
    first = chunk.first_entry_id
    ids = pa.array(np.arange(first, first + len(chunk), dtype=np.int64))
    data, offsets = chunk.packed()
    return ids, pa.Array.from_buffers(pa.binary(), len(chunk), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                                pa.py_buffer(data)])


def sub_range_entries(avg_entry_bytes: float | None) -> int:
    """Entries per sub-range read (one Arrow batch): about ARROW_BATCH_BYTES of payload, few
    entries while the entry size is still unknown."""
    if not avg_entry_bytes:
        return MIN_SUB_RANGE
    return max(MIN_SUB_RANGE, min(MAX_SUB_RANGE, int(ARROW_BATCH_BYTES // max(avg_entry_bytes, 1.0))))


async def _read_batches(uri: str, security: ClientSecurity | None, password: bytes, part: LedgerPartition,
                        include_metadata: bool) -> AsyncIterator[pa.RecordBatch]:
    """One partition's entries as Arrow record batches, in entry order.

    The partition is read as consecutive sub-ranges, PREFETCH of them in flight at once (each
    streams from a different bookie where replicas allow), so a task is not bound by one
    bookie's round trips; batches are still yielded strictly in entry order.
    """
    bk = await client(uri, security)
    handle = await bk.open_ledger(part.ledger_id, password=password, recovery=False)
    md = handle.metadata
    columns = LedgerColumns(md, include_metadata)
    closed = md.is_closed
    avg = md.length / (md.last_entry_id + 1) if closed and md.last_entry_id >= 0 and md.length else None

    async def fetch(first: int, last: int) -> list[pa.RecordBatch]:
        return [columns.batch(*chunk_columns(c)) async for c in handle.read_chunks(first, last)]

    # striped ledgers (E > Qw) already stream from all E bookies at once for each sub-range:
    # more sub-ranges in flight measured no faster there (256 MiB E3/Qw2: 94.5 vs 90.0 MB/s)
    prefetch = PREFETCH if md.ensemble_size == md.write_quorum else 1
    next_first = part.first
    pending: deque[asyncio.Task] = deque()

    def launch() -> None:
        nonlocal next_first
        while len(pending) < prefetch and next_first <= part.last:
            last = min(part.last, next_first + sub_range_entries(avg) - 1)
            pending.append(asyncio.ensure_future(fetch(next_first, last)))
            next_first = last + 1

    try:
        launch()
        while pending:
            batches = await pending.popleft()
            rows = sum(b.num_rows for b in batches)
            if rows:
                avg = sum(b.column(2).nbytes for b in batches) / rows
            launch()
            for batch in batches:
                yield batch
    finally:
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def read_partition(opts: ReadOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    """Synchronous iterator of one partition's record batches (what Spark's read() returns).

    Spark replaces an empty plan by one InputPartition(None): that reads nothing."""
    if not isinstance(part, LedgerPartition):
        return iter(())
    return drive(lambda: _read_batches(opts.metadata_uri, opts.security, opts.password_for(part.ledger_id), part,
                                        opts.include_metadata))
