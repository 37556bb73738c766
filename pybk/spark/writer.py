"""The batch writer of the `pybk` data source: one new ledger per partition, tagged with the job."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pybk.security.settings import ClientSecurity

from .commit import JOB_KEY, PARTITION_KEY
from .options import OptionError, WriteOptions
from .runtime import client, connect, is_no_such_ledger, run

log = logging.getLogger("pybk.spark")
WRITE_WINDOW = 2048


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


def _partition_id() -> int:
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        return int(ctx.partitionId()) if ctx is not None else -1
    except Exception:
        return -1


async def _write_partition(opts: WriteOptions, column: str, batches: Iterator[pa.RecordBatch],
                           partition: int, tags: Mapping[str, bytes] | None = None) -> LedgerWritten:
    """Write one partition's payloads into a new ledger and close it; delete it on failure.
    tags: the ledger's custom metadata (default: the job id and partition)."""
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
                    metadata=dict(tags) if tags is not None else
                    {JOB_KEY: opts.job_id.encode(), PARTITION_KEY: str(partition).encode()})
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
            if not is_no_such_ledger(exc):
                log.warning("pybk write abort: could not delete ledger %d: %s", lid, exc)
    return deleted


async def job_ledgers(uri: str, job_id: str, security: ClientSecurity | None = None) -> dict[int, int]:
    """{partition: ledger_id} of the ledgers a write job with this id created (after its commit
    or abort, one per partition that wrote anything)."""
    return {partition: lid for lid, partition in sorted((await _tagged(uri, job_id, security)).items())}


async def _tagged(uri: str, job_id: str, security: ClientSecurity | None = None) -> dict[int, int]:
    """{ledger_id: partition} of every ledger tagged with the job id, from every task attempt."""
    bk = await connect(uri, security)  # its own client: also called from callers' event loops
    try:
        out: dict[int, int] = {}
        async for lid in bk.list_ledgers():
            try:
                md = await bk.ledger_metadata(lid)
            except Exception as exc:
                if is_no_such_ledger(exc):
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
    bk = await client(opts.metadata_uri, opts.security)
    return await _delete_quietly(bk, sorted(set(ledger_ids) | set(leftovers)), opts.password)


async def _drop_uncommitted(opts: WriteOptions, committed: Sequence[int]) -> list[int]:
    """After a commit: delete the job's ledgers that are not in it, written by task attempts
    that were killed or lost to a retry (Spark keeps only one attempt's output per partition)."""
    strays = set(await _tagged(opts.metadata_uri, opts.job_id, opts.security)) - set(committed)
    if not strays:
        return []
    bk = await client(opts.metadata_uri, opts.security)
    return await _delete_quietly(bk, sorted(strays), opts.password)


class LedgerWriter(DataSourceArrowWriter):
    """Each partition's payloads go into one new ledger, tagged with the job id; commit logs the
    ledgers and deletes any other ledger tagged with the job (from attempts that did not commit),
    abort deletes them all."""

    def __init__(self, opts: WriteOptions, column: str):
        self.opts = opts
        self.column = column
        run(client(opts.metadata_uri, opts.security))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return run(_write_partition(self.opts, self.column, iterator, _partition_id()))

    def commit(self, messages: list[LedgerWritten | None]) -> None:
        ledgers = {m.partition: m.ledger_id for m in messages if m is not None and m.ledger_id is not None}
        log.warning("pybk write job %s committed %d ledger(s): %s", self.opts.job_id, len(ledgers),
                    ", ".join(str(lid) for _, lid in sorted(ledgers.items())))
        dropped = run(_drop_uncommitted(self.opts, list(ledgers.values())))
        if dropped:
            log.warning("pybk write job %s: deleted ledger(s) of task attempts that did not commit: %s",
                        self.opts.job_id, ", ".join(map(str, dropped)))

    def abort(self, messages: list[LedgerWritten | None]) -> None:
        ids = [m.ledger_id for m in messages if m is not None and m.ledger_id is not None]
        deleted = run(_abort(self.opts, ids))
        log.warning("pybk write job %s aborted; deleted ledger(s): %s", self.opts.job_id,
                    ", ".join(map(str, deleted)) or "none")
