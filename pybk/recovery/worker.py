"""The replication worker: brings marked ledgers back to their full write quorum.

For each under-replication marker whose lock it wins, the worker re-reads the ledger's
metadata and, fragment by fragment, restores the replicas of every bookie that is lost (not
registered), being drained (decommission), or named by the marker while alive (entries missing
on it, found by the periodic check). Lost and drained bookies get a replacement: their share of
the fragment is copied there from surviving replicas (read_range from a source, recovery adds to
the target, in batches), then the fragment's ensemble is CAS-updated. A bookie that is back but
lacks entries gets them copied in place; the ensemble does not change. The marker is deleted only
when nothing is left to do, so a worker that dies mid-ledger loses nothing: the lock expires with
its lease and another worker starts the ledger again (copies are idempotent recovery adds).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import time
from typing import Iterable, Sequence

from pybk import entry, ledger
from pybk.client.bookie_client import BookieError, Status
from pybk.client.errors import NotEnoughBookiesError
from pybk.client.placement import replace_bookies
from pybk.meta import NoSuchLedgerError, VersionConflictError
from pybk.meta.ledgers import Change, LedgerMetadata, Unchanged

from . import decommission, metrics, plan
from .bookies import BookiePool, BookieUnavailable
from .options import RecoveryOptions

log = logging.getLogger(__name__)
# The key the worker's copies and fences carry: none. Bookies accept keyless recovery adds and
# fences from an admin caller (autorecovery's credential); ledger metadata holds no master key.
KEYLESS = b""


class ReplicationFailed(Exception):
    """This pass could not finish the ledger; the marker stays and a later pass retries."""


def swap_bookie(fi: int, first_entry: int, lost: str, target: str) -> Change[None]:
    """The end of a copy as a metadata change: fragment fi (from first_entry) names target where
    it named lost. If that fragment changed meanwhile (gone, moved, or lost already replaced)
    the copy is void and the metadata stays as it is."""
    def change(md: LedgerMetadata) -> LedgerMetadata | Unchanged[None]:
        frags = list(md.fragments)
        if fi >= len(frags) or frags[fi].first_entry_id != first_entry or lost not in frags[fi].bookies:
            return Unchanged()
        frags[fi] = dataclasses.replace(frags[fi], bookies=plan.replace_in_fragment(frags[fi].bookies, lost, target))
        return md.replace(fragments=frags)
    return change


class ReplicationWorker:
    """Takes markers' locks and replicates their ledgers; `run()` until cancelled."""

    def __init__(self, store, metadata_uri: str, options: RecoveryOptions | None = None,
                 pool: BookiePool | None = None):
        self.store = store
        self.metadata_uri = metadata_uri
        self.options = options or RecoveryOptions()
        self.pool = pool or BookiePool(store)
        self._retry_after: dict[int, float] = {}
        self._progress: dict[int, tuple[int, float]] = {}
        self._failures: dict[int, int] = {}
        self.errors: dict[int, str] = {}  # ledger id -> why its last pass failed (shown by status)
        self._wake = asyncio.Event()
        self.busy: set[int] = set()

    def wake(self) -> None:
        """Look at the markers now (a new marker appeared)."""
        self._wake.set()

    async def run(self) -> None:
        """Replicate marked ledgers until cancelled."""
        while True:
            try:
                worked = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replication pass failed; retrying")
                worked = 0
            if not worked:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.options.poll_interval)
                except asyncio.TimeoutError:
                    pass

    async def run_once(self) -> int:
        """One pass over the markers; returns how many ledgers were finished."""
        markers = [m async for m in self.store.underreplication.list()]
        metrics.under_replicated_seen(len(markers), min(m.since_ms for m in markers) / 1000 if markers else None)
        now = time.monotonic()
        todo = [m for m in markers if self._retry_after.get(m.ledger_id, 0) <= now]
        random.shuffle(todo)
        sem = asyncio.Semaphore(self.options.parallel_ledgers)
        finished = 0

        async def one(marker) -> None:
            nonlocal finished
            async with sem:
                if await self._locked_replicate(marker):
                    finished += 1

        await asyncio.gather(*(one(m) for m in todo))
        return finished

    async def _locked_replicate(self, marker) -> bool:
        lock = await self.store.locks.try_acquire(self.store.locks.underreplicated_name(marker.ledger_id))
        if lock is None:
            return False
        self.busy.add(marker.ledger_id)
        try:
            done = await self.replicate_ledger(marker.ledger_id, marker.missing, marker.since_ms / 1000,
                                               marker.version)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures = self._failures.get(marker.ledger_id, 0) + 1
            self._failures[marker.ledger_id] = failures
            metrics.REPLICATION_FAILURES.inc()
            delay = min(30.0, self.options.poll_interval * 2 ** min(failures, 8))
            log.warning("ledger %d: %s; retrying in %.1fs", marker.ledger_id, exc, delay,
                        exc_info=not isinstance(exc, (ReplicationFailed, NotEnoughBookiesError, BookieUnavailable)),
                        extra={"ledger_id": marker.ledger_id})
            self._retry_after[marker.ledger_id] = time.monotonic() + delay
            self.errors[marker.ledger_id] = str(exc) or type(exc).__name__
            return False
        finally:
            self.busy.discard(marker.ledger_id)
            try:
                await lock.release()
            except Exception as exc:
                log.info("releasing the lock of ledger %d: %s (it expires with the lease)", marker.ledger_id, exc,
                         extra={"ledger_id": marker.ledger_id})
        self._failures.pop(marker.ledger_id, None)
        self.errors.pop(marker.ledger_id, None)
        if done:
            self._retry_after.pop(marker.ledger_id, None)
            self._progress.pop(marker.ledger_id, None)
        else:
            self._retry_after[marker.ledger_id] = time.monotonic() + self.options.poll_interval
        return done

    async def replicate_ledger(self, ledger_id: int, marked: Iterable[str], since_s: float,
                               marker_version: int | None = None) -> bool:
        """Restore one ledger's replicas; True when it is complete and its marker deleted.

        since_s is when the ledger was marked (wall-clock seconds), for the open-ledger grace;
        the marker is removed only if unchanged since marker_version (a bookie marked meanwhile
        makes another pass).
        """
        marked = set(marked)
        try:
            md = await self.store.ledgers.get(ledger_id)
        except NoSuchLedgerError:
            await self.store.underreplication.unmark(ledger_id)
            return True
        password = self.options.password_for(md.password_hash)
        writable, readonly = await self.pool.registered()
        draining = {b for b, rec in (await self.store.decommission.list()).items()
                    if rec.state in decommission.ACTIVE}
        alive = set(writable) | set(readonly)
        zones = {b: info.zone or "" for b, info in writable.items()}
        waiting = False
        for _ in range(10_000):
            waiting = False
            bad = {b for b in plan.ledger_bookies(md.fragments) if b not in alive or b in draining}
            suspects = (marked & set(writable)) - draining
            _refuse_read_only(md, marked & set(readonly) - draining)
            ranges = ledger.fragment_ranges(md.fragments, md.last_entry_id)
            restart = False
            for fi, frag in enumerate(md.fragments):
                last_open = fi == len(md.fragments) - 1 and not md.is_closed
                frag_bad = [b for b in frag.bookies if b in bad]
                # an open ledger's last fragment belongs to its writer: only lost bookies count
                frag_suspect = [] if last_open else [b for b in frag.bookies if b in suspects]
                if not frag_bad and not frag_suspect:
                    continue
                if last_open:
                    progress = await self._writer_progress(md, frag, bad)
                    action = plan.last_fragment_action(True, max(since_s, progress), time.time(),
                                                       self.options.open_ledger_grace)
                    if action is plan.LastFragment.WAIT:
                        waiting = True
                        continue
                    md = await self._recover(md, password)
                    restart = True
                    break
                first, last = ranges[fi]
                for b in frag_suspect:
                    await self._fill_in_place(md, frag, first, last, b, bad, password, alive)
                if frag_bad:
                    b = frag_bad[0]
                    index = frag.bookies.index(b)
                    target = replace_bookies(zones, frag.bookies, [index], exclude=bad | draining)[index]
                    wanted = list(ledger.expected_entries(index, first, last, md.ensemble_size, md.write_quorum))
                    await self._copy(md, frag.bookies, index, wanted, target, bad - alive, password)
                    md = await self._swap(md, fi, frag.first_entry_id, b, target)
                    restart = True
                    break
            if not restart:
                break
        else:
            raise ReplicationFailed("metadata kept changing under the worker")
        if waiting:
            return False
        try:
            await self.store.underreplication.unmark(ledger_id, marker_version)
        except VersionConflictError:
            log.info("ledger %d was marked again meanwhile; another pass follows", ledger_id,
                     extra={"ledger_id": ledger_id})
            return False
        metrics.LEDGERS_REPLICATED.inc()
        log.info("ledger %d fully replicated", ledger_id, extra={"ledger_id": ledger_id})
        return True

    async def _writer_progress(self, md, frag, bad: set[str]) -> float:
        """When the open ledger's LAC (max over the reachable bookies of its last fragment) last
        rose, as seen by this worker; 0 if it could not be read."""
        async def lac(bookie: str) -> int:
            try:
                client = await self.pool.get(bookie)
                return await asyncio.wait_for(client.read_lac(md.ledger_id), 5)
            except Exception:
                return -2

        lacs = await asyncio.gather(*(lac(b) for b in frag.bookies if b not in bad))
        seen = max(lacs, default=-2)
        if seen < -1:
            return self._progress.get(md.ledger_id, (0, 0.0))[1]
        self._progress[md.ledger_id] = plan.writer_progress(self._progress.get(md.ledger_id), seen, time.time())
        return self._progress[md.ledger_id][1]

    async def _recover(self, md, password: bytes | None):
        """Fence and recover an open ledger whose writer is gone, so its last fragment closes
        (keyless; without the password MAC entries are checked structurally)."""
        from pybk.client import BookKeeper
        from pybk.client.recovery import recover
        log.info("ledger %d: open past the grace period with a lost bookie in its last fragment; "
                 "fencing and recovering it", md.ledger_id, extra={"ledger_id": md.ledger_id})
        bk = await BookKeeper.connect(self.metadata_uri, security=self.pool.security)
        try:
            await recover(bk, await bk.ledger_metadata(md.ledger_id), password, keyless=True)
        finally:
            await bk.close()
        return await self.store.ledgers.get(md.ledger_id)

    async def _swap(self, md, fi: int, first_entry: int, lost: str, target: str):
        """Store fragment fi's ensemble with target for lost (swap_bookie); returns the metadata
        as stored now (unchanged if the fragment changed meanwhile: the copy is then void)."""
        result = await self.store.ledgers.update(md.ledger_id, swap_bookie(fi, first_entry, lost, target), current=md)
        if result.written:
            log.info("ledger %d fragment %d (from entry %d): %s replaced by %s",
                     md.ledger_id, fi, first_entry, lost, target, extra={"ledger_id": md.ledger_id, "fragment": fi})
        return result.metadata

    async def _fill_in_place(self, md, frag, first: int, last: int, bookie: str, bad: set[str],
                             password: bytes | None, alive: set[str]) -> None:
        """Copy the entries a live ensemble member should hold but lacks back onto it."""
        if last < first:
            return
        client = await self.pool.get(bookie)
        try:
            held = await client.list_entries(md.ledger_id)
        except BookieError as exc:
            if exc.code is not Status.NO_LEDGER:
                raise ReplicationFailed(f"ListEntries on {bookie}: {exc}") from exc
            held = []
        index = frag.bookies.index(bookie)
        missing = plan.missing_entries(index, first, last, md.ensemble_size, md.write_quorum, held)
        if missing:
            log.info("ledger %d: %d entries missing on %s; copying them back", md.ledger_id, len(missing), bookie,
                     extra={"ledger_id": md.ledger_id, "bookie": bookie})
            await self._copy(md, frag.bookies, index, missing, bookie, bad - alive, password)

    async def _copy(self, md, ensemble: Sequence[str], index: int, wanted: list[int], target: str,
                    lost: set[str], password: bytes | None) -> None:
        """Copy entries (the share of ensemble[index]) from surviving replicas onto target. Lost
        bookies are no source; ensemble[index] itself is one when it is alive (a drained bookie)
        and not the target."""
        if not wanted:
            return
        unavailable = set(lost) | {target}
        if ensemble[index] == target:
            unavailable.add(ensemble[index])
        dst = await self.pool.get(target)
        failed: list[int] = []
        sem = asyncio.Semaphore(self.options.parallel_runs)
        try:
            runs = plan.copy_runs(index, ensemble, md.ensemble_size, md.write_quorum, wanted, unavailable,
                                  batch=self.options.batch_entries, spread=random.randrange(1 << 16),
                                  self_source=ensemble[index] not in unavailable)
        except ValueError as exc:
            raise ReplicationFailed(f"ledger {md.ledger_id}: {exc}") from exc

        async def one(run: plan.CopyRun) -> None:
            async with sem:
                copied = await self._copy_run(md, run, dst, target, password)
                failed.extend(e for e in range(run.first, run.last + 1) if e not in copied)

        await asyncio.gather(*(one(r) for r in runs))
        for e in sorted(failed):
            await self._copy_one(md, ensemble, e, dst, target, unavailable, password)

    async def _copy_run(self, md, run: plan.CopyRun, dst, target: str,
                        password: bytes | None) -> set[int]:
        """Stream a run from its source into target, keeping at most max_inflight_bytes of adds
        unanswered; returns the entry ids copied (a source error or a corrupt replica stops the
        run; the caller retries the rest entry by entry)."""
        copied: set[int] = set()
        chunks: collections.deque = collections.deque()  # (futures, entry ids, bytes) awaiting answers
        futs: list[asyncio.Future] = []
        ids: list[int] = []
        size = inflight = 0
        cap = self.options.max_inflight_bytes

        async def settle() -> None:
            nonlocal inflight
            c_futs, c_ids, c_bytes = chunks.popleft()
            inflight -= c_bytes
            results = await asyncio.gather(*c_futs, return_exceptions=True)
            for eid, r in zip(c_ids, results):
                if isinstance(r, BaseException):
                    await self.pool.drop(target)
                    raise ReplicationFailed(f"ledger {md.ledger_id}: recovery add of {eid} to {target} failed: {r}")
            copied.update(c_ids)
            metrics.ENTRIES_REPLICATED.inc(len(c_ids))
            metrics.BYTES_REPLICATED.inc(c_bytes)

        try:
            try:
                src = await self.pool.get(run.source)
                async for eid, body in src.read_range(md.ledger_id, run.first, run.last):
                    if not self._valid(md, eid, body, password):
                        log.warning("ledger %d entry %d: corrupt replica on %s", md.ledger_id, eid, run.source,
                                    extra={"ledger_id": md.ledger_id, "entry_id": eid, "bookie": run.source})
                        break
                    futs.append(dst.add_nowait(md.ledger_id, eid, body, KEYLESS, recovery=True))
                    ids.append(eid)
                    size += len(body)
                    if size >= cap // 4:
                        chunks.append((futs, ids, size))
                        inflight += size
                        futs, ids, size = [], [], 0
                        while inflight > cap:
                            await settle()
            except (BookieError, BookieUnavailable, OSError) as exc:
                log.info("ledger %d: reading %d..%d from %s stopped: %s", md.ledger_id, run.first, run.last,
                         run.source, exc,
                         extra={"ledger_id": md.ledger_id, "entry_range": [run.first, run.last], "bookie": run.source})
            if ids:
                chunks.append((futs, ids, size))
                inflight += size
                futs, ids = [], []
            while chunks:
                await settle()
        finally:
            for c_futs, _, _ in chunks:
                for fut in c_futs:
                    fut.cancel()
            for fut in futs:
                fut.cancel()
        return copied

    async def _add(self, dst, ledger_id: int, eid: int, body: bytes) -> int:
        await dst.add(ledger_id, eid, body, master_key=KEYLESS, recovery=True)
        metrics.ENTRIES_REPLICATED.inc()
        metrics.BYTES_REPLICATED.inc(len(body))
        return eid

    async def _copy_one(self, md, ensemble: Sequence[str], eid: int, dst, target: str,
                        unavailable: set[str], password: bytes | None) -> None:
        """Slow path for one entry: try every surviving member of its write set in turn."""
        for source in ledger.write_set_bookies(eid, ensemble, md.write_quorum):
            if source in unavailable or source == target:
                continue
            try:
                src = await self.pool.get(source)
                body = await src.read(md.ledger_id, eid)
            except (BookieError, BookieUnavailable) as exc:
                log.info("ledger %d entry %d not readable from %s: %s", md.ledger_id, eid, source, exc)
                continue
            if not self._valid(md, eid, body, password):
                continue
            try:
                await self._add(dst, md.ledger_id, eid, body)
            except BookieError as exc:
                raise ReplicationFailed(f"ledger {md.ledger_id}: recovery add of {eid} to {target}: {exc}") from exc
            return
        raise ReplicationFailed(f"ledger {md.ledger_id} entry {eid}: no surviving replica could be read")

    @staticmethod
    def _valid(md, eid: int, body: bytes, password: bytes | None) -> bool:
        """Digest checked when the password is known or the digest is CRC32C; otherwise (a MAC
        ledger repaired with its stored master key) length and ids only."""
        try:
            entry.decode(body, md.digest_type, password or b"", ledger_id=md.ledger_id, entry_id=eid,
                         verify_digest=password is not None or md.digest_type is entry.DigestType.CRC32C)
            return True
        except entry.DigestMismatch:
            return False


def _refuse_read_only(md, read_only: set[str]) -> None:
    """A bookie marked as missing entries that is read-only now can take none back: the ledger
    waits (ReplicationFailed, retried with back-off) rather than losing its marker unrepaired.
    Only the writer's own last fragment of an open ledger is not ours to fill."""
    last = len(md.fragments) - 1
    held = sorted({b for i, frag in enumerate(md.fragments) if md.is_closed or i < last
                   for b in frag.bookies if b in read_only})
    if held:
        raise ReplicationFailed(f"ledger {md.ledger_id}: {', '.join(held)} marked as missing entries but read-only; "
                                "they are copied back once it is writable again")
