"""How a write job's ledgers become visible all at once, or never: the rules, as pure functions.

A write job (a Spark batch write, or one micro-batch of a streaming query) writes one ledger per
task. Every such ledger is created *pending*; its custom metadata says so:

    pybk.spark.job = <job id>   pybk.spark.partition = <task partition>   pybk.spark.state = pending

1. Readers never see a pending ledger unless its job's record lists it (`visible`).
2. Commit (driver): create the job record `committed` with the ledgers the tasks reported
   (`pybk.meta.jobs.Jobs.decide`, create-if-absent). That one etcd transaction is the commit
   point: the job's whole output becomes visible together. Then mark each listed ledger
   committed (`mark_committed`, through the metadata update loop; an optimisation, so readers
   need not look at the record) and delete the job's other ledgers (attempts that lost).
3. Abort (driver): create the record `aborted`, then delete every ledger tagged with the job.
4. A task attempt, after closing its ledger, reads the record (`late_attempt`): if the job was
   decided without this ledger, the attempt deletes it. An attempt that outlives the abort thus
   cleans up after itself: either the abort's scan (after its record) saw the ledger, or the
   ledger was created after the record and the attempt sees the record.
5. Whatever a crash leaves behind is pending, so invisible; the garbage collector
   (`pybk shell gc-jobs`, and autorecovery periodically) settles it with `gc_action`: delete the
   ledgers of jobs that never decided after a grace period, finish the commit of listed ones.

Because the record is written once, a streaming micro-batch replayed after a failure (same
job id: query id and batch id) finds the earlier attempt's decision and keeps exactly one
attempt's rows.
"""
from __future__ import annotations

import enum
from typing import Mapping

from pybk.meta.jobs import JobOutcome, JobRecord
from pybk.meta.ledgers import LedgerMetadata, Unchanged

JOB_KEY = "pybk.spark.job"
PARTITION_KEY = "pybk.spark.partition"
STATE_KEY = "pybk.spark.state"
QUERY_KEY = "pybk.spark.query"   # a streaming sink's ledger: the query whose micro-batch wrote it
BATCH_KEY = "pybk.spark.batch"   # ... and the micro-batch id
DEFAULT_GRACE_S = 86400.0  # an undecided job's ledgers are kept this long (a job may run for hours)


class WriteState(enum.StrEnum):
    """A job ledger's own view of the commit: pending until its job commits it."""

    PENDING = "pending"
    COMMITTED = "committed"


class GcAction(enum.Enum):
    """What the garbage collector does with one ledger of a job."""

    KEEP = "keep"          # not a job ledger, already committed, or its job may still decide
    COMMIT = "commit"      # its job committed it: finish marking it committed
    DELETE = "delete"      # its job aborted, committed without it, or never decided in time


def pending_tags(job_id: str, partition: int, extra: Mapping[str, str] | None = None) -> dict[str, bytes]:
    """Custom metadata of a ledger a job's task creates (extra: e.g. a stream's query and batch)."""
    tags = {JOB_KEY: job_id, PARTITION_KEY: str(partition), STATE_KEY: WriteState.PENDING.value}
    tags.update(extra or {})
    return {k: v.encode() for k, v in tags.items()}


def job_of(custom: Mapping[str, bytes]) -> str | None:
    """The id of the job that wrote this ledger, or None for a ledger not written by a job."""
    value = custom.get(JOB_KEY)
    return value.decode("utf-8", "replace") if value is not None else None


def partition_of(custom: Mapping[str, bytes]) -> int:
    """The task partition that wrote this ledger (-1 when unknown)."""
    try:
        return int(custom.get(PARTITION_KEY, b"-1"))
    except ValueError:
        return -1


def state_of(custom: Mapping[str, bytes]) -> WriteState | None:
    """PENDING or COMMITTED for a job's ledger; None for any other ledger (and for ledgers written
    by releases before the commit protocol, which were visible at once)."""
    value = custom.get(STATE_KEY)
    if value is None:
        return None
    try:
        return WriteState(value.decode("ascii", "replace"))
    except ValueError:
        return WriteState.PENDING  # unknown state: never show what we cannot vouch for


def needs_record(custom: Mapping[str, bytes]) -> bool:
    """True when visibility depends on the job record (a pending ledger): readers fetch it."""
    return state_of(custom) is WriteState.PENDING and job_of(custom) is not None


def visible(ledger_id: int, custom: Mapping[str, bytes], record: JobRecord | None) -> bool:
    """May readers see this ledger? Any ledger not pending; a pending one only once its job's
    record lists it as committed output."""
    if state_of(custom) is not WriteState.PENDING:
        return True
    return (record is not None and record.outcome is JobOutcome.COMMITTED
            and ledger_id in record.ledgers and record.job_id == job_of(custom))


def late_attempt_keeps(ledger_id: int, record: JobRecord | None) -> bool:
    """A task attempt that has closed its ledger: keep it (True) while the job is undecided or
    committed it; delete it (False) when the job was decided without it."""
    if record is None:
        return True
    return record.outcome is JobOutcome.COMMITTED and ledger_id in record.ledgers


def is_stream(custom: Mapping[str, bytes]) -> bool:
    """True for a ledger a streaming sink's micro-batch wrote."""
    return QUERY_KEY in custom


def gc_action(ledger_id: int, custom: Mapping[str, bytes], ctime_ms: int, record: JobRecord | None,
              now_ms: int, grace_ms: int) -> GcAction:
    """What the garbage collector does with this ledger (see the module docstring, rule 5).

    A micro-batch that never decided is left alone however old: its query replays it from the
    checkpoint under the same job id when it restarts, maybe after a long outage, and an abort
    decided meanwhile would make that batch impossible to commit (the query could never go on).
    Its replay's commit or abort deletes what the failed attempt left."""
    if state_of(custom) is not WriteState.PENDING or job_of(custom) is None:
        return GcAction.KEEP
    if record is None:
        if is_stream(custom):
            return GcAction.KEEP
        return GcAction.DELETE if now_ms - ctime_ms >= grace_ms else GcAction.KEEP
    if record.outcome is JobOutcome.COMMITTED and ledger_id in record.ledgers:
        return GcAction.COMMIT
    return GcAction.DELETE


def mark_committed(md: LedgerMetadata) -> LedgerMetadata | Unchanged[WriteState]:
    """The metadata change (for `Ledgers.update`) that marks a job ledger committed."""
    if state_of(md.custom) is not WriteState.PENDING:
        return Unchanged(state_of(md.custom))
    return md.replace(custom={**md.custom, STATE_KEY: WriteState.COMMITTED.value.encode()})
