"""Writing DataFrames to a named log (option log): batch writes and the streaming sink, each job
appended exactly once.

A log has one writer at a time (a new writer fences the last), so Spark's tasks cannot all append
to it. Instead:

1. **Stage** (tasks): each task packs its partition's rows (payload; key and timestamp when the
   DataFrame has them) into log record entries (`pybk.log.codec`) in a new *pending* job ledger,
   tagged with the job and the log, as a ledger write's tasks do (`pybk.meta.job_commit`). Readers
   of ledgers never see pending ledgers, and a failed or retried attempt's ledger is never
   appended: only the ledgers the driver's commit receives are.
2. **Append** (driver's commit): one writer, an *idempotent producer*, appends the staged records
   in partition order. Record j of the job carries sequence `base + j`: for a batch write the
   producer id is derived from the job id and base is 0; for a stream the producer id is derived
   from the query id (kept in the checkpoint) and base is `batch id << 32`. The log stores a
   sequence once: a commit that runs again after dying half-way (a replay of the micro-batch
   from the checkpoint, or the batch job run again with the same jobId) finds the prefix it
   already stored as duplicates and appends exactly the rest.
3. **Record** (driver): only after the append is the job record decided `committed` (listing no
   ledger, so the staged ledgers never become visible as ledgers), then the staged ledgers are
   deleted. A replay that finds the record committed appends nothing.

A stream's commit keeps its writer open for the next micro-batch (Spark commits them in the same
Python worker), so a stream does not seal a segment per micro-batch; a kept writer fenced
meanwhile is replaced, and the deduplication keeps the append exactly once.

So a micro-batch is appended exactly once across driver kill -9 (the replay completes the
append), task retries (only reported attempts are appended) and Spark's lost commits (the record
says it is done). A batch write appends nothing unless every task succeeded; a driver that dies
during the append leaves a prefix of the job in the log, which running the job again with the
same jobId completes (the dedup remembers a producer for `WriterOptions.producer_idle`, 6 h).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pybk.meta.jobs import JobOutcome, JobRecord

from pybk.meta import job_commit as commit
from .logoptions import LogWriteOptions
from .options import OptionError, WriteOptions
from .runtime import announce, client, run
from .writer import decide, delete_attempt, dropped_late, partition_id, settle

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.log import LogWriter

log = logging.getLogger("pybk.spark")

LOG_KEY = "pybk.spark.log"          # a staged ledger's custom metadata: the log it is staged for
ENTRY_BYTES = 64 * 1024             # staged entries, as a log writer packs them
NO_TIMESTAMP = -1                   # staged: the row had no timestamp (appended with the time of the append)
FAILPOINT_ENV = "SPARK_PYBK_FAILPOINT"   # tests: "<point>:<marker file>,..." (see `failpoint`)
STREAM_SEQUENCE_SHIFT = 32          # a stream's sequences: batch id << 32 | record index

# A stream's log writers, kept open between micro-batches in the Python worker that commits them:
# (metadata URI, credentials, log, producer id) -> writer.
_KEPT: dict[tuple, "LogWriter"] = {}


def armed(point: str) -> str | None:
    """Tests only: the marker file of `point` when SPARK_PYBK_FAILPOINT arms it, else None."""
    for item in os.environ.get(FAILPOINT_ENV, "").split(","):
        name, _, marker = item.partition(":")
        if name == point:
            return marker
    return None


def failpoint(point: str) -> None:
    """Tests only: when SPARK_PYBK_FAILPOINT arms `point` (`sink.task_first_attempt`), append to its
    marker file and fail the task's first attempt there, after it staged its rows."""
    marker = armed(point)
    if marker is None:
        return
    from pyspark import TaskContext
    ctx = TaskContext.get()
    if ctx is None or ctx.attemptNumber() > 0:
        return
    _mark(marker, point)
    raise RuntimeError(f"failpoint {point}")


async def hang(point: str) -> None:
    """Tests only: append to the armed point's marker file, then stop there for good (the event
    loop keeps running, so what was appended becomes visible) until the test kills the process."""
    marker = armed(point)
    if marker is None:
        return
    _mark(marker, point)
    await asyncio.Event().wait()


def _mark(marker: str, point: str) -> None:
    if marker:
        with open(marker, "a") as f:
            f.write(f"{point} {os.getpid()}\n")


def producer_id(kind: str, ident: str) -> int:
    """A stable positive 63-bit producer id for a job or query id."""
    return (int.from_bytes(hashlib.sha256(f"pybk.spark.{kind}:{ident}".encode()).digest()[:8], "big") >> 1) or 1


@dataclass(frozen=True)
class Columns:
    """Where a write's columns are: payload (required), key and timestamp (optional)."""

    payload: str
    key: str | None = None
    timestamp: str | None = None


def log_columns(schema: StructType) -> Columns:
    """The payload, key and timestamp columns of a DataFrame written to a log, or a clear error."""
    by = {f.name.lower(): f for f in schema.fields}
    p = by.get("payload")
    if p is None:
        raise OptionError("writing to a log needs a column named payload (binary or string); columns are: "
                          + (", ".join(schema.fieldNames()) or "(none)"))
    for name, kinds in (("payload", ("binary", "string")), ("key", ("binary", "string")),
                        ("timestamp", ("timestamp", "timestamp_ntz", "long"))):
        f = by.get(name)
        if f is not None and f.dataType.typeName() not in kinds:
            raise OptionError(f"column {name} must be {' or '.join(kinds)}, not {f.dataType.simpleString()}")
    return Columns(p.name, by["key"].name if "key" in by else None,
                   by["timestamp"].name if "timestamp" in by else None)


def _bytes_list(col: pa.Array) -> list[bytes | None]:
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.binary())
    return col.to_pylist()


def _millis(col: pa.Array) -> np.ndarray:
    """A timestamp (or long, ms) column as int64 ms; nulls become NO_TIMESTAMP."""
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("ms", col.type.tz)).cast(pa.int64())
    return np.asarray(col.fill_null(NO_TIMESTAMP).cast(pa.int64()))


@dataclass
class LogStaged(WriterCommitMessage):
    """What one task staged: its ledger (None for an empty partition) and how many records."""

    partition: int
    ledger_id: int | None
    records: int
    query_id: str = ""
    batch_id: int = -1


async def stage_partition(opts: LogWriteOptions, geometry: tuple[int, int, int], columns: Columns,
                          batches: Iterator[pa.RecordBatch], partition: int, job_id: str,
                          tags: dict[str, bytes]) -> LogStaged:
    """Pack one partition's rows into record entries of a new pending ledger and close it; delete it
    on failure, and when the job was decided meanwhile (a late attempt: nothing would append it)."""
    from pybk.log import codec
    bk = await client(opts.metadata_uri, opts.security)
    handle = None
    records = 0
    pending: list[asyncio.Future] = []
    builder = codec.BatchBuilder()
    try:
        async def send() -> None:
            nonlocal builder, handle
            if not builder.count:
                return
            if handle is None:
                e, qw, qa = geometry
                handle = await bk.create_ledger(ensemble=e, write_quorum=qw, ack_quorum=qa, password=opts.password,
                                                metadata=tags)
            pending.append(handle.add_entry_async(builder.build(0)))
            builder = codec.BatchBuilder()
            if len(pending) >= 64:
                await asyncio.gather(*pending)
                pending.clear()

        for batch in batches:
            pcol = batch.column(batch.schema.get_field_index(columns.payload))
            if pcol.null_count:
                raise ValueError(f"pybk write to log {opts.log}: partition {partition} has a null payload")
            payloads = _bytes_list(pcol)
            keys = _bytes_list(batch.column(batch.schema.get_field_index(columns.key))) if columns.key else None
            stamps = _millis(batch.column(batch.schema.get_field_index(columns.timestamp))).tolist() \
                if columns.timestamp else None
            for i, payload in enumerate(payloads):
                builder.add(payload, keys[i] if keys else None, stamps[i] if stamps else NO_TIMESTAMP)
                if builder.size >= ENTRY_BYTES:
                    await send()
            records += len(payloads)
        await send()
        await asyncio.gather(*pending)
        if handle is None:
            return LogStaged(partition, None, 0)
        await handle.close()
        failpoint("sink.task_first_attempt")
        if await dropped_late(bk, job_id, partition, handle.ledger_id, opts.password):
            return LogStaged(partition, None, 0)
        return LogStaged(partition, handle.ledger_id, records)
    except BaseException:
        if handle is not None:
            await delete_attempt(bk, handle.ledger_id, opts.password)
        raise


@dataclass
class Appended:
    """What a commit did: records appended now, and records found already stored (a replay)."""

    appended: int = 0
    skipped: int = 0


async def append_staged(writer: "LogWriter", bk: "BookKeeper", password: bytes, staged: list[LogStaged],
                        base: int) -> Appended:
    """Append the staged ledgers' records in partition order, record j with sequence base + j; the
    prefix already stored (a commit run again) is skipped by the producer's deduplication."""
    from pybk.client import reader as ledger_reader
    from pybk.log import DuplicateSequenceError, codec
    out = Appended()
    seq = base
    probing = True
    acks: list = []
    stop_at = sum(s.records for s in staged) // 2 if armed("sink.mid_append") else None

    def probe(b, i: int) -> bool:
        """Append record i with its sequence: True if the log already held it."""
        ts = int(b.timestamps[i])
        p = writer.append_nowait(b.payload(i), key=b.key(i), timestamp=None if ts == NO_TIMESTAMP else ts,
                                 sequence=seq)
        if p.done() and (p.exception() is None or isinstance(p.exception(), DuplicateSequenceError)):
            return True
        acks.append(p)
        return False

    async def append(b, i: int, j: int) -> None:
        """Records i..j-1 of the entry, with sequences seq.. (packed when keyless and untimed)."""
        if (b.key_lengths[i:j] < 0).all() and (b.timestamps[i:j] == NO_TIMESTAMP).all():
            acks.append(asyncio.ensure_future(writer.append_many([b.payload(k) for k in range(i, j)])))
            # append_many packs its records before its first await: let it, so that the next
            # entry's records follow these in the log
            await asyncio.sleep(0)
            return
        for k in range(i, j):
            ts = int(b.timestamps[k])
            acks.append(writer.append_nowait(b.payload(k), key=b.key(k), sequence=seq + k - i,
                                             timestamp=None if ts == NO_TIMESTAMP else ts))

    for s in sorted(staged, key=lambda s: s.partition):
        if s.ledger_id is None:
            continue
        md = await bk.ledger_metadata(s.ledger_id)
        if md.last_entry_id < 0:
            continue
        async for chunk in ledger_reader.read_chunks(bk, md, password, 0, md.last_entry_id):
            for body in chunk.payloads():
                b = codec.decode(body)
                n, i = len(b), 0
                while probing and i < n:
                    probing = probe(b, i)
                    seq += 1
                    i += 1
                    if probing:
                        out.skipped += 1
                    else:
                        out.appended += 1
                j = n
                if stop_at is not None:
                    j = max(i, min(n, stop_at - out.skipped - out.appended + i))
                if j > i:
                    await append(b, i, j)
                    seq += j - i
                    out.appended += j - i
                if len(acks) >= 4096:
                    await asyncio.gather(*acks)
                    acks.clear()
                if stop_at is not None and out.skipped + out.appended >= stop_at:
                    await asyncio.gather(*acks)
                    await writer.flush()
                    await hang("sink.mid_append")
    await asyncio.gather(*acks)
    await writer.flush()
    return out


async def _close_quietly(writer: "LogWriter") -> None:
    try:
        await writer.close()
    except Exception as exc:   # a fenced or broken writer: nothing of it is needed any more
        log.info("pybk write: closing a log writer: %s", exc)


async def commit_job(opts: LogWriteOptions, job_id: str, staged: list[LogStaged], producer: int,
                     base: int, keep: bool = False) -> Appended:
    """Append a job's staged records to the log exactly once, then record the job committed and
    delete the staged ledgers (the module docstring's steps 2 and 3). `keep` (a stream's commit):
    leave the writer open for the next micro-batch (which the same Python worker commits), so a
    stream does not seal a segment per micro-batch; the next commit opens another if it was fenced."""
    from pybk.log import Logs, WriterOptions
    bk = await client(opts.metadata_uri, opts.security)
    wopts = _ledger_options(opts, job_id)
    record = await bk.store.jobs.get(job_id)
    if record is not None:
        if record.outcome is not JobOutcome.COMMITTED:
            raise commit_error(job_id, record)
        await settle(wopts, record, [s.ledger_id for s in staged if s.ledger_id is not None])
        log.warning("pybk write job %s to log %r was already committed (a replay whose first run's Spark "
                    "commit was lost): appended nothing", job_id, opts.log)
        return Appended()
    done = Appended()
    if any(s.records for s in staged):   # an empty job opens no writer (which would fence and roll the log)
        key = (opts.metadata_uri, opts.security, opts.log, producer)
        writer = _KEPT.pop(key, None) if keep else None
        if writer is not None:
            try:
                done = await append_staged(writer, bk, opts.password, staged, base)
            except Exception as exc:   # fenced meanwhile, or broken: a new writer completes the append
                log.info("pybk write job %s: the writer kept from the last micro-batch failed (%s); opening another",
                         job_id, exc)
                await _close_quietly(writer)
                writer = None
        if writer is None:
            writer = await Logs(bk).open_writer(opts.log, password=opts.password,
                                                options=WriterOptions(producer_id=producer, name=f"spark job {job_id}"))
            try:
                done = await append_staged(writer, bk, opts.password, staged, base)
            except BaseException:
                await _close_quietly(writer)
                raise
        if keep:   # append_staged flushed: readers see the whole micro-batch while the writer waits
            _KEPT[key] = writer
        else:
            await writer.close()
    stored, _ = await decide(wopts, JobRecord(job_id, JobOutcome.COMMITTED, frozenset()),
                             [s.ledger_id for s in staged if s.ledger_id is not None])
    if stored.outcome is not JobOutcome.COMMITTED:
        raise commit_error(job_id, stored)
    log.info("pybk write job %s appended %d record(s) to log %r%s", job_id, done.appended, opts.log,
             f" ({done.skipped} already there from an earlier attempt)" if done.skipped else "")
    return done


def commit_error(job_id: str, record: JobRecord) -> RuntimeError:
    """The error of a job whose record says it is decided otherwise."""
    return RuntimeError(f"pybk write job {job_id} was already {record.outcome.value} (by `pybk shell gc-jobs` or "
                        "an earlier job with this jobId): nothing more is appended")


def _ledger_options(opts: LogWriteOptions, job_id: str) -> WriteOptions:
    """The ledger writer's options for the job-ledger helpers (decide, settle, abort)."""
    return WriteOptions(metadata_uri=opts.metadata_uri, password=opts.password, job_id=job_id, security=opts.security)


async def resolve(opts: LogWriteOptions) -> tuple[int, int, int]:
    """Driver side, once: the log exists and the password is its own; returns the staged ledgers'
    E/Qw/Qa (the log's)."""
    from pybk.client.errors import UnauthorizedError
    from pybk.entry import password_hash
    from pybk.log import Logs
    ref = await Logs(await client(opts.metadata_uri, opts.security)).ref(opts.log)
    if password_hash(opts.password) != ref.password_hash:
        raise UnauthorizedError(f"writing to log {opts.log!r} needs its password (option password)"
                                + (": the one given is wrong" if opts.password else ""))
    return ref.config.ensemble, ref.config.write_quorum, ref.config.ack_quorum


class LogBatchWriter(DataSourceArrowWriter):
    """df.write.format('pybk').option('log', ...): tasks stage, the commit appends once."""

    def __init__(self, opts: LogWriteOptions, columns: Columns):
        import uuid
        self.opts = replace(opts, job_id=opts.job_id or uuid.uuid4().hex)
        self.columns = columns
        self.geometry = run(self._start())
        announce(f"pybk write job {self.opts.job_id} to log {self.opts.log!r} starting")

    async def _start(self) -> tuple[int, int, int]:
        bk = await client(self.opts.metadata_uri, self.opts.security)
        record = await bk.store.jobs.get(self.opts.job_id)
        if record is not None:
            raise OptionError(f"option jobId: job {self.opts.job_id} was already {record.outcome.value}; a job id is "
                              "used once (run a job that died during its commit again with the same jobId only "
                              "while it has no record)")
        return await resolve(self.opts)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LogStaged:
        part = partition_id()
        tags = commit.pending_tags(self.opts.job_id, part, {LOG_KEY: self.opts.log})
        return run(stage_partition(self.opts, self.geometry, self.columns, iterator, part, self.opts.job_id, tags))

    def commit(self, messages: list[LogStaged | None]) -> None:
        staged = [m for m in messages if m is not None]
        run(commit_job(self.opts, self.opts.job_id, staged, producer_id("job", self.opts.job_id), 0))

    def abort(self, messages: list[LogStaged | None]) -> None:
        ids = [m.ledger_id for m in messages if m is not None and m.ledger_id is not None]
        stored, deleted = run(decide(_ledger_options(self.opts, self.opts.job_id),
                                     JobRecord(self.opts.job_id, JobOutcome.ABORTED), ids))
        log.warning("pybk write job %s to log %r aborted%s: nothing appended; deleted staged ledger(s): %s",
                    self.opts.job_id, self.opts.log,
                    "" if stored.outcome is JobOutcome.ABORTED else f" (its record says {stored.outcome.value})",
                    ", ".join(map(str, deleted)) or "none")


class LogStreamWriter(DataSourceStreamArrowWriter):
    """df.writeStream.format('pybk').option('log', ...): each micro-batch appended exactly once."""

    def __init__(self, opts: LogWriteOptions, columns: Columns):
        self.opts = opts
        self.columns = columns
        self.geometry = run(resolve(opts))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LogStaged:
        from .sink import _task_batch, stream_job_id, stream_tags
        query_id, batch_id = _task_batch()
        part = partition_id()
        tags = {**stream_tags(query_id, batch_id, part), LOG_KEY: self.opts.log.encode()}
        staged = run(stage_partition(self.opts, self.geometry, self.columns, iterator, part,
                                     stream_job_id(query_id, batch_id), tags))
        return replace(staged, query_id=query_id, batch_id=batch_id)

    def commit(self, messages: list[LogStaged | None], batchId: int) -> None:
        from .sink import stream_job_id
        query_id = _query_of(messages, batchId)
        if query_id is None:
            return
        run(commit_job(self.opts, stream_job_id(query_id, batchId), [m for m in messages if m is not None],
                       producer_id("query", query_id), batchId << STREAM_SEQUENCE_SHIFT, keep=True))

    def abort(self, messages: list[LogStaged | None], batchId: int) -> None:
        from .sink import abort_micro_batch
        query_id = _query_of(messages, batchId)
        if query_id is None:
            return
        ids = [m.ledger_id for m in messages if m is not None and m.ledger_id is not None]
        deleted = run(abort_micro_batch(_ledger_options(self.opts, ""), query_id, batchId, ids))
        log.warning("pybk stream %s batch %d to log %r aborted: deleted staged ledger(s): %s", query_id, batchId,
                    self.opts.log, ", ".join(map(str, deleted)) or "none")


def _query_of(messages: Iterable[LogStaged | None], batch_id: int) -> str | None:
    seen = {(m.query_id, m.batch_id) for m in messages if m is not None}
    if not seen:
        return None
    if len(seen) > 1 or next(iter(seen))[1] != batch_id:
        raise ValueError(f"pybk streaming sink: tasks reported query/batch {sorted(seen)} for the commit of "
                         f"batch {batch_id}")
    return next(iter(seen))[0]
