"""Job ledgers: which ledgers a write job made, and settling what crashed jobs left behind.

The I/O around the pure rules of `pybk.meta.job_commit`, shared by the batch writer (commit, abort),
`pybk.spark.written_ledgers`, `pybk shell listledgers --job` / `gc-jobs` and the elected
autorecovery auditor (`collect`, periodically). Imports neither pyspark nor the ledger client:
everything goes through a `pybk.meta.MetadataStore`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

from pybk.meta.errors import NoSuchLedgerError, VersionConflictError
from pybk.meta.jobs import JobOutcome, JobRecord
from pybk.meta.ledgers import LedgerMetadata

from . import job_commit as commit
from .job_commit import GcAction, WriteState

log = logging.getLogger("pybk.meta.job_gc")

DEFAULT_RETENTION_S = 7 * 24 * 3600.0  # a settled job's record is kept this long (then `written_ledgers` scans tags)

Delete = Callable[[LedgerMetadata], Awaitable[None]]  # raises a LookupError when the ledger is gone


async def tagged(store, job_id: str | None = None) -> AsyncIterator[LedgerMetadata]:
    """The metadata of every ledger a write job created (of job_id only, when given), in id order,
    from every task attempt, pending or committed."""
    async for md in store.ledgers.list_metadata():
        job = commit.job_of(md.custom)
        if job is not None and (job_id is None or job == job_id):
            yield md


async def written(store, job_id: str) -> dict[int, int]:
    """{partition: ledger id} of what a job wrote: its committed output once it committed
    (nothing once it aborted); for a job without a record (undecided, or its record removed
    after the retention) every ledger tagged with it."""
    record = await store.jobs.get(job_id)
    if record is not None and record.outcome is JobOutcome.ABORTED:
        return {}
    out: dict[int, int] = {}
    if record is not None:
        for lid in sorted(record.ledgers):
            try:
                out[commit.partition_of((await store.ledgers.get(lid)).custom)] = lid
            except NoSuchLedgerError:
                pass
    else:
        async for md in tagged(store, job_id):
            out[commit.partition_of(md.custom)] = md.ledger_id
    return dict(sorted(out.items()))


async def settle(store, record: JobRecord, delete: Delete, seen: list[int] = ()) -> tuple[list[int], list[int]]:
    """After a job's decision: mark the ledgers its record lists committed, delete its other
    ledgers (attempts that lost, tasks that outlived an abort). `seen`: ledgers the caller knows
    of (the tasks' reports), handled even if a scan misses them. Returns (committed, deleted)."""
    mds = {md.ledger_id: md async for md in tagged(store, record.job_id)}
    for lid in seen:
        if lid not in mds:
            try:
                mds[lid] = await store.ledgers.get(lid)
            except NoSuchLedgerError:
                pass
    committed, deleted = [], []
    for lid, md in sorted(mds.items()):
        if commit.late_attempt_keeps(lid, record):
            if await mark_committed(store, lid):
                committed.append(lid)
        elif await _delete(md, delete):
            deleted.append(lid)
    return committed, deleted


async def mark_committed(store, ledger_id: int) -> bool:
    """Set the ledger's state committed (the record already made it visible); False if it is gone."""
    try:
        await store.ledgers.update(ledger_id, commit.mark_committed)
        return True
    except NoSuchLedgerError:
        return False


async def _delete(md: LedgerMetadata, delete: Delete) -> bool:
    """Delete one job ledger; False when it is already gone or changed meanwhile (looked at again
    on the next pass)."""
    try:
        await delete(md)
        return True
    except (LookupError, VersionConflictError):  # the store's NoSuchLedgerError, or the client's
        return False


def metadata_delete(store) -> Delete:
    """Delete through the metadata store, only if the ledger is unchanged since it was read (the
    autorecovery process: its etcd account may delete any ledger)."""
    async def delete(md: LedgerMetadata) -> None:
        await store.ledgers.delete(md.ledger_id, version=md.version)
    return delete


@dataclass
class GcReport:
    """What one garbage collection pass did (or, dry, would do)."""

    dry_run: bool = False
    ledgers: int = 0                 # job ledgers looked at
    deleted: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    aborted_jobs: list[str] = field(default_factory=list)     # undecided past the grace: decided aborted
    removed_records: list[str] = field(default_factory=list)  # settled records older than the retention
    errors: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"dry_run": self.dry_run, "job_ledgers": self.ledgers, "deleted": self.deleted,
                "committed": self.committed, "kept": self.kept, "aborted_jobs": self.aborted_jobs,
                "removed_records": self.removed_records,
                "errors": {str(k): v for k, v in sorted(self.errors.items())}}


async def collect(store, delete: Delete | None = None, *, grace_s: float = commit.DEFAULT_GRACE_S,
                  retention_s: float = DEFAULT_RETENTION_S, dry_run: bool = False,
                  now_ms: int | None = None) -> GcReport:
    """One pass over every job ledger, by `commit.gc_action`: finish commits, delete what no
    committed job lists. A job still undecided after the grace (counted from its ledger's
    creation) is first decided aborted, by the same create-once record its driver would write, so
    a driver that comes back later fails its commit clearly instead of losing ledgers. Then job
    records older than the retention whose ledgers are all committed or gone are removed.
    `delete`: how a ledger is deleted (default `metadata_delete`; the shell's admin client)."""
    delete = delete or metadata_delete(store)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    grace_ms, report = int(grace_s * 1000), GcReport(dry_run=dry_run)
    records: dict[str, JobRecord | None] = {}
    unsettled: set[str] = set()
    async for md in tagged(store):
        report.ledgers += 1
        job = commit.job_of(md.custom)
        if job not in records:
            records[job] = await store.jobs.get(job)
        action = commit.gc_action(md.ledger_id, md.custom, md.ctime_ms, records[job], now, grace_ms)
        if action is GcAction.DELETE and records[job] is None and not dry_run:
            records[job] = await store.jobs.decide(JobRecord(job, JobOutcome.ABORTED))
            if records[job].outcome is JobOutcome.ABORTED:
                report.aborted_jobs.append(job)
                log.warning("write job %s never decided within %.0fs: aborted it", job, grace_s)
            action = commit.gc_action(md.ledger_id, md.custom, md.ctime_ms, records[job], now, grace_ms)
        try:
            done = await _apply(store, md, action, delete, dry_run)
        except Exception as exc:  # one ledger's failure must not stop the pass
            report.errors[md.ledger_id] = f"{type(exc).__name__}: {exc}"
            log.warning("job ledger %d (job %s): %s failed: %s", md.ledger_id, job, action.value, exc)
            unsettled.add(job)
            continue
        if action is GcAction.KEEP:
            report.kept.append(md.ledger_id)
            if commit.state_of(md.custom) is WriteState.PENDING:
                unsettled.add(job)
        elif done:
            (report.committed if action is GcAction.COMMIT else report.deleted).append(md.ledger_id)
        if action is not GcAction.KEEP and (dry_run or not done):
            unsettled.add(job)
    async for record in store.jobs.list():
        if record.job_id in unsettled or now - record.time_ms < retention_s * 1000:
            continue
        if dry_run or await store.jobs.delete(record.job_id):
            report.removed_records.append(record.job_id)
    return report


async def _apply(store, md: LedgerMetadata, action: GcAction, delete: Delete, dry_run: bool) -> bool:
    if action is GcAction.KEEP or dry_run:
        return True
    if action is GcAction.COMMIT:
        return await mark_committed(store, md.ledger_id)
    return await _delete(md, delete)
