"""The `pybk` PySpark data source: batch reads, streaming reads and writes of ledgers.

Planning (which ledgers, how far they are readable) runs in Spark's driver-side Python worker;
each partition is one entry range of one ledger, read straight from the bookies by an executor's
Python worker and handed to Spark as Arrow record batches. Readers open ledgers without recovery,
so an open ledger is read up to its LAC and its writer is never fenced. Spark calls read()/write()
synchronously: the asyncio client runs on one event loop per Python worker process (`_loop`).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Iterator, Sequence, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                    DataSourceStreamReader, InputPartition, WriterCommitMessage)
from pyspark.sql.types import StructType

from pybk.local.client import local_client_for, overlay
from pybk.security.settings import ClientSecurity

from . import offsets as offs
from .options import JOB_KEY, PARTITION_KEY, OptionError, ReadOptions, StartingPosition, WriteOptions
from .plan import Bounds, EntryRange, candidate_ledgers, narrow, plan_ranges, select_ledgers

try:  # Spark 4.2+: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - older Spark
    ReadLimit = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

log = logging.getLogger("pybk.spark")

BASE_SCHEMA = "ledger_id long, entry_id long, payload binary"
METADATA_SCHEMA = BASE_SCHEMA + ", ledger_metadata map<string,binary>"
ARROW_BATCH_BYTES = 4 << 20   # payload bytes per Arrow batch (one sub-range read)
MIN_SUB_RANGE = 64            # entries per sub-range while entry sizes are unknown
MAX_SUB_RANGE = 4096
PREFETCH = 8                  # sub-ranges of one partition read concurrently (measured: 1 -> 8 about 2-3x)
WRITE_WINDOW = 2048
CONNECT_TIMEOUT = 20.0
PLAN_CONCURRENCY = 32


# ---------------------------------------------------------------- asyncio plumbing

_LOOP: asyncio.AbstractEventLoop | None = None
_CLIENTS: dict[tuple[str, ClientSecurity | None], Any] = {}


def _loop() -> asyncio.AbstractEventLoop:
    """This process's event loop, created once and never closed.

    grpc.aio binds its completion queue to the first loop that uses it, and Spark reuses Python
    workers for many tasks: a fresh loop per task would leave gRPC posting to a closed loop. One
    loop per process also lets every task share one client (one etcd and one bookie connection
    each) instead of connecting per partition.
    """
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    asyncio.set_event_loop(_LOOP)
    return _LOOP


def _run(coro) -> Any:
    """Run one coroutine to completion on this process's loop (Spark calls us synchronously)."""
    return _loop().run_until_complete(coro)


def _drive(make: Callable[[], AsyncIterator[Any]]) -> Iterator[Any]:
    """Iterate an async generator from synchronous code on this process's loop.

    Spark pulls Arrow batches one by one; each pull runs the loop until the next batch is ready.
    Stopping early (a LIMIT) closes the generator on the same loop.
    """
    loop = _loop()
    agen = make()
    try:
        while True:
            try:
                item = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        loop.run_until_complete(agen.aclose())


async def _connect(uri: str, security: ClientSecurity | None = None):
    """A new BookKeeper client for uri with these credentials (None: this process's credential
    variables, `PYBK_TLS_CA`, `PYBK_TOKEN_FILE`, ...), or an OptionError that names the
    unreachable service."""
    from pybk.client import BookKeeper
    from pybk.meta.errors import BadMetadataUriError, MetadataUnavailableError
    try:
        return await asyncio.wait_for(BookKeeper.connect(uri, security=security), CONNECT_TIMEOUT)
    except (asyncio.TimeoutError, OSError) as exc:
        raise OptionError(f"metadata service {uri} is unreachable: {exc or 'timed out'}") from exc
    except (MetadataUnavailableError, BadMetadataUriError) as exc:
        raise OptionError(f"metadata service {uri}: {exc}") from exc


async def _client(uri: str, security: ClientSecurity | None = None):
    """This process's shared client for uri and credentials (kept open for the worker's later tasks)."""
    bk = _CLIENTS.get((uri, security))
    if bk is None:
        bk = _CLIENTS[(uri, security)] = await _connect(uri, security)
    return bk


Options = TypeVar("Options", ReadOptions, WriteOptions)


def with_credentials(opts: Options) -> Options:
    """opts with the credentials resolved on the driver, so that every executor presents the same
    files: the ones given as options, else the local cluster's (its local.json, when the URI names
    the cluster of $PYBK_LOCAL_DIR or ./.pybk-local) overridden by the driver's credential
    variables (`PYBK_TLS_CA`, `PYBK_TOKEN_FILE`, ...); else none (executors then use their own
    environment's)."""
    if opts.security is not None:
        return opts
    local = local_client_for(opts.metadata_uri)
    if local is None or not local.security.as_mapping():
        return opts
    return replace(opts, security=overlay(local.security))


def _is_no_such_ledger(exc: BaseException) -> bool:
    """The ledger does not exist: the client's error, or the metadata store's that it wraps.
    Imported here, like the client in `_connect`, so importing this module stays light."""
    from pybk.client.errors import NoSuchLedgerError
    from pybk.meta.errors import NoSuchLedgerError as MetaNoSuchLedgerError
    return isinstance(exc, (NoSuchLedgerError, MetaNoSuchLedgerError))


async def _readable(bk: Any, ledger_id: int, password: bytes) -> tuple[int, bool] | None:
    """(last readable entry, closed) of one ledger; None when it does not exist.

    A closed ledger is readable to its last entry; an open one to the LAC that bookies report.
    Opening without recovery checks the password and never fences the writer.
    """
    try:
        handle = await bk.open_ledger(ledger_id, password=password, recovery=False)
    except Exception as exc:
        if _is_no_such_ledger(exc):
            return None
        raise
    md = handle.metadata
    if md.is_closed:
        return int(md.last_entry_id), True
    return int(await handle.read_last_add_confirmed()), False


async def _readable_all(bk: Any, ids: Sequence[int], password: bytes) -> list[tuple[int, bool] | None]:
    gate = asyncio.Semaphore(PLAN_CONCURRENCY)

    async def one(lid: int):
        async with gate:
            return await _readable(bk, lid, password)
    return list(await asyncio.gather(*(one(i) for i in ids)))


async def _ledger_ids(bk: Any, opts: ReadOptions, bounds: Bounds) -> tuple[list[int], bool]:
    """Ledger ids to consider, and whether they were named explicitly (so must exist)."""
    named = candidate_ledgers(opts.ledgers, bounds)
    if named is not None:
        return named, opts.ledgers.finite
    listed = [lid async for lid in bk.list_ledgers()]
    return select_ledgers(listed, opts.ledgers, bounds), False


async def _discover(opts: ReadOptions, bounds: Bounds, strict: bool,
                    closed: dict[int, int] | None = None) -> dict[int, int]:
    """{ledger_id: last readable entry} for the ledgers a query covers.

    strict (batch reads): a ledger named in the options that does not exist is an error.
    closed: last entries of ledgers already known to be closed (they never change, so they are not
    asked again); newly seen closed ledgers are added to it.
    """
    bk = await _client(opts.metadata_uri, opts.security)
    ids, named = await _ledger_ids(bk, opts, bounds)
    known = closed if closed is not None else {}
    ask = [i for i in ids if i not in known]
    found = await _readable_all(bk, ask, opts.password)
    missing = [i for i, r in zip(ask, found) if r is None]
    if strict and named and missing:
        raise OptionError(f"option ledgers: unknown ledger(s) {', '.join(map(str, missing))} "
                          f"in {opts.metadata_uri}")
    out = {i: known[i] for i in ids if i in known}
    for lid, r in zip(ask, found):
        if r is not None:
            out[lid] = r[0]
            if r[1] and closed is not None:
                closed[lid] = r[0]
    return out


# ---------------------------------------------------------------- reading partitions

class LedgerPartition(InputPartition):
    """Entries [first, last] of one ledger."""

    def __init__(self, ledger_id: int, first: int, last: int):
        self.ledger_id = ledger_id
        self.first = first
        self.last = last

    @classmethod
    def of(cls, r: EntryRange) -> "LedgerPartition":
        return cls(r.ledger_id, r.first, r.last)


def _arrow_schema(include_metadata: bool) -> pa.Schema:
    fields = [pa.field("ledger_id", pa.int64()), pa.field("entry_id", pa.int64()),
              pa.field("payload", pa.binary())]
    if include_metadata:
        fields.append(pa.field("ledger_metadata", pa.map_(pa.string(), pa.binary())))
    return pa.schema(fields)


def _batch(schema: pa.Schema, ledger_id: int, ids: list[int], payloads: list[bytes],
           metadata: list[tuple[str, bytes]] | None) -> pa.RecordBatch:
    n = len(ids)
    cols = [pa.array([ledger_id] * n, pa.int64()), pa.array(ids, pa.int64()),
            pa.array(payloads, pa.binary())]
    if metadata is not None:
        cols.append(pa.array([metadata] * n, pa.map_(pa.string(), pa.binary())))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


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
    schema = _arrow_schema(include_metadata)
    bk = await _client(uri, security)
    handle = await bk.open_ledger(part.ledger_id, password=password, recovery=False)
    md = handle.metadata
    metadata = None
    if include_metadata:
        custom = getattr(md, "custom", None) or {}
        metadata = sorted((str(k), bytes(v)) for k, v in custom.items())
    closed = md.is_closed
    avg = md.length / (md.last_entry_id + 1) if closed and md.last_entry_id >= 0 and md.length else None

    async def fetch(first: int, last: int) -> pa.RecordBatch:
        ids: list[int] = []
        payloads: list[bytes] = []
        async for entry in handle.read_entries(first, last):
            ids.append(entry.entry_id)
            payloads.append(entry.data)
        return _batch(schema, part.ledger_id, ids, payloads, metadata)

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
            batch = await pending.popleft()
            if batch.num_rows:
                avg = batch.column(2).nbytes / batch.num_rows
            launch()
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
    return _drive(lambda: _read_batches(opts.metadata_uri, opts.security, opts.password, part,
                                        opts.include_metadata))


# ---------------------------------------------------------------- the data source

class LedgerDataSource(DataSource):
    """format('pybk'): ledgers as rows (ledger_id, entry_id, payload[, ledger_metadata])."""

    @classmethod
    def name(cls) -> str:
        return "pybk"

    def schema(self) -> str:
        opts = ReadOptions.parse(self.options)
        return METADATA_SCHEMA if opts.include_metadata else BASE_SCHEMA

    def reader(self, schema: StructType) -> "LedgerBatchReader":
        return LedgerBatchReader(with_credentials(ReadOptions.parse(self.options)))

    def streamReader(self, schema: StructType) -> "LedgerStreamReader":
        return LedgerStreamReader(with_credentials(ReadOptions.parse(self.options)))

    def writer(self, schema: StructType, overwrite: bool) -> "LedgerWriter":
        opts = with_credentials(WriteOptions.parse(self.options))
        if overwrite:
            raise OptionError("pybk ledgers are append-only: use mode('append')")
        return LedgerWriter(opts, _payload_column(schema))


class LedgerBatchReader(DataSourceReader):
    """Batch scan: one partition per entry range; ledger_id/entry_id filters cut the ranges."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.bounds = Bounds().with_entries(opts.start_entry, opts.end_entry)

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Take the ledger_id/entry_id comparisons into the plan; hand the rest back to Spark."""
        self.bounds, remaining = narrow(self.bounds, filters)
        return iter(remaining)

    def partitions(self) -> Sequence[InputPartition]:
        readable = _run(_discover(self.opts, self.bounds, strict=True))
        ranges = plan_ranges(readable.items(), self.bounds, self.opts.entries_per_partition)
        log.info("pybk scan of %d ledgers: %d partitions", len(readable), len(ranges))
        return [LedgerPartition.of(r) for r in ranges]

    def read(self, partition: LedgerPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)


class LedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Follows the selected ledgers (and new ones inside the selection) with offsets
    {ledger_id: next_entry}; maxEntriesPerTrigger bounds each micro-batch via ReadMaxRows."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.bounds = Bounds().with_entries(opts.start_entry, opts.end_entry)
        self._target: dict[int, int] | None = None
        self._closed: dict[int, int] = {}
        self._last_end: dict[str, int] | None = None

    def _available(self) -> dict[int, int]:
        """Per ledger, the next entry that is not readable yet (capped by endEntry)."""
        readable = _run(_discover(self.opts, self.bounds, strict=False, closed=self._closed))
        cap = None if self.opts.end_entry is None else self.opts.end_entry + 1
        out = {lid: last + 1 if cap is None else min(last + 1, cap) for lid, last in readable.items()}
        if self._target is not None:
            out = {lid: min(n, self._target[lid]) for lid, n in out.items() if lid in self._target}
        return out

    def initialOffset(self) -> dict:
        available = self._available()
        first = self.opts.start_entry
        if self.opts.starting_position is StartingPosition.LATEST:
            start = {lid: max(first, n) for lid, n in available.items()}
        else:
            start = {lid: first for lid in available}
        return offs.to_json(start)

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_entries_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        if start is None:  # Spark < 4.2 calls latestOffset() without arguments
            start = self._last_end if self._last_end is not None else self.initialOffset()
            max_entries = self.opts.max_entries_per_trigger
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_entries = limit.max_rows
        else:
            max_entries = None
        end = offs.admit(offs.from_json(start), self._available(), max_entries, self.opts.start_entry)
        self._last_end = offs.to_json(end)
        return self._last_end

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._available()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = offs.batch_ranges(offs.from_json(start), offs.from_json(end),
                                   self.opts.entries_per_partition, self.opts.start_entry)
        return [LedgerPartition.of(r) for r in ranges]

    def read(self, partition: LedgerPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        pass


# ---------------------------------------------------------------- writing

def _payload_column(schema: StructType) -> str:
    """The name of the payload column (binary or string), or a clear error."""
    for f in schema.fields:
        if f.name.lower() == "payload":
            if f.dataType.typeName() not in ("binary", "string"):
                raise OptionError(f"column payload must be binary or string, not {f.dataType.simpleString()}")
            return f.name
    raise OptionError("df.write.format('pybk') needs a column named payload (binary or string); "
                      f"columns are: {', '.join(schema.fieldNames()) or '(none)'}")


@dataclass
class LedgerWritten(WriterCommitMessage):
    """What one write task produced: its ledger (None for an empty partition)."""

    partition: int
    ledger_id: int | None
    entries: int


def _partition_id() -> int:
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        return int(ctx.partitionId()) if ctx is not None else -1
    except Exception:
        return -1


async def _write_partition(opts: WriteOptions, column: str, batches: Iterator[pa.RecordBatch],
                           partition: int) -> LedgerWritten:
    """Write one partition's payloads into a new ledger and close it; delete it on failure."""
    bk = await _client(opts.metadata_uri, opts.security)
    handle = None
    written = 0
    try:
        pending: list[asyncio.Future] = []
        for batch in batches:
            col = batch.column(batch.schema.get_field_index(column))
            if col.null_count:
                raise ValueError(f"pybk write: partition {partition} has a null payload")
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                values = [s.encode("utf-8") for s in col.to_pylist()]
            else:
                values = col.to_pylist()
            if handle is None and values:
                handle = await bk.create_ledger(
                    ensemble=opts.ensemble_size, write_quorum=opts.write_quorum,
                    ack_quorum=opts.ack_quorum, digest=opts.digest_type, password=opts.password,
                    metadata={JOB_KEY: opts.job_id.encode(), PARTITION_KEY: str(partition).encode()})
            for payload in values:
                pending.append(handle.add_entry_async(payload))
                if len(pending) >= WRITE_WINDOW:
                    await asyncio.gather(*pending)
                    written += len(pending)
                    pending = []
        if pending:
            await asyncio.gather(*pending)
            written += len(pending)
        if handle is None:
            return LedgerWritten(partition, None, 0)
        await handle.close()
        return LedgerWritten(partition, handle.ledger_id, written)
    except BaseException:
        if handle is not None:
            await _delete_quietly(bk, [handle.ledger_id], opts.password)
        raise


async def _delete_quietly(bk: Any, ledger_ids: Sequence[int], password: bytes) -> list[int]:
    """Delete the job's ledgers (with the job's password); those already gone are skipped."""
    deleted = []
    for lid in ledger_ids:
        try:
            await bk.delete_ledger(lid, password)
            deleted.append(lid)
        except Exception as exc:
            if not _is_no_such_ledger(exc):
                log.warning("pybk write abort: could not delete ledger %d: %s", lid, exc)
    return deleted


async def job_ledgers(uri: str, job_id: str, security: ClientSecurity | None = None) -> dict[int, int]:
    """{partition: ledger_id} of the ledgers a write job with this id created (after its commit
    or abort, one per partition that wrote anything)."""
    return {partition: lid for lid, partition in sorted((await _tagged(uri, job_id, security)).items())}


async def _tagged(uri: str, job_id: str, security: ClientSecurity | None = None) -> dict[int, int]:
    """{ledger_id: partition} of every ledger tagged with the job id, from every task attempt."""
    bk = await _connect(uri, security)  # its own client: also called from callers' event loops
    try:
        out: dict[int, int] = {}
        async for lid in bk.list_ledgers():
            try:
                md = await bk.ledger_metadata(lid)
            except Exception as exc:
                if _is_no_such_ledger(exc):
                    continue
                raise
            custom = getattr(md, "custom", None) or {}
            if custom.get(JOB_KEY) == job_id.encode():
                out[lid] = int(custom.get(PARTITION_KEY, b"-1"))
        return out
    finally:
        await bk.close()


async def _abort(opts: WriteOptions, ledger_ids: Sequence[int]) -> list[int]:
    """Delete what a failed job wrote: the ledgers reported, then any others tagged with its id
    (a task killed before it could report or clean up)."""
    leftovers = await _tagged(opts.metadata_uri, opts.job_id, opts.security)
    bk = await _client(opts.metadata_uri, opts.security)
    return await _delete_quietly(bk, sorted(set(ledger_ids) | set(leftovers)), opts.password)


async def _drop_uncommitted(opts: WriteOptions, committed: Sequence[int]) -> list[int]:
    """After a commit: delete the job's ledgers that are not in it, written by task attempts
    that were killed or lost to a retry (Spark keeps only one attempt's output per partition)."""
    strays = set(await _tagged(opts.metadata_uri, opts.job_id, opts.security)) - set(committed)
    if not strays:
        return []
    bk = await _client(opts.metadata_uri, opts.security)
    return await _delete_quietly(bk, sorted(strays), opts.password)


class LedgerWriter(DataSourceArrowWriter):
    """Each partition's payloads go into one new ledger, tagged with the job id; commit logs the
    ledgers and deletes any other ledger tagged with the job (from attempts that did not commit),
    abort deletes them all."""

    def __init__(self, opts: WriteOptions, column: str):
        self.opts = opts
        self.column = column
        _run(_client(opts.metadata_uri, opts.security))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return _run(_write_partition(self.opts, self.column, iterator, _partition_id()))

    def commit(self, messages: list[LedgerWritten | None]) -> None:
        ledgers = {m.partition: m.ledger_id for m in messages if m is not None and m.ledger_id is not None}
        log.warning("pybk write job %s committed %d ledger(s): %s", self.opts.job_id, len(ledgers),
                    ", ".join(str(lid) for _, lid in sorted(ledgers.items())))
        dropped = _run(_drop_uncommitted(self.opts, list(ledgers.values())))
        if dropped:
            log.warning("pybk write job %s: deleted ledger(s) of task attempts that did not commit: %s",
                        self.opts.job_id, ", ".join(map(str, dropped)))

    def abort(self, messages: list[LedgerWritten | None]) -> None:
        ids = [m.ledger_id for m in messages if m is not None and m.ledger_id is not None]
        deleted = _run(_abort(self.opts, ids))
        log.warning("pybk write job %s aborted; deleted ledger(s): %s", self.opts.job_id,
                    ", ".join(map(str, deleted)) or "none")

