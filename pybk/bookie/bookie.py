"""A bookie: its storage, ledger states and disk state behind one small facade.

`Bookie` is what the gRPC service, the admin API, garbage collection and the scrubber talk to.
The parts do the work: `storage` (journal, write cache, entry logs, index, checkpoints),
`disk` (water marks, read-only reasons), `adds.decide` (the add path's decisions), `state`
(keys, fencing, LAC and its waiters), `compaction` and `rebuild` (the offline index rebuild).
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Sequence

from pybk.proto import pb

from . import compaction
from .adds import AddRun, Admission, Decision, Refusal, count, decide, runs_of
from .disk import DiskState, ReadOnlyReason, disk_fullness
from .journal import Mark, RecordType, encode_record, encode_run
from .metrics import Metrics
from .rebuild import rebuild_index
from .state import LacWaiters, LedgerState, check_key
from .storage import BookieStorageError, DirsInUseError, Storage, StorageOptions

__all__ = ["AddRun", "Admission", "Bookie", "BookieStorageError", "DirsInUseError", "ReadOnlyReason",
           "StorageOptions", "disk_fullness", "rebuild_index", "runs_of"]

log = logging.getLogger("pybk.bookie")

_MASTER_KEY = int(RecordType.MASTER_KEY)
_FENCE = int(RecordType.FENCE)
_LAC = int(RecordType.LAC)
_OK = pb.OK
_BAD = pb.BAD_REQUEST


class Bookie:
    """One bookie's storage. Use `await start()` then the add/read/fence methods; `await close()`."""

    def __init__(self, journal_dir: Path, ledger_dirs: list[Path], options: StorageOptions | None = None,
                 metrics: Metrics | None = None):
        self.opts = options or StorageOptions()
        self.metrics = metrics or Metrics()
        self.disk = DiskState([Path(journal_dir), *map(Path, ledger_dirs)], self.opts.disk, self.metrics)
        self.storage = Storage(journal_dir, ledger_dirs, self.opts, self.disk, self.metrics)
        self.lac_waiters = LacWaiters()
        self.journal_dir, self.ledger_dirs = self.storage.journal_dir, self.storage.ledger_dirs
        self.ledgers: dict[int, LedgerState] = self.storage.ledgers

    @property
    def read_only(self) -> bool:
        return self.disk.read_only

    @property
    def read_only_reasons(self) -> list[ReadOnlyReason]:
        """Every reason the bookie is read-only now (empty: writable)."""
        return self.disk.reasons

    # ---- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the storage (see Storage.start): check, replay, start the writer and the checks."""
        await self.storage.start()

    async def close(self) -> None:
        """Stop background work, checkpoint what is cached, close files."""
        await self.storage.close()

    def pending_journal_loss(self) -> list[str]:
        """Accepted journal gaps not yet reported (they survive restarts until reported)."""
        return self.storage.pending_journal_loss()

    def journal_loss_reported(self) -> None:
        """The ledgers touched by the accepted loss are marked under-replicated: forget it."""
        self.storage.journal_loss_reported()

    # ---- adds -------------------------------------------------------------------------------

    def add_batch(self, entries, keyless: bool = False, admit: Admission | None = None
                  ) -> tuple[list[Refusal], asyncio.Future | None]:
        """Validate and journal a batch of pb.AddEntry (a sequence): add_runs of its runs
        (runs_of); the refusals' indices are the entries' positions in `entries`."""
        return self.add_runs(runs_of(entries), keyless, admit)

    def add_runs(self, runs: Sequence[AddRun], keyless: bool = False, admit: Admission | None = None
                 ) -> tuple[list[Refusal], asyncio.Future | None]:
        """Validate and journal a batch of runs (AddRun: entries of one ledger, key and flags).

        Returns the refused entries as (index, status, message), index counting the entries of
        all runs in order, in ascending order (every other entry is OK once the future completes),
        and a future that completes when the accepted ones are durable (None if none were
        accepted). Accepted entries are in the write cache before this returns (readers may see
        them; they only read up to a LAC, which only durable quorums advance). The decisions are
        adds.decide's (see there for `keyless` and `admit`); this applies them."""
        if self.read_only:
            return [(i, pb.READ_ONLY, "bookie is read-only") for i in range(count(runs))], None
        storage = self.storage
        if storage.backlog_bytes() >= self.opts.max_write_cache_bytes:
            storage.request_checkpoint()
            return [(i, pb.TOO_MANY_REQUESTS, "write cache full, checkpoint behind: retry shortly")
                    for i in range(count(runs))], None
        decision = decide(runs, self.ledgers, max_entry_size=self.opts.max_entry_size, held_last=storage.held_last,
                          existing=storage.existing, keyless=keyless, admit=admit)
        return decision.errors, self._apply(decision)

    def _apply(self, decision: Decision) -> asyncio.Future | None:
        """The I/O of a decided batch: record first keys, journal and cache the accepted entries,
        raise the LACs (waking long-polls); the future of the journal write, None if nothing."""
        storage, ledgers = self.storage, self.ledgers
        records: list[bytes] = []
        nbytes = entries = 0
        for ledger, new_key, ids, bodies, packed in decision.writes:
            if new_key is not None:
                st = ledgers.get(ledger)
                if st is None:
                    st = ledgers[ledger] = LedgerState(master_key=new_key)
                    self.metrics.ledgers.set(len(ledgers))
                elif new_key:
                    st.master_key = new_key
                    st.dirty = True
                if new_key:
                    records.append(encode_record(_MASTER_KEY, ledger, -1, new_key))
            if ids:
                records += encode_run(ledger, ids, list(map(len, bodies)),
                                      packed if packed is not None else b"".join(bodies))
                nbytes += storage.cache.put_many(ledger, dict(zip(ids, bodies)))
                entries += len(ids)
        for ledger, lac in decision.lacs.items():
            st = ledgers[ledger]
            if lac > st.lac:
                st.lac = lac
                st.dirty = True
                if ledger in self.lac_waiters:
                    self.lac_waiters.wake(ledger)
        if not records:
            return None
        self.metrics.adds.inc(entries)
        self.metrics.add_bytes.inc(nbytes)
        if storage.cache.bytes >= self.opts.checkpoint_bytes:
            storage.request_checkpoint()
        return storage.journal.append(records)

    def backlog_bytes(self) -> int:
        """Bytes held in memory for adds: write cache, checkpoint in flight, journal queue."""
        return self.storage.backlog_bytes()

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
        await self.storage.journal.append(b"".join(records))
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
            last = self.storage.last_entry(ledger)
            if last is None or lac > last:
                return _BAD, (f"explicit LAC {lac} of ledger {ledger} is beyond the entries this bookie holds "
                              f"(last entry {-1 if last is None else last})")
        fut = self.storage.journal.append(encode_record(_LAC, ledger, lac))
        if lac > st.explicit_lac:
            st.explicit_lac = lac
            st.dirty = True
            self.lac_waiters.wake(ledger)
        await fut
        return _OK, ""

    def last_entry(self, ledger: int) -> int | None:
        """The highest entry id of a ledger stored here, None if none."""
        return self.storage.last_entry(ledger)

    def lac(self, ledger: int) -> int | None:
        """The bookie's LAC for a ledger, None if it knows nothing of the ledger."""
        st = self.ledgers.get(ledger)
        return st.last_add_confirmed if st is not None else None

    async def wait_lac(self, ledger: int, previous: int, timeout: float) -> int | None:
        """Long-poll: return as soon as the LAC passes `previous`, or the current LAC at timeout."""
        return await self.lac_waiters.wait(ledger, previous, lambda: self.lac(ledger), timeout)

    # ---- reads ------------------------------------------------------------------------------

    def read_entry(self, ledger: int, entry: int) -> bytes | None:
        """An entry's body from the write cache, the flushing cache, or the entry log via the index."""
        return self.storage.read_entry(ledger, entry)

    async def read_chunk(self, ledger: int, first: int, last: int, max_bytes: int,
                         max_entries: int, step: int = 1) -> list[tuple[int, bytes]]:
        """read_bodies as (entry id, body) pairs."""
        return await self.storage.read_chunk(ledger, first, last, max_bytes, max_entries, step)

    async def read_bodies(self, ledger: int, first: int, last: int, max_bytes: int,
                          max_entries: int, step: int = 1, checked: bool = True) -> list[bytes | memoryview]:
        """Bodies of entries first, first+step, ... (see Storage.read_bodies)."""
        return await self.storage.read_bodies(ledger, first, last, max_bytes, max_entries, step, checked)

    def has_ledger(self, ledger: int) -> bool:
        return ledger in self.ledgers

    def entry_ids(self, ledger: int) -> list[int]:
        """Every entry id of a ledger stored here, sorted."""
        return self.storage.entry_ids(ledger)

    def list_entries(self, ledger: int) -> list[tuple[int, int]]:
        return self.storage.list_entries(ledger)

    # ---- garbage collection, scrubbing, checkpoints -----------------------------------------

    async def delete_ledgers(self, ledgers: set[int]) -> int:
        """Forget ledgers deleted from the metadata (compaction.delete_ledgers); their long-polls end."""
        dropped = await compaction.delete_ledgers(self.storage, ledgers)
        for ledger in ledgers:
            self.lac_waiters.wake(ledger)
        return dropped

    async def compact(self, threshold: float) -> dict:
        """Rewrite entry logs whose live fraction is under `threshold` (compaction.compact)."""
        return await compaction.compact(self.storage, threshold)

    async def drop_locations(self, pairs: list[tuple[bytes, bytes]]) -> list[tuple[int, int]]:
        """Forget entries the scrubber found unreadable (Storage.drop_locations)."""
        return await self.storage.drop_locations(pairs)

    def request_checkpoint(self) -> None:
        self.storage.request_checkpoint()

    async def checkpoint(self) -> Mark:
        """Move the write cache into the entry log + index and persist the journal mark."""
        return await self.storage.checkpoint()

    # ---- disk -------------------------------------------------------------------------------

    def set_read_only(self, value: bool) -> None:
        """Force read-only by request (admin API), or lift that request; it survives restarts."""
        self.disk.request(value)

    def disk_space(self) -> tuple[int, int]:
        """(free, total) bytes for the Info call."""
        return self.disk.space(self.ledger_dirs[0])
