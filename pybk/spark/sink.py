"""The streaming sink of the `pybk` data source: each micro-batch is one write job, exactly once.

`df.writeStream.format("pybk")` writes each micro-batch like a batch write (`writer`): one new
ledger per task, created pending (`commit.pending_tags`). The micro-batch's job id is
`<query id>.<batch id>` (`stream_job_id`), so a batch that Spark replays after a failure (same
checkpoint: same query id and batch id) is the same job, and the job record decides once which
attempt's ledgers hold its rows (`pybk.meta.job_commit`, rules 1-5):

- tasks (executors) learn the query and batch from Spark's local properties `sql.streaming.queryId`
  and `streaming.sql.batchId`; after closing its ledger a task reads the record and deletes its
  ledger when the batch was already decided without it (a replay of a batch committed in pybk);
- commit (driver; the query id travels in the tasks' messages) creates the record `committed`.
  When a record is already there, an earlier attempt of the batch committed in pybk but Spark
  died before recording it in its checkpoint: that attempt's ledgers are kept and this one's
  deleted. Either way the listed ledgers are marked committed and the job's other ledgers
  (attempts that lost) deleted;
- abort (driver) deletes the batch's ledgers except those of a committed record, and writes no
  record: Spark replays the batch under the same job id, which must still be able to commit.
  Ledgers that task attempts create after the abort stay pending (invisible) until the replay's
  commit or `pybk shell gc-jobs` deletes them.

Shared with the batch writer (`writer`): `LedgerWritten`, `partition_id`, `_write_partition`
(with the batch's tags), `decide` and `settle` (which use `pybk.meta.job_gc.settle`), and
`with_cluster_defaults`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from pybk.meta.jobs import JobOutcome, JobRecord, check_job_id

from pybk.meta.job_commit import BATCH_KEY, QUERY_KEY, pending_tags
from .options import WriteOptions
from .runtime import client, run
from .writer import LedgerWritten, partition_id, _write_partition, decide, settle, with_cluster_defaults

log = logging.getLogger("pybk.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"   # Spark's local properties, set on the stream
BATCH_ID_PROPERTY = "streaming.sql.batchId"   # execution thread and passed on to its tasks


class StreamCommitError(RuntimeError):
    """A micro-batch cannot be committed exactly once (e.g. pybk recorded it as aborted)."""


def stream_job_id(query_id: str, batch_id: int) -> str:
    """The job id of one micro-batch: the same for every attempt of that batch of that query."""
    return check_job_id(f"{query_id}.{batch_id}")


def stream_tags(query_id: str, batch_id: int, partition: int) -> dict[str, bytes]:
    """Custom metadata of a ledger a micro-batch's task creates (pending until the batch commits)."""
    return pending_tags(stream_job_id(query_id, batch_id), partition,
                        {QUERY_KEY: query_id, BATCH_KEY: str(batch_id)})


@dataclass
class MicroBatchWritten(WriterCommitMessage):
    """What one task of a micro-batch produced, with the query and batch it belongs to (the
    driver's commit gets only the batch id from Spark)."""

    query_id: str
    batch_id: int
    written: LedgerWritten


def query_of(messages: Sequence[MicroBatchWritten | None], batch_id: int) -> str | None:
    """The query id the tasks reported (None when no task reported: nothing to commit or clean);
    a ValueError when they disagree with each other or with the batch Spark commits."""
    seen = {(m.query_id, m.batch_id) for m in messages if m is not None}
    if not seen:
        return None
    if len(seen) > 1 or next(iter(seen))[1] != batch_id:
        raise ValueError(f"pybk streaming sink: tasks reported query/batch {sorted(seen)} for the "
                         f"commit of batch {batch_id}")
    return next(iter(seen))[0]


def reported_ledgers(messages: Iterable[MicroBatchWritten | None]) -> frozenset[int]:
    """The ledgers the tasks wrote (a task of an empty partition writes none)."""
    return frozenset(m.written.ledger_id for m in messages
                     if m is not None and m.written.ledger_id is not None)


def _task_batch() -> tuple[str, int]:
    """(query id, batch id) of the running task, from Spark's local properties."""
    from pyspark import TaskContext
    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
    if not query_id or batch is None:
        raise StreamCommitError(f"pybk streaming sink: the task carries no streaming query id and batch "
                                f"id (Spark local properties {QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY})")
    return query_id, int(batch)


async def write_micro_batch_partition(opts: WriteOptions, column: str, batches: Iterator[pa.RecordBatch],
                                      partition: int, query_id: str, batch_id: int) -> MicroBatchWritten:
    """One task of a micro-batch: the batch writer's task under the batch's job id and tags (it
    deletes its ledger again when the batch was already decided without it: a replay of a
    committed batch)."""
    job_id = stream_job_id(query_id, batch_id)
    written = await _write_partition(replace(opts, job_id=job_id), column, batches, partition,
                                     stream_tags(query_id, batch_id, partition))
    return MicroBatchWritten(query_id, batch_id, written)


async def commit_micro_batch(opts: WriteOptions, query_id: str, batch_id: int,
                             ledgers: Iterable[int]) -> JobRecord:
    """Commit one micro-batch: record these ledgers as its output unless an earlier attempt
    already did (then keep that attempt's and delete these); mark the kept ledgers committed and
    delete the batch's other ledgers. Returns the batch's record."""
    job_id = stream_job_id(query_id, batch_id)
    mine = JobRecord(job_id, JobOutcome.COMMITTED, frozenset(ledgers))
    stored, dropped = await decide(replace(opts, job_id=job_id), mine, sorted(mine.ledgers))
    if stored.outcome is not JobOutcome.COMMITTED:
        raise StreamCommitError(f"pybk stream {query_id} batch {batch_id}: job {job_id} is recorded as "
                                f"{stored.outcome.value} in pybk, so its rows cannot be committed")
    if stored != mine:
        log.warning("pybk stream %s batch %d was already committed in pybk (ledgers %s) by an attempt "
                    "whose Spark commit was lost: kept it; deleted this attempt's ledger(s): %s",
                    query_id, batch_id, _ids(stored.ledgers), _ids(dropped))
    else:
        log.info("pybk stream %s batch %d committed ledger(s): %s", query_id, batch_id, _ids(stored.ledgers))
        if dropped:
            log.warning("pybk stream %s batch %d: deleted ledger(s) of task attempts that did not "
                        "commit: %s", query_id, batch_id, _ids(dropped))
    return stored


async def abort_micro_batch(opts: WriteOptions, query_id: str, batch_id: int,
                            reported: Iterable[int] = ()) -> list[int]:
    """Delete what a failed attempt of a micro-batch wrote, sparing the ledgers of an earlier
    attempt that committed it; write no record (Spark replays the batch under the same job id).
    Returns the deleted ledger ids."""
    job_id = stream_job_id(query_id, batch_id)
    bk = await client(opts.metadata_uri, opts.security)
    record = await bk.store.jobs.get(job_id)
    if record is None or record.outcome is not JobOutcome.COMMITTED:
        record = JobRecord(job_id, JobOutcome.ABORTED)  # settle as if aborted, without storing it
    return await settle(replace(opts, job_id=job_id), record, sorted(reported))


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(map(str, sorted(ids))) or "none"


class LedgerStreamWriter(DataSourceStreamArrowWriter):
    """df.writeStream.format('pybk'): each micro-batch's partitions go into new ledgers tagged with
    the query and batch; each batch's rows are committed exactly once (see the module docstring)."""

    def __init__(self, opts: WriteOptions, column: str):
        self.column = column
        self.opts = run(with_cluster_defaults(opts))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> MicroBatchWritten:
        query_id, batch_id = _task_batch()
        return run(write_micro_batch_partition(self.opts, self.column, iterator, partition_id(),
                                               query_id, batch_id))

    def commit(self, messages: list[MicroBatchWritten | None], batchId: int) -> None:
        query_id = query_of(messages, batchId)
        if query_id is None:
            log.info("pybk stream batch %d: no task reported; nothing to commit", batchId)
            return
        run(commit_micro_batch(self.opts, query_id, batchId, reported_ledgers(messages)))

    def abort(self, messages: list[MicroBatchWritten | None], batchId: int) -> None:
        query_id = query_of(messages, batchId)
        if query_id is None:
            log.warning("pybk stream batch %d aborted before any task reported; what its tasks wrote "
                        "stays pending (invisible) until the batch is replayed or gc-jobs deletes it",
                        batchId)
            return
        deleted = run(abort_micro_batch(self.opts, query_id, batchId, reported_ledgers(messages)))
        log.warning("pybk stream %s batch %d aborted; deleted ledger(s): %s", query_id, batchId, _ids(deleted))
