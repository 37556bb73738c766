"""The local scrubber: finds checkpointed entries this bookie can no longer read and gives them up,
so that autorecovery copies them back from the other replicas (BookKeeper's `localScrubPeriod`).

What it checks: every location in the LMDB index against the entry-log record it points at
(`EntryLog.read_at`: the record header names the same ledger and entry, its length is sane, the
record is complete, the CRC32C over ledger, entry and body matches). Entries still in the write
cache are not checked: they are in memory and in the journal.

What it does with a bad entry (flipped bits, a truncated or deleted entry log, EIO from the
disk): removes its location from the index, only if the index still points at the location that
was checked (a checkpoint or compaction that moved the entry meanwhile wins), so ListEntries
omits it and reads answer NO_ENTRY (clients go to another replica); then marks each affected
ledger under-replicated in the metadata store, naming this bookie, so the replication worker
copies the entries back in place. A marking that fails (etcd unreachable) is retried until it
succeeds; meanwhile the auditor's periodic check sees the gap through ListEntries too.

Failure modes: the scrub refuses to judge (ScrubError, nothing removed from then on) when it
cannot look rather than finding a bad record: a ledger dir without its entrylogs directory (an
unmounted disk), an index location in a ledger dir that is not configured, an error opening or
reading a file other than "no such file" or EIO (e.g. EMFILE, EACCES).

Pacing: the worker thread (one of its own, with descriptors of its own) checks at most
STEP_ENTRIES entries or STEP_BYTES bytes per step, in one short LMDB read transaction, and closes its
descriptors after each (a file compaction deleted meanwhile frees its space). The scrub then
rests as long as the step took (half of one core at most) on an idle bookie, and BUSY_REST times
as long (a twentieth) when the journal was written meanwhile, so adds keep their pace; a daily
scrub has time.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .entrylog import EntryLogCorruptError
from .index import KEY, LOCATION

if TYPE_CHECKING:
    from pybk.meta.underreplication import UnderReplication

    from .storage import Storage

log = logging.getLogger("pybk.bookie.scrub")

STEP_ENTRIES = 1000
STEP_BYTES = 8 * 1024 * 1024
MAX_PROBLEMS = 20  # problem descriptions kept in a result (all are counted)
MARK_RETRY_SECONDS = 10.0
MAX_OPEN_FILES = 64  # entry logs a step keeps open at once
IDLE_REST = 1.0  # after a step, rest this many times as long as the step took (no writes meanwhile)
BUSY_REST = 19.0  # ... when the journal was written meanwhile: adds come first
_MEDIA_ERRORS = (errno.EIO, errno.ENXIO)  # the disk failed to give these bytes: the entry is bad


class ScrubError(Exception):
    """The scrub could not look at the files (not a verdict on any entry): it stopped there."""


@dataclass
class ScrubResult:
    """One scrub run: what was checked, what was found bad and removed, which ledgers were marked."""

    started: float  # wall-clock seconds
    seconds: float = 0.0
    entries_checked: int = 0
    bytes_checked: int = 0
    bad: dict[int, list[list[int]]] = field(default_factory=dict)  # ledger -> [first, last] ranges removed
    bad_entries: int = 0
    files_missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the first MAX_PROBLEMS, for the operator
    marked: list[int] = field(default_factory=list)  # ledgers marked under-replicated
    mark_error: str = ""  # why some ledgers are not marked yet ("" when all are)
    error: str = ""  # why the run stopped early ("" when it finished)

    def add_bad(self, ledger: int, entry: int) -> None:
        """Record a removed entry (entries arrive in (ledger, entry) order)."""
        self.bad_entries += 1
        ranges = self.bad.setdefault(ledger, [])
        if ranges and ranges[-1][1] == entry - 1:
            ranges[-1][1] = entry
        else:
            ranges.append([entry, entry])

    def to_json(self) -> dict:
        return {"started": self.started, "seconds": round(self.seconds, 3), "entries_checked": self.entries_checked,
                "bytes_checked": self.bytes_checked, "bad_entries": self.bad_entries,
                "bad_by_ledger": {str(lid): ranges for lid, ranges in sorted(self.bad.items())},
                "files_missing": self.files_missing, "problems": self.problems,
                "marked_under_replicated": self.marked, "mark_error": self.mark_error, "error": self.error}


@dataclass
class _Step:
    checked: int = 0
    nbytes: int = 0
    bad: list[tuple[bytes, bytes]] = field(default_factory=list)  # packed (KEY, LOCATION)
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


class _Scan:
    """The worker-thread side of one run: walks the index in key order, one bounded step at a time,
    reading records with descriptors of its own (never the event loop's cached ones)."""

    def __init__(self, storage: Storage):
        self.index = storage.index
        self.entrylogs = storage.entrylogs
        self.after: bytes | None = None
        self.done = False
        self._fds: dict[tuple[int, int], int | None] = {}  # None: the file is missing
        self._missing: set[str] = set()  # reported once per run

    def step(self) -> _Step:
        """Check the next entries (at most STEP_ENTRIES, about STEP_BYTES). Descriptors are closed
        at the end of every step, so files compaction deleted meanwhile free their space."""
        out = _Step()
        pairs = self.index.locations_after(self.after, STEP_ENTRIES)
        if len(pairs) < STEP_ENTRIES:
            self.done = True
        try:
            for key, loc in pairs:
                self.after = key
                ledger, entry = KEY.unpack(key)
                d, log_id, offset = LOCATION.unpack(loc)
                problem = self._check(out, d, log_id, offset, ledger, entry)
                out.checked += 1
                if problem:
                    out.bad.append((key, loc))
                    out.problems.append(problem)
                if out.nbytes >= STEP_BYTES:
                    self.done = False
                    break
        finally:
            self.close()
        return out

    def _check(self, out: _Step, d: int, log_id: int, offset: int, ledger: int, entry: int) -> str:
        """'' if the record at the location is the entry, intact; else what is wrong with it."""
        if d >= len(self.entrylogs):
            raise ScrubError(f"the index puts entry {ledger}:{entry} in ledger dir #{d}, but only "
                             f"{len(self.entrylogs)} are configured: not judging (start the bookie with all "
                             f"its ledger dirs)")
        el = self.entrylogs[d]
        fd = self._open(out, d, log_id)
        if fd is None:
            return f"entry {ledger}:{entry}: {el.path(log_id)} is missing"
        try:
            out.nbytes += len(el.read_at(fd, log_id, offset, ledger, entry))
        except EntryLogCorruptError as exc:
            return str(exc)
        except OSError as exc:
            if exc.errno not in _MEDIA_ERRORS:
                raise ScrubError(f"reading {el.path(log_id)}: {exc}") from exc
            return f"entry {ledger}:{entry}: {el.path(log_id)} offset {offset}: {exc.strerror}"
        return ""

    def _open(self, out: _Step, d: int, log_id: int) -> int | None:
        if (d, log_id) in self._fds:
            return self._fds[(d, log_id)]
        if len(self._fds) >= MAX_OPEN_FILES:
            self.close()
        path = self.entrylogs[d].path(log_id)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            fd = None
            if str(path) not in self._missing:
                self._missing.add(str(path))
                out.missing.append(str(path))
        except OSError as exc:
            raise ScrubError(f"opening {path}: {exc}") from exc
        self._fds[(d, log_id)] = fd
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds.clear()


class Scrubber:
    """Runs the scrub every `interval` seconds (0 = only on request) and on request (`scrub()`,
    POST /api/v1/bookie/scrub). Without a metadata store (`underreplication` None) it still
    removes bad entries; the result then says the ledgers could not be marked."""

    def __init__(self, storage: Storage, interval: float, bookie_id: str = "",
                 underreplication: UnderReplication | None = None):
        self.storage = storage
        self.interval = interval
        self.bookie_id = bookie_id
        self.underreplication = underreplication
        self.last: ScrubResult | None = None
        self._unmarked: set[int] = set()  # ledgers with removed entries not marked yet
        self._mark_failed = asyncio.Event()  # wakes the background loop to retry sooner
        self._running: asyncio.Task | None = None
        self._task: asyncio.Task | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="scrub")

    @property
    def running(self) -> bool:
        """A scrub is in progress."""
        return self._running is not None and not self._running.done()

    async def scrub(self) -> ScrubResult:
        """Run one scrub now, or join the one in progress; its result (also kept as `last`)."""
        if not self.running:
            self._running = asyncio.get_running_loop().create_task(self._run(), name="scrub")
        return await asyncio.shield(self._running)

    async def _run(self) -> ScrubResult:
        storage = self.storage
        m = storage.metrics
        result = ScrubResult(started=time.time())
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        scan = _Scan(storage)
        try:
            for el in storage.entrylogs:
                if not el.directory.is_dir():
                    raise ScrubError(f"{el.directory} does not exist (is the disk mounted?): not judging")
            while not scan.done:
                s0 = time.monotonic()
                written = storage.journal.position
                step = await loop.run_in_executor(self._executor, scan.step)
                result.entries_checked += step.checked
                result.bytes_checked += step.nbytes
                result.files_missing += step.missing
                m.scrub_entries_checked.inc(step.checked)
                if step.bad:
                    for ledger, entry in await storage.drop_locations(step.bad):
                        result.add_bad(ledger, entry)
                        if self.underreplication is not None:
                            self._unmarked.add(ledger)
                    kept = step.problems[:max(MAX_PROBLEMS - len(result.problems), 0)]
                    result.problems += kept
                    for problem in kept:  # the first few; the summary at the end counts them all
                        log.error("scrub: %s", problem)
                rest = BUSY_REST if storage.journal.position != written else IDLE_REST
                await asyncio.sleep(max((time.monotonic() - s0) * rest, 0.001))
        except ScrubError as exc:
            result.error = str(exc)
            m.scrub_failures.inc()
            log.error("scrub stopped: %s", exc)
        m.scrub_bad_entries.inc(result.bad_entries)
        m.scrub_files_missing.inc(len(result.files_missing))
        if result.bad and self.underreplication is None:
            result.mark_error = ("no metadata store (the bookie runs without --metadata-uri): ledgers not "
                                 "marked under-replicated")
        if self._unmarked:
            await self._mark_pending(result)
        result.seconds = time.monotonic() - t0
        m.scrub_runs.inc()
        m.scrub_last_run.set(time.time())
        m.scrub_last_run_seconds.set(result.seconds)
        self.last = result
        if result.bad_entries:
            log.warning("scrub: %d entries of %d ledgers unreadable and dropped from the index (%d files missing); "
                        "ledgers marked under-replicated: %s%s", result.bad_entries, len(result.bad),
                        len(result.files_missing), result.marked, f" ({result.mark_error})" if result.mark_error else "")
        else:
            log.info("scrub: %d entries checked in %.1fs, none bad", result.entries_checked, result.seconds)
        return result

    async def _mark_pending(self, result: ScrubResult | None = None) -> None:
        """Mark the ledgers that lost entries here under-replicated, naming this bookie."""
        for ledger in sorted(self._unmarked):
            try:
                await self.underreplication.mark(ledger, [self.bookie_id])
            except Exception as exc:  # noqa: BLE001 - retried every MARK_RETRY_SECONDS
                log.warning("scrub: marking ledger %d under-replicated failed (%s); retrying", ledger, exc,
                            extra={"ledger_id": ledger})
                self._mark_failed.set()
                if result is not None:
                    result.mark_error = f"marking ledger {ledger} failed: {exc}; retried every {MARK_RETRY_SECONDS:g}s"
                return
            self._unmarked.discard(ledger)
            if result is not None:
                result.marked.append(ledger)

    def start(self) -> None:
        """Scrub every `interval` seconds in the background (the first after one interval); also
        retries markings that failed. Nothing runs in the background when the interval is 0 (failed
        markings are then retried by the next scrub on request)."""
        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="scrubber")

    async def _loop(self) -> None:
        due = time.monotonic() + self.interval
        while True:
            wait = due - time.monotonic()
            if self._unmarked:
                wait = min(wait, MARK_RETRY_SECONDS)
            self._mark_failed.clear()
            try:
                await asyncio.wait_for(self._mark_failed.wait(), max(wait, 0))
                continue  # a marking failed meanwhile: wait MARK_RETRY_SECONDS, not the whole interval
            except asyncio.TimeoutError:
                pass
            if self._unmarked:
                await self._mark_pending()
            if time.monotonic() < due:
                continue
            try:
                await self.scrub()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - never stop the bookie; try again next interval
                log.exception("scrub failed")
            due = time.monotonic() + self.interval

    async def close(self) -> None:
        """Stop background and running scrubs; returns once the worker thread is idle (the index
        may be closed after this)."""
        for task in (self._task, self._running):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._task, self._running) if t is not None), return_exceptions=True)
        await asyncio.to_thread(self._executor.shutdown, True)
