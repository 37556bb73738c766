"""One autorecovery process: an auditor candidate and a replication worker, on one metadata store.

Run standalone (`pybk autorecovery`) or inside a bookie (`pybk bookie --autorecovery`). Every such
process campaigns for the auditor role; the elected one audits (and finishes drains), all of them
replicate. Losing the session lease ends the leadership; the process campaigns again.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket

from pybk.log import metrics as log_metrics
from pybk.recovery import decommission, metrics
from pybk.recovery.auditor import ELECTION, Auditor
from pybk.recovery.bookies import BookiePool
from pybk.recovery.options import RecoveryOptions
from pybk.recovery.worker import ReplicationWorker

log = logging.getLogger("pybk.recovery.service")  # the name logs and dashboards know


class RecoveryStopped(RuntimeError):
    """A part of a running autorecovery (its auditor campaign or its replication worker) ended
    although nothing stopped the whole."""


class AutoRecovery:
    """`await AutoRecovery(store, uri, options).run()` until cancelled."""

    def __init__(self, store, metadata_uri: str, options: RecoveryOptions | None = None,
                 name: str | None = None, http: str = "", worker: bool = True, security=None):
        """security: the ClientSecurity bookies are called with (default: from the environment)."""
        metrics.register()
        log_metrics.register_service()
        self.store = store
        self.options = options or RecoveryOptions()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.http = http
        self.metadata_uri = metadata_uri
        self.pool = BookiePool(store, security)
        self.auditor = Auditor(store, self.options, self.pool)
        self.worker = ReplicationWorker(store, metadata_uri, self.options, self.pool) if worker else None
        self.is_auditor = False
        self.last_job_gc: dict | None = None

    @property
    def identity(self) -> str:
        """What the election key holds: who this is and where its admin API listens."""
        return json.dumps({"id": self.name, "http": self.http, "pid": os.getpid()})

    async def run(self) -> None:
        """Campaign and replicate until cancelled. Both loop for ever, so one that ends (even by
        a cancellation that did not come through here) is a fault: the other is stopped too and
        RecoveryStopped names it, rather than the process idling on as half an autorecovery."""
        tasks = [asyncio.create_task(self._campaign(), name="auditor campaign")]
        if self.worker is not None:
            tasks.append(asyncio.create_task(self.worker.run(), name="replication worker"))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            task = done.pop()
            why = "it was cancelled" if task.cancelled() else f"{task.exception() or 'it returned'}"
            raise RecoveryStopped(f"autorecovery {self.name}: its {task.get_name()} stopped: {why}")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.pool.close()

    async def _campaign(self) -> None:
        while True:
            try:
                leadership = await self.store.election.campaign(self.identity, ELECTION)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("auditor election failed (%s); retrying", exc)
                await asyncio.sleep(self.options.poll_interval)
                continue
            log.info("%s is the auditor", self.name)
            self.is_auditor = True
            lead = asyncio.ensure_future(self._lead())
            lost = asyncio.ensure_future(leadership.lost.wait())
            try:
                await asyncio.wait({lead, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.is_auditor = False
                metrics.IS_AUDITOR.set(0)
                for t in (lead, lost):
                    t.cancel()
                await asyncio.gather(lead, lost, return_exceptions=True)
                try:
                    await leadership.resign()
                except Exception:
                    pass
            if lead.done() and not lead.cancelled() and lead.exception() is not None:
                log.error("auditor failed: %s; campaigning again", lead.exception())
                await asyncio.sleep(self.options.poll_interval)
            else:
                log.warning("%s lost the auditor leadership; campaigning again", self.name)

    async def _lead(self) -> None:
        await asyncio.gather(self.auditor.lead(), self._drains(), self._job_gc(), self._log_retention())

    async def _log_retention(self) -> None:
        """Named logs' retention (pybk.log.retention_service), by the elected auditor only."""
        from pybk.log.retention_service import run_as_auditor
        await run_as_auditor(self.metadata_uri, self.pool.security, self.name)

    async def _job_gc(self) -> None:
        """Settle what write jobs left behind (`pybk.meta.job_gc.collect`, as `pybk shell gc-jobs`),
        every job_gc_interval seconds; only the auditor does, so two processes never race."""
        from pybk.meta import job_gc as gc
        if self.options.job_gc_interval <= 0:
            return
        while True:
            try:
                report = await gc.collect(self.store, grace_s=self.options.job_gc_grace)
                self.last_job_gc = report.to_json()
                if report.deleted or report.committed or report.removed_records or report.errors:
                    log.info("write-job GC: deleted %s, marked committed %s, removed records %s, errors %s",
                             report.deleted, report.committed, report.removed_records, report.errors)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("write-job GC failed; next pass as scheduled")
            await asyncio.sleep(self.options.job_gc_interval)

    async def _drains(self) -> None:
        """Finish decommissions (also those started with --no-wait), and show their progress in
        the decommission gauges while this process is the auditor."""
        shown: set[str] = set()
        try:
            while True:
                try:
                    records = await self.store.decommission.list()
                    for bookie, rec in records.items():
                        progress = await decommission.drain_step(self.store, rec)
                        metrics.DECOMMISSION_TOTAL.labels(bookie).set(progress.total)
                        metrics.DECOMMISSION_REMAINING.labels(bookie).set(progress.remaining)
                        shown.add(bookie)
                    for bookie in shown - set(records):  # requests cleared meanwhile
                        metrics.DECOMMISSION_TOTAL.remove(bookie)
                        metrics.DECOMMISSION_REMAINING.remove(bookie)
                        shown.discard(bookie)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("drain check failed")
                if self.worker is not None:
                    self.worker.wake()
                await asyncio.sleep(self.options.poll_interval)
        finally:  # no longer the auditor: the new one shows them
            metrics.DECOMMISSION_TOTAL.clear()
            metrics.DECOMMISSION_REMAINING.clear()

    async def status(self) -> dict:
        """What /api/v1/autorecovery/status shows."""
        count = await self.store.underreplication.count()
        out = {"id": self.name, "is_auditor": self.is_auditor, "replicates": self.worker is not None,
               "under_replicated": count,
               "worker_busy": sorted(self.worker.busy) if self.worker else [],
               "worker_errors": {str(k): v for k, v in sorted(self.worker.errors.items())} if self.worker else {},
               "lost_bookies": sorted(self.auditor.lost),
               "last_audit": self.auditor.last_audit.to_json() if self.auditor.last_audit else None,
               "last_job_gc": self.last_job_gc}
        return out
