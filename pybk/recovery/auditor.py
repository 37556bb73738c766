"""The auditor: one per cluster (elected in etcd), it finds under-replicated ledgers and marks them.

Two ways in:
- lost bookies: a bookie that was registered (or is referenced by a ledger) and has been absent
  from the registry for longer than the lost-bookie delay is lost; every ledger with a fragment on
  it gets an under-replication marker naming it;
- the periodic check: for every ledger, every live bookie of its fragments is asked which entries
  it holds (ListEntries); a bookie lacking entries of its share gets the ledger marked. Closed
  ledgers are checked whole, open ones up to their last (still growing) fragment. The same scan
  reports fragments whose ensemble violates zone spreading.

Replication workers act on the markers; the auditor never copies data.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from pybk.client.bookie_client import BookieError, Status

from . import metrics, plan
from .bookies import BookiePool, BookieUnavailable
from .options import RecoveryOptions

log = logging.getLogger(__name__)
ELECTION = "auditor"  # the election whose leader is the auditor


@dataclasses.dataclass
class AuditReport:
    """What the last periodic check found."""

    started: float = 0.0
    duration: float = 0.0
    ledgers: int = 0
    marked: list[int] = dataclasses.field(default_factory=list)
    violations: list[plan.PlacementViolation] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {"started": self.started, "duration_s": round(self.duration, 3), "ledgers": self.ledgers,
                "marked": self.marked, "placement_violations": [str(v) for v in self.violations]}


class Auditor:
    """Marks under-replicated ledgers while it holds the auditor leadership."""

    def __init__(self, store, options: RecoveryOptions | None = None, pool: BookiePool | None = None):
        self.store = store
        self.options = options or RecoveryOptions()
        self.pool = pool or BookiePool(store)
        self.gone_since: dict[str, float] = {}
        self.lost: set[str] = set()
        self._handled: set[str] = set()
        self._trigger = asyncio.Event()
        self.last_audit: AuditReport | None = None
        self.audits = 0

    def trigger(self) -> None:
        """Run the periodic check now."""
        self._trigger.set()

    async def lead(self) -> None:
        """Audit until cancelled (the caller cancels when leadership is lost)."""
        metrics.IS_AUDITOR.set(1)
        try:
            await self._note_referenced()
            await asyncio.gather(self._watch_bookies(), self._periodic())
        finally:
            metrics.IS_AUDITOR.set(0)

    async def _note_referenced(self) -> None:
        """Bookies that ledgers reference but that are not registered count as gone from now."""
        writable, readonly = await self.pool.registered()
        present = set(writable) | set(readonly)
        now = time.monotonic()
        async for md in self.store.ledgers.list_metadata():
            for b in md.bookies():
                if b not in present:
                    self.gone_since.setdefault(b, now)

    async def _watch_bookies(self) -> None:
        """Track departures; mark the ledgers of bookies gone longer than the lost-bookie delay."""
        known: set[str] = set()
        while True:
            writable, readonly = await self.pool.registered()
            present = set(writable) | set(readonly)
            now = time.monotonic()
            known |= present | set(self.gone_since)
            for b in known:
                if b in present:
                    if self.gone_since.pop(b, None) is not None:
                        log.info("bookie %s is back", b)
                    self.lost.discard(b)
                    self._handled.discard(b)
                else:
                    since = self.gone_since.setdefault(b, now)
                    if now - since >= self.options.lost_bookie_delay:
                        self.lost.add(b)
            metrics.LOST_BOOKIES.set(len(self.lost))
            new = self.lost - self._handled
            if new:
                log.warning("bookies lost (gone > %.0fs): %s; marking their ledgers",
                            self.options.lost_bookie_delay, ", ".join(sorted(new)))
                await self.mark_ledgers_of(new)
                self._handled |= new
            await asyncio.sleep(min(self.options.poll_interval, max(0.05, self.options.lost_bookie_delay / 4)))

    async def mark_ledgers_of(self, bookies: set[str]) -> list[int]:
        """Mark every ledger with a fragment on any of `bookies`; returns their ids."""
        marked = []
        async for md in self.store.ledgers.list_metadata():
            hit = md.bookies() & bookies
            if hit:
                await self.store.underreplication.mark(md.ledger_id, sorted(hit))
                marked.append(md.ledger_id)
        log.info("marked %d ledgers under-replicated for %s", len(marked), ", ".join(sorted(bookies)))
        metrics.UNDER_REPLICATED.set(await self.store.underreplication.count())
        return marked

    async def _periodic(self) -> None:
        interval = self.options.audit_interval
        while True:
            try:
                timeout = interval if interval > 0 else None
                await asyncio.wait_for(self._trigger.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._trigger.clear()
            try:
                await self.audit()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic check failed; next one as scheduled")

    async def audit(self) -> AuditReport:
        """The full check: ListEntries of every ledger on every live bookie of its fragments."""
        report = AuditReport(started=time.time())
        t0 = time.monotonic()
        writable, readonly = await self.pool.registered()
        alive = set(writable) | set(readonly)
        zones = {b: i.zone or "" for d in (writable, readonly) for b, i in d.items()}
        sem = asyncio.Semaphore(16)
        tasks = []

        async def check(md) -> None:
            async with sem:
                missing = await self._check_ledger(md, alive)
            lost = md.bookies() & self.lost
            if missing or lost:
                await self.store.underreplication.mark(md.ledger_id, sorted(missing | lost))
                report.marked.append(md.ledger_id)

        async for md in self.store.ledgers.list_metadata():
            report.ledgers += 1
            report.violations.extend(plan.placement_violations(md.ledger_id, md.fragments, zones))
            tasks.append(asyncio.ensure_future(check(md)))
            if len(tasks) >= 256:
                await asyncio.gather(*tasks)
                tasks.clear()
        await asyncio.gather(*tasks)
        report.duration = time.monotonic() - t0
        report.marked.sort()
        metrics.AUDIT_SECONDS.observe(report.duration)
        metrics.LAST_AUDIT.set(time.time())
        metrics.UNDER_REPLICATED.set(await self.store.underreplication.count())
        metrics.PLACEMENT_VIOLATIONS.set(len(report.violations))
        self.last_audit = report
        self.audits += 1
        log.info("periodic check: %d ledgers in %.2fs, %d marked, %d placement violations",
                 report.ledgers, report.duration, len(report.marked), len(report.violations))
        return report

    async def _check_ledger(self, md, alive: set[str]) -> set[str]:
        """Live bookies of md that lack entries of their share (open ledgers: closed fragments only)."""
        frags = md.fragments if md.is_closed else md.fragments[:-1]
        if not frags:
            return set()
        last = md.last_entry_id if md.is_closed else md.fragments[-1].first_entry_id - 1
        held: dict[str, list | None] = {}
        for b in plan.ledger_bookies(frags):
            if b not in alive:
                held[b] = None
                continue
            try:
                client = await self.pool.get(b)
                held[b] = await client.list_entries(md.ledger_id)
            except BookieError as exc:
                held[b] = [] if exc.code is Status.NO_LEDGER else None
            except BookieUnavailable:
                held[b] = None
        gaps = plan.fragment_gaps(frags, md.ensemble_size, md.write_quorum, last, held)
        for g in gaps:
            log.warning("ledger %d fragment %d: %s lacks %d entries (%s)", md.ledger_id, g.fragment, g.bookie,
                        g.count, ", ".join(f"{a}-{b}" for a, b in g.missing[:5]))
        return {g.bookie for g in gaps}
