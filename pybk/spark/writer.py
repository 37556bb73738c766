"""The batch writer of the `pybk` data source: one new ledger per partition, committed all at once.

The commit protocol is `pybk.meta.job_commit` (its docstring): every task's ledger is created
pending (invisible to readers); the driver's commit decides the job record `committed` with the
reported ledgers, which makes them visible together; abort decides it `aborted`. Whatever else
is tagged with the job (attempts that lost, tasks that outlive an abort) is deleted by the driver,
by the late attempt itself, or by the garbage collector (`pybk.meta.job_gc`).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pybk.meta.jobs import JobOutcome, JobRecord

from pybk.meta import job_commit as commit, job_gc as gc
from .options import OptionError, WriteOptions
from .runtime import announce, client, is_no_such_ledger, run

if TYPE_CHECKING:
    from pybk.client import BookKeeper

log = logging.getLogger("pybk.spark")
WRITE_WINDOW = 2048


class JobAlreadyDecidedError(RuntimeError):
    """The job's record was decided before this driver's commit: its ledgers are not committed."""


def payload_column(schema: StructType) -> str:
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


def partition_id() -> int:
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        return int(ctx.partitionId()) if ctx is not None else -1
    except Exception:
        return -1


def _password_delete(bk, password: bytes) -> gc.Delete:
    """Delete a job ledger with the job's password (what any writer of the job may do)."""
    async def delete(md) -> None:
        await bk.delete_ledger(md.ledger_id, password)
    return delete


async def _write_partition(opts: WriteOptions, column: str, batches: Iterator[pa.RecordBatch],
                           partition: int, tags: Mapping[str, bytes] | None = None) -> LedgerWritten:
    """Write one partition's payloads into a new, pending ledger and close it; delete it on failure,
    and also when the job was decided without it meanwhile (an attempt that outlived the abort or
    lost to another attempt: `commit.late_attempt_keeps`). tags: the ledger's custom metadata
    (default `commit.pending_tags` of the job and partition; the streaming sink adds its own)."""
    bk = await client(opts.metadata_uri, opts.security)
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
                    metadata=dict(tags) if tags is not None else commit.pending_tags(opts.job_id, partition))
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
        if await dropped_late(bk, opts.job_id, partition, handle.ledger_id, opts.password):
            return LedgerWritten(partition, None, 0)
        return LedgerWritten(partition, handle.ledger_id, written)
    except BaseException:
        if handle is not None:
            await delete_attempt(bk, handle.ledger_id, opts.password)
        raise


async def delete_attempt(bk: "BookKeeper", ledger_id: int, password: bytes) -> None:
    """Delete a task attempt's ledger (gone already: the driver's settling was first); failing that,
    the garbage collector will (it is pending)."""
    try:
        await bk.delete_ledger(ledger_id, password)
    except Exception as exc:
        if not is_no_such_ledger(exc):
            log.warning("pybk write: could not delete ledger %d of a task attempt: %s", ledger_id, exc)


async def dropped_late(bk: "BookKeeper", job_id: str, partition: int, ledger_id: int, password: bytes) -> bool:
    """Whether a task attempt's closed ledger was deleted because its job was decided without it
    meanwhile (an attempt that outlived the abort or lost to another: `commit.late_attempt_keeps`)."""
    record = await bk.store.jobs.get(job_id)
    if commit.late_attempt_keeps(ledger_id, record):
        return False
    log.warning("pybk write job %s was %s before partition %d's ledger %d was reported: deleting it",
                job_id, record.outcome.value, partition, ledger_id)
    await delete_attempt(bk, ledger_id, password)
    return True


async def _resolve(opts: WriteOptions) -> WriteOptions:
    """Driver side, once: the job id must be new, and E/Qw/Qa come from `with_cluster_defaults`."""
    bk = await client(opts.metadata_uri, opts.security)
    record = await bk.store.jobs.get(opts.job_id)
    if record is not None:
        raise OptionError(f"option jobId: job {opts.job_id} was already {record.outcome.value}; "
                          "a job id is used once: give a new jobId (or none for a new UUID)")
    return await with_cluster_defaults(opts)


async def with_cluster_defaults(opts: WriteOptions) -> WriteOptions:
    """opts with the E/Qw/Qa not given taken from the cluster's stored ledger defaults (else
    `options.FALLBACK_GEOMETRY`)."""
    bk = await client(opts.metadata_uri, opts.security)
    stored = await bk.store.cluster.ledger_defaults()
    e, qw, qa = opts.geometry(stored.geometry() if stored else None)
    return replace(opts, ensemble_size=e, write_quorum=qw, ack_quorum=qa)


async def decide(opts: WriteOptions, record: JobRecord, seen: list[int]) -> tuple[JobRecord, list[int]]:
    """Decide the job (create-once), then settle its ledgers by the record that stands; returns
    it and the ledgers deleted."""
    bk = await client(opts.metadata_uri, opts.security)
    stored = await bk.store.jobs.decide(record)
    return stored, await settle(opts, stored, seen)


async def settle(opts: WriteOptions, record: JobRecord, seen: list[int]) -> list[int]:
    """Settle the job's ledgers by record (`gc.settle`); returns the ledgers deleted. Settling is a
    clean-up: if it fails, the outcome stands and the garbage collector finishes it (warned)."""
    bk = await client(opts.metadata_uri, opts.security)
    try:
        _, deleted = await gc.settle(bk.store, record, _password_delete(bk, opts.password), seen)
        return deleted
    except Exception as exc:
        log.warning("pybk write job %s is %s, but settling its ledgers failed (the garbage collector, "
                    "`pybk shell gc-jobs`, finishes it): %s", record.job_id, record.outcome.value, exc)
        return []


class LedgerWriter(DataSourceArrowWriter):
    """Each partition's payloads go into one new pending ledger tagged with the job id; commit
    decides the job committed with the reported ledgers (visible from then on) and deletes the
    job's other ledgers; abort decides it aborted and deletes them all."""

    def __init__(self, opts: WriteOptions, column: str):
        self.opts = run(_resolve(opts))
        self.column = column
        announce(f"pybk write job {self.opts.job_id} starting (E/Qw/Qa {self.opts.ensemble_size}/"
                 f"{self.opts.write_quorum}/{self.opts.ack_quorum}) on {self.opts.metadata_uri}")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return run(_write_partition(self.opts, self.column, iterator, partition_id()))

    def commit(self, messages: list[LedgerWritten | None]) -> None:
        ledgers = {m.partition: m.ledger_id for m in messages if m is not None and m.ledger_id is not None}
        want = JobRecord(self.opts.job_id, JobOutcome.COMMITTED, frozenset(ledgers.values()))
        stored, deleted = run(decide(self.opts, want, list(ledgers.values())))
        if stored.outcome is not JobOutcome.COMMITTED or stored.ledgers != want.ledgers:
            raise JobAlreadyDecidedError(
                f"pybk write job {self.opts.job_id} was already {stored.outcome.value} (by `pybk shell gc-jobs` or "
                f"autorecovery after the grace period, or by an earlier job with this jobId): "
                f"its {len(ledgers)} ledger(s) are not committed")
        log.info("pybk write job %s committed %d ledger(s): %s", self.opts.job_id, len(ledgers),
                 ", ".join(str(lid) for _, lid in sorted(ledgers.items())) or "none")
        if deleted:
            log.info("pybk write job %s: deleted ledger(s) of task attempts that did not commit: %s",
                     self.opts.job_id, ", ".join(map(str, deleted)))

    def abort(self, messages: list[LedgerWritten | None]) -> None:
        ids = [m.ledger_id for m in messages if m is not None and m.ledger_id is not None]
        stored, deleted = run(decide(self.opts, JobRecord(self.opts.job_id, JobOutcome.ABORTED), ids))
        log.warning("pybk write job %s aborted%s; deleted ledger(s): %s", self.opts.job_id,
                    "" if stored.outcome is JobOutcome.ABORTED else f" (its record says {stored.outcome.value})",
                    ", ".join(map(str, deleted)) or "none")
