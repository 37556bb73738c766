"""Named logs' retention, enforced by the elected autorecovery process (the auditor) for every log.

Each pass (every `interval` seconds, PYBK_LOG_RETENTION_INTERVAL, default 60; 0: off) looks at
every log, a page of names at a time:
1. a CRC32C log with a retention policy whose last segment is OPEN, with no live writer (no
   writer key) and older than the rollover's `max_idle` (else `max_age`), is sealed: the service takes the
   next epoch as a writer would, fences and recovers the segment's ledger keylessly (its admin
   role) and seals it in one transaction. No new segment is opened; the next writer starts one.
   Without this an abandoned log's last segment never closes, so its age never counts;
2. retention (`retention.retention_before`) picks the prefix of closed segments to delete, and
   the truncation deletes them as `Logs.truncate(force=True)` does: marked TRUNCATED and the
   start moved in one transaction, then their ledgers (bookies reclaim the space by their garbage
   collection), then their keys.
It also sets each log's end offset and slowest cursor's lag in the metrics (`pybk.log.metrics`).

Who may: deleting segment ledgers without their passwords and fencing without their keys need
the admin role, which autorecovery's credential has (docs/security.md). Only the elected auditor
runs it, so two processes never truncate the same log at once; if leadership moves mid-pass, a
truncation run twice finishes what the first left (it is idempotent).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from dataclasses import replace

from pybk.client.handle import LedgerHandle
from pybk.client.recovery import recover
from pybk.entry import DigestType
from pybk.security.roles import Operation, allowed

from . import metrics
from .dedup import Dedup
from .errors import LogNotFoundError
from .layout import LogState, SegmentState, seal, take_over, truncation_prefix
from .logs import LogRef, Logs
from .options import RetentionPolicy, WriterOptions
from .reader import end_offset
from .writer import summarize

log = logging.getLogger(__name__)

ENV_INTERVAL = "PYBK_LOG_RETENTION_INTERVAL"
DEFAULT_INTERVAL = 60.0


def interval_from_env() -> float:
    """Seconds between passes (PYBK_LOG_RETENTION_INTERVAL; 0 disables)."""
    try:
        return max(0.0, float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL)))
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using %.0f", ENV_INTERVAL, os.environ[ENV_INTERVAL],
                    DEFAULT_INTERVAL)
        return DEFAULT_INTERVAL


@dataclasses.dataclass
class RetentionReport:
    """What one pass did."""

    logs: int = 0
    sealed: list[str] = dataclasses.field(default_factory=list)
    deleted_segments: dict[str, int] = dataclasses.field(default_factory=dict)
    deleted_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class RetentionService:
    """One pass over every log (`run_pass`), or passes for ever (`run`), on a BookKeeper client
    whose credential has the admin role."""

    def __init__(self, logs: Logs, name: str = "autorecovery"):
        self.logs = logs
        self.holder = f"retention:{name}"
        self.last: RetentionReport | None = None

    async def run(self, interval: float) -> None:
        """A pass every `interval` seconds until cancelled; a failed pass is logged and retried."""
        metrics.register_service()
        while True:
            try:
                self.last = await self.run_pass()
                if self.last.sealed or self.last.deleted_segments or self.last.errors:
                    log.info("log retention: sealed %s, deleted segments %s, errors %s", self.last.sealed,
                             self.last.deleted_segments, self.last.errors)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("log retention pass failed; next pass as scheduled")
            await asyncio.sleep(interval)

    async def run_pass(self, now_ms: int | None = None) -> RetentionReport:
        """Seal abandoned segments and apply every log's retention once."""
        role = await self.logs.bk.caller_role()
        if not allowed(role, Operation.ADMINISTER):
            raise PermissionError(f"log retention deletes segment ledgers without their passwords: it needs the "
                                  f"admin role; bookies take this process for role {role}")
        report = RetentionReport()
        async for name, _ in self.logs.meta.names():
            report.logs += 1
            try:
                await self._one(name, now_ms, report)
            except LogNotFoundError:
                continue   # deleted meanwhile
            except Exception as e:   # one log's failure must not stop the pass
                metrics.RETENTION_ERRORS.inc()
                report.errors[name] = f"{type(e).__name__}: {e}"
                log.warning("log %s: retention failed: %s", name, e)
        metrics.LAST_PASS.set(time.time())
        return report

    async def _one(self, name: str, now_ms: int | None, report: RetentionReport) -> None:
        logs, meta = self.logs, self.logs.meta
        ref = await logs.ref(name)
        label = metrics.label(name)
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        if ref.config.retention.policy is not RetentionPolicy.NONE and await self._seal_if_abandoned(ref, now):
            report.sealed.append(name)
            metrics.IDLE_ROLLS.labels(label).inc()
        before, segments = await logs.retention_point(ref, now)
        if before is not None:
            doomed = [s for s in truncation_prefix(segments, before) if s.state is SegmentState.CLOSED]
            await logs._truncate(ref, before, None)
            if doomed:
                report.deleted_segments[name] = len(doomed)
                report.deleted_bytes[name] = sum(s.bytes for s in doomed)
                metrics.RETENTION_DELETED_SEGMENTS.labels(label).inc(len(doomed))
                metrics.RETENTION_DELETED_BYTES.labels(label).inc(report.deleted_bytes[name])
        if ref.config.digest is DigestType.CRC32C:
            end = await end_offset(logs, ref, b"")
            metrics.END_OFFSET.labels(label).set(end)
            cursors = [c.offset for c in await meta.cursors(ref.log_id)]
            if cursors:
                metrics.CURSOR_LAG.labels(label).set(max(0, end - min(cursors)))

    async def _seal_if_abandoned(self, ref: LogRef, now_ms: int) -> bool:
        """Seal the OPEN last segment of a log no live writer holds once it is past the rollover's
        idle time (else its age); True if this pass sealed it."""
        if ref.config.digest is DigestType.MAC:
            return False   # its entries are read with the password, which autorecovery does not hold
        meta = self.logs.meta
        last = await meta.last_segment(ref.log_id)
        if last is None or last.state is not SegmentState.OPEN:
            return False
        r = ref.config.rollover
        limit = r.max_idle if r.max_idle is not None else r.max_age
        if limit is None or now_ms - last.created_ms < limit * 1000:
            return False
        if await meta.writer_key(ref.log_id) is not None:
            return False   # a live writer rolls its own segment
        head = await meta.head(ref.log_id)
        if head is None or head.state is not LogState.ACTIVE or head.last_seq != last.seq:
            return False
        bk = self.logs.bk
        lease = await bk.store.session.lease_id()
        mine = take_over(head, self.holder)
        ok, _, rev = await meta.put_head(ref.log_id, mine, lease=lease, writer=self.holder)
        if not ok:
            return False   # a writer opened meanwhile
        try:
            md = await recover(bk, await bk.ledger_metadata(last.ledger_id), None, keyless=True)
            opts = WriterOptions()
            dedup = Dedup.from_snapshot(last.dedup, opts.max_producers, int(opts.producer_idle * 1000),
                                        opts.dedup_window)
            lh = LedgerHandle(bk, md, b"", writable=False)
            summary = await summarize(lh, last.first_offset, dedup if last.producer else None)
            await lh.close()
            sealed = replace(seal(last, summary), dedup=dedup.snapshot())
            ok, _, _ = await meta.commit(ref.log_id, replace(mine, version=rev), None, [sealed])
            return ok
        finally:
            await meta.release_writer(ref.log_id, lease)


async def run_as_auditor(metadata_uri: str, security, name: str, interval: float | None = None) -> None:
    """The retention loop of the elected auditor (`pybk.autorecovery.service.AutoRecovery` runs it
    while it leads), on a client of its own with autorecovery's credential."""
    from pybk.client import BookKeeper
    interval = interval_from_env() if interval is None else interval
    if interval <= 0:
        return
    async with await BookKeeper.connect(metadata_uri, security=security) as bk:
        await RetentionService(Logs(bk), name).run(interval)
