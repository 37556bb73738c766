"""The storage core of a bookie: journal, write cache, checkpoints, entry logs, LMDB index.

An add is journaled (group commit, fdatasync) and put in the write cache; its future completes
once the journal record is durable, and only then does the service answer. A checkpoint moves the
write cache into the entry log + index and persists the journal mark; start-up replays the journal
from that mark. Ledger state (master key, fenced, LAC) is journaled and checkpointed the same way.
"""
from __future__ import annotations

import asyncio
import enum
import fcntl
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np

from pybk.config import option_field
from pybk.entry import HEADER, HEADER_SIZE
from pybk.ledger import entry_ranges
from pybk.proto import pb

from .entrylog import LOG_HEADER, EntryLog, EntryLogCorruptError, scan_log
from .index import KEY, LOCATION, Index, index_dir, inspect
from .journal import (Journal, JournalCorruptError, JournalOptions, JournalGap, JournalGapError, Mark, RecordType,
                      check as check_journal, discard_unused, encode_record, encode_run, is_space_error, journal_files,
                      read_head, read_mark, replay, scan_file, write_atomic, write_mark)
from .metrics import Metrics
from .state import KEY_MISSING, LedgerState, check_key

Admission = Callable[[int, bytes], tuple[int, str]]  # (ledger, first key) -> (status, why not)
from .writecache import WriteCache

log = logging.getLogger("pybk.bookie")

_ADD = int(RecordType.ADD)
_MASTER_KEY = int(RecordType.MASTER_KEY)
_FENCE = int(RecordType.FENCE)
_LAC = int(RecordType.LAC)
_OK = pb.OK
_BAD = pb.BAD_REQUEST
READ_ONLY_FILE = "READONLY"  # in the journal dir while read-only by request
JOURNAL_LOSS_FILE = "journal.loss"  # in the journal dir: an accepted loss not yet reported
LOCK_FILE = "LOCK"  # in the journal dir: flock'd by the process that has the dirs open
DISK_READ_ENTRIES = 4096  # entries per worker-thread read from the entry logs
READ_SPAN = 4 << 20  # neighbouring records within this many bytes of a run's first are read with one pread


class ReadOnlyReason(enum.Enum):
    """Why a bookie refuses adds (it may have several reasons at once)."""
    DISK = "disk"            # above the high-water mark, or a write found the disk full
    JOURNAL = "journal"      # a journal write failed: until restarted
    REQUESTED = "requested"  # the admin API (a decommission drains a bookie this way)


class AddRun(NamedTuple):
    """Entries of one ledger with one master key and flags, as add_runs takes them: a packed
    run of the wire (pb.AddRun) or consecutive AddEntry messages alike. `packed` is the bodies
    back to back, when the wire brought them so (a run wholly accepted is journaled from it)."""

    ledger_id: int
    master_key: bytes
    flags: int
    entry_ids: Sequence[int]
    bodies: Sequence[bytes]
    packed: bytes | None = None


def runs_of(entries) -> list[AddRun]:
    """pb.AddEntry messages grouped into runs of consecutive entries with the same ledger, key
    and flags (the order kept, so an entry's index is the same in both)."""
    runs: list[AddRun] = []
    ids: list[int] = []
    bodies: list[bytes] = []
    last = None
    for e in entries:
        k = (e.ledger_id, e.master_key, e.flags)
        if k != last:
            ids, bodies, last = [], [], k
            runs.append(AddRun(*k, ids, bodies))
        ids.append(e.entry_id)
        bodies.append(e.body)
    return runs


def _count(runs: Sequence[AddRun]) -> int:
    return sum(len(r.entry_ids) for r in runs)


def disk_fullness(path: Path) -> tuple[float, int]:
    """(used fraction, total bytes) of the disk holding `path`, as the water marks see it: free
    space counted as an unprivileged writer sees it, so root's reserved blocks count as used."""
    u = shutil.disk_usage(path)
    total = u.used + u.free
    return (u.used / total if total else 0.0), total


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
class DiskOptions:
    """When the bookie turns read-only for want of room, and when it is writable again."""

    high_water_mark: float = option_field("high_water_mark")
    low_water_mark: float = option_field("low_water_mark")
    capacity: int = option_field("disk_capacity")  # 0: the filesystem's size; else a byte budget for our dirs
    check_interval: float = option_field("disk_check_interval")


@dataclass(frozen=True)
class StorageOptions:
    """Tunables of the storage core."""

    journal: JournalOptions = field(default_factory=JournalOptions)
    disk: DiskOptions = field(default_factory=DiskOptions)
    checkpoint_interval: float = option_field("checkpoint_interval")
    checkpoint_bytes: int = option_field("checkpoint_bytes")
    entrylog_max_file_size: int = option_field("entrylog_max_file_size")
    max_entry_size: int = option_field("max_entry_size")
    # past this (cache + checkpoint in flight + journal backlog) adds get TOO_MANY_REQUESTS
    max_write_cache_bytes: int = option_field("max_write_cache_bytes")
    accept_journal_loss: bool = option_field("accept_journal_loss")  # start despite missing/cut journal files


class Bookie:
    """One bookie's storage. Use `await start()` then the add/read/fence methods; `await close()`."""

    def __init__(self, journal_dir: Path, ledger_dirs: list[Path], options: StorageOptions | None = None,
                 metrics: Metrics | None = None):
        self.journal_dir = Path(journal_dir)
        self.ledger_dirs = [Path(d) for d in ledger_dirs]
        if not self.ledger_dirs:
            raise ValueError("a bookie needs at least one ledger dir")
        self.opts = options or StorageOptions()
        self.metrics = metrics or Metrics()
        self.metrics.water_marks(self.opts.disk.high_water_mark, self.opts.disk.low_water_mark)
        self.metrics.explain_read_only(ReadOnlyReason, lambda: self.read_only_reasons)
        self.ledgers: dict[int, LedgerState] = {}
        self.cache = WriteCache()
        self.flushing: WriteCache | None = None
        self._indexed_last: dict[int, int] = {}  # ledger -> highest entry id in the index (-1: none), as looked up
        self.read_only_forced = False
        self.read_only_disk = False
        self.journal_failed = False  # a journal write failed: read-only until restarted
        self.disk_usage = 0.0
        self._disk_total = 0  # bytes of the disk (or budget) disk_usage is a fraction of
        self._written_since_check = 0
        self.on_read_only_change: Callable[[bool], None] | None = None
        self._lac_waiters: dict[int, list[asyncio.Future]] = {}
        self._disk_reads = 0  # entry log reads running in worker threads
        self._ckpt_lock = asyncio.Lock()
        self._ckpt_task: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self.journal: Journal | None = None
        self.index: Index | None = None
        self.entrylogs: list[EntryLog] = []
        self.replayed = 0
        self.started = False
        self._lock_fd = -1

    # ---- life cycle -------------------------------------------------------------------------

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
        self.entrylogs = [EntryLog(d, self.opts.entrylog_max_file_size) for d in self.ledger_dirs]
        for ledger, raw in self.index.ledger_states():
            self.ledgers[ledger] = LedgerState.from_bytes(raw)
        self.replayed = await loop.run_in_executor(None, self._replay, mark, bool(gaps))
        self.journal = Journal(self.journal_dir, self.opts.journal, self._journal_synced, self._journal_failed)
        self.journal.open()
        self.index.bind_journal(self.journal.journal_id)
        self.read_only_forced = (self.journal_dir / READ_ONLY_FILE).exists()
        self._update_disk_state()
        self.metrics.read_only.set(int(self.read_only))
        self._tasks = [loop.create_task(self._checkpoint_loop(), name="checkpointer"),
                       loop.create_task(self._disk_loop(), name="disk-checker")]
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
        n = 0
        for rtype, ledger, entry, body in replay(self.journal_dir, mark, accept_loss):
            n += 1
            st = self.ledgers.get(ledger)
            if st is None:
                st = self.ledgers[ledger] = LedgerState()
            st.dirty = True
            if rtype == _ADD:
                self.cache.put(ledger, entry, body)
                if len(body) >= HEADER_SIZE:
                    lac = HEADER.unpack_from(body)[2]
                    if lac > st.lac:
                        st.lac = lac
            elif rtype == _MASTER_KEY:
                st.master_key = body
            elif rtype == _FENCE:
                st.fenced = True
            elif rtype == _LAC:
                st.explicit_lac = max(st.explicit_lac, entry)
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

    # ---- adds -------------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self.read_only_forced or self.read_only_disk or self.journal_failed

    @property
    def read_only_reasons(self) -> list[ReadOnlyReason]:
        """Every reason the bookie is read-only now (empty: writable)."""
        held = {ReadOnlyReason.DISK: self.read_only_disk, ReadOnlyReason.JOURNAL: self.journal_failed,
                ReadOnlyReason.REQUESTED: self.read_only_forced}
        return [reason for reason, on in held.items() if on]

    def add_batch(self, entries, keyless: bool = False, admit: Admission | None = None
                  ) -> tuple[list[tuple[int, int, str]], asyncio.Future | None]:
        """Validate and journal a batch of pb.AddEntry (a sequence): add_runs of its runs
        (runs_of); the refusals' indices are the entries' positions in `entries`."""
        return self.add_runs(runs_of(entries), keyless, admit)

    def add_runs(self, runs: Sequence[AddRun], keyless: bool = False, admit: Admission | None = None
                 ) -> tuple[list[tuple[int, int, str]], asyncio.Future | None]:
        """Validate and journal a batch of runs (AddRun: entries of one ledger, key and flags).

        Returns the refused entries as (index, status, message), index counting the entries of
        all runs in order, in ascending order (every other entry is OK once the future completes),
        and a future that completes when the accepted ones are durable (None if none were
        accepted). Accepted entries are in the write cache before this returns (readers may see
        them; they only read up to a LAC, which only durable quorums advance). Every entry is
        checked alone (size, header, LAC); the key and fencing are decided once per run.

        `keyless`: the caller may do keyless recovery (admin), so recovery adds with an empty key
        are accepted (and record no key). `admit(ledger, key)` decides a key this bookie would
        record first for a ledger (state.needs_admission): (OK, "") to accept, a refusal, or
        (LOOKUP, "") when the metadata must be read first (those entries are answered LOOKUP for
        the service to add again). None accepts every first key (a bookie without metadata).

        Entries are write-once: an entry id already held (write cache, checkpoint in flight or
        index) is accepted again only with the same bytes (a retry, a recovery add), journaled
        again like a new one, and refused ENTRY_EXISTS with other bytes, the stored entry staying.
        New ids are the common case and cost one comparison each: only an id at or below the
        ledger's highest held one (`_held_last`, once per run) is looked up (`_existing`)."""
        errors: list[tuple[int, int, str]] = []
        if self.read_only:
            return [(i, pb.READ_ONLY, "bookie is read-only") for i in range(_count(runs))], None
        if self.backlog_bytes() >= self.opts.max_write_cache_bytes:
            self.request_checkpoint()
            return [(i, pb.TOO_MANY_REQUESTS, "write cache full, checkpoint behind: retry shortly")
                    for i in range(_count(runs))], None
        records: list[bytes] = []
        append = records.append
        ledgers = self.ledgers
        cache = self.cache
        unpack = HEADER.unpack_from
        max_size = self.opts.max_entry_size
        changed: set[int] = set()  # ledgers whose LAC rose while long-polls wait on them
        nbytes = 0
        count = 0
        last_ledger = -1
        st = None
        cur_key = b""
        cur_recovery_only = False  # fenced, or a keyless run: only recovery adds pass
        cur_lac = -1
        i = -1
        for r in runs:
            ledger = r.ledger_id
            key = r.master_key
            recovery = r.flags & 1
            decided = False
            refusal = None
            refused = len(errors)
            high = -1            # ids above it are new (_held_last, then the run's accepted ids)
            earlier: dict = {}   # the run's accepted entries before index `seen`, filled on the rare path
            start = seen = i + 1
            for eid, body in zip(r.entry_ids, r.bodies):
                i += 1
                size = len(body)
                if size < HEADER_SIZE or size > max_size:
                    errors.append((i, _BAD, f"entry body of {size} bytes: must be {HEADER_SIZE}..{max_size} bytes"))
                    continue
                hl, he, hlac, _ = unpack(body)
                if hl != ledger or he != eid or eid < 0:
                    errors.append((i, _BAD, f"request says entry {ledger}:{eid}, body header says {hl}:{he}"))
                    continue
                if hlac >= eid:
                    errors.append((i, _BAD, f"entry {ledger}:{eid} carries LAC {hlac}: a LAC must be below its entry id"))
                    continue
                if not decided:  # the run's key, once, at its first well-formed entry
                    decided = True
                    if ledger != last_ledger or key != cur_key:
                        if st is not None:
                            self._raise_lac(st, cur_lac, last_ledger, changed)
                            st = None
                        state = ledgers.get(ledger)
                        if state is None or state.master_key != key:
                            state, refusal = self._run_key(ledger, key, state, keyless, admit, append)
                            if refusal is not None:
                                last_ledger = -1
                        if refusal is None:
                            st = state
                            last_ledger = ledger
                            cur_key = key
                            cur_recovery_only = st.fenced or not key
                            cur_lac = st.lac
                    if refusal is None:
                        high = self._held_last(ledger)
                if refusal is not None:
                    errors.append((i, *refusal))
                    continue
                if cur_recovery_only and not recovery:
                    errors.append((i, pb.FENCED, f"ledger {ledger} is fenced") if cur_key else (i, _BAD, KEY_MISSING))
                    continue
                if eid > high:
                    high = eid
                else:  # an id this bookie, or this run, may hold already: the rare path
                    _catch_up(earlier, r, start, seen, i, errors, refused)
                    seen = i + 1
                    held = self._existing(ledger, eid)
                    if held is None:
                        held = earlier.get(eid)
                    if held is not None and held != body:
                        errors.append((i, pb.ENTRY_EXISTS, f"entry {ledger}:{eid} is stored here with other bytes: "
                                                            f"entries are write-once, the stored one stays"))
                        continue
                    earlier[eid] = body
                if hlac > cur_lac:
                    cur_lac = hlac
            ids, bodies, packed = r.entry_ids, r.bodies, r.packed
            if len(errors) > refused:  # some of the run refused: journal the rest
                first = i + 1 - len(ids)
                out = {k - first for k, _, _ in errors[refused:]}
                keep = [k for k in range(len(ids)) if k not in out]
                ids, bodies, packed = [ids[k] for k in keep], [bodies[k] for k in keep], None
            if ids:
                records += encode_run(ledger, ids, list(map(len, bodies)),
                                      packed if packed is not None else b"".join(bodies))
                nbytes += cache.put_many(ledger, dict(zip(ids, bodies)))
                count += len(ids)
        if st is not None:
            self._raise_lac(st, cur_lac, last_ledger, changed)
        for ledger in changed:
            self._wake_lac(ledger)
        if not records:
            return errors, None
        m = self.metrics
        m.adds.inc(count)
        m.add_bytes.inc(nbytes)
        if cache.bytes >= self.opts.checkpoint_bytes:
            self.request_checkpoint()
        return errors, self.journal.append(records)

    def _run_key(self, ledger: int, key: bytes, st: LedgerState | None, keyless: bool,
                 admit: Admission | None, append: Callable[[bytes], None]
                 ) -> tuple[LedgerState | None, tuple[int, str] | None]:
        """The key decision for a run of a batch whose key is not the one recorded for its ledger
        (the rare path of add_batch): (ledger state, None) to accept the run, or (None, (status,
        message)) to refuse it. A first key accepted is recorded."""
        if not key:
            if not keyless:
                return None, (_BAD, KEY_MISSING)
            if st is None:
                st = self.ledgers[ledger] = LedgerState()
                self.metrics.ledgers.set(len(self.ledgers))
            return st, None
        if st is not None and st.master_key:
            return None, (pb.UNAUTHORIZED, f"wrong master key for ledger {ledger}")
        if admit is not None:
            status, why = admit(ledger, key)
            if status != _OK:
                return None, (status, why)
        if st is None:
            st = self.ledgers[ledger] = LedgerState(master_key=key)
            self.metrics.ledgers.set(len(self.ledgers))
        else:
            st.master_key = key
            st.dirty = True
        append(encode_record(_MASTER_KEY, ledger, -1, key))
        return st, None

    def _held_last(self, ledger: int) -> int:
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

    def _existing(self, ledger: int, entry: int) -> bytes | memoryview | None:
        """The body of an entry this bookie holds, None if it holds none, or none it can read (a
        rotted record: the add then stores a good copy in its place). An entry in the entry logs
        is read here, on the event loop: only adds of ids already held come here (retries,
        recovery adds), each at most one message's worth of entries."""
        try:
            return self.read_entry(ledger, entry)
        except BookieStorageError as exc:
            log.warning("entry %d:%d cannot be read (%s): an add stores it again", ledger, entry, exc)
            return None

    def _raise_lac(self, st: LedgerState, lac: int, ledger: int, changed: set[int]) -> None:
        """Keep the highest LAC a ledger's adds carried; note the ledger when long-polls wait on it."""
        if lac > st.lac:
            st.lac = lac
            st.dirty = True
            if ledger in self._lac_waiters:
                changed.add(ledger)

    def backlog_bytes(self) -> int:
        """Bytes held in memory for adds: write cache, checkpoint in flight, journal queue."""
        flushing = self.flushing.bytes if self.flushing is not None else 0
        return self.cache.bytes + flushing + self.journal.queued_bytes

    # ---- fencing and LAC --------------------------------------------------------------------

    async def fence(self, ledger: int, master_key: bytes, keyless: bool = False) -> tuple[int, int]:
        """Fence a ledger: later normal adds get FENCED. Durable before it returns (status, lac).
        With `keyless` (an admin's recovery) an empty key fences without recording a key; without,
        it is BAD_REQUEST (state.KEY_MISSING). A first key is recorded as given: the service
        checks it against the metadata first (state.needs_admission)."""
        st = self.ledgers.get(ledger)
        status = check_key(st, master_key, keyless)
        if status != _OK:
            return status, -1
        records = []
        if st is None:
            st = self.ledgers[ledger] = LedgerState()
        if master_key and not st.master_key:
            st.master_key = master_key
            records.append(encode_record(_MASTER_KEY, ledger, -1, master_key))
        st.fenced = True
        st.dirty = True
        records.append(encode_record(_FENCE, ledger, -1))
        await self.journal.append(b"".join(records))
        return _OK, st.last_add_confirmed

    async def write_lac(self, ledger: int, lac: int, master_key: bytes) -> tuple[int, str]:
        """Record an explicit LAC (journaled); returns (status, why not). A ledger this bookie never
        stored is NO_LEDGER (no record is created for it), and a LAC past the last entry it holds is
        BAD_REQUEST: a writer only confirms entries its bookies acknowledged, and readers take the
        largest LAC of a quorum, so the bookies that hold the entry carry its LAC."""
        st = self.ledgers.get(ledger)
        if st is None:
            return pb.NO_LEDGER, f"ledger {ledger} is not stored on this bookie"
        status = check_key(st, master_key)
        if status != _OK:
            return status, "master key missing" if status == _BAD else f"wrong master key for ledger {ledger}"
        if lac > st.last_add_confirmed:
            last = self.last_entry(ledger)
            if last is None or lac > last:
                return _BAD, (f"explicit LAC {lac} of ledger {ledger} is beyond the entries this bookie holds "
                              f"(last entry {-1 if last is None else last})")
        fut = self.journal.append(encode_record(_LAC, ledger, lac))
        if lac > st.explicit_lac:
            st.explicit_lac = lac
            st.dirty = True
            self._wake_lac(ledger)
        await fut
        return _OK, ""

    def last_entry(self, ledger: int) -> int | None:
        """The highest entry id of a ledger stored here (write cache, checkpoint in flight or
        index), None if none."""
        ids = [last for c in (self.cache, self.flushing)
               if c is not None and (last := c.last_entry(ledger)) is not None]
        indexed = self.index.last_entry(ledger)
        if indexed is not None:
            ids.append(indexed)
        return max(ids, default=None)

    def lac(self, ledger: int) -> int | None:
        """The bookie's LAC for a ledger, None if it knows nothing of the ledger."""
        st = self.ledgers.get(ledger)
        return st.last_add_confirmed if st is not None else None

    async def wait_lac(self, ledger: int, previous: int, timeout: float) -> int | None:
        """Long-poll: return as soon as the LAC passes `previous`, or the current LAC at timeout."""
        lac = self.lac(ledger)
        if lac is not None and lac > previous:
            return lac
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self.lac(ledger)
            fut = asyncio.get_running_loop().create_future()
            self._lac_waiters.setdefault(ledger, []).append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                waiters = self._lac_waiters.get(ledger)
                if waiters is not None:
                    if fut in waiters:
                        waiters.remove(fut)
                    if not waiters:
                        del self._lac_waiters[ledger]
            lac = self.lac(ledger)
            if lac is not None and lac > previous:
                return lac

    def _wake_lac(self, ledger: int) -> None:
        for fut in self._lac_waiters.pop(ledger, ()):
            if not fut.done():
                fut.set_result(None)

    # ---- reads ------------------------------------------------------------------------------

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
        self._disk_reads += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self._pread_runs, ledger, eid, step, locs,
                                                                    max_bytes, checked)
        except (OSError, IndexError, ValueError) as exc:
            raise BookieStorageError(f"reading entries of ledger {ledger} from {first}: {exc}") from exc
        finally:
            self._disk_reads -= 1

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

    # ---- garbage collection ---------------------------------------------------------------

    async def delete_ledgers(self, ledgers: set[int]) -> int:
        """Forget ledgers deleted from the metadata: state, cached entries and index locations.
        Returns the number of entries dropped; `compact()` then reclaims their entry log space."""
        async with self._ckpt_lock:
            dropped = 0
            for ledger in ledgers:
                self.ledgers.pop(ledger, None)
                self._indexed_last.pop(ledger, None)
                dropped += self.cache.drop_ledger(ledger)
                self._wake_lac(ledger)
            dropped += await asyncio.get_running_loop().run_in_executor(None, self.index.delete_ledgers, ledgers)
            self.metrics.ledgers.set(len(self.ledgers))
        await self.checkpoint()  # moves the journal mark past their records, so replay cannot revive them
        return dropped

    async def compact(self, threshold: float) -> dict:
        """Rewrite entry logs (not the current ones) whose live fraction is under `threshold`:
        copy their live entries to the current log, repoint the index in one transaction, delete
        the old files. Returns {"rewritten_logs", "copied_entries", "reclaimed_bytes"}."""
        async with self._ckpt_lock:
            loop = asyncio.get_running_loop()
            plans = await loop.run_in_executor(None, self._compact, threshold)
            reclaimed = copied = 0
            while self._disk_reads:  # reads in worker threads may still use the old locations
                await asyncio.sleep(0.005)
            for d, log_id, size, n in plans:
                self.entrylogs[d].remove(log_id)  # on the loop thread: no read is between lookup and pread
                reclaimed += size
                copied += n
            return {"rewritten_logs": len(plans), "copied_entries": copied, "reclaimed_bytes": reclaimed}

    def _compact(self, threshold: float) -> list[tuple[int, int, int, int]]:
        plans = []
        for d, el in enumerate(self.entrylogs):
            candidates = set(el.log_ids()) - {el.current}
            if not candidates:
                continue
            live = self.index.live_locations(d, candidates)
            for log_id in sorted(candidates):
                entries = live.get(log_id, [])
                size = el.path(log_id).stat().st_size
                fd = os.open(el.path(log_id), os.O_RDONLY)
                try:
                    items = [(ledger, entry, el.read_at(fd, log_id, off, ledger, entry))
                             for ledger, entry, off in entries]
                except EntryLogCorruptError as exc:
                    log.error("compaction leaves %s alone: %s", el.path(log_id), exc)
                    continue
                finally:
                    os.close(fd)
                live_bytes = sum(len(b) + LOG_HEADER for _, _, b in items)
                if size == 0 or live_bytes / size >= threshold:
                    continue
                if items:
                    self.index.commit(el.append_sorted(sorted(items, key=lambda t: (t[0], t[1])), d), [])
                plans.append((d, log_id, size, len(items)))
        return plans

    # ---- scrubbing --------------------------------------------------------------------------

    async def drop_locations(self, pairs: list[tuple[bytes, bytes]]) -> list[tuple[int, int]]:
        """Forget entries the scrubber found unreadable: packed (KEY, LOCATION) pairs, each dropped
        only if the index still points at that location (a checkpoint or compaction that moved the
        entry meanwhile wins). ListEntries then omits them and reads answer NO_ENTRY, so clients
        and autorecovery turn to the other replicas. Returns the (ledger, entry) ids dropped."""
        removed = await asyncio.get_running_loop().run_in_executor(None, self.index.delete_locations, pairs)
        return [KEY.unpack(k) for k in removed]

    # ---- checkpoint -------------------------------------------------------------------------

    def request_checkpoint(self) -> None:
        if self._ckpt_task is None or self._ckpt_task.done():
            self._ckpt_task = asyncio.get_running_loop().create_task(self.checkpoint())

    async def checkpoint(self) -> Mark:
        """Move the write cache into the entry log + index, then persist the journal mark and
        delete the journal files before it."""
        async with self._ckpt_lock:
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
                    self._no_room("checkpoint", exc)
                raise
            finally:
                self.flushing = None
            self._note_written(snap.bytes)
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

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.opts.checkpoint_interval)
            try:
                await self.checkpoint()
            except Exception as exc:  # noqa: BLE001 - keep serving from the journal + cache; retry later
                if not is_space_error(exc):
                    log.exception("checkpoint failed")

    # ---- disk water marks -------------------------------------------------------------------

    def _dirs(self) -> list[Path]:
        return [self.journal_dir, *self.ledger_dirs]

    def measure_disk_usage(self) -> tuple[float, int]:
        """(used fraction, total bytes): of the byte budget (disk_capacity) by our dirs, else of
        the fullest disk (free space counted as an unprivileged writer sees it)."""
        if self.opts.disk.capacity > 0:
            used = 0
            for d in self._dirs():
                for root, _, files in os.walk(d):
                    for f in files:
                        try:
                            used += os.stat(os.path.join(root, f)).st_size
                        except OSError:
                            pass
            return used / self.opts.disk.capacity, self.opts.disk.capacity
        return max(disk_fullness(d) for d in self._dirs())

    def disk_space(self) -> tuple[int, int]:
        """(free, total) bytes for the Info call."""
        if self.opts.disk.capacity > 0:
            used = int(self.disk_usage * self.opts.disk.capacity)
            return max(self.opts.disk.capacity - used, 0), self.opts.disk.capacity
        u = shutil.disk_usage(self.ledger_dirs[0])
        return u.free, u.total

    def _update_disk_state(self) -> None:
        self._measured(*self.measure_disk_usage())

    def _measured(self, usage: float, total: int) -> None:
        self.disk_usage, self._disk_total, self._written_since_check = usage, total, 0
        self.metrics.disk_measured(usage, total)
        self._update_disk_state_from(usage)

    def _journal_synced(self, seconds: float, nbytes: int, appends: int) -> None:
        self.metrics.journal_synced(seconds, nbytes, appends)
        self._note_written(nbytes)

    def _note_written(self, nbytes: int) -> None:
        """Count bytes written since the last disk check, so the bookie turns read-only as soon as
        its own writes cross the high-water mark, not a sampling interval later."""
        self._written_since_check += nbytes
        if not self.read_only_disk and self._disk_total:
            estimate = self.disk_usage + self._written_since_check / self._disk_total
            if estimate >= self.opts.disk.high_water_mark:
                self._update_disk_state_from(estimate)

    def _journal_failed(self, exc: BaseException, recoverable: bool) -> None:
        if recoverable:
            self._no_room("journal", exc)
            return
        log.error("journal write failed (%s): read-only until restarted; acknowledged adds are safe", exc)
        before = self.read_only
        self.journal_failed = True
        if before != self.read_only:
            self._read_only_changed()

    def _no_room(self, what: str, exc: BaseException) -> None:
        """A write found the disk full: nothing was half written (the journal and the entry log cut
        a failed write back); turn read-only until usage is below the low-water mark again."""
        if not self.read_only_disk:
            log.warning("%s: the disk is full (%s); read-only until disk usage is below the low-water "
                        "mark %.2f. Acknowledged entries are safe.", what, exc, self.opts.disk.low_water_mark)
        before = self.read_only
        self.read_only_disk = True
        if before != self.read_only:
            self._read_only_changed()

    def set_read_only(self, value: bool) -> None:
        """Force read-only by request (admin API), or lift that request. The request survives
        restarts (a file in the journal dir), so a draining bookie stays read-only."""
        before = self.read_only
        self.read_only_forced = value
        marker = self.journal_dir / READ_ONLY_FILE
        if value:
            marker.write_text("read-only by request through the admin API\n")
        else:
            marker.unlink(missing_ok=True)
        if before != self.read_only:
            self._read_only_changed()

    def _read_only_changed(self) -> None:
        self.metrics.read_only.set(int(self.read_only))
        if self.on_read_only_change:
            self.on_read_only_change(self.read_only)

    async def _disk_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.opts.disk.check_interval)
            try:
                self._measured(*await loop.run_in_executor(None, self.measure_disk_usage))
                self.metrics.write_cache_bytes.set(self.cache.bytes)
                self.metrics.write_cache_entries.set(self.cache.count)
            except Exception:  # noqa: BLE001
                log.exception("disk check failed")

    def _update_disk_state_from(self, usage: float) -> None:
        self.metrics.disk_usage.set(usage)
        before = self.read_only
        if not self.read_only_disk and usage >= self.opts.disk.high_water_mark:
            log.warning("disk usage %.4f >= high-water mark %.4f: turning read-only", usage, self.opts.disk.high_water_mark)
            self.read_only_disk = True
        elif self.read_only_disk and usage < self.opts.disk.low_water_mark:
            log.warning("disk usage %.4f < low-water mark %.4f: writable again", usage, self.opts.disk.low_water_mark)
            self.read_only_disk = False
        if before != self.read_only:
            self._read_only_changed()


def _catch_up(earlier: dict, run: AddRun, start: int, seen: int, i: int, errors: list[tuple[int, int, str]],
              refused: int) -> None:
    """Add to `earlier` (entry id -> body) the entries of `run`, whose first has batch index
    `start`, from index `seen` up to `i` (excluded) that were not refused: what a later entry of
    the run may repeat. The run's refusals are errors[refused:], in index order, so those at or
    after `seen` are their tail."""
    out = set()
    k = len(errors) - 1
    while k >= refused and errors[k][0] >= seen:
        out.add(errors[k][0])
        k -= 1
    ids, bodies = run.entry_ids, run.bodies
    for j in range(seen, i):
        if j not in out:
            earlier[ids[j - start]] = bodies[j - start]


def _has_entry_logs(ledger_dirs: list[Path]) -> bool:
    """True if any entry log holds a record (the bookie has checkpointed entries)."""
    return any(p.stat().st_size > 0 for d in ledger_dirs for p in (Path(d) / "entrylogs").glob("entrylog-*.log"))


def rebuild_index(journal_dir: Path, ledger_dirs: list[Path], master_keys: dict[int, bytes] | None = None
                  ) -> dict:
    """Rebuild the LMDB index of a stopped bookie from its entry logs and journal; the old index
    directory is renamed aside, not deleted. Returns a summary.

    Every entry log record whose CRC holds is indexed (a later copy of an entry wins, as in the
    index). Ledger state is rebuilt as far as the files allow: the LAC from the entry headers and
    from the journal's LAC records; master keys from the journal's MASTER_KEY records, else from
    `master_keys` (the keys earlier releases stored in ledger metadata), else empty (the next key
    a writer or reader sends is checked against the ledger's key check in the metadata). Every
    ledger is marked fenced: whether it was fenced went with the index, and a fenced ledger is the
    safe answer (its writer, which this bookie's outage already sent elsewhere, gets FENCED; reads
    and recovery work). Entries of ledgers deleted but not yet compacted away come back until the
    next garbage collection removes them again. Entries after the journal mark are not in the
    entry logs: the next start replays them from the journal, as always. DirsInUseError while the
    bookie runs."""
    lock = lock_dirs(Path(journal_dir))
    try:
        return _rebuild_index(Path(journal_dir), ledger_dirs, master_keys or {})
    finally:
        os.close(lock)


def _rebuild_index(journal_dir: Path, ledger_dirs: list[Path], master_keys: dict[int, bytes]) -> dict:
    idir = index_dir(ledger_dirs[0])
    aside = None
    if idir.exists():
        aside = idir.with_name(f"index.broken-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(idir, aside)
    index = Index(ledger_dirs[0])
    states: dict[int, LedgerState] = {}
    damaged: list[str] = []
    entries = 0
    try:
        for d, ledger_dir in enumerate(ledger_dirs):
            for path in sorted((Path(ledger_dir) / "entrylogs").glob("entrylog-*.log")):
                log_id = int(path.stem.split("-", 1)[1], 16)
                batch: list[tuple[bytes, bytes]] = []
                try:
                    for offset, ledger, eid, body in scan_log(path):
                        batch.append((KEY.pack(ledger, eid), LOCATION.pack(d, log_id, offset)))
                        st = states.get(ledger) or states.setdefault(ledger, LedgerState(fenced=True))
                        if len(body) >= HEADER_SIZE:
                            st.lac = max(st.lac, HEADER.unpack_from(body)[2])
                        if len(batch) >= 10_000:
                            index.commit(batch, [])
                            entries += len(batch)
                            batch = []
                except EntryLogCorruptError as exc:
                    damaged.append(str(exc))
                index.commit(batch, [])
                entries += len(batch)
        for _, path in journal_files(journal_dir):
            try:
                for rtype, ledger, eid, body in scan_file(path, 0, is_last=False):
                    if rtype not in (_MASTER_KEY, _LAC, _FENCE):
                        continue
                    st = states.get(ledger) or states.setdefault(ledger, LedgerState(fenced=True))
                    if rtype == _MASTER_KEY:
                        st.master_key = body
                    elif rtype == _LAC:
                        st.explicit_lac = max(st.explicit_lac, eid)
            except (JournalCorruptError, JournalGapError) as exc:
                damaged.append(str(exc).splitlines()[0])
        missing_keys = 0
        for ledger, st in states.items():
            if not st.master_key:
                st.master_key = master_keys.get(ledger, b"")
                missing_keys += not st.master_key
        mark = read_mark(journal_dir)
        index.commit([], [(ledger, st.to_bytes()) for ledger, st in states.items()], mark)
        journal_id = read_head(journal_dir).journal_id
        if journal_id:
            index.bind_journal(journal_id)
    finally:
        index.close()
    return {"index": str(idir / "data.mdb"), "old_index": str(aside) if aside else None, "entries": entries,
            "ledgers": len(states), "ledgers_without_master_key": missing_keys, "damaged": damaged,
            "journal_mark": tuple(mark)}
