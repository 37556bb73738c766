"""A bookie's storage: journal, write cache, entry logs, LMDB index and checkpoints.

An add is journaled (group commit, fdatasync) and put in the write cache; its future completes
once the journal record is durable, and only then does the service answer. A checkpoint moves the
write cache into the entry log + index and persists the journal mark; start-up replays the journal
from that mark. Ledger state (master key, fenced, LAC) is journaled and checkpointed the same way.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pybk.config import option_field
from pybk.ledger import entry_ranges

from .disk import DiskOptions, DiskState
from .entrylog import EntryLog
from .index import KEY, Index, index_dir, inspect
from .journal import (Journal, JournalGap, JournalGapError, JournalOptions, Mark, RecordType, check as check_journal,
                      discard_unused, is_space_error, read_head, read_mark, replay, write_atomic, write_mark)
from .metrics import Metrics
from .state import LedgerState, apply_record
from .writecache import WriteCache

log = logging.getLogger("pybk.bookie")

_ADD = int(RecordType.ADD)
JOURNAL_LOSS_FILE = "journal.loss"  # in the journal dir: an accepted loss not yet reported
LOCK_FILE = "LOCK"  # in the journal dir: flock'd by the process that has the dirs open
DISK_READ_ENTRIES = 4096  # entries per worker-thread read from the entry logs
READ_SPAN = 4 << 20  # neighbouring records within this many bytes of a run's first are read with one pread


class DirsInUseError(Exception):
    """Another process (a running bookie, a rebuild) has this bookie's dirs open."""


def lock_dirs(journal_dir: Path) -> int:
    """Take the bookie's exclusive lock (flock on LOCK in the journal dir, released when the
    descriptor closes or the process dies); DirsInUseError if another process holds it."""
    fd = os.open(Path(journal_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DirsInUseError(f"journal dir {journal_dir} is in use by another process (a running bookie or "
                             f"index rebuild): stop it first") from None
    return fd


class BookieStorageError(Exception):
    """The store cannot serve a request (I/O failure, corrupt entry log)."""



@dataclass(frozen=True)
class StorageOptions:
    """Tunables of the storage core."""

    journal: JournalOptions = field(default_factory=JournalOptions)
    disk: DiskOptions = field(default_factory=DiskOptions)
    checkpoint_interval: float = option_field("checkpoint_interval")
    checkpoint_bytes: int = option_field("checkpoint_bytes")
    entrylog_max_file_size: int = option_field("entrylog_max_file_size")
    entrylog_direct_io: bool = option_field("entrylog_direct_io")
    max_entry_size: int = option_field("max_entry_size")
    # past this (cache + checkpoint in flight + journal backlog) adds get TOO_MANY_REQUESTS
    max_write_cache_bytes: int = option_field("max_write_cache_bytes")
    accept_journal_loss: bool = option_field("accept_journal_loss")  # start despite missing/cut journal files


class Storage:
    """One bookie's files and what is cached of them: `await start()`, then adds go through
    `journal` and `cache`, reads through the read methods; `await close()`. The ledgers' states
    (`ledgers`) are replayed and checkpointed with the entries."""

    def __init__(self, journal_dir: Path, ledger_dirs: list[Path], options: StorageOptions, disk: DiskState,
                 metrics: Metrics):
        self.journal_dir = Path(journal_dir)
        self.ledger_dirs = [Path(d) for d in ledger_dirs]
        if not self.ledger_dirs:
            raise ValueError("a bookie needs at least one ledger dir")
        self.opts = options
        self.disk = disk
        self.metrics = metrics
        self.ledgers: dict[int, LedgerState] = {}
        self.cache = WriteCache()
        self.flushing: WriteCache | None = None
        self._indexed_last: dict[int, int] = {}  # ledger -> highest entry id in the index (-1: none), as looked up
        self.disk_reads = 0  # entry log reads running in worker threads
        self.lock = asyncio.Lock()  # checkpoints, deletions and compactions one at a time
        self._ckpt_task: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self.journal: Journal | None = None
        self.index: Index | None = None
        self.entrylogs: list[EntryLog] = []
        self.replayed = 0
        self.started = False
        self._lock_fd = -1

    async def start(self) -> None:
        """Check the index and the journal against each other, open them, replay the journal from
        the mark, start the writer. IndexDamagedError or JournalGapError stop it (the latter not
        with accept_journal_loss: the loss is then logged, kept for reporting, every ledger held is
        fenced, since a fence recorded in the lost range is gone too, and a checkpoint moves past it).
        DirsInUseError if another process has the dirs open."""
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        for d in self.ledger_dirs:
            d.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_dirs(self.journal_dir)
        try:
            await self._open()
        except BaseException:
            self._unlock()
            raise

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        mark = read_mark(self.journal_dir)
        holds_data = mark.seq > 0 or _has_entry_logs(self.ledger_dirs)
        await loop.run_in_executor(None, inspect, index_dir(self.ledger_dirs[0]), holds_data)
        self.index = Index(self.ledger_dirs[0], sync=self.opts.journal.fsync)
        self.index.check_current(mark, holds_data, read_head(self.journal_dir).journal_id)
        # The index holds everything before its checkpoint record: replay may start there (it is
        # the mark itself, or one checkpoint later, or the only mark left if journal.mark was lost).
        mark = max(mark, Mark(*(self.index.checkpoint() or (0, 0))))
        for path in discard_unused(self.journal_dir):
            log.info("removed %s: a journal file the last stop left unused", path)
        gaps = check_journal(self.journal_dir, mark)
        if gaps and not self.opts.accept_journal_loss:
            raise JournalGapError(gaps)
        if gaps:
            self._accept_journal_loss(gaps)
        self.entrylogs = [EntryLog(d, self.opts.entrylog_max_file_size, self.opts.entrylog_direct_io) for d in self.ledger_dirs]
        for ledger, raw in self.index.ledger_states():
            self.ledgers[ledger] = LedgerState.from_bytes(raw)
        self.replayed = await loop.run_in_executor(None, self._replay, mark, bool(gaps))
        self.journal = Journal(self.journal_dir, self.opts.journal, self._journal_synced, self.disk.journal_failure)
        self.journal.open()
        self.index.bind_journal(self.journal.journal_id)
        self.disk.open()
        self._tasks = [loop.create_task(self._checkpoint_loop(), name="checkpointer"),
                       loop.create_task(self.disk.watch(self._cache_measured), name="disk-checker")]
        self.metrics.ledgers.set(len(self.ledgers))
        self.started = True
        if gaps:
            for st in self.ledgers.values():  # a lost FENCE record must not let a zombie writer back in
                st.fenced = st.dirty = True
            await self.checkpoint()  # the mark moves past the gaps: the next start finds the journal whole
        log.info("storage started: %d ledgers, %d journal records replayed from %s", len(self.ledgers),
                 self.replayed, mark)

    def _accept_journal_loss(self, gaps: list[JournalGap]) -> None:
        """Log the lost range and keep it (durably) until it is reported to the metadata store."""
        for gap in gaps:
            log.error("journal loss accepted (--accept-journal-loss): %s; entries acknowledged there are "
                      "lost on this bookie", gap)
        lost = self.pending_journal_loss() + [str(g) for g in gaps]
        write_atomic(self.journal_dir / JOURNAL_LOSS_FILE,
                     json.dumps({"lost": lost, "since_ms": int(time.time() * 1000)}).encode())

    def pending_journal_loss(self) -> list[str]:
        """Accepted journal gaps not yet reported (they survive restarts until reported)."""
        try:
            return list(json.loads((self.journal_dir / JOURNAL_LOSS_FILE).read_text())["lost"])
        except FileNotFoundError:
            return []

    def journal_loss_reported(self) -> None:
        """The ledgers touched by the accepted loss are marked under-replicated: forget it."""
        (self.journal_dir / JOURNAL_LOSS_FILE).unlink(missing_ok=True)

    def _replay(self, mark: Mark, accept_loss: bool = False) -> int:
        """Worker thread: the journal's records from the mark into the write cache and ledger states."""
        n = 0
        for rtype, ledger, entry, body in replay(self.journal_dir, mark, accept_loss):
            n += 1
            st = self.ledgers.get(ledger)
            if st is None:
                st = self.ledgers[ledger] = LedgerState()
            st.dirty = True
            if rtype == _ADD:
                self.cache.put(ledger, entry, body)
            apply_record(st, rtype, entry, body)
        return n

    async def close(self) -> None:
        """Stop background work, checkpoint what is cached, close files."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.journal:
            await self.journal.close()
            if self.started:
                try:
                    await self.checkpoint()
                except Exception:  # noqa: BLE001 - the journal still holds everything
                    log.exception("final checkpoint failed; the journal will be replayed")
        for el in self.entrylogs:
            el.close()
        if self.index:
            self.index.close()
        self.started = False
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def held_last(self, ledger: int) -> int:
        """The highest entry id of `ledger` this bookie may hold (-1: none): in the write cache, the
        checkpoint in flight or the index. The index's is looked up once per ledger and then kept
        up to date by checkpoints; entries dropped later (scrub) can leave it high, which only
        costs lookups."""
        last = self.cache._last.get(ledger, -1)
        flushing = self.flushing
        if flushing is not None:
            last = max(last, flushing._last.get(ledger, -1))
        indexed = self._indexed_last.get(ledger)
        if indexed is None:
            found = self.index.last_entry(ledger)
            indexed = self._indexed_last[ledger] = -1 if found is None else found
        return max(last, indexed)

    def forget_indexed(self, ledger: int) -> None:
        """The ledger is gone from the index: look its highest entry up again if it comes back."""
        self._indexed_last.pop(ledger, None)

    def existing(self, ledger: int, entry: int) -> bytes | memoryview | None:
        """The body of an entry this bookie holds, None if it holds none, or none it can read (a
        rotted record: the add then stores a good copy in its place). An entry in the entry logs
        is read here, on the event loop: only adds of ids already held come here (retries,
        recovery adds), each at most one message's worth of entries."""
        try:
            return self.read_entry(ledger, entry)
        except BookieStorageError as exc:
            log.warning("entry %d:%d cannot be read (%s): an add stores it again", ledger, entry, exc)
            return None

    def backlog_bytes(self) -> int:
        """Bytes held in memory for adds: write cache, checkpoint in flight, journal queue."""
        flushing = self.flushing.bytes if self.flushing is not None else 0
        return self.cache.bytes + flushing + self.journal.queued_bytes

    def last_entry(self, ledger: int) -> int | None:
        """The highest entry id of a ledger stored here (write cache, checkpoint in flight or
        index), None if none."""
        ids = [last for c in (self.cache, self.flushing)
               if c is not None and (last := c.last_entry(ledger)) is not None]
        indexed = self.index.last_entry(ledger)
        if indexed is not None:
            ids.append(indexed)
        return max(ids, default=None)

    def read_entry(self, ledger: int, entry: int) -> bytes | None:
        """An entry's body from the write cache, the flushing cache, or the entry log via the index."""
        body = self.cache.get(ledger, entry)
        if body is not None:
            return body
        if self.flushing is not None:
            body = self.flushing.get(ledger, entry)
            if body is not None:
                return body
        loc = self.index.location(ledger, entry)
        if loc is None:
            return None
        d, log_id, offset = loc
        try:
            return self.entrylogs[d].read(log_id, offset, ledger, entry)
        except (OSError, IndexError, ValueError) as exc:
            raise BookieStorageError(f"reading entry {ledger}:{entry}: {exc}") from exc

    async def read_chunk(self, ledger: int, first: int, last: int, max_bytes: int,
                         max_entries: int, step: int = 1) -> list[tuple[int, bytes]]:
        """read_bodies as (entry id, body) pairs."""
        bodies = await self.read_bodies(ledger, first, last, max_bytes, max_entries, step)
        return [(first + i * step, bytes(b)) for i, b in enumerate(bodies)]

    async def read_bodies(self, ledger: int, first: int, last: int, max_bytes: int,
                          max_entries: int, step: int = 1, checked: bool = True) -> list[bytes | memoryview]:
        """Bodies of entries first, first+step, ... (at most up to `last`), stopping at the first
        one not stored here or at the caps. Cached entries are served on the event loop; entries
        that must come from the entry logs are read in a worker thread so that a cold read never
        stalls the adds, a run of neighbouring records with one pread. A striped replica is read
        with step = E (it holds every E-th entry). Bodies from the entry logs are views of what
        was read (bytes-like, not bytes); their record checksums are checked unless not `checked`
        (a reader that checks each entry's digest itself asked to skip the same work)."""
        out: list[bytes | memoryview] = []
        size = 0
        eid = first
        mem = [c.ledgers[ledger] for c in (self.cache, self.flushing) if c is not None and ledger in c.ledgers]
        while eid <= last and len(out) < max_entries and size < max_bytes:
            body = None
            for entries in mem:
                body = entries.get(eid)
                if body is not None:
                    break
            if body is None:
                break
            out.append(body)
            size += len(body)
            eid += step
        if out or eid > last:
            return out
        want = min(max_entries, DISK_READ_ENTRIES, (last - eid) // step + 1)
        locs = self.index.locations_from(ledger, eid, step, want)
        for i in range(len(locs)) if mem else ():
            if any(eid + i * step in entries for entries in mem):  # newer in the cache: read from there
                locs = locs[:i]
                break
        if not len(locs):
            return out
        self.disk_reads += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self._pread_runs, ledger, eid, step, locs,
                                                                    max_bytes, checked)
        except (OSError, IndexError, ValueError) as exc:
            raise BookieStorageError(f"reading entries of ledger {ledger} from {first}: {exc}") from exc
        finally:
            self.disk_reads -= 1

    def _pread_runs(self, ledger: int, first: int, step: int, locs: np.ndarray, max_bytes: int,
                    checked: bool = True) -> list[bytes | memoryview]:
        """Worker thread: the records at locs (Index.locations_from's records, entries first,
        first+step, ...), each run of neighbouring records of one file with one pread, with
        descriptors of its own. Runs are cut where the file changes, an offset does not ascend or
        lies beyond READ_SPAN from the run's first (found with numpy, not record by record)."""
        fds: dict[tuple[int, int], int] = {}
        out: list[bytes | memoryview] = []
        size = 0
        disk, log, offset = locs["disk"], locs["log"], locs["offset"].astype(np.int64)
        n = len(locs)
        cut = np.flatnonzero((disk[1:] != disk[:-1]) | (log[1:] != log[:-1]) | (offset[1:] <= offset[:-1])) + 1
        try:
            i = 0
            while i < n and size < max_bytes:
                d, log_id, base = int(disk[i]), int(log[i]), int(offset[i])
                c = int(np.searchsorted(cut, i, side="right"))
                end = int(cut[c]) if c < len(cut) else n
                j = i + int(np.searchsorted(offset[i:end], base + READ_SPAN, side="right"))
                fd = fds.get((d, log_id))
                if fd is None:
                    fd = fds[(d, log_id)] = os.open(self.entrylogs[d].path(log_id), os.O_RDONLY)
                got = self.entrylogs[d].read_run(fd, log_id, ledger, first + i * step, step, offset[i:j],
                                                 max_bytes - size, checked)
                out.extend(got)
                size += sum(map(len, got))
                if len(got) < j - i:
                    break
                i = j
        finally:
            for fd in fds.values():
                os.close(fd)
        return out

    def has_ledger(self, ledger: int) -> bool:
        return ledger in self.ledgers

    def entry_ids(self, ledger: int) -> list[int]:
        """Every entry id of a ledger stored here, sorted."""
        ids = set(self.index.entries(ledger))
        ids.update(self.cache.entry_ids(ledger))
        if self.flushing is not None:
            ids.update(self.flushing.entry_ids(ledger))
        return sorted(ids)

    def list_entries(self, ledger: int) -> list[tuple[int, int]]:
        return entry_ranges(self.entry_ids(ledger))

    async def drop_locations(self, pairs: list[tuple[bytes, bytes]]) -> list[tuple[int, int]]:
        """Forget entries the scrubber found unreadable: packed (KEY, LOCATION) pairs, each dropped
        only if the index still points at that location (a checkpoint or compaction that moved the
        entry meanwhile wins). ListEntries then omits them and reads answer NO_ENTRY, so clients
        and autorecovery turn to the other replicas. Returns the (ledger, entry) ids dropped."""
        removed = await asyncio.get_running_loop().run_in_executor(None, self.index.delete_locations, pairs)
        return [KEY.unpack(k) for k in removed]

    def request_checkpoint(self) -> None:
        if self._ckpt_task is None or self._ckpt_task.done():
            self._ckpt_task = asyncio.get_running_loop().create_task(self.checkpoint())

    async def checkpoint(self) -> Mark:
        """Move the write cache into the entry log + index, then persist the journal mark and
        delete the journal files before it."""
        async with self.lock:
            t0 = time.perf_counter()
            snap = self.cache
            self.cache = WriteCache()
            self.flushing = snap
            mark = self.journal.position
            dirty = []
            for ledger, st in self.ledgers.items():
                if st.dirty:
                    dirty.append((ledger, st.to_bytes()))
                    st.dirty = False
            try:
                await asyncio.get_running_loop().run_in_executor(None, self._flush, snap, dirty, mark)
                indexed = self._indexed_last
                for ledger, last in snap._last.items():  # the snapshot's entries are in the index now
                    if ledger in indexed and last > indexed[ledger]:
                        indexed[ledger] = last
            except BaseException as exc:
                self.cache.merge_from(snap)
                for ledger, _ in dirty:
                    if ledger in self.ledgers:
                        self.ledgers[ledger].dirty = True
                if is_space_error(exc):
                    self.disk.no_room("checkpoint", exc)
                raise
            finally:
                self.flushing = None
            self.disk.note_written(snap.bytes)
            removed = self.journal.delete_before(mark)
            m = self.metrics
            m.checkpoints.inc()
            m.checkpoint_seconds.observe(time.perf_counter() - t0)
            m.write_cache_bytes.set(self.cache.bytes)
            m.write_cache_entries.set(self.cache.count)
            m.ledgers.set(len(self.ledgers))
            log.debug("checkpoint: %d entries, %d ledger states, mark %s, %d journal files removed",
                      snap.count, len(dirty), mark, removed)
            return mark

    def _flush(self, snap: WriteCache, dirty: list[tuple[int, bytes]], mark: Mark) -> None:
        """Runs in a worker thread (the snapshot no longer changes): sort, append, index, mark."""
        n = len(self.ledger_dirs)
        per_dir = [snap.sorted_items(lambda l, i=i: l % n == i) for i in range(n)] if n > 1 \
            else [snap.sorted_items()]
        locations = []
        for d, items in enumerate(per_dir):
            if items:
                locations.extend(self.entrylogs[d].append_sorted(items, d))
        self.index.commit(locations, dirty, mark)
        write_mark(self.journal_dir, mark)

    def _journal_synced(self, seconds: float, nbytes: int, appends: int) -> None:
        self.metrics.journal_synced(seconds, nbytes, appends)
        self.disk.note_written(nbytes)

    def _cache_measured(self) -> None:
        self.metrics.write_cache_bytes.set(self.cache.bytes)
        self.metrics.write_cache_entries.set(self.cache.count)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.opts.checkpoint_interval)
            try:
                await self.checkpoint()
            except Exception as exc:  # noqa: BLE001 - keep serving from the journal + cache; retry later
                if not is_space_error(exc):
                    log.exception("checkpoint failed")


def _has_entry_logs(ledger_dirs: list[Path]) -> bool:
    """True if any entry log holds a record (the bookie has checkpointed entries)."""
    return any(p.stat().st_size > 0 for d in ledger_dirs for p in (Path(d) / "entrylogs").glob("entrylog-*.log"))


